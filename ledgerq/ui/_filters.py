"""What the console's pages show of a value: the templates' ``finalize``, their filters
and :func:`url`.

Every ``{{ ... }}`` of a template passes :func:`shown_text`, so nothing a queue holds can
reorder or recolour a page; the filters (``age``, ``bytes``, ``count``, ``field``,
``when``) write figures, sizes, durations and times as people read them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import markupsafe

from ledgerq.ui._preview import printable

__all__ = [
    "field_value",
    "format_age",
    "format_bytes",
    "format_count",
    "format_time",
    "shown_text",
    "url",
]


def shown_text(value: Any) -> Any:
    """What a template shows of ``value`` (the environment's ``finalize``, applied to
    every ``{{ ... }}``): text with its control and bidirectional-override characters
    escaped (``_preview.printable``), so nothing a queue holds - a header, a failure
    reason, a group, a queue's name - can reorder or recolour the page around it.
    Markup (the charts, the macros, :func:`field_value`) is the console's own and
    passes as it is; autoescaping then applies as always."""
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return printable(value)
    return value


def field_value(value: Any) -> markupsafe.Markup:
    """``value`` for a form field's ``value=""`` (the ``field`` filter): HTML-escaped,
    and its control and format characters written as character references
    (``&#x202e;``), so the page holds none of them raw while the browser still posts
    the very text back - a queue name or a filter is the same text, not its shown form."""
    text = str(markupsafe.escape(value))
    if printable(text) != text:
        text = "".join(
            ch if ch in "\n\t" or printable(ch) == ch else f"&#x{ord(ch):x};" for ch in text
        )
    return markupsafe.Markup(text)


def format_age(seconds: float | None) -> str:
    """``3725.0`` -> ``"1h 2m"``: two units at most; ``"-"`` for nothing."""
    if seconds is None or seconds <= 0:
        return "\u2014"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    total = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def format_bytes(size: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns


def format_count(value: int) -> str:
    """``12345`` -> ``"12,345"``."""
    return f"{value:,}"


def format_time(ns: int | None) -> str:
    """Nanoseconds since the epoch as local time to the second (``"-"`` for None)."""
    if not ns:
        return "\u2014"
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def url(path: str, *pairs: tuple[str, Any], **params: Any) -> str:
    """``path`` with a query string of ``pairs`` and ``params`` (None values left out)."""
    items = [(k, v) for k, v in [*pairs, *params.items()] if v is not None and v != ""]
    return path + ("?" + urlencode(items) if items else "")
