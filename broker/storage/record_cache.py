"""The bodies of big records pulls read in part, for consumers that pull a record a few messages
at a time.

A batch producer (``Producer.send_batch``, the Spark sink) stores records of thousands of messages,
and a consumer pulls tens or hundreds at a time (``PullConsumer.poll``: 32, the push consumers:
128). Each of its pulls read the whole record again from the file and checked its CRC, to answer
with a slice of it: a pull of 32 messages out of a 10,000-message record cost the broker 0.63 ms of
CPU, against 0.30-0.34 from here. A record a pull ends inside (``Segment.records_from``'s ``stop``) is
kept, checked (up to ``BUDGET_BYTES`` in all, the least recently used going first), and the next
pull, which starts inside it, takes it from memory. A reader of whole records (the Spark source)
keeps none.

Entries are keyed by segment and position in its file. Records are only appended, so what a
position holds changes only when the segment is cut back (recovery, a lost write, a replica
dropping a tail) or replaced (compaction, retention): the segment then forgets its entries
(``forget``). A read that began before the cut may still be under way with the old record: its
``put`` passes ``valid``, which the segment makes false at the cut, before it forgets, so the
record is either refused or forgotten. Bodies smaller than ``SMALLEST_BYTES`` are not kept: a read
of the file takes many of them at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from broker.storage.record import RecordHeader

__all__ = ["BUDGET_BYTES", "SMALLEST_BYTES", "RecordCache", "RECENT_RECORDS"]

BUDGET_BYTES = 64 * 1024 * 1024
SMALLEST_BYTES = 32 * 1024


class RecordCache:
    """``(segment, position) -> (header, body)`` of records read lately; thread-safe."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES, smallest_bytes: int = SMALLEST_BYTES) -> None:
        self._budget = budget_bytes
        self._smallest = smallest_bytes
        self._entries: OrderedDict[tuple[Hashable, int], tuple[RecordHeader, bytes]] = OrderedDict()
        self._positions: dict[Hashable, set[int]] = {}  # a segment's entries, to forget them together
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    def holds(self, segment: Hashable) -> bool:
        """Whether ``segment`` has entries (unlocked: one put meanwhile is only missed)."""
        return segment in self._positions

    def get(self, segment: Hashable, position: int) -> tuple[RecordHeader, bytes] | None:
        with self._lock:
            entry = self._entries.get((segment, position))
            if entry is not None:
                self._entries.move_to_end((segment, position))
            return entry

    def put(self, segment: Hashable, position: int, header: RecordHeader, body: bytes,
            valid: Callable[[], bool] = lambda: True) -> None:
        """Keep a record's checked body, if it is big enough to be worth it, small enough to fit,
        and still what the segment holds there (``valid()``, asked under the lock ``forget`` takes)."""
        size = len(body)
        if not self._smallest <= size <= self._budget // 4:
            return
        with self._lock:
            key = (segment, position)
            if key in self._entries or not valid():
                return
            self._entries[key] = (header, body)
            self._positions.setdefault(segment, set()).add(position)
            self._bytes += size
            while self._bytes > self._budget:
                (old_segment, old_position), (_, old_body) = self._entries.popitem(last=False)
                self._bytes -= len(old_body)
                self._positions[old_segment].discard(old_position)
                if not self._positions[old_segment]:
                    del self._positions[old_segment]

    def forget(self, segment: Hashable) -> None:
        """Drop ``segment``'s entries: it was cut back or closed."""
        with self._lock:
            for position in self._positions.pop(segment, ()):
                _, body = self._entries.pop((segment, position))
                self._bytes -= len(body)


RECENT_RECORDS = RecordCache()  # the broker process's
