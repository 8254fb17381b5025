"""The staged data of live transactions: one file per transaction, recycled once it finishes.

A file's page-cache pages are allocated when it is first written; writing into pages a file
already has costs only the copy. On the 2-core virtual machine of our benchmarks, 512 MB written
into new files took 1.1-1.6 s of system time, into the pages of files kept from finished
transactions 0.03 s, and staging was half of a broker's CPU under an exactly-once Spark sink. So
a finished transaction's file goes into a pool (up to ``pool_bytes`` in all, on disk and in the
page cache, which the kernel may still reclaim) and the next transaction writes over it from the
start, where deleting it and creating a new one would pay for new pages every time. The pool
gives way to the disk: a file is kept only while the file system has twice ``pool_bytes`` free, a
staged send refused for want of space empties the pool and is written once more, and any other
write the broker's disk refuses empties it too (``broker.persist.keep_spare_space``).

A file is a header ``[8-byte magic "OMQSTG01"][8-byte random nonce]`` followed by frames
``[u32 length][u32 crc32c][body]`` (big-endian) whose CRCs are seeded from the header and the
file's name. A recycled file still holds its previous transaction's frames past the new ones:
seeded from another nonce and name, they fail their CRC, so reading, and cutting after a crash,
stops at the new transaction's end; a crash between taking a pooled file and writing its new
header leaves the old header under the new name, whose frames then fail theirs too. Files written
before this layout (frames from byte 0, CRCs unseeded) are still read and appended to.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import crc32c

from broker.persist import fsync_dir, is_disk_full, keep_spare_space

__all__ = ["FRAME_HEADER", "POOL_BYTES", "StagedFiles", "split_frames"]

log = logging.getLogger(__name__)

FRAME_HEADER = struct.Struct(">II")  # body length, crc32c(body)
_MAX_FRAME = 2**31  # no frame is larger: a bigger length is garbage, not data
_MAGIC = b"OMQSTG01"
_HEADER_BYTES = 16  # magic and nonce
_POOLED = "free-"
POOL_BYTES = 512 * 1024 * 1024  # the default: a few micro-batches of a busy exactly-once Spark sink
_CHECK_THREADS = min(os.cpu_count() or 1, 4)  # threads checking the CRCs of one commit's staged frames
_SPLIT_BYTES = 4 * 1024 * 1024  # staged frames fewer bytes than this are checked on the caller's thread
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only


@dataclass
class _Extent:
    """Where a live transaction's frames are: from ``start`` to ``end``, CRCs seeded with ``seed``."""

    start: int
    end: int
    seed: int


class StagedFiles:
    """The staged-data files under ``directory``, one per live transaction under a name the
    manager gives, and the pool of finished ones. Calls for one transaction must be serialised by
    the caller; calls for different transactions may run in parallel."""

    def __init__(self, directory: Path, fsync: bool, pool_bytes: int) -> None:
        self._dir = directory
        self._fsync = fsync
        self._pool_bytes = pool_bytes
        self._mutex = threading.Lock()
        self._extents: dict[str, _Extent] = {}  # file name -> extent, for live files read or written
        self._pool: list[tuple[Path, int]] = []  # (path, size), most recently pooled last
        self._checkers = ThreadPoolExecutor(_CHECK_THREADS, thread_name_prefix="orderlymq-staged-crc")
        self._dir.mkdir(parents=True, exist_ok=True)
        keep_spare_space(self)

    def load(self, live: Iterable[str]) -> dict[str, int]:
        """Cut each live file (by name) after its last whole frame; pool or delete every other.

        Returns how many frames each live file holds (0 for a live name without a file)."""
        live = set(live)
        counts = {}
        for name in sorted(live):
            counts[name] = self._cut_torn_tail(self._dir / name)
        for path in sorted(self._dir.iterdir()):
            if path.name not in live:  # a finished transaction's (a crash came before pooling it), or pooled
                self._release_path(path)
        return counts

    def append(self, name: str, parts: Sequence[bytes | memoryview]) -> None:
        """Write one frame of ``parts`` after the file's last one (a first frame into a pooled file
        when there is one); durable on return when the manager fsyncs. A failed write leaves the
        file as it was: no partial frame, and no whole frame that the caller was told failed."""
        try:
            self._append(name, parts)
        except OSError as exc:
            if not (is_disk_full(exc) and self.give_back_space()):
                raise
            self._append(name, parts)

    def _append(self, name: str, parts: Sequence[bytes | memoryview]) -> None:
        path = self._dir / name
        extent = self._extent(path)
        header = b""
        if extent is None:  # the first frame: into a pooled file, else a new one
            self._take_pooled(path)
            header = _MAGIC + os.urandom(8)
            extent = _Extent(_HEADER_BYTES, _HEADER_BYTES, _seed(header, name))
        length, crc = 0, extent.seed
        for part in parts:
            length += len(part)
            crc = crc32c.crc32c(part, crc)
        data = [header, FRAME_HEADER.pack(length, crc), *parts]  # an empty header writes nothing
        size = len(header) + FRAME_HEADER.size + length
        position = extent.end - len(header)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            try:
                if os.pwritev(fd, data, position) != size:
                    raise OSError(errno.ENOSPC, f"short write to {path}")
                if self._fsync:
                    os.fsync(fd)
                    if header:  # created or renamed: findable after a power cut
                        fsync_dir(self._dir)
            except BaseException:
                self._undo(fd, path, position, bool(header))
                raise
        finally:
            os.close(fd)
        with self._mutex:
            self._extents[name] = _Extent(extent.start, position + size, extent.seed)

    def frames(self, name: str) -> tuple[list[memoryview], int | None]:
        """The bodies of the file's frames, in order, as views of the file mapped into memory (a
        commit writes them to the queue logs without copying them on the way), and the byte at
        which its frames stop being whole when that is before its known end (None otherwise)."""
        path = self._dir / name
        extent = self._extent(path)
        if extent is None or extent.end == extent.start:
            return [], None
        try:
            with open(path, "rb") as file:
                length = min(extent.end, os.fstat(file.fileno()).st_size)  # shorter: cut by someone else
                if length <= extent.start:
                    return [], extent.start
                # Unmapped once unreferenced. Its pages are mapped at once: faulting them in one at a time
                # as the CRCs are checked took a third of the time of the check (70 MB).
                data = mmap.mmap(file.fileno(), length, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
        except FileNotFoundError:  # deleted by someone else
            return [], extent.start
        bodies, end = split_frames(memoryview(data).toreadonly()[extent.start:], extent.seed, self._checkers)
        return bodies, None if extent.start + end == extent.end else extent.start + end

    def size(self, name: str) -> int:
        """Bytes of the file's frames (0 when there is none)."""
        extent = self._extent(self._dir / name)
        return 0 if extent is None else extent.end - extent.start

    def release(self, name: str) -> None:
        """The transaction is finished: its file goes into the pool, or is deleted past its limit."""
        with self._mutex:
            self._extents.pop(name, None)
        with contextlib.suppress(FileNotFoundError):
            self._release_path(self._dir / name)

    def close(self) -> None:
        """Stop the CRC-checking threads once idle; the files must not be read afterwards."""
        self._checkers.shutdown(wait=False)

    def pooled_bytes(self) -> int:
        with self._mutex:
            return sum(size for _, size in self._pool)

    def give_back_space(self) -> int:
        """Delete every pooled file (the disk needs their space); the bytes freed."""
        with self._mutex:
            pooled, self._pool = self._pool, []
        for path, _size in pooled:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        if pooled:
            log.warning("disk full: deleted the %d staged-data file(s) kept for reuse in %s", len(pooled), self._dir)
        return sum(size for _, size in pooled)

    # ---- helpers ------------------------------------------------------------------------------

    def _extent(self, path: Path) -> _Extent | None:
        """The extent of a live file, read from its header the first time (after a restart)."""
        with self._mutex:
            extent = self._extents.get(path.name)
        if extent is not None:
            return extent
        try:
            with open(path, "rb") as file:
                head = file.read(_HEADER_BYTES)
                size = os.fstat(file.fileno()).st_size
        except FileNotFoundError:
            return None
        if head.startswith(_MAGIC) and len(head) == _HEADER_BYTES:
            extent = _Extent(_HEADER_BYTES, size, _seed(head, path.name))
        else:  # an older broker's file
            extent = _Extent(0, size, 0)
        with self._mutex:
            return self._extents.setdefault(path.name, extent)

    def _cut_torn_tail(self, path: Path) -> int:
        """Cut the file after its last whole frame (only the last, unacknowledged frame can be
        torn by a crash); how many frames it holds."""
        extent = self._extent(path)
        if extent is None:
            return 0
        with open(path, "r+b") as file:
            file.seek(extent.start)
            bodies, end = split_frames(memoryview(file.read()), extent.seed)
            if extent.start + end != extent.end:
                log.info("cutting %d bytes past the last whole frame of %s (a write torn by a crash, or what a "
                         "recycled file held before)", extent.end - extent.start - end, path)
                file.truncate(extent.start + end)
                if self._fsync:
                    os.fsync(file.fileno())
        with self._mutex:
            self._extents[path.name] = _Extent(extent.start, extent.start + end, extent.seed)
        return len(bodies)

    def _take_pooled(self, path: Path) -> None:
        """Rename the most recently pooled file (its pages likeliest cached), if any, to ``path``."""
        with self._mutex:
            if not self._pool:
                return
            pooled, _size = self._pool.pop()
        os.rename(pooled, path)

    def _release_path(self, path: Path) -> None:
        size = path.stat().st_size
        keep = self.pooled_bytes() + size <= self._pool_bytes and size > _HEADER_BYTES
        if keep:
            disk = os.statvfs(self._dir)
            keep = disk.f_bavail * disk.f_frsize >= 2 * self._pool_bytes
        if not keep:
            path.unlink()
            return
        if not path.name.startswith(_POOLED):
            target = path.with_name(f"{_POOLED}{uuid.uuid4().hex}.stage")
            os.rename(path, target)
            path = target
        with self._mutex:
            self._pool.append((path, size))

    @staticmethod
    def _undo(fd: int, path: Path, position: int, first: bool) -> None:
        """After a failed write at ``position``: never leave a frame behind it (a partial one would
        hide later frames; a whole one, refused, would be staged a second time by a resend). A
        file whose first frame failed goes: the resend starts a file again."""
        with contextlib.suppress(OSError):
            if first:
                path.unlink()
            else:
                os.ftruncate(fd, position)


def _seed(header: bytes, name: str) -> int:
    """The CRC seed of a file's frames: its header's nonce and its name."""
    return crc32c.crc32c(name.encode("utf-8"), crc32c.crc32c(header))


def split_frames(data: bytes | memoryview, seed: int = 0,
                 checkers: Executor | None = None) -> tuple[list[memoryview], int]:
    """The bodies of the whole, intact frames at the start of ``data``, and where they end.

    Stops at the first incomplete frame or CRC mismatch (``seed``: the CRC's initial value):
    everything from there on is a torn tail, or a recycled file's earlier contents. With
    ``checkers``, the CRCs of ``_SPLIT_BYTES`` or more of whole frames are checked on its threads,
    a share of the frames each (crc32c leaves the GIL): a commit waits for them all.
    """
    data = memoryview(data)
    frames = list(_whole_frames(data))
    if checkers is None or len(data) < _SPLIT_BYTES:
        intact = _intact(data, frames, seed)
    else:
        intact = 0
        shares = _shares(frames, _CHECK_THREADS)
        for share, count in zip(shares, checkers.map(lambda share: _intact(data, share, seed), shares), strict=True):
            intact += count
            if count < len(share):
                break
    return [data[start:end] for start, end, _ in frames[:intact]], frames[intact - 1][1] if intact else 0


def _whole_frames(data: memoryview) -> Iterator[tuple[int, int, int]]:
    """``(body start, body end, crc)`` of the frames at the start of ``data`` that are whole by
    their lengths, their CRCs unchecked."""
    pos = 0
    while pos + FRAME_HEADER.size <= len(data):
        length, crc = FRAME_HEADER.unpack_from(data, pos)
        start, end = pos + FRAME_HEADER.size, pos + FRAME_HEADER.size + length
        if length >= _MAX_FRAME or end > len(data):
            return
        yield start, end, crc
        pos = end


def _shares(frames: list[tuple[int, int, int]], count: int) -> list[list[tuple[int, int, int]]]:
    """``frames`` cut into at most ``count`` runs of about as many bytes, in order."""
    total = frames[-1][1] if frames else 0
    shares: list[list[tuple[int, int, int]]] = [[]]
    for frame in frames:
        if shares[-1] and frame[0] > total * len(shares) / count:
            shares.append([])
        shares[-1].append(frame)
    return shares


def _intact(data: memoryview, frames: list[tuple[int, int, int]], seed: int) -> int:
    """How many of ``frames``, from the first, hold the CRC their header gives."""
    for count, (start, end, crc) in enumerate(frames):
        if crc32c.crc32c(data[start:end], seed) != crc:
            return count
    return len(frames)
