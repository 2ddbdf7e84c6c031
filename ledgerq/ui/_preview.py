"""A payload shown to a person: as JSON, as text or as hex, and never too much of it.

The preview is *text*: the templates escape it (Jinja2 autoescaping), so a payload
holding ``<script>`` shows those characters and runs nothing.  Control characters
other than newline and tab are shown as ``\\xNN`` escapes, so a payload cannot rewrite
what the page around it says either (bidirectional overrides, backspaces).
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = [
    "PREVIEW_BYTES",
    "SHORT_PREVIEW_CHARS",
    "Preview",
    "PreviewKind",
    "preview",
    "printable",
    "short",
]

PreviewKind: TypeAlias = Literal["json", "text", "hex"]

PREVIEW_BYTES = 16 * 1024  # of a payload shown on its message page
HEX_BYTES = 4 * 1024  # a hex dump is four times as long as its bytes
SHORT_PREVIEW_CHARS = 80  # in a table row


@dataclass(frozen=True, slots=True)
class Preview:
    """``text`` to show for a payload of ``size`` bytes as ``kind``; ``shown_bytes`` of
    it went into the text (``truncated`` when that is not all of it)."""

    kind: PreviewKind
    text: str
    size: int
    shown_bytes: int

    @property
    def truncated(self) -> bool:
        """Whether part of the payload is not shown."""
        return self.shown_bytes < self.size


def printable(text: str) -> str:
    """``text`` with control and format characters (but newline and tab) escaped:
    ``"a\u202eb\x1b"`` -> ``"a\\u202eb\\x1b"``.  What every page shows of text it did
    not write itself (payloads, header keys and values, failure reasons, names)."""
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch in "\n\t" or (ch.isprintable() and unicodedata.category(ch) != "Cf"):
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    return "".join(out)


def _decoded(payload: bytes, limit: int) -> tuple[str, int] | None:
    """The first ``limit`` bytes as UTF-8 text (a character cut at the end dropped) and
    how many bytes that is; None when it is not UTF-8 text."""
    head = payload[:limit]
    for cut in range(4):  # a multi-byte character cut by the limit: drop its bytes
        part = head[: len(head) - cut] if cut else head
        try:
            text = part.decode("utf-8")
        except UnicodeDecodeError:
            if len(head) == len(payload):
                return None  # the whole payload, and not UTF-8
            continue
        return text, len(part)
    return None


def hex_dump(data: bytes) -> str:
    """``data`` as lines of 16 bytes: offset, hex, and the printable ASCII."""
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)


def _looks_binary(text: str) -> bool:
    controls = sum(1 for ch in text if ch not in "\n\r\t" and unicodedata.category(ch) == "Cc")
    return controls > max(2, len(text) // 20)


def preview(payload: bytes, kind: PreviewKind | None = None) -> Preview:
    """How to show ``payload``: as ``kind``, or the best fit - JSON when it parses as
    a whole, text when it is UTF-8 and not mostly control characters, else hex.  A
    payload asked for as JSON that is not JSON shows as text (or hex, not being text)."""
    size = len(payload)
    if kind != "hex":
        decoded = _decoded(payload, PREVIEW_BYTES)
        is_text = decoded is not None and (kind is not None or not _looks_binary(decoded[0]))
        if decoded is not None and is_text:
            text, shown = decoded
            if kind != "text" and shown == size:
                try:
                    value = json.loads(text)
                except ValueError:
                    pass
                else:
                    pretty = json.dumps(value, indent=2, ensure_ascii=False)
                    return Preview("json", printable(pretty), size, size)
            return Preview("text", printable(text), size, shown)
    shown_bytes = payload[:HEX_BYTES]
    return Preview("hex", hex_dump(shown_bytes), size, len(shown_bytes))


def short(payload: bytes) -> str:
    """One line of at most :data:`SHORT_PREVIEW_CHARS` for a table row."""
    decoded = _decoded(payload, SHORT_PREVIEW_CHARS * 4)
    if decoded is None or _looks_binary(decoded[0]):
        return " ".join(f"{b:02x}" for b in payload[:24]) + (" …" if len(payload) > 24 else "")
    text = " ".join(decoded[0].split())
    if len(text) > SHORT_PREVIEW_CHARS or decoded[1] < len(payload):
        return printable(text[: SHORT_PREVIEW_CHARS - 1]) + "…"
    return printable(text)
