"""A MessageQueue's log: ordered appends, offset reads, long-poll wake-ups, retention.

Offsets are contiguous per queue (0, 1, 2, ...; never reused). Store timestamps never decrease,
so "first offset at or after a timestamp" is a binary search. A resend of a batch already stored
under the same (producer, sequence) returns the original result instead of storing it twice;
that state is rebuilt from record headers on recovery, so it survives a crash.

An append that fails (a full disk: ``DiskFullError``) stores nothing: the record is counted only
once fully written, so no reader sees part of it and the next append takes the same offsets. A
failed flush is never retried (``broker.storage.lost_writes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, TypeVar

import pyarrow as pa

from broker.persist import fsync_dir, write_failure_as_error
from broker.storage import compaction
from broker.storage.arrivals import Arrivals
from broker.storage.lost_writes import LostWrites
from broker.storage.open_files import OpenFiles
from broker.storage.page_cache import PageCacheWindow
from broker.storage.record import (
    HEADER,
    Body,
    RecordHeader,
    body_parts,
    frame,
    new_header,
    parse_header,
    producer_hash,
)
from broker.storage.segment import CutReport, Segment, SegmentClosedError
from broker.wire import codec
from broker.wire.errors import DamagedRecordError, OffsetOutOfRangeError, TopicNotFoundError

__all__ = ["AppendResult", "QueueLog", "ReadResult"]

log = logging.getLogger(__name__)

T = TypeVar("T")
_READ_ATTEMPTS = 3  # a read is tried again this often when retention or compaction closed a segment under it
_MAX_PRODUCERS = 10_000  # idempotence state kept per queue (least recently used dropped)
_MAX_RESULTS_PER_PRODUCER = compaction.PRODUCER_RESULTS


def _nothing() -> None:
    pass


class AppendResult(NamedTuple):  # a tuple: built on every append, where a frozen dataclass costs more
    base_offset: int
    count: int
    store_timestamp: int
    duplicate: bool = False


@dataclass(frozen=True)
class ReadResult:
    table: pa.Table  # STORED_SCHEMA: the messages with their store columns, in queue order
    next_offset: int

    @property
    def count(self) -> int:
        return self.table.num_rows


class QueueLog:
    """The segments of one queue directory. Appends are serialised by a lock; reads run
    concurrently with them (segments are immutable below ``next_offset``)."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int,
        index_interval_bytes: int,
        sync: bool,
        clock: Callable[[], int] = codec.now_ms,
        data_dir: Path | None = None,
        lost_writes: LostWrites | None = None,
        open_files: OpenFiles | None = None,
        page_cache: PageCacheWindow | None = None,
    ) -> None:
        self.directory = directory
        self.lost_writes = lost_writes or LostWrites()  # shared by the queues of a store
        self.open_files = open_files  # the store's budget of open segment files; None: no bound
        self.page_cache = page_cache  # the store's log kept in the page cache; None: the kernel decides
        self.data_dir = data_dir if data_dir is not None else directory
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.sync = sync
        self.clock = clock
        self.dirty = False
        self.on_end_moved: Callable[[], None] = _nothing  # called under the lock when max_offset moves
        self._closed = False
        self.cut_reports: list[CutReport] = []
        self._lock = threading.Lock()
        self._appended = Arrivals(self._lock)  # wakes long polls: threads and event loops
        self._producers: OrderedDict[int, OrderedDict[int, AppendResult]] = OrderedDict()
        self._visible: int | None = None  # None: every stored message is visible (see hold_back)
        self._examined: set[int] = set()  # base offsets of the segments compaction looked at
        self._rolled: list[Segment] = []  # closed, not yet fsynced nor indexed (flush = "async"), oldest first
        directory.mkdir(parents=True, exist_ok=True)
        self.segments: list[Segment] = self._open_segments()

    # -- opening and recovery ------------------------------------------------------------------

    def _open_segments(self) -> list[Segment]:
        for side in self.directory.glob("*.compact"):  # a compaction a crash interrupted: the log is intact
            side.unlink()
        for kept in self.directory.glob("*.producers"):  # of a segment retention deleted before a crash
            if not kept.with_suffix(".log").exists():
                kept.unlink()
        paths = sorted(self.directory.glob("*.log"))
        segments = [self._segment(int(p.stem), p) for p in paths]
        if not segments:
            return [self._segment(0)]
        for i, seg in enumerate(segments):
            last = i == len(segments) - 1
            if last or not seg.load_index():
                flushed = seg.index_path.exists()  # a rolled segment is indexed once a flush made it durable
                report = seg.recover(verify_crc=True)
                if report:
                    self._report_cut(report, -1 if last else segments[i + 1].base_offset)
                if not (last or flushed) and seg.next_offset < segments[i + 1].base_offset:
                    self._drop_after_unflushed(seg, segments[i + 1:])
                    segments = segments[:i + 1]
                    break
        kept = [segments[0]]
        for seg in segments[1:]:
            if seg.base_offset < kept[-1].next_offset:  # overlaps what precedes it: cannot be placed
                self._report_cut(CutReport(str(seg.path), 0, seg.path.stat().st_size,
                                           f"overlaps offsets up to {kept[-1].next_offset - 1}", seg.base_offset), -1)
                seg.delete()
                continue
            kept.append(seg)  # a gap before it (a cut closed segment) stays a hole: reads name it
        for seg in kept[-2:]:
            self._rebuild_producers(seg)
        return kept

    def _drop_after_unflushed(self, unflushed: Segment, later: list[Segment]) -> None:
        """Remove the segments after one rolled but never flushed before a crash that lost its
        tail (cut, or never written: ``flush = "async"``). What they hold was written after that
        tail, and kept they would leave a hole; the queue continues where that segment ends."""
        log.warning("queue %s: %s was never flushed and lost offsets %d..%d; the %d segment(s) after it are removed "
                    "and the queue continues at offset %d", self._name, unflushed.path.name, unflushed.next_offset,
                    later[0].base_offset - 1, len(later), unflushed.next_offset)
        for seg in later:
            self._report_cut(CutReport(str(seg.path), 0, seg.path.stat().st_size,
                                       "follows a segment cut before it was ever flushed", seg.base_offset), -1)
            seg.delete()

    def _segment(self, base_offset: int, path: Path | None = None) -> Segment:
        path = self.directory / Segment.file_name(base_offset) if path is None else path
        return Segment(path, base_offset, self.index_interval_bytes, self.open_files, self.page_cache)

    def _report_cut(self, report: CutReport, lost_until: int) -> None:
        self.cut_reports.append(report)
        lost = f"offsets {report.first_lost_offset}..{lost_until - 1}" if lost_until > 0 else (
            f"offsets from {report.first_lost_offset}")
        log.warning("recovery cut %d bytes from %s at byte %d (%s): %s lost", report.bytes_cut, report.path,
                    report.position, report.reason, lost)

    def _rebuild_producers(self, seg: Segment) -> None:
        for phash, seq, header in seg.producer_states():
            self._remember(phash, seq, AppendResult(header.base_offset, header.count, header.store_ts))

    def _remember(self, phash: int, seq: int, result: AppendResult) -> None:
        results = self._producers.get(phash)
        if results is None:
            results = self._producers[phash] = OrderedDict()
            if len(self._producers) > _MAX_PRODUCERS:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(phash)
        results[seq] = result
        if len(results) > _MAX_RESULTS_PER_PRODUCER:
            results.popitem(last=False)

    # -- state ---------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def max_offset(self) -> int:
        """The offset the next stored message gets."""
        return self.segments[-1].next_offset

    @property
    def visible_offset(self) -> int:
        """Where what readers may see ends: ``max_offset`` unless newer messages are held back."""
        end = self.max_offset
        return end if self._visible is None else min(self._visible, end)

    def hold_back(self) -> None:
        """From now on, keep messages stored after this moment from readers until ``make_visible``
        passes them (a broker group's master: until its sync-state set has them)."""
        with self._lock:
            if self._visible is None:
                self._visible = self.max_offset

    def make_visible(self, end: int) -> None:
        """Let readers see messages before ``end``; wakes long polls."""
        with self._lock:
            if self._visible is not None and end > self._visible:
                self._visible = end
                self._appended.notify_all()

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # -- appending -----------------------------------------------------------------------------

    def append(self, body: Body, count: int, producer_id: str = "", sequence: int = -1, *, since: int | None = None,
               admit: Callable[[], object] | None = None, burst: bool = False) -> AppendResult:
        """Store one batch (``codec.message_batch`` output: ``count`` messages; or the parts that
        concatenate to one, ``codec.join_records``) as one record; returns its offsets.

        A (producer_id, sequence) already stored returns the earlier result with
        ``duplicate=True`` and stores nothing. The idempotence state keeps the last 10,000
        producers; with ``since`` a producer it no longer holds is looked for in the records from
        that offset on (a commit re-applied long after its first attempt). ``admit`` is called
        under the log's lock before anything is stored, and stops the append by raising: a broker
        group's master checks there that it still is (a slave's cut of its log takes that lock).
        ``burst``: one of many appends made at once, a transaction's commit (``Segment.append``).
        """
        phash = producer_hash(producer_id) if producer_id and sequence >= 0 else 0
        with self._lock:
            if self._closed:
                raise self._deleted()
            self.lost_writes.check()
            if admit is not None:
                admit()
            if phash:
                earlier = self._producers.get(phash, {}).get(sequence)
                if earlier is None and since is not None:
                    earlier = self._stored_since(phash, sequence, since)
                if earlier is not None:
                    return AppendResult(earlier.base_offset, earlier.count, earlier.store_timestamp, True)
            active = self.segments[-1]
            base = active.next_offset
            store_ts = max(self.clock(), active.last_store_ts)
            head, header = new_header(body, base, count, store_ts, phash, sequence)
            with write_failure_as_error(self.data_dir, f"store {count} message(s) in queue {self._name}"):
                if active.size and active.size + header.size > self.segment_bytes:
                    active = self._roll()
                active.append((head, *body_parts(body)), header, sync=self.sync, burst=burst)
            if not self.sync:
                self.dirty = True
            result = AppendResult(base, count, store_ts)
            if phash:
                self._remember(phash, sequence, result)
            self._end_moved()
            return result

    def _stored_since(self, phash: int, sequence: int, since: int) -> AppendResult | None:
        """The record of ``(phash, sequence)`` at or after offset ``since``, read from the headers."""
        for seg in list(self.segments):
            if seg.next_offset <= since:
                continue
            for found, seq, header in seg.producer_states():
                if found == phash and seq == sequence and header.base_offset >= since:
                    return AppendResult(header.base_offset, header.count, header.store_ts)
        return None

    # -- replication ---------------------------------------------------------------------------

    def read_frames(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole framed records from ``offset`` (a record boundary) on, as stored, up to about
        ``max_bytes``; returns them and the offset after them. What a slave appends verbatim."""
        return self._retried(lambda: self._read_frames(offset, max_bytes))

    def _read_frames(self, offset: int, max_bytes: int) -> tuple[bytes, int]:
        self.check_offset(offset)
        end = self.max_offset
        frames: list[bytes] = []
        size, position = 0, offset
        for seg in list(self.segments):
            if seg.next_offset <= position or position >= end:
                continue
            for header, body in seg.records_from(position):
                if header.base_offset >= end:
                    break
                if header.base_offset != position:
                    raise OffsetOutOfRangeError(f"offset {position} of queue {self._name} is inside a record; "
                                                f"replicas fetch from record boundaries")
                frames.append(frame(body, header.base_offset, header.count, header.store_ts,
                                    header.producer_hash, header.sequence))
                size += header.size
                position = header.next_offset
                if size >= max_bytes:
                    return b"".join(frames), position
        return b"".join(frames), position

    def append_frames(self, frames: bytes) -> int:
        """Append records framed by the master, at the offsets they carry (which must continue
        this log); their producer ids join the idempotence state. Returns the new end offset."""
        view = memoryview(frames)
        with self._lock:
            if self._closed:
                raise self._deleted()
            self.lost_writes.check()
            at = 0
            while at < len(view):
                header = parse_header(bytes(view[at:at + HEADER.size]))
                if header is None or header.base_offset != self.max_offset:
                    raise DamagedRecordError(
                        f"replicated record at byte {at} of a batch for queue {self._name} does not continue the "
                        f"log at offset {self.max_offset}", self.max_offset)
                framed = bytes(view[at:at + header.size])
                active = self.segments[-1]
                what = f"replicate {header.count} message(s) into queue {self._name}"
                with write_failure_as_error(self.data_dir, what):
                    if active.size and active.size + len(framed) > self.segment_bytes:
                        active = self._roll()
                    active.append((framed,), header, sync=self.sync)
                if header.producer_hash:
                    self._remember(header.producer_hash, header.sequence,
                                   AppendResult(header.base_offset, header.count, header.store_ts))
                at += header.size
            if not self.sync:
                self.dirty = True
            self._end_moved()
            return self.max_offset

    def _end_moved(self) -> None:
        self._appended.notify_all()
        self.on_end_moved()

    def truncate(self, offset: int) -> int:
        """Drop every message from ``offset`` on (a replica's tail its group's master never had);
        the idempotence state is rebuilt from what stays. Returns the new end offset."""
        with self._lock:
            if offset >= self.max_offset:
                return self.max_offset
            while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
                self.segments.pop().delete()
            self._forget_removed_rolled()  # the segment cut is the active one again
            self.segments[-1].truncate_at(offset)
            self._producers.clear()
            for seg in self.segments[-2:]:
                self._rebuild_producers(seg)
            if self._visible is not None:
                self._visible = min(self._visible, self.max_offset)
            self.on_end_moved()
            log.warning("queue %s truncated to offset %d: the tail past it was never in its group", self._name,
                        self.max_offset)
            return self.max_offset

    def restart_at(self, offset: int) -> None:
        """Drop every message and continue at ``offset`` (past the end): a replica whose copy ends
        before the first offset its master's retention left starts over there."""
        with self._lock:
            if offset <= self.max_offset:
                raise OffsetOutOfRangeError(f"queue {self._name} ends at {self.max_offset}: it cannot restart at "
                                            f"{offset}, which it has")
            for seg in self.segments:
                seg.delete()
            self.segments = [self._segment(offset)]
            self._rolled.clear()
            self._producers.clear()
            if self._visible is not None:
                self._visible = offset
            fsync_dir(self.directory)
            self.on_end_moved()
            log.warning("queue %s restarts at offset %d: its master's retention removed what preceded it", self._name,
                        offset)

    def _deleted(self) -> TopicNotFoundError:
        return TopicNotFoundError(f"queue {self._name} was deleted with its topic; create the topic again to use it")

    @functools.cached_property
    def _name(self) -> str:  # in every append's error text: a path's parts cost more than the write
        return f"{self.directory.parent.name}/{self.directory.name}"

    def _roll(self) -> Segment:
        """Close the active segment and start the next; on failure nothing changed. With
        ``flush = "async"`` the closed segment is fsynced and indexed by the next flush, off the
        append path: an fsync of a whole segment under the lock would stall every send to the
        queue meanwhile. Until then it has no index, so a restart scans and checks it."""
        closed = self.segments[-1]
        if self.sync:  # its records were fsynced one by one: this makes its directory entry durable
            closed.sync()
            closed.write_index()
        else:
            self._rolled.append(closed)
            self.dirty = True
        seg = self._segment(closed.next_offset)
        self.segments.append(seg)
        return seg

    def flush(self) -> None:
        """fsync what was appended since the last flush, segments rolled meanwhile first; a
        failure is recorded in ``lost_writes`` and raised, never retried."""
        if not self.dirty:
            return
        self.dirty = False
        active = self._sync_rolled()
        try:
            active.sync()
        except OSError as exc:
            with self._lock:
                self._lose_unsynced(active, exc)
            raise

    def _sync_rolled(self) -> Segment:
        """fsync the segments rolled since the last flush, oldest first, then write each one's
        index: a restart trusts an index only for a segment that was durable when it was written.
        Returns the segment active then: fsynced before one rolled later, it would leave a hole
        after a power cut where that one's unsynced tail was."""
        with self._lock:
            rolled, self._rolled = self._rolled, []
            active = self.segments[-1]
        for segment in rolled:
            self._sync_one_rolled(segment)
        return active

    def _sync_one_rolled(self, segment: Segment) -> None:
        try:
            segment.sync()
        except SegmentClosedError:
            return  # retention, a truncation or a topic's delete removed it meanwhile
        except OSError as exc:
            with self._lock:
                if segment in self.segments:
                    self._lose_unsynced(segment, exc)
            raise
        try:
            segment.write_index()
        except OSError as exc:  # the restart scans the segment instead
            log.warning("could not write the index of %s (%s): a restart scans the segment", segment.path, exc)
        with self._lock:
            if segment not in self.segments:  # removed while its index was written: no index left behind
                segment.index_path.unlink(missing_ok=True)

    def _forget_removed_rolled(self) -> None:
        self._rolled = [seg for seg in self._rolled if seg in self.segments[:-1]]

    def secure(self) -> None:
        """Once another queue lost writes: fsync what this one appended, or cut it back where
        that fails too."""
        with contextlib.suppress(OSError):  # cut back, and recorded in lost_writes
            self.flush()

    def _lose_unsynced(self, segment: Segment, exc: OSError) -> None:
        """A failed fsync of ``segment`` (the queue's lock held): see ``broker.storage.lost_writes``.
        The segments after it go too (a rolled one's fsync failed): kept, they would sit behind a hole."""
        self.lost_writes.record(str(segment.path), exc)
        if segment not in self.segments:  # removed meanwhile (a truncation): nothing of it is served
            return
        lost_from = self.max_offset
        while self.segments[-1] is not segment:
            self.segments.pop().delete()
        self._forget_removed_rolled()
        segment.drop_unsynced()
        self.dirty = False
        if segment.next_offset < lost_from:
            log.critical("queue %s: offsets %d..%d were acknowledged but not fsynced, and are dropped", self._name,
                         segment.next_offset, lost_from - 1)

    # -- reading -------------------------------------------------------------------------------

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until a message at ``offset`` exists or ``timeout_s`` passes (long poll)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self.visible_offset <= offset:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._appended.wait(remaining)
            return True

    async def wait_for_data_async(self, offset: int, timeout_s: float) -> bool:
        """``wait_for_data`` for an event loop: awaits a wake-up without holding a thread."""
        deadline = time.monotonic() + timeout_s
        while True:
            arrived = self._appended.register()  # before the check: an append after it resolves it
            try:
                if self.visible_offset > offset or self._closed:  # closed: the topic was deleted
                    return self.visible_offset > offset
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(arrived, remaining)
                except asyncio.TimeoutError:  # builtin TimeoutError from 3.11, not on 3.10
                    return self.visible_offset > offset
            finally:
                self._appended.discard(arrived)

    def wake_waiters(self) -> None:
        with self._lock:
            self._appended.notify_all()

    def check_offset(self, offset: int) -> None:
        lo, hi = self.min_offset, self.max_offset
        if offset < lo:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {self.directory.parent.name}/{self.directory.name} is below the minimum "
                f"{lo}: messages before {lo} were removed by retention; restart from {lo} (earliest)"
            )
        if offset > hi:
            raise OffsetOutOfRangeError(
                f"offset {offset} of {self.directory.parent.name}/{self.directory.name} is beyond the maximum "
                f"{hi}: no message has been stored there yet; pull from at most {hi}"
            )

    def read(self, offset: int, max_messages: int, max_bytes: int) -> ReadResult:
        """Up to ``max_messages`` messages from ``offset`` (at least one record's worth if any),
        with the store columns added."""
        headers, bodies, counts = self._retried(lambda: self._read_records(offset, max_messages, max_bytes))
        if not bodies:
            return ReadResult(codec.empty_stored_table(), offset)
        messages, stamps = codec.decode_stamped_records(bodies, [h.store_ts for h in headers],
                                                        [h.count for h in headers])
        skip, taken = offset - headers[0].base_offset, sum(counts)  # the first and last records may straddle
        table = codec.with_offsets_and_stamps(messages.slice(skip, taken), offset, stamps[skip:skip + taken])
        if table.num_rows < compaction.SMALL_RECORD_ROWS * len(bodies):  # many small records: one batch, not one each
            table = table.combine_chunks()
        return ReadResult(table, offset + table.num_rows)

    def _retried(self, read: Callable[[], T]) -> T:
        """``read()``, again over the segments as they are now when one it began on was closed
        meanwhile: retention deleted it, or compaction replaced it."""
        for attempt in range(_READ_ATTEMPTS):
            try:
                return read()
            except OSError as exc:
                if self._closed:  # the topic was deleted while this read ran
                    raise self._deleted() from None
                if not isinstance(exc, SegmentClosedError) or attempt == _READ_ATTEMPTS - 1:
                    raise
            with self._lock:  # a compaction swap holds it until its new segment is in the list
                pass
        raise AssertionError("unreachable")

    def _read_records(self, offset: int, max_messages: int,
                      max_bytes: int) -> tuple[list[RecordHeader], list[bytes], list[int]]:
        """The headers and bodies of the records holding messages from ``offset`` on, and how many
        of each record's messages are read (the first and last may be partial)."""
        self.check_offset(offset)
        segments = list(self.segments)
        end = min(segments[-1].next_offset, self.visible_offset)
        start_index = max(i for i, s in enumerate(segments) if s.base_offset <= offset)
        headers: list[RecordHeader] = []
        bodies: list[bytes] = []
        counts: list[int] = []
        count = size = 0
        position = offset
        for seg in segments[start_index:]:
            if position < seg.base_offset:  # a hole left by recovery: stop before it, or name it
                if count:
                    break
                raise DamagedRecordError(
                    f"messages {position}..{seg.base_offset - 1} of {self.directory.parent.name}/"
                    f"{self.directory.name} were cut by recovery after disk damage; pull from offset "
                    f"{seg.base_offset} to skip them", seg.base_offset)
            try:
                for header, body in seg.records_from(position, stop=offset + max_messages):
                    if header.base_offset >= end:
                        break
                    take = min(min(header.next_offset, end) - position, max_messages - count)
                    headers.append(header)
                    bodies.append(body)
                    counts.append(take)
                    count += take
                    size += len(body)
                    position += take
                    if count >= max_messages or size >= max_bytes:
                        return headers, bodies, counts
            except DamagedRecordError:
                if count:  # serve what precedes the damage; the next pull names it
                    return headers, bodies, counts
                raise
            if position >= end:
                break
        return headers, bodies, counts

    # -- compaction ----------------------------------------------------------------------------

    def compact(self, idle_ms: int = 0) -> int:
        """Merge the small records of closed segments (``broker.storage.compaction``); returns how
        many segments were rewritten. The producers of merged records are kept aside for recovery
        (``Segment.write_producers``), which rebuilds the idempotent producers of the newest closed
        segment and the active one. The active one is never merged, but with ``idle_ms`` one of
        small records that nothing was appended to for that long is closed first, so that the
        last records of a backlog are merged too."""
        if self.lost_writes.reason is not None:
            return 0  # nothing more is written to a disk that lost writes
        if idle_ms:
            self._close_idle(idle_ms)
        try:  # what compaction rewrites is made durable: the older segments before it
            self._sync_rolled()
        except OSError:
            return 0  # recorded in lost_writes
        rewritten = 0
        for seg in self.segments[:-1]:
            if self._closed:
                break
            if seg.base_offset in self._examined or seg in self._rolled:  # a rolled one: after its flush
                continue
            self._examined.add(seg.base_offset)
            side = seg.path.with_suffix(".compact")
            try:
                if not compaction.looks_small(seg):
                    continue
                read, written, producers = compaction.rewrite(seg, side)
                if written * 2 > read:
                    side.unlink(missing_ok=True)
                    continue
                seg.write_producers(producers)
                if not self._swap(seg, side):  # retention or a delete took the segment meanwhile
                    side.unlink(missing_ok=True)
                    seg.producers_path.unlink(missing_ok=True)
                    continue
            except (OSError, ValueError, DamagedRecordError) as exc:  # left as it is; reads work either way
                side.unlink(missing_ok=True)
                log.warning("could not compact %s: %s", seg.path, exc)
                continue
            log.info("compacted %s: %d records into %d", seg.path, read, written)
            rewritten += 1
        return rewritten

    def _close_idle(self, idle_ms: int) -> None:
        active = self.segments[-1]
        if not active.size or self.clock() - active.last_store_ts < idle_ms or not compaction.looks_small(active):
            return
        with self._lock:
            if not self._closed and self.segments[-1] is active and self.clock() - active.last_store_ts >= idle_ms:
                self._roll()  # the next append creates the next segment's file

    def _swap(self, old: Segment, side: Path) -> bool:
        """Put the rewritten file in place of ``old``, unless retention or a delete took it meanwhile."""
        with self._lock:
            if self._closed or old not in self.segments:
                return False
            old.index_path.unlink(missing_ok=True)  # describes the old file: a crash now rescans
            old.close()  # before its path names the new file: a read that had not begun reads the new segment
            try:
                os.replace(side, old.path)
            finally:  # the merged file, or the old one where the replace failed
                new = self._segment(old.base_offset, old.path)
                new.recover(verify_crc=False)
                self.segments[self.segments.index(old)] = new
            fsync_dir(self.directory)
            new.write_index()
            return True

    def offset_for_timestamp(self, timestamp: int) -> int:
        """First offset stored at or after ``timestamp`` (``max_offset`` if none yet)."""
        return self._retried(lambda: self._offset_for_timestamp(timestamp))

    def _offset_for_timestamp(self, timestamp: int) -> int:
        for seg in list(self.segments):
            found = seg.offset_at_or_after(timestamp)
            if found is not None:
                return max(found, self.min_offset)
        return self.max_offset

    # -- retention -----------------------------------------------------------------------------

    def apply_retention(self, retention_ms: int, retention_bytes: int) -> int:
        """Delete closed segments older than ``retention_ms`` or beyond ``retention_bytes``;
        returns the number of messages removed. The active segment is never deleted."""
        now = self.clock()
        removed = 0
        with self._lock:
            while len(self.segments) > 1:
                oldest = self.segments[0]
                too_old = retention_ms > 0 and oldest.last_store_ts >= 0 and oldest.last_store_ts < now - retention_ms
                too_big = retention_bytes > 0 and self.size_bytes - oldest.size >= retention_bytes
                if not (too_old or too_big):
                    break
                self.segments.pop(0)
                removed += oldest.next_offset - oldest.base_offset
                oldest.delete()  # reads on it keep its file until they end
            self._forget_removed_rolled()
        if removed:
            fsync_dir(self.directory)  # else a power cut can bring the deleted segments back
            log.info("retention removed %d messages from %s (now from offset %d)", removed, self.directory, self.min_offset)
        return removed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.lost_writes.reason is None:  # else secured already, or cut back
                for seg in self._rolled:
                    seg.sync()
                    seg.write_index()
                self.segments[-1].sync()
            for seg in self.segments:
                seg.close()


