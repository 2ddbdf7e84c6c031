"""Small charts of the last minutes, drawn on the server as inline SVG.

No chart library and no script: a chart is a few ``<path>`` elements whose colours
come from the stylesheet (CSS classes, so the page's Content-Security-Policy needs no
inline styles), redrawn with the page.  Every text that goes into the SVG is escaped
here (its control and bidirectional-override characters shown as escapes first, as
every page shows them), and numbers are formatted by this module: the templates
insert the result as is.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from ledgerq.ui._preview import printable

__all__ = ["Series", "chart", "format_rate", "span_text", "sparkline"]

Points = Sequence[tuple[float, float]]


def _text(value: str) -> str:
    """``value`` for the SVG: shown (``printable``), then HTML-escaped."""
    return html.escape(printable(value))


@dataclass(frozen=True, slots=True)
class Series:
    """One line of a chart: its legend ``label``, a CSS ``kind`` (its colour) and its
    (time, value) ``points``."""

    label: str
    kind: str
    points: Points


def _nice_max(value: float) -> float:
    """A round number at least ``value`` (the top of the y axis): 1, 2, 5, 10, 20, ..."""
    if value <= 0:
        return 1.0
    step = 1.0
    while step * 10 <= value:
        step *= 10
    while step > value * 10:
        step /= 10
    for factor in (1, 2, 5, 10):
        if step * factor >= value:
            return step * factor
    return step * 10  # pragma: no cover - the loop always returns


def format_rate(value: float | None) -> str:
    """``1234.5`` -> ``"1.2k"``; ``None`` -> an em dash; small rates keep a decimal."""
    if value is None:
        return "\u2014"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    if value >= 10:
        return f"{value:.0f}"
    if value > 0:
        return f"{value:.1f}"
    return "0"


# Steps between time labels, the first that gives at most six labels is used.
_TICK_STEPS_S = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


def span_text(seconds: float) -> str:
    """``600`` -> ``"10 minutes"``, ``45`` -> ``"45 seconds"``, ``7200`` -> ``"2 hours"``."""
    for size, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if (seconds >= size and seconds % size == 0) or seconds >= 2 * size:
            value = seconds / size
            return f"{value:g} {unit}{'' if value == 1 else 's'}"
    return f"{seconds:g} second{'' if seconds == 1 else 's'}"


def _tick_text(seconds_ago: float) -> str:
    if seconds_ago == 0:
        return "now"
    for size, unit in ((3600, " h"), (60, " min"), (1, "s")):
        if seconds_ago >= size and seconds_ago % size == 0:
            return f"-{seconds_ago / size:g}{unit}"
    return f"-{seconds_ago:g}s"


def _format_count(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1e6:g}M"
    if value >= 1000:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def _path(points: Points, x0: float, span: float, top: float, w: float, h: float) -> str:
    coords = []
    for at, value in points:
        x = (at - x0) / span * w
        y = h - min(value / top, 1.0) * h
        coords.append(f"{max(x, 0.0):.1f},{y:.1f}")
    return "M" + " L".join(coords) if coords else ""


def sparkline(
    points: Points, *, now: float, span_s: float, label: str, kind: str = "pending"
) -> str:
    """A 120x28 sparkline of ``points`` over the last ``span_s`` seconds before ``now``,
    the area under it shaded; ``label`` is its accessible name (and tooltip)."""
    w, h = 120.0, 28.0
    x0 = now - span_s
    shown = [(at, v) for at, v in points if at >= x0]
    title = _text(label)
    if len(shown) < 2:
        return (
            f'<svg class="spark" viewBox="0 0 {w:g} {h:g}" role="img" aria-label="{title}">'
            f"<title>{title}</title>"
            f'<line class="spark-none" x1="0" y1="{h - 0.5:g}" x2="{w:g}" y2="{h - 0.5:g}"/>'
            "</svg>"
        )
    top = _nice_max(max(v for _, v in shown))
    line = _path(shown, x0, span_s, top, w, h - 1)
    first_x = line[1:].split(",", 1)[0]
    last_x = line.rsplit(" L", 1)[-1].split(",", 1)[0] if " L" in line else first_x
    area = f"{line} L{last_x},{h:g} L{first_x},{h:g} Z"
    return (
        f'<svg class="spark spark-{kind}" viewBox="0 0 {w:g} {h:g}" preserveAspectRatio="none" '
        f'role="img" aria-label="{title}"><title>{title}</title>'
        f'<path class="area" d="{area}"/><path class="line" d="{line}"/></svg>'
    )


def chart(series: Sequence[Series], *, now: float, span_s: float, unit: str) -> str:
    """A 640x180 line chart of ``series`` over the last ``span_s`` seconds, with a y axis
    in ``unit``, time labels and a legend."""
    w, h = 640.0, 180.0
    left, right, top_pad, bottom = 48.0, 12.0, 12.0, 40.0
    pw, ph = w - left - right, h - top_pad - bottom
    x0 = now - span_s
    values = [v for s in series for at, v in s.points if at >= x0]
    top = _nice_max(max(values, default=0.0))
    parts = [
        f'<svg class="chart" viewBox="0 0 {w:g} {h:g}" role="img" '
        f'aria-label="{_text(", ".join(s.label for s in series))} over the last '
        f'{_text(span_text(span_s))}">'
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = top_pad + ph - fraction * ph
        parts.append(
            f'<line class="grid" x1="{left:g}" y1="{y:.1f}" x2="{w - right:g}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{left - 6:g}" y="{y + 4:.1f}" text-anchor="end">'
            f"{_text(_format_count(top * fraction))}</text>"
        )
    step = next((s for s in _TICK_STEPS_S if span_s / s <= 6), _TICK_STEPS_S[-1])
    ago = 0.0
    while ago <= span_s:
        x = left + pw - ago / span_s * pw
        parts.append(
            f'<text class="axis" x="{x:.1f}" y="{top_pad + ph + 16:g}" text-anchor="middle">'
            f"{_tick_text(ago)}</text>"
        )
        ago += step
    parts.append(f'<g transform="translate({left:g},{top_pad:g})">')
    for s in series:
        shown = [(at, v) for at, v in s.points if at >= x0]
        if len(shown) >= 2:
            d = _path(shown, x0, span_s, top, pw, ph)
            parts.append(f'<path class="series series-{_text(s.kind)}" d="{d}"/>')
    parts.append("</g>")
    x = left
    for s in series:
        label = _text(s.label)
        parts.append(
            f'<rect class="key series-{_text(s.kind)}" x="{x:g}" y="{h - 12:g}" '
            f'width="10" height="4"/><text class="legend" x="{x + 14:g}" y="{h - 8:g}">'
            f"{label}</text>"
        )
        x += 24 + 7 * len(s.label)
    parts.append(
        f'<text class="axis unit" x="{w - right:g}" y="{h - 8:g}" text-anchor="end">'
        f"{_text(unit)}</text></svg>"
    )
    return "".join(parts)
