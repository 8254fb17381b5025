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
of need, they would be back with the host a few seconds later). Readers at the tail still read from
memory; one further behind reads from disk, as it would on a machine with less memory. A segment's
last chunk, if partial, is left to the kernel, and so is a file closed for room
(``broker.storage.open_files``).

Elsewhere a new page costs no more than a reused one, and keeping old log cached only helps
readers, so the default (-1) keeps a window only where a virtio memory balloon reports free pages
to its host; 0 leaves every page to the kernel.

A chunk is as large as the largest folio (block of pages) the page cache makes, because the kernel
drops only the folios a range holds whole: ext4 caches a write of megabytes in folios of up to
``hpage_pmd_size`` (2 MiB on x86-64), and a drop of 1 MiB inside one frees nothing. With 1 MiB
chunks, an exactly-once Spark sink (whose commits append several megabytes at once) left 3.0 of
the 3.4 GiB it wrote cached under a 1 GiB window while the broker counted 1.6 GiB dropped, and its
appends found no freed pages.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.storage.segment import Segment

__all__ = ["AUTO", "CHUNK_BYTES", "PageCacheWindow", "reports_free_pages", "window_bytes"]

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
_VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")
_BALLOON = "0x0005"  # virtio device id of a memory balloon
_REPORTING = 5  # its feature bit VIRTIO_BALLOON_F_REPORTING


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
    """The window ``page_cache_bytes`` asks for (``AUTO`` resolved on this machine); 0 is none."""
    if setting == AUTO:
        return WINDOW_BYTES if reports_free_pages() else 0
    return setting


class PageCacheWindow:
    """The chunks of log made durable most recently, oldest first; each append first drops as many
    bytes of the oldest chunks beyond the budget from the page cache (``make_room``)."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_chunks = budget_bytes // CHUNK_BYTES
        self.dropped_bytes = 0  # in total, for the metrics
        self._chunks: deque[tuple[Segment, int]] = deque()
        self._owed = 0  # bytes appended and not yet matched by chunks dropped
        self._lock = threading.Lock()

    def durable(self, segment: Segment, before: int, now: int) -> None:
        """``segment`` was durable up to byte ``before`` and is now up to ``now``: the whole chunks
        this completed join the window."""
        first, end = before // CHUNK_BYTES, now // CHUNK_BYTES
        if end > first:
            with self._lock:
                self._chunks.extend((segment, index) for index in range(first, end))

    def make_room(self, nbytes: int) -> int:
        """Before ``nbytes`` are appended: drop as many bytes of the oldest chunks beyond the budget
        (what earlier appends left owed too, up to ``_MAX_OWED``); how many chunks were dropped (a
        removed segment's are not)."""
        with self._lock:
            self._owed = min(self._owed + nbytes, _MAX_OWED)
            count = min(self._owed // CHUNK_BYTES, len(self._chunks) - self.budget_chunks)
            if count <= 0:
                return 0
            oldest = [self._chunks.popleft() for _ in range(count)]
            self._owed -= count * CHUNK_BYTES
        dropped = sum(segment.drop_cached(index * CHUNK_BYTES, CHUNK_BYTES) for segment, index in oldest)
        with self._lock:
            self.dropped_bytes += dropped * CHUNK_BYTES
        return dropped
