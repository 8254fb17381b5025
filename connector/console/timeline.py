"""The series the console plots: messages/s in per topic and total lag per group, over time.

Kept by the console process (not the page), so a page opened late still sees the recent past.
A topic's rate is the growth of the sum of its queues' max offsets between two snapshots; a topic
deleted and re-created in between shows 0 for that step rather than a negative rate.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["Timeline"]


class Timeline:
    """The last ``max_points`` points ``{"t": seconds, "rates": {topic: msg/s}, "lags": {group: n}}``."""

    def __init__(self, max_points: int = 600) -> None:
        self._points: deque[dict[str, Any]] = deque(maxlen=max_points)
        self._previous: tuple[float, dict[str, int]] | None = None

    def add(self, snapshot: dict[str, Any]) -> None:
        """Append the point of one snapshot (``connector.console.snapshot.take_snapshot``)."""
        t = snapshot["time_ms"] / 1000
        offsets = {topic["name"]: topic["max_offset_sum"] for topic in snapshot["topics"]}
        rates: dict[str, float] = {}
        if self._previous is not None and t > self._previous[0]:
            before_t, before = self._previous
            for name, total in offsets.items():
                grown = total - before.get(name, total)  # a new topic starts at rate 0
                rates[name] = max(0, grown) / (t - before_t)
        self._previous = (t, offsets)
        lags = {group["name"]: group["lag"] for group in snapshot["groups"]}
        self._points.append({"t": t, "rates": rates, "lags": lags})

    def points(self) -> list[dict[str, Any]]:
        return list(self._points)
