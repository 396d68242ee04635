"""The console's charts of a sink's last hour of commits, drawn as SVG on the server."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Final

CHART_WIDTH: Final = 600
CHART_HEIGHT: Final = 120


@dataclass(frozen=True)
class Chart:
    """A line chart of the last hour in SVG coordinates (x 0-600 from an hour ago to now, y 0-120), with its top
    value as a label."""

    points: tuple[tuple[float, float], ...]
    top: str
    unit: str

    @property
    def polyline(self) -> str:
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in self.points)


def line_chart(series: list[tuple[float, float]], unit: str, window_seconds: float) -> Chart:
    if not series:
        return Chart((), "", unit)
    start = time.time() - window_seconds
    top = max(value for _, value in series) or 1.0
    points = tuple(
        ((at - start) / window_seconds * CHART_WIDTH, CHART_HEIGHT - 4 - value / top * (CHART_HEIGHT - 12))
        for at, value in series
    )
    shown = f"{top:.0f}" if top >= 10 or math.isclose(top, round(top)) else f"{top:.2f}"
    return Chart(points, shown, unit)
