"""Charts as inline SVG strings, drawn on the server: an x/y chart (lines, steps, dots, horizontal
reference lines, one highlighted point) and a stacked bar chart, each with axes, ticks, axis
labels and a legend. No JavaScript, no plotting library: the page shows pictures even offline.

Every text that reaches the SVG (labels, legend entries, names from the database) is XML-escaped
here, because the result is inserted into the page unescaped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal
from xml.sax.saxutils import escape

from markupsafe import Markup

Formatter = Callable[[float], str]

FONT = 'font-family="system-ui, sans-serif" font-size="11"'
AXIS = "#555"
GRID = "#e3e3e3"
# Margins: room for the y tick labels on the left and the x labels and legend below.
LEFT, RIGHT, TOP, BOTTOM = 52, 14, 12, 50


def _esc(text: str) -> str:
    return escape(text, {'"': "&quot;"})


def _num(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def plain(value: float) -> str:
    """A tick label: integers without a fraction, large values with k/M."""
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if abs(value) >= 10_000:
        return f"{value / 1000:g}k"
    return f"{value:g}" if value == int(value) else f"{value:.2g}"


def ago(seconds: float) -> str:
    """A time axis label for `seconds` relative to now (negative: in the past)."""
    s = -seconds
    if abs(s) < 0.5:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if abs(s) >= size:
            return f"-{s / size:g}{unit}" if s / size == int(s / size) else f"-{s / size:.1f}{unit}"
    return f"-{s:.0f}s"


def duration(seconds: float) -> str:
    """A seconds axis label."""
    if seconds >= 3600:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def nice_ticks(lo: float, hi: float, count: int = 5, *, whole: bool = False) -> list[float]:
    """About `count` round tick values covering [lo, hi] (1, 2, 2.5 or 5 times a power of ten);
    `whole`: integers only (counts)."""
    if hi <= lo:
        hi = lo + 1
    raw = max((hi - lo) / max(count, 1), 1.0 if whole else 0.0) or 1e-9
    power = 10 ** math.floor(math.log10(raw))
    step = next(
        m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw and not (whole and m == 2.5 and power < 10)
    )
    start = math.floor(lo / step) * step
    ticks: list[float] = []
    value = start
    while not ticks or ticks[-1] < hi - step * 1e-9:  # the last tick at or above `hi`
        if value >= lo - step * 1e-9:
            ticks.append(round(value, 10))
        value += step
    return ticks


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    color: str
    kind: Literal["line", "step", "dots"] = "line"


@dataclass(frozen=True)
class Rule:
    """A horizontal reference line (a lease, a threshold)."""

    label: str
    y: float
    color: str = "#888"


@dataclass(frozen=True)
class Mark:
    """One highlighted point with a caption (where the horde is now)."""

    label: str
    x: float
    y: float
    color: str = "#d81b60"


@dataclass
class _Frame:
    width: int
    height: int
    x0: float
    x1: float
    y0: float
    y1: float
    parts: list[str] = field(default_factory=list)

    @property
    def plot_w(self) -> float:
        return self.width - LEFT - RIGHT

    @property
    def plot_h(self) -> float:
        return self.height - TOP - BOTTOM

    def px(self, x: float) -> float:
        span = (self.x1 - self.x0) or 1.0
        return LEFT + (x - self.x0) / span * self.plot_w

    def py(self, y: float) -> float:
        span = (self.y1 - self.y0) or 1.0
        return TOP + self.plot_h - (y - self.y0) / span * self.plot_h


def _open(width: int, height: int, title: str) -> str:
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{_esc(title)}" {FONT}>'
        f"<title>{_esc(title)}</title>"
    )


def _tag(name: str, text: str | None = None, **attrs: object) -> str:
    """One SVG element; attribute names use `_` for `-` (`text_anchor`), `cls` for `class`.
    Numbers are rounded to 0.1 px, text content is escaped."""
    parts = [name]
    for key, value in attrs.items():
        attr = "class" if key == "cls" else key.replace("_", "-")
        shown = _num(value) if isinstance(value, float) else str(value)
        parts.append(f'{attr}="{_esc(shown)}"')
    opening = "<" + " ".join(parts)
    return opening + "/>" if text is None else f"{opening}>{_esc(text)}</{name}>"


def _axes(
    f: _Frame,
    x_ticks: list[tuple[float, str]],
    y_ticks: list[float],
    y_fmt: Formatter,
    x_label: str,
    y_label: str,
) -> None:
    bottom = TOP + f.plot_h
    right = LEFT + f.plot_w
    for y in y_ticks:
        py = f.py(y)
        f.parts.append(_tag("line", x1=LEFT, x2=right, y1=py, y2=py, stroke=GRID))
        f.parts.append(
            _tag("text", y_fmt(y), x=LEFT - 6, y=py, text_anchor="end", dominant_baseline="middle", fill=AXIS)
        )
    for x, text in x_ticks:
        px = f.px(x)
        f.parts.append(_tag("line", x1=px, x2=px, y1=bottom, y2=bottom + 4, stroke=AXIS))
        f.parts.append(_tag("text", text, x=px, y=bottom + 15, text_anchor="middle", fill=AXIS))
    f.parts.append(_tag("line", x1=LEFT, x2=LEFT, y1=TOP, y2=bottom, stroke=AXIS))
    f.parts.append(_tag("line", x1=LEFT, x2=right, y1=bottom, y2=bottom, stroke=AXIS))
    f.parts.append(
        _tag("text", x_label, x=LEFT + f.plot_w / 2, y=bottom + 30, text_anchor="middle", fill="#333")
    )
    f.parts.append(
        _tag("text", y_label, transform=f"translate(12 {_num(TOP + f.plot_h / 2)}) rotate(-90)",
             text_anchor="middle", fill="#333")
    )  # fmt: skip


def _legend(f: _Frame, entries: Sequence[tuple[str, str]]) -> None:
    x = float(LEFT)
    y = f.height - 8.0
    for label, color in entries:
        f.parts.append(_tag("rect", x=x, y=y - 8, width=10, height=10, rx=2, fill=color))
        f.parts.append(_tag("text", label, x=x + 14, y=y + 1, fill="#333"))
        x += 24 + 6.2 * len(label)


def _empty(width: int, height: int, title: str, message: str) -> Markup:
    text = _tag("text", message, cls="empty", x=width / 2, y=height / 2, text_anchor="middle", fill="#888")
    return Markup(_open(width, height, title) + text + "</svg>")


def xy_chart(
    series: Sequence[Series],
    *,
    title: str,
    x_label: str,
    y_label: str,
    x_fmt: Formatter = plain,
    y_fmt: Formatter = plain,
    x_range: tuple[float, float] | None = None,
    rules: Sequence[Rule] = (),
    mark: Mark | None = None,
    width: int = 560,
    height: int = 250,
    empty: str = "no data yet",
) -> Markup:
    """Lines, steps (a value held until the next point) and dots on shared axes; y starts at 0."""
    xs = [x for s in series for x, _ in s.points] + ([mark.x] if mark else [])
    ys = [y for s in series for _, y in s.points] + [r.y for r in rules] + ([mark.y] if mark else [])
    if not any(s.points for s in series):
        return _empty(width, height, title, empty)
    x0, x1 = x_range or (min(xs), max(xs))
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    y_ticks = nice_ticks(0, max(max(ys), 1e-9) * 1.05)
    f = _Frame(width, height, x0, x1, 0.0, y_ticks[-1])
    x_ticks = [(x, x_fmt(x)) for x in nice_ticks(x0, x1, 6) if x0 <= x <= x1]
    _axes(f, x_ticks, y_ticks, y_fmt, x_label, y_label)
    for rule in rules:
        py = f.py(rule.y)
        f.parts.append(_tag("line", cls="rule", x1=LEFT, x2=LEFT + f.plot_w, y1=py, y2=py, stroke=rule.color,
                            stroke_dasharray="5 4"))  # fmt: skip
        f.parts.append(
            _tag("text", rule.label, x=LEFT + f.plot_w - 2, y=py - 4, text_anchor="end", fill=rule.color)
        )
    for s in series:
        points = sorted(s.points)
        if s.kind == "dots":
            for x, y in points:
                f.parts.append(_tag("circle", cls="mark", cx=f.px(x), cy=f.py(y), r=3, fill=s.color,
                                    fill_opacity=0.75))  # fmt: skip
            continue
        coords: list[str] = []
        for i, (x, y) in enumerate(points):
            if s.kind == "step" and i:
                coords.append(f"{_num(f.px(x))},{_num(f.py(points[i - 1][1]))}")
            coords.append(f"{_num(f.px(x))},{_num(f.py(y))}")
        f.parts.append(_tag("polyline", cls="mark", points=" ".join(coords), fill="none", stroke=s.color,
                            stroke_width=2))  # fmt: skip
    if mark is not None:
        cx, cy = f.px(mark.x), f.py(mark.y)
        f.parts.append(_tag("circle", cls="mark now", cx=cx, cy=cy, r=6, fill="none", stroke=mark.color,
                            stroke_width=2.5))  # fmt: skip
        anchor = "end" if cx > LEFT + f.plot_w * 0.7 else "start"
        f.parts.append(_tag("text", mark.label, x=cx + (-9 if anchor == "end" else 9), y=cy - 9,
                            text_anchor=anchor, fill=mark.color, font_weight=600))  # fmt: skip
    legend = [(s.label, s.color) for s in series]  # rules are labelled on the line itself
    if mark is not None:
        legend.append((mark.label.split(":")[0], mark.color))
    _legend(f, legend)
    return Markup(_open(width, height, title) + "".join(f.parts) + "</svg>")


@dataclass(frozen=True)
class Stack:
    """One layer of a stacked bar chart: a value per category."""

    label: str
    color: str
    values: Sequence[float]


def bar_chart(
    categories: Sequence[str],
    stacks: Sequence[Stack],
    *,
    title: str,
    x_label: str,
    y_label: str,
    y_fmt: Formatter = plain,
    width: int = 560,
    height: int = 250,
    max_labels: int = 8,
    empty: str = "no data yet",
    grouped: bool = False,
) -> Markup:
    """Stacked bars, one per category (time bins or buckets), layers in the order given; or, with
    `grouped`, the layers side by side within each category."""
    sums = [[s.values[i] for s in stacks] for i in range(len(categories))]
    totals = [max(v, default=0) if grouped else sum(v) for v in sums]
    if not categories or not any(totals):
        return _empty(width, height, title, empty)
    y_ticks = nice_ticks(0, max(totals) * 1.05, whole=True)
    f = _Frame(width, height, 0.0, float(len(categories)), 0.0, y_ticks[-1])
    every = max(1, math.ceil(len(categories) / max_labels))
    x_ticks = [(i + 0.5, c) for i, c in enumerate(categories) if i % every == 0 or i == len(categories) - 1]
    if len(x_ticks) > 1 and x_ticks[-1][0] - x_ticks[-2][0] < every:
        x_ticks.pop(-2)  # keep the last label (the newest bin) readable
    _axes(f, x_ticks, y_ticks, y_fmt, x_label, y_label)
    slot = f.plot_w / len(categories)
    bar = max(slot * 0.75, 1.0)
    width_each = bar / len(stacks) if grouped else bar
    for i in range(len(categories)):
        base = 0.0
        for j, s in enumerate(stacks):
            value = s.values[i]
            if value <= 0:
                continue
            top, bottom = f.py(base + value), f.py(base)
            x = LEFT + i * slot + (slot - bar) / 2 + (j * width_each if grouped else 0)
            tip = _tag("title", f"{categories[i]}: {s.label} {plain(value)}")
            rect = _tag("rect", cls="mark", x=x, y=top, width=max(width_each - (1 if grouped else 0), 1.0),
                        height=max(bottom - top, 0.5), fill=s.color)  # fmt: skip
            f.parts.append(rect[:-2] + ">" + tip + "</rect>")
            if not grouped:
                base += value
    _legend(f, [(s.label, s.color) for s in stacks])
    return Markup(_open(width, height, title) + "".join(f.parts) + "</svg>")
