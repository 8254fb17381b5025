"""How much of the queues' logs the broker leaves in the OS page cache.

Every byte appended to a log lands in a page of the page cache, and the kernel keeps those pages
until memory runs short: a broker taking hundreds of megabytes a second fills gigabytes with log
that is rarely read again, and each append takes a page nobody used before. On a virtual machine
that hands free memory back to its host (free page reporting, balloon drivers) the first write to
such a page faults into the host: measured on one, appending 1 GiB took 1.2-1.5 s of system time
into pages never used, against 0.2 s into pages freed a moment before.

So on such a machine the broker leaves the last ``page_cache_bytes`` of log written (across all
queues, in chunks of ``CHUNK_BYTES``) in the page cache: before each append, as many bytes of the
oldest log beyond that, on disk by then, are dropped from it
(``posix_fadvise(POSIX_FADV_DONTNEED)``), and the append takes the pages just freed (dropped ahead
of need, they would be back with the host a few seconds later). Log written and not yet on disk
counts toward the window: counting durable log alone, an exactly-once commit, hundreds of
megabytes between two flushes, found only what lay beyond the budget, and its appends took new
pages (a Spark sink's commit of 525 MB: 161-520 MB freed, 0.32-0.63 s; counted, 472-522 MB and
0.22-0.31 s). Readers at the tail still read from memory; one further behind reads from disk, as it
would on a machine with less memory. A segment's last chunk, if partial, is left to the kernel; a
file closed for room (``broker.storage.open_files``) is opened for its drop alone. Log the page
cache still holds from before a restart joins the window at start, oldest first, so new log pushes
it out as it would log written since.

Elsewhere a new page costs no more than a reused one, and keeping old log cached only helps
readers, so the default (-1) keeps a window only where a virtio memory balloon reports free pages
to its host; 0 leaves every page to the kernel.

A chunk is as large as the largest folio (block of pages) the page cache makes, because the kernel
drops only the folios a range holds whole: ext4 caches a write of megabytes in folios of up to
``hpage_pmd_size`` (2 MiB on x86-64), and a drop of 1 MiB inside one frees nothing. With 1 MiB
chunks, an exactly-once Spark sink (whose commits append several megabytes at once) left 3.0 of
the 3.4 GiB it wrote cached under a 1 GiB window while the broker counted 1.6 GiB dropped, and its
appends found no freed pages. What a drop frees is counted as the kernel reports it (``cachestat``,
Linux 6.5+), and a drop that frees nothing of a cached chunk is logged once: so a kernel caching
log in folios larger than a chunk shows, where the count of chunks asked to be dropped hid it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.storage.segment import Segment

__all__ = [
    "AUTO",
    "CHUNK_BYTES",
    "WRITE_UNIT_BYTES",
    "PageCacheWindow",
    "cached_bytes",
    "drop_from_cache",
    "reports_free_pages",
    "window_bytes",
]

log = logging.getLogger(__name__)

_FOLIO_LIMIT = Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")


def _largest_folio_bytes(limit: Path = _FOLIO_LIMIT) -> int:
    """The largest folio the page cache makes here: a huge page (2 MiB where that is unreadable)."""
    try:
        return max(int(limit.read_text()), 1 << 20)
    except (OSError, ValueError):
        return 2 << 20


CHUNK_BYTES = _largest_folio_bytes()
AUTO = -1  # the setting's default: WINDOW_BYTES where free pages are reported to a host, else none
WINDOW_BYTES = 1 << 30
_MAX_OWED = 64 << 20  # dropped by one append at most: a flush makes chunks durable in bursts
# Where the window is kept, one write of a commit's append takes at most this many bytes. A
# buffered write of megabytes gets its new pages as 2 MiB folios, and on the machine measured those
# came from memory the host had taken back far more often than small ones: 512 MB written into a
# new file took 1.9-2.0 s of system time in 8 MiB writes and 0.10 s in 64 KiB writes (2 GiB: 4 s
# against 2). An exactly-once commit, hundreds of megabytes appended by several threads at once,
# found the window's freed pages less reliably than other appends: in the Spark benchmark's order
# of queries it took 0.35-1.04 s in 8 MiB writes and 0.35-0.40 s in 64 KiB ones. Other appends
# stay one write: split alike, batched ingest lost 12% (4.65-4.71 M msg/s against 4.05-4.14).
WRITE_UNIT_BYTES = 64 << 10
_VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")
_BALLOON = "0x0005"  # virtio device id of a memory balloon
_REPORTING = 5  # its feature bit VIRTIO_BALLOON_F_REPORTING


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64)
                for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


_CACHESTAT = 451  # the syscall's number on every architecture (Linux 6.5+)
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
# None elsewhere than on Linux, or once the kernel refused cachestat
_libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def cached_bytes(fd: int, position: int, length: int) -> int | None:
    """Bytes of the range in the page cache, or None where the kernel cannot say (no cachestat:
    older than 6.5, or refused by a seccomp filter)."""
    global _libc
    libc = _libc
    if libc is None:
        return None
    stat = _Cachestat()
    if libc.syscall(_CACHESTAT, fd, ctypes.byref(_Range(position, length)), ctypes.byref(stat), 0) == 0:
        return stat.nr_cache * _PAGE_BYTES
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EPERM):
        _libc = None
        return None
    raise OSError(code, os.strerror(code))


def drop_from_cache(fd: int, position: int, length: int) -> tuple[int, int]:
    """Drop the range, on disk by now, from the page cache: ``(bytes cached before, bytes freed)``,
    both ``length`` where the kernel cannot say."""
    before = cached_bytes(fd, position, length)
    os.posix_fadvise(fd, position, length, os.POSIX_FADV_DONTNEED)
    if before is None:
        return length, length
    after = cached_bytes(fd, position, length) if before else 0
    return before, before - (after or 0)


def reports_free_pages(devices: Path = _VIRTIO_DEVICES) -> bool:
    """Whether a virtio memory balloon here reports free pages to the host (then the host takes
    them back, and the next write to one faults into it)."""
    for device in devices.glob("*"):
        try:
            if (device / "device").read_text().strip() == _BALLOON:
                features = (device / "features").read_text().strip()  # one character per bit, bit 0 first
                if features[_REPORTING:_REPORTING + 1] == "1":
                    return True
        except OSError:
            continue
    return False


def window_bytes(setting: int) -> int:
    """The window ``page_cache_bytes`` asks for (``AUTO`` resolved on this machine); 0 is none, and
    so is any where the system cannot drop pages of a file (no ``posix_fadvise``: macOS, which has no
    virtio balloon either, so ``AUTO`` never asks for one there)."""
    if setting == AUTO:
        return WINDOW_BYTES if reports_free_pages() else 0
    if setting and not hasattr(os, "posix_fadvise"):
        log.warning("page_cache_bytes = %d is ignored: this system cannot drop a file's pages from its cache", setting)
        return 0
    return setting


class PageCacheWindow:
    """The chunks of log made durable most recently, oldest first, and the log written since, not
    yet durable; each append first drops as many bytes of the oldest chunks as the two hold beyond
    the budget from the page cache (``make_room``)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_chunks = -(-budget_bytes // CHUNK_BYTES)  # whole chunks, at least the bytes asked for
        self.dropped_bytes = 0  # freed in total, for the metrics
        self._warned = False  # that a drop freed nothing of a cached chunk
        self._chunks: deque[tuple[Segment, int]] = deque()
        self._owed = 0  # bytes appended and not yet matched by chunks dropped
        self._unsynced: dict[Segment, int] = {}  # bytes written and not yet durable, per segment
        self.unsynced_bytes = 0  # their sum
        self._lock = threading.Lock()

    def durable(self, segment: Segment, before: int, now: int) -> None:
        """``segment`` was durable up to byte ``before`` and is now up to ``now``: the whole chunks
        this completed join the window."""
        first, end = before // CHUNK_BYTES, now // CHUNK_BYTES
        with self._lock:
            self._chunks.extend((segment, index) for index in range(first, end))
            self._note_unsynced(segment, segment.size - now)  # appends may have raced the fsync

    def forget(self, segment: Segment) -> None:
        """``segment`` is closed: what it wrote and never made durable no longer counts."""
        with self._lock:
            self._note_unsynced(segment, 0)

    def _note_unsynced(self, segment: Segment, nbytes: int) -> None:
        """Set from the segment's own sizes at each event, so a failed write or a cut is not counted for long."""
        self.unsynced_bytes += nbytes - self._unsynced.pop(segment, 0)
        if nbytes > 0:
            self._unsynced[segment] = nbytes

    def keep_cached(self, segments: Iterable[Segment]) -> None:
        """At start: the chunks of ``segments`` (oldest first) that the page cache still holds from
        before the restart join the window ahead of everything since, to be dropped in their turn.
        Where the kernel cannot say what it holds, they are left to it."""
        found = [(segment, index) for segment in segments for index in segment.cached_chunks(CHUNK_BYTES)]
        with self._lock:
            self._chunks.extendleft(reversed(found))

    def make_room(self, into: Segment, nbytes: int) -> int:
        """Before ``nbytes`` are appended to ``into``: drop as many bytes of the oldest chunks as
        the window and the log not yet durable (this append included) hold beyond the budget, and
        at most what appends asked for (what earlier ones left owed too, up to ``_MAX_OWED``); how
        many bytes that freed (a removed segment's chunks are not dropped). Log not yet durable
        counts: else a burst of appends (an exactly-once commit of hundreds of megabytes within one
        flush interval) finds only the chunks beyond the budget, and takes pages nobody used before."""
        with self._lock:
            self._note_unsynced(into, into.size - into.synced_size + nbytes)
            self._owed = min(self._owed + nbytes, _MAX_OWED)
            beyond = len(self._chunks) + self.unsynced_bytes // CHUNK_BYTES - self.budget_chunks
            count = min(self._owed // CHUNK_BYTES, beyond, len(self._chunks))
            if count <= 0:
                return 0
            oldest = [self._chunks.popleft() for _ in range(count)]
            self._owed -= count * CHUNK_BYTES
        drops = [(segment, segment.drop_cached(first * CHUNK_BYTES, chunks * CHUNK_BYTES))
                 for segment, first, chunks in _runs(oldest)]
        freed = sum(drop[1] for _, drop in drops if drop)
        with self._lock:
            self.dropped_bytes += freed
        # A run of which a chunk's worth or more stayed cached: as much as a chunk freed nothing.
        stuck = next(((segment, drop) for segment, drop in drops if drop and drop[0] - drop[1] >= CHUNK_BYTES), None)
        if stuck is not None and not self._warned:
            self._warned = True
            segment, (cached, freed) = stuck
            log.warning("dropping log of %s from the page cache freed nothing of %d MiB of it: the kernel may cache "
                        "it in blocks larger than the %d MiB chunks dropped (page_cache_bytes; logged once)",
                        segment.path, (cached - freed) >> 20, CHUNK_BYTES >> 20)
        return freed


def _runs(chunks: list[tuple[Segment, int]]) -> list[tuple[Segment, int, int]]:
    """``chunks`` as runs of consecutive chunks of one segment, ``(segment, first index, count)``,
    in order: each run is dropped in one call (a commit's append frees dozens of chunks at once)."""
    runs: list[tuple[Segment, int, int]] = []
    for segment, index in chunks:
        if runs and runs[-1][0] is segment and runs[-1][1] + runs[-1][2] == index:
            runs[-1] = (segment, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((segment, index, 1))
    return runs
