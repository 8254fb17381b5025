"""Compaction of small records: a closed segment written by one-message sends is rewritten with
runs of adjacent small records merged into one record each.

Every synchronous send stores a record of its own: a header, an Arrow schema and a record batch
for one message, about ten times the bytes of a 100-byte body, and a pull pays a header check and
a batch per message. Merged, the same messages cost a pull what a batch send's do. A merged record
keeps the offsets (its base offset and count are the run's), the order and every column; each
message's store timestamp, which a record header cannot hold, goes in its body
(``codec.COMPACTED_SCHEMA``), and its header carries the run's last store timestamp, so the
segment's time bounds and index stay true. Records that are big already are copied as they are.

A merged record's header has no producer identity, so the newest results of each producer whose
records were merged are kept beside the segment (``Segment.write_producers``): after a restart a
resend of one of them is still recognised. The owner (``QueueLog.compact``) rewrites closed
segments only, to a side file swapped in by rename; readers holding the old segment keep its file.
"""

from __future__ import annotations

import itertools
import os
from collections import OrderedDict
from pathlib import Path

from broker.storage.record import RecordHeader, frame
from broker.storage.segment import Segment
from broker.wire import codec

__all__ = ["PRODUCER_RESULTS", "SMALL_RECORD_ROWS", "looks_small", "rewrite"]

PRODUCER_RESULTS = 64  # results a queue remembers per producer (QueueLog): the newest are kept aside

SMALL_RECORD_ROWS = 256  # records holding fewer messages than this on average are merged
_SMALL_RECORD_BYTES = 64 * 1024  # a record at least this big is copied as it is
_MAX_ROWS = 10_000  # messages of one merged record
_MAX_BYTES = 1 << 20  # body bytes of the records merged into one
_SAMPLE = 64  # records looked at to decide whether a segment is worth rewriting


def looks_small(segment: Segment) -> bool:
    """Whether the segment's first records hold few messages each. Only their headers are read: a
    segment of batches would otherwise be read whole (64 records of a megabyte) and stay in the
    page cache, for nothing."""
    counts = [header.count for header in itertools.islice(segment.headers(), _SAMPLE)]
    return len(counts) > 1 and sum(counts) < SMALL_RECORD_ROWS * len(counts)


def rewrite(segment: Segment, target: Path) -> tuple[int, int, list[RecordHeader]]:
    """Write ``segment``'s records to ``target`` with small adjacent ones merged, and fsync it;
    returns (records read, records written, the headers of merged records that carried a producer,
    its last ``PRODUCER_RESULTS`` per producer: what recovery needs to recognise resends)."""
    producers: dict[int, OrderedDict[int, RecordHeader]] = {}
    run: list[tuple[RecordHeader, bytes]] = []
    run_rows = run_bytes = read = written = 0
    with open(target, "wb") as out:

        def flush() -> None:
            nonlocal run_rows, run_bytes, written
            if run:
                out.write(_merged(run))
                written += 1
            run.clear()
            run_rows = run_bytes = 0

        for header, body in segment.records_from(segment.base_offset):
            read += 1
            if header.count >= SMALL_RECORD_ROWS or len(body) >= _SMALL_RECORD_BYTES:
                flush()
                run.append((header, body))
                flush()
                continue
            if run_rows + header.count > _MAX_ROWS or run_bytes + len(body) > _MAX_BYTES:
                flush()
            if header.producer_hash:
                kept = producers.setdefault(header.producer_hash, OrderedDict())
                kept[header.sequence] = header
                if len(kept) > PRODUCER_RESULTS:
                    kept.popitem(last=False)
            run.append((header, body))
            run_rows += header.count
            run_bytes += len(body)
        flush()
        out.flush()
        os.fsync(out.fileno())
    return read, written, [h for kept in producers.values() for h in kept.values()]


def _merged(run: list[tuple[RecordHeader, bytes]]) -> bytes:
    """One framed record for a run of adjacent records (a lone record framed as it was)."""
    first, last = run[0][0], run[-1][0]
    if len(run) == 1:
        return frame(run[0][1], first.base_offset, first.count, first.store_ts, first.producer_hash, first.sequence)
    headers = [h for h, _ in run]
    table, stamps = codec.decode_stamped_records([b for _, b in run], [h.store_ts for h in headers],
                                                 [h.count for h in headers])
    if table.num_rows != last.next_offset - first.base_offset:
        raise ValueError(f"records at offsets {first.base_offset}..{last.next_offset - 1} hold {table.num_rows} "
                         "messages; left as they are")
    body = codec.compacted_body(table, stamps)
    return frame(body, first.base_offset, last.next_offset - first.base_offset, last.store_ts)
