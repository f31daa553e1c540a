"""Geometry of the ops page's stacked bar chart (message statuses per hour), drawn as inline
SVG by the template: no script and nothing loaded from elsewhere, so it shows without JS."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

WIDTH, HEIGHT, LABEL_SPACE = 960, 150, 18
GAP = 2


def status_chart(buckets: list[dict[str, Any]], statuses: list[str]) -> dict[str, Any]:
    """Bars scaled to the busiest hour; every fourth hour labelled in local time."""
    busiest = max((sum(bucket["counts"].values()) for bucket in buckets), default=0)
    scale = busiest or 1
    slot = WIDTH / max(len(buckets), 1)
    bars = []
    for index, bucket in enumerate(buckets):
        x = index * slot
        y = HEIGHT
        segments = []
        for status in statuses:
            count = bucket["counts"][status]
            if not count:
                continue
            height = count / scale * HEIGHT
            y -= height
            segments.append({"status": status, "count": count, "y": y, "height": height})
        hour = timezone.localtime(bucket["start"]).strftime("%H:00")
        bars.append(
            {
                "x": x + GAP / 2,
                "width": slot - GAP,
                "center": x + slot / 2,
                "segments": segments,
                "total": sum(bucket["counts"].values()),
                "hour": hour,
                "label": hour if index % 4 == 0 else "",
            }
        )
    return {
        "width": WIDTH,
        "height": HEIGHT + LABEL_SPACE,
        "plot_height": HEIGHT,
        "label_y": HEIGHT + LABEL_SPACE - 3,
        "busiest": busiest,
        "bars": bars,
    }
