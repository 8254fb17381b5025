"""Compaction of small records (broker/storage/compaction.py): closed segments of one-message
records are merged into few records, and every message keeps its offset, order, columns and store
timestamp; recovery and idempotent resends are unchanged; a broker does it in the background."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from broker.storage.queue_log import QueueLog
from broker.storage.segment import SegmentClosedError
from broker.wire import codec
from broker.wire.one_message import encode_one
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.history import History
from tests.faults.workload import body, parse_body, stored_deliveries
from tests.support import resident_bytes

SEGMENT_BYTES = 16 * 1024


def _queue(path) -> QueueLog:
    return QueueLog(path, segment_bytes=SEGMENT_BYTES, index_interval_bytes=1024, sync=False)


def _fill(queue: QueueLog, history: History, messages: int) -> list[tuple[str, int, int]]:
    """One-message records of 5 keys (some with tags and properties), with a batch now and then;
    returns the (producer id, sequence, offset) of each one-message record."""
    seqs, sent = {}, []
    for i in range(messages):
        key = f"k{i % 5}"
        seq = seqs[key] = seqs.get(key, -1) + 1
        row = {"key": key, "body": body(key, seq), "tag": "T" if i % 3 else None,
               "properties": {"i": str(i)} if i % 4 == 0 else None, "born_timestamp": 1_700_000_000_000 + i}
        if i % 50 == 49:  # a batch of 3 of this key's next messages in one record
            rows = [row] + [{"key": key, "body": body(key, seq + j)} for j in (1, 2)]
            seqs[key] = seq + 2
            queue.append(codec.encode(codec.messages_to_batch(rows)), 3, "batcher", i)
        else:
            sent.append((f"producer-{i % 7}", i, queue.append(encode_one(row), 1, f"producer-{i % 7}", i).base_offset))
        for s in range(seq, seqs[key] + 1):
            history.sent(key, s, acked=True)
    return sent


def _everything(queue: QueueLog) -> pa.Table:
    return queue.read(queue.min_offset, 1_000_000, 1 << 30).table


def _deliveries(table: pa.Table, history: History) -> None:
    for raw, offset in zip(table.column("body").to_pylist(), table.column("queue_offset").to_pylist(), strict=True):
        key, seq = parse_body(raw)
        history.delivered(key, seq, consumer="log", offset=offset)


def test_merged_records_keep_offsets_order_columns_store_times_and_recovery(tmp_path):
    queue = _queue(tmp_path / "t" / "0")
    history = History()
    sent = _fill(queue, history, 1500)
    before = _everything(queue)
    sizes = [seg.size for seg in queue.segments]
    stamps = before.column("store_timestamp").cast(pa.int64()).to_pylist()
    probes = sorted(set(stamps[::37])) + [stamps[-1] + 1]
    at_before = [queue.offset_for_timestamp(t) for t in probes]
    assert len(sizes) > 4

    rewritten = queue.compact()

    assert rewritten == len(sizes) - 1  # the active segment stays as written
    assert queue.segments[-1].size == sizes[-1]
    assert all(seg.size * 3 < size for seg, size in zip(queue.segments[:-1], sizes, strict=False))
    after = _everything(queue)
    assert after.equals(before)  # offsets, columns and each message's store timestamp
    assert [queue.offset_for_timestamp(t) for t in probes] == at_before
    for offset in (0, 1, 37, 500, 1000):  # pulls from inside a merged record
        part = queue.read(offset, 10, 1 << 20).table
        assert part.equals(before.slice(offset, 10))
    _deliveries(after, history)
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == before.num_rows, verdict
    assert queue.compact() == 0  # nothing left to merge
    queue.close()

    (tmp_path / "t" / "0" / "00000000000000000000.compact").write_bytes(b"a crash left this")
    reopened = _queue(tmp_path / "t" / "0")
    assert not list((tmp_path / "t" / "0").glob("*.compact"))
    assert _everything(reopened).equals(before)
    newest_closed = reopened.segments[-2]
    resent = [(producer, seq, offset) for producer, seq, offset in sent
              if newest_closed.base_offset <= offset < newest_closed.next_offset]
    assert resent
    for producer, seq, offset in resent:  # merged, yet recognised after the restart
        again = reopened.append(encode_one({"key": "k", "body": b"again"}), 1, producer, seq)
        assert again.duplicate and again.base_offset == offset, (producer, seq, again)
    reopened.close()


def test_an_idle_active_segment_is_closed_and_merged_and_appends_go_on(tmp_path):
    queue = _queue(tmp_path / "t" / "0")
    history = History()
    _fill(queue, history, 400)
    before = _everything(queue)
    assert queue.compact(idle_ms=60_000) == len(queue.segments) - 1  # appended to just now: left open
    time.sleep(0.01)
    assert queue.compact(idle_ms=1) == 1  # idle: closed, then merged
    assert all(header.count > 1 for seg in queue.segments[:-1] for header, _ in seg.records_from(seg.base_offset))
    assert queue.segments[-1].size == 0
    assert _everything(queue).equals(before)
    queue.append(encode_one({"key": "k0", "body": body("k0", 80)}), 1)
    history.sent("k0", 80, acked=True)
    _deliveries(_everything(queue), history)
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == before.num_rows + 1, verdict
    queue.close()


def test_reads_during_compaction_see_the_same_messages(tmp_path):
    queue = _queue(tmp_path / "t" / "0")
    _fill(queue, History(), 1200)
    expected = _everything(queue)
    failures, done = [], threading.Event()

    def read_again() -> None:
        while not done.is_set():
            for offset in (0, 333, 900):
                got = queue.read(offset, 200, 1 << 20).table
                if not got.equals(expected.slice(offset, got.num_rows)) or not got.num_rows:
                    failures.append(offset)

    reader = threading.Thread(target=read_again)
    reader.start()
    try:
        assert queue.compact() > 0
    finally:
        done.set()
        reader.join()
    assert failures == []
    queue.close()


def test_a_broker_merges_synchronous_sends_in_the_background(broker_factory, topic_name):
    broker = broker_factory(segment_bytes=SEGMENT_BYTES, compact_interval_ms=100)
    Admin(broker.address).create_topic(topic_name, 1)
    history = History()
    with Producer(broker.address) as producer:
        for i in range(600):
            producer.send(topic_name, body(f"k{i % 4}", i // 4), key=f"k{i % 4}")
            history.sent(f"k{i % 4}", i // 4, acked=True)
    queue = broker.service.store.queue(topic_name, 0)
    deadline = time.monotonic() + 60
    while queue.segments[0].size > SEGMENT_BYTES // 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert queue.segments[0].size <= SEGMENT_BYTES // 3, "the first segment was not merged"
    with BrokerConnection(broker.address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic_name))
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == 600, verdict


def test_a_read_under_way_keeps_the_file_compaction_replaces(tmp_path):
    """A read on a segment when compaction puts the merged file in its place goes on in the file it
    began on; a read of that segment begun after is refused (``QueueLog.read`` then reads the
    segments as they are now), and reads of the queue see every message as before."""
    queue = _queue(tmp_path / "t" / "0")
    _fill(queue, History(), 600)
    before = _everything(queue)
    old = queue.segments[0]
    under_way = old.records_from(old.base_offset)
    headers = [next(under_way)[0]]
    assert queue.compact() > 0 and queue.segments[0] is not old
    headers += [header for header, _ in under_way]
    assert [h.base_offset for h in headers] == [old.base_offset] + [h.next_offset for h in headers[:-1]]
    assert headers[-1].next_offset == old.next_offset and all(h.count <= 3 for h in headers)  # not merged
    with pytest.raises(SegmentClosedError):
        next(old.records_from(old.base_offset))
    assert _everything(queue).equals(before)


def test_a_merged_file_that_cannot_take_the_place_of_its_segment_leaves_it_readable(tmp_path):
    """The segment is closed before the merged file takes its path; when that rename fails, the
    queue reads the old file again, every message as before."""
    queue = _queue(tmp_path / "t" / "0")
    _fill(queue, History(), 600)
    before = _everything(queue)
    with pytest.raises(FileNotFoundError):
        queue._swap(queue.segments[0], tmp_path / "no-such-merged-file")
    assert _everything(queue).equals(before)


def test_a_segment_of_batches_is_examined_by_its_headers_alone(tmp_path):
    """Deciding whether a closed segment is worth merging reads its first records' headers, not
    their bodies: a segment of batches of 1,000 messages keeps out of the page cache (it used to be
    read whole, up to 64 records), and stays as it was."""
    queue = QueueLog(tmp_path / "t" / "0", segment_bytes=2 << 20, index_interval_bytes=4096, sync=False)
    batch = codec.encode(codec.messages_to_batch([{"key": "k", "body": b"x" * 100} for _ in range(1000)]))
    while len(queue.segments) < 2:
        queue.append(batch, 1000)
    queue.flush()
    closed = queue.segments[0]
    assert closed.drop_cached(0, closed.size)
    assert resident_bytes([closed.path]) == 0
    before = closed.path.read_bytes()
    assert resident_bytes([closed.path]) > 0  # the test reads it: it was cached again
    closed.drop_cached(0, closed.size)
    assert queue.compact() == 0
    assert resident_bytes([closed.path]) <= 64 * 4096  # a page per header at most
    assert queue.segments[0].path.read_bytes() == before
