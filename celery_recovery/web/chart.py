"""The overview's bar chart of recoveries per hour, as inline SVG (no script, no library)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WIDTH = 720
HEIGHT = 140
#: Room under the bars for the hour labels.
AXIS = 18


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    count: int
    label: str
    #: Whether the hour is labelled under the axis (every sixth, to stay legible).
    labelled: bool


def bars(per_hour: list[dict[str, Any]]) -> tuple[list[Bar], int]:
    """Bars for ``per_hour`` (``hour``, ``count``) scaled to the chart, and the tallest count."""
    peak = max((h["count"] for h in per_hour), default=0)
    slot = WIDTH / max(len(per_hour), 1)
    drawable = HEIGHT - AXIS - 4
    out = []
    for i, hour in enumerate(per_hour):
        height = drawable * hour["count"] / peak if peak else 0.0
        out.append(
            Bar(
                x=round(i * slot + 2, 1),
                y=round(HEIGHT - AXIS - height, 1),
                width=round(slot - 4, 1),
                height=round(height, 1),
                count=hour["count"],
                label=hour["hour"].strftime("%H:00"),
                labelled=i % 6 == 0,
            )
        )
    return out, peak
