"""Geometry for the console's drawings, computed on the server and rendered as inline SVG by the
templates (``templates/svg.html``): charts and graphs read without JavaScript, and every label
goes through the templates' autoescaping like any other text.

Only numbers are made here (coordinates, tick values); text stays data for the template.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

WIDTH, HEIGHT, PAD = 640, 220, 40


@dataclass(slots=True)
class Chart:
    """A line chart of values over labelled points (None: a gap)."""

    title: str
    width: int = WIDTH
    height: int = HEIGHT
    points: list[dict[str, Any]] = field(default_factory=list)  # x, y, label, value
    polyline: str = ""
    ticks: list[dict[str, Any]] = field(default_factory=list)  # y, value
    empty: bool = True


def chart(title: str, series: list[tuple[str, float | None]], *, width: int = WIDTH, height: int = HEIGHT) -> Chart:
    """``series`` (label, value) left to right, scaled into the box; the y axis from the values'
    range (a flat series is centred)."""
    out = Chart(title, width, height)
    values = [v for _, v in series if v is not None and math.isfinite(v)]
    if not values:
        return out
    low, high = min(values), max(values)
    if low == high:
        low, high = low - 1, high + 1
    n = len(series)
    inner_w, inner_h = width - 2 * PAD, height - 2 * PAD

    def y_of(v: float) -> float:
        return round(PAD + inner_h * (1 - (v - low) / (high - low)), 1)

    coords = []
    for i, (label, value) in enumerate(series):
        x = round(PAD + (inner_w * i / (n - 1) if n > 1 else inner_w / 2), 1)
        if value is None or not math.isfinite(value):
            continue
        y = y_of(value)
        coords.append(f"{x},{y}")
        out.points.append({"x": x, "y": y, "label": label, "value": value})
    out.polyline = " ".join(coords)
    out.ticks = [{"y": y_of(v), "value": v} for v in (low, (low + high) / 2, high)]
    out.empty = False
    return out


@dataclass(slots=True)
class Bars:
    """A bar chart of counts per labelled bucket."""

    title: str
    width: int = WIDTH
    height: int = HEIGHT
    bars: list[dict[str, Any]] = field(default_factory=list)  # x, y, w, h, label, value
    high: float = 0
    empty: bool = True


def bars(title: str, series: list[tuple[str, float]], *, width: int = WIDTH, height: int = HEIGHT) -> Bars:
    out = Bars(title, width, height)
    if not series:
        return out
    high = max(v for _, v in series) or 1
    inner_w, inner_h = width - 2 * PAD, height - 2 * PAD
    step = inner_w / len(series)
    for i, (label, value) in enumerate(series):
        h = round(inner_h * value / high, 1)
        out.bars.append(
            {
                "x": round(PAD + i * step + step * 0.1, 1),
                "w": round(max(step * 0.8, 1), 1),
                "y": round(PAD + inner_h - h, 1),
                "h": h,
                "label": label,
                "value": value,
            }
        )
    out.high, out.empty = high, False
    return out


@dataclass(slots=True)
class Graph:
    """Nodes on circles around the memory at the centre, and the edges between them."""

    width: int
    height: int
    nodes: list[dict[str, Any]]  # id, x, y, kind (memory|entity|neighbour), label, href
    edges: list[dict[str, Any]]  # x1, y1, x2, y2, label, lx, ly


def graph(
    centre: dict[str, Any],
    entities: list[dict[str, Any]],
    neighbours: list[dict[str, Any]],
    edges: list[tuple[str, str, str]],
    *,
    size: int = 560,
) -> Graph:
    """``centre`` in the middle, its ``entities`` on an inner circle, ``neighbours`` (other memories
    that mention them) on an outer one; ``edges`` are (from id, label, to id) between any of them."""
    mid = size / 2
    nodes = [{**centre, "x": mid, "y": mid}]
    for ring, items in ((size * 0.27, entities), (size * 0.44, neighbours)):
        n = len(items)
        for i, item in enumerate(items):
            angle = 2 * math.pi * i / max(n, 1) - math.pi / 2 + (0.3 if ring > size * 0.3 else 0)
            nodes.append(
                {**item, "x": round(mid + ring * math.cos(angle), 1), "y": round(mid + ring * math.sin(angle), 1)}
            )
    where = {node["id"]: node for node in nodes}
    lines = []
    for a, label, b in edges:
        if a in where and b in where and a != b:
            p, q = where[a], where[b]
            lines.append(
                {
                    "x1": p["x"],
                    "y1": p["y"],
                    "x2": q["x"],
                    "y2": q["y"],
                    "label": label,
                    "lx": round((p["x"] + q["x"]) / 2, 1),
                    "ly": round((p["y"] + q["y"]) / 2, 1),
                }
            )
    return Graph(size, size, nodes, lines)


@dataclass(slots=True)
class Plan:
    """A query's steps as horizontal bars of their milliseconds, in order."""

    width: int
    height: int
    rows: list[dict[str, Any]]


def plan(steps: list[dict[str, Any]], *, width: int = WIDTH) -> Plan:
    longest = max((float(s.get("ms") or 0) for s in steps), default=0) or 1
    label_w, row_h = 260, 22
    rows = []
    for i, s in enumerate(steps):
        ms = float(s.get("ms") or 0)
        rows.append(
            {
                **s,
                "y": 10 + i * row_h,
                "x": label_w,
                "w": round(max((width - label_w - 80) * ms / longest, 1), 1),
            }
        )
    return Plan(width, 20 + len(steps) * row_h, rows)
