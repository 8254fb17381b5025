"""One segment file of a queue's log, with its sparse offset/time index.

A segment is named by its base offset (``00000000000000000042.log``). The sparse index holds an
entry ``(offset, position, store_ts)`` every ``index_interval_bytes`` of log; it is written to
``.index`` when the segment is closed (rolled) and rebuilt by a scan when missing or stale.

The file is opened on first use and created by the first append, so a queue that was never
written holds no file descriptor (a topic of a thousand queues costs none until it is used).
A broker's ``OpenFiles`` may close it again while idle, to stay within its budget of open files:
every use of the descriptor holds it (``_acquire``/``_release``) and reopens it when needed.
A record is counted only once it is fully written (and fsynced in sync mode): an append that
fails, a full disk for one, cuts the file back to where it was and changes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import sys
import threading
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from broker.persist import fsync_dir
from broker.storage.open_files import OpenFiles
from broker.storage.page_cache import WRITE_UNIT_BYTES, PageCacheWindow, cached_bytes, drop_from_cache
from broker.storage.record import HEADER, RecordHeader, parse_header, verify
from broker.storage.record_cache import RECENT_RECORDS
from broker.wire import codec
from broker.wire.errors import DamagedRecordError

__all__ = ["CutReport", "Segment", "SegmentClosedError"]

log = logging.getLogger(__name__)

_INDEX_MAGIC = 0x58444E49  # "INDX"
_READ_AHEAD = 256 * 1024  # bytes read at once when scanning records for a pull
_PRODUCERS_MAGIC = b"OQMP0001"
_PRODUCER = struct.Struct("<QqqiQ")  # producer hash, sequence, base offset, count, store timestamp
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # the parts one pwritev takes


class SegmentClosedError(OSError):
    """A read of a segment closed before it began: deleted, or replaced by compaction."""


@dataclass(frozen=True)
class CutReport:
    """What recovery removed from a segment's tail."""

    path: str
    position: int
    bytes_cut: int
    reason: str
    first_lost_offset: int = -1  # the first offset whose message went with the cut bytes


class Segment:
    """An append-only file of records starting at ``base_offset``. Not thread-safe by itself:
    the owning ``QueueLog`` serialises appends; reads use ``os.pread`` and may run concurrently."""

    def __init__(self, path: Path, base_offset: int, index_interval_bytes: int,
                 open_files: OpenFiles | None = None, page_cache: PageCacheWindow | None = None) -> None:
        self.path = path
        self._open_files = open_files  # None: the file stays open once opened
        self._page_cache = page_cache  # asked for room before each append, told what fsyncs made durable
        self.base_offset = base_offset
        self.next_offset = base_offset
        self.size = 0
        self.first_store_ts = -1
        self.last_store_ts = -1
        self.index_interval_bytes = index_interval_bytes
        self._index = array("q")  # flat (offset, position, store_ts) triples
        self._bytes_since_index = index_interval_bytes  # index the first record
        self._fd: int | None = None
        self.synced_size = 0  # bytes the last successful fsync made durable (recover: all of the file)
        self._closed = False
        self._new_file = False  # created by this process and not yet fsynced into its directory
        self._open_lock = threading.Lock()
        self._users = 0  # reads and appends using the descriptor now: it is not closed under them
        self.recently_used = False  # for ``OpenFiles``: used since it last made room
        self._failed_sync: OSError | None = None  # of a close for room: the next sync raises it
        self.cuts = 0  # times the file was scanned and maybe cut back (``recover``): RECENT_RECORDS's check

    def _acquire(self, create: bool = False) -> int:
        """The descriptor, opened when needed (an existing segment's file must exist, unless
        ``create``), held open until ``_release``."""
        with self._open_lock:
            if self._closed:
                raise SegmentClosedError(errno.EBADF, f"segment {self.path} is closed")
            opened = self._fd is None
            if opened:
                existed = not create or self.path.exists()
                self._fd = os.open(self.path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
                self._new_file = self._new_file or not existed
            self._users += 1
            self.recently_used = True
            fd = self._fd
        if opened and self._open_files is not None:  # outside the lock: making room takes other segments' locks
            self._open_files.opened(self)
        return fd

    def _release(self) -> None:
        with self._open_lock:
            self._users -= 1
            if self._users or not self._closed or self._fd is None:
                return
            fd, self._fd = self._fd, None  # the last use of a closed segment's file
        with contextlib.suppress(OSError):
            os.close(fd)

    @contextlib.contextmanager
    def _opened(self, create: bool = False) -> Iterator[int]:
        fd = self._acquire(create)
        try:
            yield fd
        finally:
            self._release()

    def close_if_idle(self, sync: bool = False) -> bool:
        """Close the file for ``OpenFiles`` unless it is in use; whether it is closed now.
        A file holding writes (or a new directory entry) not yet fsynced stays open, unless ``sync``:
        then it is fsynced first. A failed fsync is raised, and kept for the queue's next flush to
        raise (``sync``), which drops what it lost as a failed flush does."""
        with self._open_lock:
            if self._fd is None:
                return True
            if self._users or (not sync and not self._synced()):
                return False
            self._users += 1  # nobody closes it during the fsync
            fd = self._fd
        try:
            if not self._synced():
                self._fsync(fd)
        except OSError as exc:
            self._failed_sync = exc
            self._release()
            raise
        with self._open_lock:
            self._users -= 1
            if self._users or not (self._closed or self._synced()):  # written to meanwhile
                return False
            self._fd = None
        with contextlib.suppress(OSError):
            os.close(fd)
        return True

    def _synced(self) -> bool:
        return not self._new_file and self.synced_size == self.size

    @classmethod
    def file_name(cls, base_offset: int) -> str:
        return f"{base_offset:020d}.log"

    @property
    def index_path(self) -> Path:
        return self.path.with_suffix(".index")

    # -- writing -------------------------------------------------------------------------------

    def append(self, parts: Sequence[bytes | memoryview], header: RecordHeader, *, sync: bool = False,
               burst: bool = False) -> None:
        """Write one framed record (``parts`` joined: header and body, written by one ``pwritev``
        so that a megabyte body is not copied to sit behind its header) after the last one; with
        ``sync``, fsync it (and, for a new file, its directory) before counting it. With ``burst``
        (one of a commit's appends) and a page-cache window, no write takes more than
        ``WRITE_UNIT_BYTES`` (``broker.storage.page_cache``).

        Raises
        ------
        OSError
            The write or fsync failed (ENOSPC for a full disk); the file is cut back and the
            segment is as before, so the next append writes at the same place.
        """
        position = self.size
        if self._page_cache is not None:
            self._page_cache.make_room(self, header.size)
        fd = self._acquire(create=True)
        try:  # held until counted: a file closed before its fsync could lose the write's error
            try:
                unit = WRITE_UNIT_BYTES if burst and self._page_cache is not None else 0
                written = _pwritev_all(fd, parts, position, unit)
                if written != header.size:  # a short write on a regular file means the disk is full
                    raise OSError(errno.ENOSPC, f"short write to {self.path}: {written} of {header.size} bytes")
                if sync:
                    self._fsync(fd)
            except OSError:
                # Reads stop at self.size and the next append writes at it, so a tail this cut cannot
                # remove is never served; recovery cuts it after a restart.
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, position)
                raise
            self._track(header, position)
            if sync:
                self._now_durable(self.size)
        finally:
            self._release()

    def _track(self, header: RecordHeader, position: int) -> None:
        if self._bytes_since_index >= self.index_interval_bytes:
            self._index.extend((header.base_offset, position, header.store_ts))
            self._bytes_since_index = 0
        self._bytes_since_index += header.size
        self.size = position + header.size
        self.next_offset = header.next_offset
        if self.first_store_ts < 0:
            self.first_store_ts = header.store_ts
        self.last_store_ts = header.store_ts

    def sync(self) -> None:
        """Make what was written durable, and a file this process created findable after a crash."""
        if self._failed_sync is not None:  # closing it for room failed: never retried as if it had not
            failure, self._failed_sync = self._failed_sync, None
            raise failure
        if self._fd is not None or not self._synced():  # a file closed for room was synced first
            with self._opened() as fd:
                self._fsync(fd)

    def _fsync(self, fd: int) -> None:
        """``sync`` through ``fd``, this segment's descriptor held open."""
        size = self.size  # read first: an append racing this fsync is not counted as durable
        os.fsync(fd)
        if self._new_file:
            fsync_dir(self.path.parent)
            self._new_file = False
        self._now_durable(size)

    def _now_durable(self, size: int) -> None:
        """The file's first ``size`` bytes are on disk (the page cache's window is told)."""
        if self._page_cache is not None:
            self._page_cache.durable(self, self.synced_size, size)
        self.synced_size = size

    def drop_cached(self, position: int, length: int) -> tuple[int, int] | None:
        """Let the kernel drop these bytes of the file, on disk by now, from its page cache
        (``broker.storage.page_cache``): ``(bytes cached before, bytes freed)``, None when the
        segment is gone."""
        try:
            with self._descriptor_for_cache() as fd:
                return None if fd is None else drop_from_cache(fd, position, length)
        except OSError:
            return None

    def cached_chunks(self, chunk_bytes: int) -> list[int]:
        """The indexes of the file's whole durable chunks of which the page cache holds some (none
        where the kernel cannot say)."""
        chunks = self.synced_size // chunk_bytes
        try:
            with self._descriptor_for_cache() as fd:
                if fd is None or not chunks or not cached_bytes(fd, 0, chunks * chunk_bytes):
                    return []
                return [index for index in range(chunks) if cached_bytes(fd, index * chunk_bytes, chunk_bytes)]
        except OSError:
            return []

    @contextlib.contextmanager
    def _descriptor_for_cache(self) -> Iterator[int | None]:
        """The file's descriptor for a look at its page cache, or one opened for that alone where
        the file was closed for room (outside the open files' budget: it is closed microseconds
        later); None when the segment is gone."""
        with self._open_lock:
            closed, fd = self._closed, self._fd
            if not closed and fd is not None:
                self._users += 1
        if closed:
            yield None
        elif fd is not None:
            try:
                yield fd
            finally:
                self._release()
        else:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                yield fd
            finally:
                os.close(fd)

    def drop_unsynced(self) -> None:
        """After a failed fsync (``broker.storage.lost_writes``): cut the file back to what the last
        successful one made durable, since reads would go on seeing what it lost."""
        with self._opened() as fd:
            os.ftruncate(fd, self.synced_size)
            with contextlib.suppress(OSError):  # the disk may refuse this too: the restart's recovery cuts then
                os.fsync(fd)
        self.index_path.unlink(missing_ok=True)
        self.recover(verify_crc=False)

    def close(self) -> None:
        """Close the file, now or when the reads still on it end; it never opens again (a read that
        had not started gets ``SegmentClosedError``). Its readers keep the file they started on
        though retention unlinks it or compaction puts another in its place."""
        with self._open_lock:
            self._closed = True
            fd = None if self._users else self._fd
            if fd is not None:
                self._fd = None
        if self._open_files is not None:
            self._open_files.forget(self)
        if self._page_cache is not None:
            self._page_cache.forget(self)
        RECENT_RECORDS.forget(self)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def write_index(self) -> None:
        """Persist the sparse index of a closed segment (with the log size it describes)."""
        header = array("q", [_INDEX_MAGIC, self.size, self.next_offset, self.first_store_ts, self.last_store_ts])
        tmp = self.index_path.with_suffix(".index.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(header.tobytes() + self._index.tobytes())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.index_path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise

    # -- recovery ------------------------------------------------------------------------------

    def load_index(self) -> bool:
        """Adopt the ``.index`` file if it describes exactly this log file; else False."""
        try:
            raw = self.index_path.read_bytes()
        except OSError:
            return False
        values = array("q")
        values.frombytes(raw[: len(raw) - len(raw) % 8])
        if len(values) < 5 or values[0] != _INDEX_MAGIC or (len(values) - 5) % 3:
            return False
        size, next_offset, first_ts, last_ts = values[1:5]
        with self._opened() as fd:
            if size != os.fstat(fd).st_size:
                return False
            self._index = values[5:]
            self.size, self.next_offset = size, next_offset
            self.first_store_ts, self.last_store_ts = first_ts, last_ts
            self.synced_size = size  # a closed segment was fsynced when it was rolled
            return True

    def recover(self, verify_crc: bool = True) -> CutReport | None:
        """Scan records from the start, rebuild the index and cut everything from the first torn,
        corrupt or non-contiguous record on. Returns what was cut, if anything."""
        self.cuts += 1  # what it cuts may be written again, differently: reads under way keep none of it
        RECENT_RECORDS.forget(self)
        self._index = array("q")
        self._bytes_since_index = self.index_interval_bytes
        self.size, self.next_offset = 0, self.base_offset
        self.first_store_ts = self.last_store_ts = -1
        with self._opened() as fd:
            file_size = os.fstat(fd).st_size
            position, reason = 0, ""
            while position < file_size:
                raw = os.pread(fd, HEADER.size, position)
                header = parse_header(raw)
                if header is None:
                    reason = "bad record header" if len(raw) == HEADER.size else "torn record header"
                    break
                if header.base_offset != self.next_offset:
                    reason = f"offset {header.base_offset} where {self.next_offset} was expected"
                    break
                if position + header.size > file_size:
                    reason = "torn record body"
                    break
                if verify_crc:
                    body = os.pread(fd, header.body_len, position + HEADER.size)
                    if not verify(raw, body, header):
                        reason = "checksum mismatch"
                        break
                self._track(header, position)
                position += header.size
            self.synced_size = position  # what a previous run wrote counts as durable
            if position >= file_size:
                return None
            os.ftruncate(fd, position)
            os.fsync(fd)
            self.index_path.unlink(missing_ok=True)
            return CutReport(str(self.path), position, file_size - position, reason, self.next_offset)

    # -- reading -------------------------------------------------------------------------------

    def records_from(self, offset: int, stop: int | None = None):
        """Yield ``(header, body)`` for the records from the one holding ``offset``; raises
        ``DamagedRecordError`` on reaching a bad header or a body that fails its checksum.

        Reads the file in chunks of at least ``_READ_AHEAD`` bytes, so small records do not cost
        two system calls each; a body larger than that is read on its own. ``stop``: the offset
        the caller reads up to at most. A record holding it is read only in part, and the caller's
        next read starts inside it: it goes into ``RECENT_RECORDS``, where every read looks first.
        """
        count = len(self._index) // 3
        i = self._floor_entry(offset)
        position = self._index[i * 3 + 1] if count else 0
        expected = self._index[i * 3] if count else self.base_offset
        end = self.size
        chunk, chunk_start = b"", position
        if position >= end:
            return  # nothing to read: a segment no append created a file for has none to open
        cached_here = RECENT_RECORDS.holds(self)  # else no lookup per record: a scan of small ones is long
        cuts = self.cuts
        with self._opened() as fd:
            while position < end:
                cached = RECENT_RECORDS.get(self, position) if cached_here else None
                if cached is not None:
                    header, body = cached
                    if header.next_offset > offset:
                        yield header, body
                    expected = header.next_offset
                    position += header.size
                    continue
                if position + HEADER.size > chunk_start + len(chunk):
                    chunk, chunk_start = os.pread(fd, min(_READ_AHEAD, end - position), position), position
                at = position - chunk_start
                raw = chunk[at:at + HEADER.size]
                header = parse_header(raw)
                if header is None:
                    raise DamagedRecordError(
                        f"messages {expected}..{self.next_offset - 1} are damaged on disk (bad record header in "
                        f"{self.path} at byte {position}); pull from offset {self.next_offset} to skip them",
                        self.next_offset,
                    )
                if header.next_offset > offset:
                    body_at = at + HEADER.size
                    if body_at + header.body_len <= len(chunk):
                        body = chunk[body_at:body_at + header.body_len]
                    else:
                        body = os.pread(fd, header.body_len, position + HEADER.size)
                    if len(body) != header.body_len or not verify(raw, body, header):
                        raise DamagedRecordError(
                            f"messages {header.base_offset}..{header.next_offset - 1} are damaged on disk (checksum "
                            f"mismatch in {self.path} at byte {position}); pull from offset {header.next_offset} to "
                            "skip them",
                            header.next_offset,
                        )
                    if stop is not None and header.base_offset < stop < header.next_offset:
                        RECENT_RECORDS.put(self, position, header, body, lambda: self.cuts == cuts)
                    yield header, body
                expected = header.next_offset
                position += header.size

    def _floor_entry(self, offset: int) -> int:
        """Index of the last index entry whose offset is <= ``offset`` (0 if none)."""
        lo, hi = 0, len(self._index) // 3
        while lo < hi:
            mid = (lo + hi) // 2
            if self._index[mid * 3] <= offset:
                lo = mid + 1
            else:
                hi = mid
        return max(lo - 1, 0)

    def offset_at_or_after(self, timestamp: int) -> int | None:
        """First offset with store_ts >= timestamp in this segment, or None."""
        if self.last_store_ts < timestamp:
            return None
        # Store timestamps never decrease within a queue: binary-search the last index entry
        # stored strictly before the timestamp, then scan forward from it.
        lo, hi = 0, len(self._index) // 3
        while lo < hi:
            mid = (lo + hi) // 2
            if self._index[mid * 3 + 2] < timestamp:
                lo = mid + 1
            else:
                hi = mid
        start, count = max(lo - 1, 0), len(self._index) // 3
        position = self._index[start * 3 + 1] if count else 0
        with self._opened() as fd:
            while position < self.size:
                raw = os.pread(fd, HEADER.size, position)
                header = parse_header(raw)
                if header is None:
                    return None
                if header.store_ts >= timestamp:  # a merged record's earlier messages may be older
                    if header.count == 1:
                        return header.base_offset
                    body = os.pread(fd, header.body_len, position + HEADER.size)
                    return header.base_offset + codec.first_stamped_at_or_after(body, timestamp)
                position += header.size
            return None

    def truncate_at(self, offset: int) -> None:
        """Cut every record from the one holding ``offset`` on (a replica dropping a tail its
        group never had); the index is rebuilt by a scan, its file is stale and removed."""
        with self._opened() as fd:
            position = 0
            while position < self.size:
                header = parse_header(os.pread(fd, HEADER.size, position))
                if header is None or header.next_offset > offset:
                    break
                position += header.size
            os.ftruncate(fd, position)
            os.fsync(fd)
            self.index_path.unlink(missing_ok=True)
            self.recover(verify_crc=False)

    @property
    def producers_path(self) -> Path:
        return self.path.with_suffix(".producers")

    def write_producers(self, states: list[RecordHeader]) -> None:
        """Keep the producer identities of records compaction merges (their headers lose them),
        for recovery: ``producer_states`` yields them first. Durable before the merged file is."""
        tmp = self.producers_path.with_suffix(".producers.tmp")
        with open(tmp, "wb") as f:
            f.write(_PRODUCERS_MAGIC + b"".join(_PRODUCER.pack(h.producer_hash, h.sequence, h.base_offset, h.count,
                                                                 h.store_ts) for h in states))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.producers_path)

    def _kept_producers(self):
        try:
            raw = self.producers_path.read_bytes()
        except OSError:
            return
        if not raw.startswith(_PRODUCERS_MAGIC) or (len(raw) - len(_PRODUCERS_MAGIC)) % _PRODUCER.size:
            log.warning("%s is damaged: idempotent resends of its records may be stored again", self.producers_path)
            return
        for phash, seq, base, count, store_ts in _PRODUCER.iter_unpack(memoryview(raw)[len(_PRODUCERS_MAGIC):]):
            yield phash, seq, RecordHeader(0, 0, base, count, store_ts, phash, seq)

    def producer_states(self):
        """Yield ``(producer_hash, sequence, header)`` of records with a producer, in order: those
        compaction merged (kept aside), then those whose headers carry them."""
        yield from self._kept_producers()
        for header in self.headers():
            if header.producer_hash:
                yield header.producer_hash, header.sequence, header

    def headers(self) -> Iterator[RecordHeader]:
        """The records' headers in order, each read when asked for, without its body; up to a
        bad header."""
        if not self.size:
            return  # nothing to read, maybe no file
        with self._opened() as fd:
            position = 0
            while position < self.size:
                header = parse_header(os.pread(fd, HEADER.size, position))
                if header is None:
                    return
                yield header
                position += header.size

    def delete(self) -> None:
        self.close()
        self.unlink()

    def unlink(self) -> None:
        """Remove the segment's files (the log, its index, its merged records' producers)."""
        self.path.unlink(missing_ok=True)
        self.index_path.unlink(missing_ok=True)
        self.producers_path.unlink(missing_ok=True)


def _pwritev_all(fd: int, parts: Sequence[bytes | memoryview], position: int, unit: int = 0) -> int:
    """Write ``parts`` at ``position``; the bytes written, short only when the disk is full. One
    call takes at most ``_IOV_MAX`` parts (a commit's record may have thousands) and, with ``unit``,
    at most that many bytes (``page_cache.WRITE_UNIT_BYTES``)."""
    if len(parts) <= _IOV_MAX and not unit:
        return os.pwritev(fd, parts, position)
    written = 0
    for group, size in _write_calls(parts, unit or sys.maxsize):
        done = os.pwritev(fd, group, position + written)
        written += done
        if done != size:
            break
    return written


def _write_calls(parts: Sequence[bytes | memoryview], unit: int) -> Iterator[tuple[list[memoryview], int]]:
    """``parts`` cut into the iovecs of consecutive ``pwritev`` calls, and the bytes of each."""
    group: list[memoryview] = []
    size = 0
    for part in parts:
        view = memoryview(part).cast("B")
        while len(view):
            piece = view[:unit - size]
            group.append(piece)
            size += len(piece)
            view = view[len(piece):]
            if size == unit or len(group) == _IOV_MAX:
                yield group, size
                group, size = [], 0
    if group:
        yield group, size
