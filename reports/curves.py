"""Line charts of the checks' curves (results.json `series`): busbw against message size, loss
against step, throughput against time.

One chart per check and curve name, with every node's lines on it, so a node whose curve
departs from the others stands out. Geometry only: the template draws the SVG, and every
label here is plain text that Jinja escapes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

WIDTH, HEIGHT = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 58, 604, 10, 170  # room right of the plot for the last x label
PALETTE = ("#0969da", "#bf3989", "#1a7f37", "#9a6700", "#8250df", "#cf222e", "#1b7c83", "#57606a")
LEGEND_ENTRIES = 8  # more lines than this: the legend names the first ones and counts the rest
DOTS_UP_TO = 12  # lines with this few points also mark each point (a bend shows where data is)
BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


@dataclass
class Line:
    label: str
    color: str
    points: str  # SVG polyline "x,y x,y ..."
    tooltip: str
    dots: list[tuple[float, float]]  # marked points, empty on dense lines


@dataclass
class CurveChart:
    key: str  # HTML id
    title: str
    check: str
    width: int
    height: int
    plot_left: float
    plot_right: float
    plot_top: float
    plot_bottom: float
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    x_title: str
    y_title: str
    lines: list[Line]
    legend: list[tuple[str, str]]  # (color, label)
    legend_more: int  # lines the legend does not name


def build_curves(checks: list[dict], where: Callable[[dict], str],
                 format_number: Callable[[float], str]) -> list[CurveChart]:
    """Charts for every (check, curve name), in the order the checks ran."""
    groups: dict[tuple[str, str], list[tuple[str, dict]]] = {}
    for check in checks:
        for curve in check.get("series") or []:
            if isinstance(curve, dict) and curve.get("lines"):
                key = (str(check.get("check") or ""), str(curve.get("name") or ""))
                groups.setdefault(key, []).append((where(check), curve))
    charts = []
    for index, ((check_name, name), members) in enumerate(groups.items()):
        chart = _chart(f"curve-{index}", check_name, name, members, format_number)
        if chart is not None:
            charts.append(chart)
    return charts


def _chart(key: str, check: str, name: str, members: list[tuple[str, dict]],
           format_number: Callable[[float], str]) -> Optional[CurveChart]:
    first = members[0][1]
    log2 = first.get("x_scale") == "log2"
    x_unit, y_unit = str(first.get("x_unit") or ""), str(first.get("y_unit") or "")
    labelled = []
    for place, curve in members:
        lines = curve.get("lines") or []
        for line in lines:
            points = [(float(x), float(y)) for x, y in line.get("points") or []
                      if _finite(x) and _finite(y) and (not log2 or float(x) > 0)]
            if points:
                label = str(line.get("label") or "")
                name_of_line = place if len(lines) == 1 or not label else f"{place}: {label}"
                labelled.append((name_of_line if place else label, sorted(points)))
    if not labelled:
        return None

    def scale_x(value: float) -> float:
        return math.log2(value) if log2 else value

    xs = [scale_x(x) for _, points in labelled for x, _ in points]
    ys = [y for _, points in labelled for _, y in points]
    x_low, x_high = min(xs), max(xs)
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    y_low, y_high = min(0.0, *ys), max(0.0, *ys)
    if y_high == y_low:
        y_high = y_low + 1.0
    y_ticks = nice_ticks(y_low, y_high + (y_high - y_low) * 0.05)
    y_low, y_high = min(y_low, y_ticks[0]), max(y_high, y_ticks[-1])

    def px(x: float) -> float:
        return round(LEFT + (scale_x(x) - x_low) / (x_high - x_low) * (RIGHT - LEFT), 2)

    def py(y: float) -> float:
        return round(BOTTOM - (y - y_low) / (y_high - y_low) * (BOTTOM - TOP), 2)

    if log2:
        step = max(1, math.ceil((x_high - x_low) / 8))
        # Sizes a rank count divides (64 MiB - 4 B on 4 ranks) still get their power-of-two tick.
        exponents = range(math.ceil(x_low - 0.01), math.floor(x_high + 0.01) + 1, step)
        x_ticks = [(px(2.0 ** e), _x_label(2.0 ** e, x_unit, format_number)) for e in exponents]
    else:
        x_ticks = [(px(t), _x_label(t, x_unit, format_number)) for t in nice_ticks(x_low, x_high)
                   if x_low <= t <= x_high]
    lines = []
    for position, (label, points) in enumerate(labelled):
        color = PALETTE[position % len(PALETTE)]
        last_x, last_y = points[-1]
        lines.append(Line(label=label, color=color,
                          points=" ".join(f"{px(x)},{py(y)}" for x, y in points),
                          dots=[(px(x), py(y)) for x, y in points] if len(points) <= DOTS_UP_TO else [],
                          tooltip=f"{label}: {format_number(last_y)} {y_unit} at "
                                  f"{_x_label(last_x, x_unit, format_number)}".strip()))
    return CurveChart(
        key=key, title=name, check=check, width=WIDTH, height=HEIGHT, plot_left=LEFT,
        plot_right=RIGHT, plot_top=TOP, plot_bottom=BOTTOM, x_ticks=x_ticks,
        y_ticks=[(py(t), format_number(t)) for t in y_ticks],
        x_title=_axis_title(first.get("x_label"), "" if x_unit == "B" else x_unit),
        y_title=_axis_title(first.get("y_label"), y_unit),
        lines=lines, legend=[(line.color, line.label) for line in lines[:LEGEND_ENTRIES]],
        legend_more=max(0, len(lines) - LEGEND_ENTRIES))


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _axis_title(label, unit: str) -> str:
    label = str(label or "")
    return f"{label} ({unit})" if unit else label


def _x_label(value: float, unit: str, format_number: Callable[[float], str]) -> str:
    """Bytes as binary multiples (1 MiB, 8 GiB), other units as plain numbers."""
    if unit == "B":
        for size, name in BYTE_UNITS:
            if value >= size:
                return f"{value / size:g} {name}"
        return f"{value:g} B"
    return format_number(value)


def nice_ticks(low: float, high: float, count: int = 4) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k steps) spanning low..high."""
    raw_step = (high - low) / count
    power = 10 ** math.floor(math.log10(raw_step))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw_step)
    ticks, value = [], math.ceil(low / step) * step
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    return ticks
