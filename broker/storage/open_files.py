"""How many segment files a broker keeps open at once.

Each queue's segments are opened on first use. Without a bound, a broker kept one descriptor per
segment it ever wrote or read: once that reached the process's open-file limit, every send to a
queue it had not opened yet failed with EMFILE, and so did every new client connection, and a
restart could not even open the data dir. Limits are low in places: a container run with
``--ulimit nofile=1024``, or macOS's soft limit of 256 where the broker cannot raise it.

``OpenFiles`` closes idle segment files once more than its budget (half the limit) are open, and
the segment reopens its file at its next use. A file is closed only while no read or append
uses it, and only once everything written to it was fsynced: a file closed before its fsync
would lose a write error to a descriptor opened later, which Linux does not report to. Files
already fsynced go first; with ``flush = "async"`` and more queues written within one flush
interval than the budget, the others are fsynced early to be closed.
"""

from __future__ import annotations

import resource
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Protocol

from broker.storage.lost_writes import LostWrites

__all__ = ["OpenFiles", "budget_for_limit"]

_MIN_BUDGET = 16
# Descriptors of a broker that are not segment files: connections, metadata, the state database,
# transactions' staged files. Half the limit is kept for them.
_SHARE_OF_LIMIT = 2


class _Closable(Protocol):
    path: Path
    recently_used: bool  # set at each use of the file; cleared each time room is made

    def close_if_idle(self, sync: bool) -> bool: ...


class OpenFiles:
    """The segment files open now, in the order they were opened; thread-safe.

    A use of an open file costs no lock here: the segment only marks itself recently used. Once
    past the budget, files are closed down to nine tenths of it (so the scan is paid once per many
    opens), those not used since the last time room was made first, each group oldest open first.
    """

    def __init__(self, budget: int, lost_writes: LostWrites | None = None) -> None:
        self.budget = budget
        self._lost_writes = lost_writes  # where a failed fsync of a file closed for room is recorded
        self._lock = threading.Lock()
        self._open: OrderedDict[_Closable, None] = OrderedDict()
        self.closed_for_room = 0  # files closed to stay within the budget, since start

    def opened(self, segment: _Closable) -> None:
        """``segment`` opened its file; past the budget, others' idle files are closed."""
        with self._lock:
            self._open[segment] = None
            if len(self._open) > self.budget:
                self._make_room(keep=segment)

    def forget(self, segment: _Closable) -> None:
        """``segment``'s file was closed and no longer counts."""
        with self._lock:
            self._open.pop(segment, None)

    def __len__(self) -> int:
        return len(self._open)

    def _make_room(self, keep: _Closable) -> None:
        """Close idle files until within nine tenths of the budget: those already fsynced, then,
        if that is not enough, others after an fsync. Files in use stay open, and are tried again
        at the next open."""
        target = self.budget - max(1, self.budget // 10)
        candidates = sorted((s for s in self._open if s is not keep), key=lambda s: s.recently_used)
        for segment in self._open:
            segment.recently_used = False
        for sync in (False, True):
            for segment in candidates:
                if len(self._open) <= target:
                    return
                if segment in self._open and self._closed(segment, sync):
                    del self._open[segment]
                    self.closed_for_room += 1

    def _closed(self, segment: _Closable, sync: bool) -> bool:
        try:
            return segment.close_if_idle(sync)
        except OSError as exc:  # the segment's queue drops what it lost at its next flush
            if self._lost_writes is not None:
                self._lost_writes.record(f"{segment.path} (to close it within the open-file budget)", exc)
            return False


def budget_for_limit(limit: int | None = None) -> int:
    """The segment files a broker may keep open under ``limit`` open files (default: this
    process's soft limit, as the broker raised it at start)."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        return 1 << 20
    return max(_MIN_BUDGET, limit // _SHARE_OF_LIMIT)

