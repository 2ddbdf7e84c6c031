"""SVG charts of benchmark results, written by hand from the numbers (no plotting library).

``benchmarks/run.py`` draws one chart beside each table of the report - the rates of
every queue per scenario, the producer-thread scaling, the shared-mode figures and
the wake-up latency percentiles - and writes them into ``docs/img/`` next to the
report.  A chart is self-contained SVG (its colours and font inline: it is shown as an
image, where no stylesheet reaches it), deterministic for the same numbers, so a
re-render from the saved JSON leaves the files unchanged.

Bars are drawn on a logarithmic scale where the values span more than two decades
(queues here differ by 100x and more); every bar is labelled with its value, so the
scale is never needed to read one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Bars", "Line", "bar_chart", "line_chart"]

PALETTE = ("#2f6fed", "#e0913a", "#1f9d63", "#d6453d", "#7b5cd6", "#5d6679")
FONT = "font-family=\"-apple-system, 'Segoe UI', Roboto, Helvetica, Arial, sans-serif\""
INK, MUTED, GRID = "#1c2330", "#6b7485", "#e3e6ec"


@dataclass(frozen=True)
class Bars:
    """One row of a bar chart: its label and one value per series (None: shown as
    ``note``)."""

    label: str
    values: Sequence[float | None]
    highlight: bool = False
    note: str = "not measured"


@dataclass(frozen=True)
class Line:
    """One line of a line chart: its name and one value per x (None: not measured)."""

    name: str
    values: Sequence[float | None]
    highlight: bool = False


def _fmt(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    if value >= 1e3:
        return f"{value / 1e3:.3g}k"
    if value >= 10:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _ticks(low: float, high: float, log: bool) -> list[float]:
    if log:
        first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
        return [10.0**e for e in range(first, last + 1)]
    step = 10 ** math.floor(math.log10(high)) if high > 0 else 1
    if high / step < 3:
        step /= 2
    return [step * i for i in range(int(high / step) + 2)]


class _Scale:
    def __init__(self, values: Sequence[float], log: bool, width: float) -> None:
        positive = [v for v in values if v > 0] or [1.0]
        self.log = log
        self.ticks = _ticks(min(positive), max(positive), log)
        self.low = self.ticks[0] if log else 0.0
        self.high = self.ticks[-1]
        self.width = width

    def x(self, value: float) -> float:
        if self.log:
            value = max(value, self.low)
            span = math.log10(self.high) - math.log10(self.low) or 1.0
            return (math.log10(value) - math.log10(self.low)) / span * self.width
        return value / (self.high or 1.0) * self.width


def _legend(series: Sequence[str], x: float, y: float) -> list[str]:
    parts = []
    for i, name in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        parts.append(
            f'<rect x="{x:.0f}" y="{y - 9:.0f}" width="10" height="10" rx="2" fill="{colour}"/>'
            f'<text x="{x + 14:.0f}" y="{y:.0f}" font-size="12" fill="{INK}">{escape(name)}</text>'
        )
        x += 28 + 7 * len(name)
    return parts


def bar_chart(
    title: str,
    rows: Sequence[Bars],
    series: Sequence[str],
    *,
    unit: str,
    log: bool | None = None,
) -> str:
    """Horizontal bars, one group per row and one bar per series, each labelled."""
    values = [v for r in rows for v in r.values if v is not None]
    if log is None:
        positive = [v for v in values if v > 0]
        log = bool(positive) and max(positive) / min(positive) > 100
    label_w, plot_w, right = 290.0, 420.0, 70.0
    bar_h, gap, group_gap = 14.0, 2.0, 12.0
    group_h = len(series) * (bar_h + gap) + group_gap
    top, bottom = 56.0, 44.0
    height = top + len(rows) * group_h + bottom
    width = label_w + plot_w + right
    scale = _Scale(values or [1.0], log, plot_w)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" {FONT} role="img" '
        f'aria-label="{escape(title)}">',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
        f'<text x="16" y="24" font-size="15" font-weight="600" fill="{INK}">{escape(title)}</text>',
        *_legend(series, label_w, 44),
    ]
    axis_y = top + len(rows) * group_h
    for tick in scale.ticks:
        x = label_w + scale.x(tick)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 4:.0f}" x2="{x:.1f}" y2="{axis_y:.0f}" '
            f'stroke="{GRID}"/><text x="{x:.1f}" y="{axis_y + 16:.0f}" font-size="11" '
            f'fill="{MUTED}" text-anchor="middle">{_fmt(tick)}</text>'
        )
    scale_note = "log scale" if log else "linear scale"
    out.append(
        f'<text x="{label_w + plot_w:.0f}" y="{axis_y + 34:.0f}" font-size="11" fill="{MUTED}" '
        f'text-anchor="end">{escape(unit)} ({scale_note})</text>'
    )
    y = top
    for row in rows:
        weight = ' font-weight="600"' if row.highlight else ""
        middle = y + len(series) * (bar_h + gap) / 2
        out.append(
            f'<text x="{label_w - 10:.0f}" y="{middle + 4:.1f}" font-size="12" fill="{INK}" '
            f'text-anchor="end"{weight}>{escape(row.label)}</text>'
        )
        for i, value in enumerate(row.values):
            by = y + i * (bar_h + gap)
            if value is None:
                out.append(
                    f'<text x="{label_w + 4:.0f}" y="{by + 11:.1f}" font-size="11" '
                    f'fill="{MUTED}">{escape(row.note)}</text>'
                )
                continue
            w = max(scale.x(value), 1.0)
            colour = PALETTE[i % len(PALETTE)]
            out.append(
                f'<rect x="{label_w:.0f}" y="{by:.1f}" width="{w:.1f}" height="{bar_h:.0f}" '
                f'rx="2" fill="{colour}"/><text x="{label_w + w + 5:.1f}" y="{by + 11:.1f}" '
                f'font-size="11" fill="{INK}">{_fmt(value)}</text>'
            )
        y += group_h
    out.append("</svg>")
    return "\n".join(out) + "\n"


def line_chart(
    title: str,
    xs: Sequence[float],
    lines: Sequence[Line],
    *,
    x_label: str,
    unit: str,
) -> str:
    """Lines over the points ``xs`` (evenly spaced, labelled), one per queue, the value
    at the last point written at the line's end."""
    left, plot_w, plot_h, right = 60.0, 520.0, 240.0, 210.0
    top, bottom = 40.0, 50.0
    width, height = left + plot_w + right, top + plot_h + bottom
    values = [v for line in lines for v in line.values if v is not None]
    high = _ticks(0.0, max(values or [1.0]), log=False)
    top_value = high[-1] or 1.0
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'width="{width:.0f}" height="{height:.0f}" {FONT} role="img" '
        f'aria-label="{escape(title)}">',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
        f'<text x="16" y="24" font-size="15" font-weight="600" fill="{INK}">{escape(title)}</text>',
    ]
    for tick in high:
        y = top + plot_h - tick / top_value * plot_h
        out.append(
            f'<line x1="{left:.0f}" y1="{y:.1f}" x2="{left + plot_w:.0f}" y2="{y:.1f}" '
            f'stroke="{GRID}"/><text x="{left - 8:.0f}" y="{y + 4:.1f}" font-size="11" '
            f'fill="{MUTED}" text-anchor="end">{_fmt(tick)}</text>'
        )

    def px(i: int) -> float:
        return left + (i / max(len(xs) - 1, 1)) * plot_w

    for i, x in enumerate(xs):
        out.append(
            f'<text x="{px(i):.1f}" y="{top + plot_h + 18:.0f}" font-size="11" fill="{MUTED}" '
            f'text-anchor="middle">{_fmt(x)}</text>'
        )
    out.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 38:.0f}" font-size="11" '
        f'fill="{MUTED}" text-anchor="middle">{escape(x_label)}; {escape(unit)}</text>'
    )
    ends: list[tuple[float, str, str]] = []
    for n, line in enumerate(lines):
        colour = PALETTE[n % len(PALETTE)]
        points = [
            (px(i), top + plot_h - v / top_value * plot_h)
            for i, v in enumerate(line.values)
            if v is not None
        ]
        if not points:
            continue
        stroke = 3 if line.highlight else 2
        path = " ".join(
            f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(points)
        )
        out.append(f'<path d="{path}" fill="none" stroke="{colour}" stroke-width="{stroke}"/>')
        out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>' for x, y in points)
        last = [v for v in line.values if v is not None][-1]
        ends.append((points[-1][1], f"{line.name} {_fmt(last)}", colour))
    # End labels, nudged apart so that none overlaps another.
    ends.sort()
    placed: list[float] = []
    for y, text, colour in ends:
        y = max(y, placed[-1] + 14) if placed else y
        placed.append(y)
        out.append(
            f'<text x="{left + plot_w + 8:.0f}" y="{y + 4:.1f}" font-size="11" '
            f'fill="{colour}">{escape(text)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
