"""How much of the queues' logs the broker leaves in the OS page cache.

Every byte appended to a log lands in a page of the page cache, and the kernel keeps those pages
until memory runs short: a broker taking hundreds of megabytes a second fills gigabytes with log
that is rarely read again, and each append takes a page nobody used before. On a virtual machine
that hands free memory back to its host (free page reporting, balloon drivers) the first write to
such a page faults into the host: measured on one, appending 1 GiB took 1.2-1.5 s of system time
into pages never used, against 0.2 s into pages freed a moment before.

So the broker leaves the last ``page_cache_bytes`` of log written (across all queues, in chunks of
1 MiB) in the page cache, and asks the kernel to drop older chunks once they are on disk
(``posix_fadvise(POSIX_FADV_DONTNEED)``): new appends reuse the memory they held. Readers at the
tail still read from memory; one further behind reads from disk, as it would on a machine with
less memory. A segment's last chunk, if partial, is left to the kernel. 0 leaves every page to it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.storage.segment import Segment

__all__ = ["CHUNK_BYTES", "DEFAULT_BYTES", "PageCacheWindow"]

CHUNK_BYTES = 1 << 20
DEFAULT_BYTES = 1 << 30


class PageCacheWindow:
    """The chunks of log made durable most recently, oldest first; ``trim`` drops those beyond
    the budget from the page cache."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_chunks = budget_bytes // CHUNK_BYTES
        self.dropped_bytes = 0  # in total, for the metrics
        self._chunks: deque[tuple[Segment, int]] = deque()
        self._lock = threading.Lock()

    def durable(self, segment: Segment, before: int, now: int) -> None:
        """``segment`` was durable up to byte ``before`` and is now up to ``now``: the whole chunks
        this completed join the window."""
        first, end = before // CHUNK_BYTES, now // CHUNK_BYTES
        if end > first:
            with self._lock:
                self._chunks.extend((segment, index) for index in range(first, end))

    def trim(self) -> int:
        """Drop the oldest chunks beyond the budget from the page cache; how many."""
        with self._lock:
            excess = len(self._chunks) - self.budget_chunks
            oldest = [self._chunks.popleft() for _ in range(excess)]
        for segment, index in oldest:
            segment.drop_cached(index * CHUNK_BYTES, CHUNK_BYTES)
        self.dropped_bytes += len(oldest) * CHUNK_BYTES
        return len(oldest)
