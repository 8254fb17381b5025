"""Which queues' ends moved: what a broker group's master reads to answer a slave's fetch without
looking at every queue it holds.

Every queue log calls its store when its end moves (an append, a replicated append, a cut, a
restart past the end), under the log's lock, so after the move is visible; the store marks the
queue in each watch. A reader takes the marks, then reads those queues' ends: a move it missed
is marked again after its take, so the next take has it.
"""

from __future__ import annotations

import threading

__all__ = ["EndWatch"]

QueueRef = tuple[str, int]


class EndWatch:
    """The queues whose end moved since the last ``take``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._moved: set[QueueRef] = set()

    def mark(self, ref: QueueRef) -> None:
        with self._lock:
            self._moved.add(ref)

    def take(self) -> set[QueueRef]:
        with self._lock:
            moved, self._moved = self._moved, set()
        return moved
