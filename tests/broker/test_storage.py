"""Storage without the server: ordered appends, reads across segments, recovery, retention."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from broker.storage import QueueLog, Store
from broker.storage.record import HEADER, parse_header
from broker.wire import codec
from broker.wire.errors import (
    DamagedRecordError,
    DiskFullError,
    OffsetOutOfRangeError,
    QueueOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
)
from tests.support import FakeClock
from tests.tmpfs import Ballast, mounted_tmpfs, open_fds


def batch(start: int, n: int, key: str = "k") -> tuple[bytes, int]:
    """A sent batch as the broker stores it: (message-column Arrow IPC stream, row count)."""
    table = codec.messages_to_batch([{"key": key, "body": f"{key}-{i}".encode()} for i in range(start, start + n)])
    return codec.message_batch(codec.encode(table))


def read_all(q: QueueLog, offset: int = 0, max_messages: int = 1_000_000, max_bytes: int = 1 << 40) -> pa.Table:
    tables = []
    while offset < q.max_offset:
        result = q.read(offset, max_messages, max_bytes)
        tables.append(result.table)
        offset = result.next_offset
    return pa.concat_tables(tables) if tables else codec.empty_stored_table()


def make_log(tmp_path, **kw) -> QueueLog:
    opts = dict(segment_bytes=4096, index_interval_bytes=512, sync=False)
    opts.update(kw)
    return QueueLog(tmp_path / "t" / "0", **opts)


def test_appends_get_contiguous_offsets_and_read_back_in_order(tmp_path):
    q = make_log(tmp_path)
    for i in range(50):
        result = q.append(*batch(i * 3, 3))
        assert (result.base_offset, result.count) == (i * 3, 3)
    assert len(q.segments) > 1, "small segments must roll"
    table = read_all(q)
    assert table.column("queue_offset").to_pylist() == list(range(150))
    assert table.column("body").to_pylist() == [f"k-{i}".encode() for i in range(150)]


def test_a_record_given_as_more_parts_than_one_write_takes_is_stored_whole(tmp_path):
    """A transaction's commit appends the parts of thousands of staged sends as one record."""
    bodies = [batch(i, 1)[0] for i in range(os.sysconf("SC_IOV_MAX") + 300)]
    parts, count = codec.join_records(bodies)
    q = make_log(tmp_path, segment_bytes=1 << 30)
    assert q.append(parts, count).count == len(bodies)
    q.append(*batch(len(bodies), 1))
    q.close()
    reopened = make_log(tmp_path, segment_bytes=1 << 30)  # recovery checks each record's CRC
    assert read_all(reopened).column("body").to_pylist() == [f"k-{i}".encode() for i in range(len(bodies) + 1)]


def test_a_canonical_batch_is_stored_as_sent_and_others_are_normalized():
    canonical = codec.encode(codec.messages_to_batch([{"key": "a", "body": b"1"}, {"key": "b", "body": b"2"}]))
    assert codec.message_batch(canonical) == (canonical, 2)
    loose = codec.encode(pa.table({"key": [7, 8], "body": ["x", "y"]}))  # int keys, string bodies
    body, count = codec.message_batch(loose)
    table = codec.decode(body)
    assert count == 2 and table.schema.equals(codec.MESSAGE_SCHEMA)
    assert table.column("key").to_pylist() == ["7", "8"] and table.column("body").to_pylist() == [b"x", b"y"]


def test_records_written_with_store_columns_read_back_with_their_offsets(tmp_path):
    """Records from before bodies were stored as sent carry queue_offset/store_timestamp already."""
    q = make_log(tmp_path, clock=FakeClock(5_000))
    q.append(*batch(0, 2))
    legacy = codec.with_store_columns(codec.messages_to_batch([{"body": b"old-2"}, {"body": b"old-3"}]), 2, [5_000], [2])
    q.append(codec.encode(legacy), 2)
    q.append(*batch(4, 1))
    table = read_all(q, 1)
    assert table.schema.equals(codec.STORED_SCHEMA)
    assert table.column("queue_offset").to_pylist() == [1, 2, 3, 4]
    assert table.column("body").to_pylist() == [b"k-1", b"old-2", b"old-3", b"k-4"]


def test_read_from_the_middle_of_a_record_and_limits(tmp_path):
    q = make_log(tmp_path)
    for i in range(20):
        q.append(*batch(i * 5, 5))
    result = q.read(7, 4, 1 << 30)
    table = result.table
    assert table.column("queue_offset").to_pylist() == [7, 8, 9, 10]
    assert table.column("body").to_pylist() == [b"k-7", b"k-8", b"k-9", b"k-10"], "bodies match their offsets"
    assert result.next_offset == 11
    assert read_all(q, 7, max_messages=3).column("queue_offset").to_pylist() == list(range(7, 100))


def test_offsets_out_of_range_are_precise(tmp_path):
    q = make_log(tmp_path)
    q.append(*batch(0, 2))
    assert q.read(2, 10, 1000).count == 0
    with pytest.raises(OffsetOutOfRangeError, match="beyond the maximum 2"):
        q.read(3, 10, 1000)


def test_reopen_rebuilds_state_and_keeps_order(tmp_path):
    q = make_log(tmp_path)
    for i in range(40):
        q.append(*batch(i * 2, 2))
    q.close()
    q2 = make_log(tmp_path)
    assert q2.max_offset == 80 and not q2.cut_reports
    q2.append(*batch(80, 1))
    assert read_all(q2).column("queue_offset").to_pylist() == list(range(81))


def test_async_flush_fsyncs_and_indexes_rolled_segments_at_the_flush_not_the_append(tmp_path):
    q = make_log(tmp_path)
    for i in range(40):
        q.append(*batch(i * 2, 2))
    closed = q.segments[:-1]
    assert len(closed) >= 3
    assert not any(seg.index_path.exists() for seg in closed), "indexed before it was fsynced"
    assert all(seg.synced_size < seg.size for seg in closed), "fsynced on the append path"
    q.flush()
    assert all(seg.index_path.exists() and seg.synced_size == seg.size for seg in closed)
    q.close()
    q2 = make_log(tmp_path)
    assert q2.max_offset == 80 and not q2.cut_reports
    assert read_all(q2).column("queue_offset").to_pylist() == list(range(80))


def test_a_restart_before_the_flush_checks_every_rolled_segment_and_leaves_no_hole(tmp_path):
    """Segments rolled since the last flush have no index: a restart scans them and checks their
    records' checksums. A tail lost there (a power cut before the flush) ends the log: the later
    segments were written after it, and kept they would leave a hole."""
    q = make_log(tmp_path)
    for i in range(40):
        q.append(*batch(i * 2, 2))
    first, later = q.segments[0], q.segments[1:]
    data = bytearray(first.path.read_bytes())
    data[-3] ^= 0xFF  # inside the last record's body
    first.path.write_bytes(bytes(data))
    q2 = make_log(tmp_path)  # q never flushed nor closed: a crash
    assert [r.path for r in q2.cut_reports] == [str(seg.path) for seg in [first, *later]]
    assert q2.cut_reports[0].reason == "checksum mismatch"
    kept = q2.cut_reports[0].first_lost_offset
    assert q2.max_offset == kept and not any(seg.path.exists() for seg in later)
    assert q2.append(*batch(kept, 1)).base_offset == kept
    assert read_all(q2).column("queue_offset").to_pylist() == list(range(kept + 1))


def test_recovery_cuts_only_a_torn_tail_record(tmp_path):
    q = make_log(tmp_path, segment_bytes=1 << 20)
    for i in range(10):
        q.append(*batch(i, 1))
    q.close()
    path = q.segments[-1].path
    size = path.stat().st_size
    with open(path, "r+b") as f:  # flip a byte in the last record's body
        f.seek(size - 10)
        byte = f.read(1)
        f.seek(size - 10)
        f.write(bytes([byte[0] ^ 0xFF]))
    q2 = make_log(tmp_path, segment_bytes=1 << 20)
    assert q2.max_offset == 9
    assert [r.reason for r in q2.cut_reports] == ["checksum mismatch"]
    assert read_all(q2).column("body").to_pylist() == [f"k-{i}".encode() for i in range(9)]


def test_recovery_cuts_a_half_written_header(tmp_path):
    q = make_log(tmp_path, segment_bytes=1 << 20)
    for i in range(3):
        q.append(*batch(i, 1))
    q.close()
    with open(q.segments[-1].path, "ab") as f:
        f.write(b"\x4f\x51\x4d")  # a torn header of a fourth record
    q2 = make_log(tmp_path, segment_bytes=1 << 20)
    assert q2.max_offset == 3 and q2.cut_reports[0].bytes_cut == 3
    assert q2.append(*batch(3, 1)).base_offset == 3


def test_resend_of_a_stored_sequence_is_not_stored_twice_even_after_restart(tmp_path):
    q = make_log(tmp_path)
    first = q.append(*batch(0, 2), "producer-1", 0)
    again = q.append(*batch(0, 2), "producer-1", 0)
    assert again.duplicate and again.base_offset == first.base_offset
    q.close()
    q2 = make_log(tmp_path)
    assert q2.append(*batch(0, 2), "producer-1", 0).duplicate
    assert q2.append(*batch(2, 1), "producer-1", 1).base_offset == 2
    assert q2.max_offset == 3


def test_a_producer_the_idempotence_state_dropped_is_found_from_a_given_offset(tmp_path):
    """The state keeps the last 10,000 producers. A commit re-applied after more than that many
    others wrote to the queue says from where to look: its first attempt's record is found in the
    segments (one rolled meanwhile), and nothing is stored twice."""
    q = make_log(tmp_path, segment_bytes=64 * 1024)
    q.append(*batch(0, 1, "before"), "other", 0)
    start = q.max_offset
    first = q.append(*batch(1, 2, "txn"), "txn:t", 0)
    for n in range(10_001):
        q.append(*batch(3 + n, 1, "x"), f"producer-{n}", 0)
    assert len(q.segments) > 1
    again = q.append(*batch(1, 2, "txn"), "txn:t", 0, since=start)
    assert again.duplicate and (again.base_offset, again.count) == (first.base_offset, 2)
    end = q.max_offset
    assert not q.append(*batch(1, 2, "txn"), "txn:t", 0, since=end).duplicate  # not looked for before it
    assert read_all(q).column("key").to_pylist().count("txn") == 4


def test_an_append_that_admit_refuses_stores_nothing(tmp_path):
    """A broker group's master checks, under the log's lock, that it still is before appending."""
    from broker.wire.errors import NotMasterError

    q = make_log(tmp_path)
    q.append(*batch(0, 2))
    checked = []

    def step_down_meanwhile():
        checked.append(q.max_offset)
        raise NotMasterError("no longer master", "")

    with pytest.raises(NotMasterError):
        q.append(*batch(2, 1), "p", 0, admit=step_down_meanwhile)
    assert checked == [2] and q.max_offset == 2
    assert q.append(*batch(2, 1), "p", 0, admit=lambda: None).base_offset == 2  # not taken for a duplicate
    assert read_all(q).column("queue_offset").to_pylist() == [0, 1, 2]


def test_offset_for_timestamp(tmp_path):
    clock = FakeClock()
    q = make_log(tmp_path, clock=clock)
    for i in range(30):
        clock.now = 1_000_000 + i * 10
        q.append(*batch(i, 1))
    assert q.offset_for_timestamp(1_000_000 + 95) == 10
    assert q.offset_for_timestamp(0) == 0
    assert q.offset_for_timestamp(9_999_999) == 30


def test_retention_by_age_and_size_removes_whole_old_segments(tmp_path):
    clock = FakeClock()
    q = make_log(tmp_path, clock=clock)
    for i in range(60):
        q.append(*batch(i, 1))
    segments = len(q.segments)
    assert segments > 2
    clock.now += 10_000
    removed = q.apply_retention(retention_ms=5_000, retention_bytes=0)
    assert len(q.segments) == 1 and q.min_offset == removed == 60 - (q.max_offset - q.min_offset)
    with pytest.raises(OffsetOutOfRangeError, match="removed by retention"):
        q.read(0, 10, 1000)
    for i in range(60, 120):
        q.append(*batch(i, 1))
    q.apply_retention(retention_ms=0, retention_bytes=4096)
    assert q.size_bytes < 4096 + q.segments[-1].size
    remaining = read_all(q, q.min_offset)
    assert remaining.column("queue_offset").to_pylist() == list(range(q.min_offset, 120))


def test_store_topics_persist_and_errors_name_the_problem(tmp_path):
    store = Store(tmp_path)
    store.create_topic("orders", 4)
    with pytest.raises(TopicExistsError):
        store.create_topic("orders", 4)
    assert store.create_topic("orders", 8, if_not_exists=True) == 4
    with pytest.raises(TopicNotFoundError, match="'nope' does not exist"):
        store.queue("nope", 0)
    with pytest.raises(QueueOutOfRangeError, match="queues 0..3"):
        store.queue("orders", 4)
    store.queue("orders", 2).append(*batch(0, 3))
    store.close()
    reopened = Store(tmp_path)
    assert reopened.topics() == {"orders": 4}
    assert reopened.queue("orders", 2).max_offset == 3
    reopened.grow_topic("orders", 6)
    reopened.delete_topic("orders")
    assert reopened.topics() == {}
    assert not (tmp_path / "topics" / "orders").exists()




def with_closed_segment(tmp_path):
    """A closed log of 60 one-message records over several segments, and the (position, raw
    header, header) of the middle record of its first, closed, segment."""
    q = make_log(tmp_path, segment_bytes=16384)
    for i in range(60):
        q.append(*batch(i, 1))
    seg = q.segments[0]
    data, records, position = seg.path.read_bytes(), [], 0
    while position < len(data):
        raw = data[position:position + HEADER.size]
        header = parse_header(raw)
        records.append((position, raw, header))
        position += header.size
    q.close()
    return q, seg, records[len(records) // 2]


def test_damage_in_a_closed_segment_is_named_on_read_and_can_be_skipped(tmp_path):
    _, seg, (position, _, header) = with_closed_segment(tmp_path)
    with open(seg.path, "r+b") as f:
        f.seek(position + header.size - 5)
        byte = f.read(1)
        f.seek(position + header.size - 5)
        f.write(bytes([byte[0] ^ 0x01]))
    q2 = make_log(tmp_path, segment_bytes=16384)
    assert q2.max_offset == 60, "a closed segment is not rescanned on start: nothing is cut"
    served = q2.read(0, 1000, 1 << 30)
    assert served.next_offset == header.base_offset, "what precedes the damage is served first"
    with pytest.raises(DamagedRecordError, match=f"pull from offset {header.next_offset}") as info:
        q2.read(header.base_offset, 1000, 1 << 30)
    assert info.value.next_offset == header.next_offset
    rest = read_all(q2, header.next_offset)
    assert rest.column("queue_offset").to_pylist() == list(range(header.next_offset, 60))


def test_a_bad_header_in_a_closed_segment_is_served_up_to_and_named_on_read(tmp_path):
    _, seg, (position, _, header) = with_closed_segment(tmp_path)
    with open(seg.path, "r+b") as f:
        f.seek(position)
        f.write(b"\x00\x00\x00\x00")  # the record's magic
    q2 = make_log(tmp_path, segment_bytes=16384)
    served = q2.read(0, 1000, 1 << 30)
    assert served.table.column("body").to_pylist() == [f"k-{i}".encode() for i in range(header.base_offset)]
    with pytest.raises(DamagedRecordError, match="bad record header") as info:
        q2.read(header.base_offset, 1000, 1 << 30)
    assert info.value.next_offset == q2.segments[1].base_offset, "the rest of the segment cannot be framed"


def test_a_closed_segment_cut_short_leaves_a_hole_and_keeps_later_segments(tmp_path):
    q, seg, (position, _, header) = with_closed_segment(tmp_path)
    next_base = q.segments[1].base_offset
    os.truncate(seg.path, position + 10)  # cut inside a record header
    q2 = make_log(tmp_path, segment_bytes=16384)
    assert [r.first_lost_offset for r in q2.cut_reports] == [header.base_offset]
    assert q2.max_offset == 60 and len(q2.segments) == len(q.segments), "later segments are kept"
    served = q2.read(0, 1000, 1 << 30).table
    assert served.column("queue_offset").to_pylist() == list(range(header.base_offset))
    with pytest.raises(DamagedRecordError, match="cut by recovery") as info:
        q2.read(header.base_offset, 10, 1 << 30)
    assert info.value.next_offset == next_base
    assert read_all(q2, next_base).column("queue_offset").to_pylist() == list(range(next_base, 60))
    assert q2.append(*batch(60, 1)).base_offset == 60


def test_an_append_on_a_full_disk_stores_nothing_and_the_next_takes_its_offsets(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", 256) as disk:
        q = QueueLog(disk / "t" / "0", segment_bytes=64 * 1024, index_interval_bytes=512, sync=True, data_dir=disk)
        acked = 0
        for i in range(5):
            acked += q.append(*batch(i * 2, 2)).count
        ballast = Ballast(disk)
        ballast.fill()
        with pytest.raises(DiskFullError, match=f"could not store 2 message.* in queue t/0: .* data dir {disk}"):
            while True:  # the last partly used page of the segment takes a record or two first
                acked += q.append(*batch(acked, 2)).count
        size, segments = q.size_bytes, len(q.segments)
        for _ in range(3):
            with pytest.raises(DiskFullError):
                q.append(*batch(acked, 2))
        assert (q.max_offset, q.size_bytes, len(q.segments)) == (acked, size, segments)
        assert sum(p.stat().st_size for p in (disk / "t" / "0").glob("*.log")) == size, "a partial record was kept"
        ballast.free()
        assert q.append(*batch(acked, 2)).base_offset == acked
        q.close()
        reopened = QueueLog(disk / "t" / "0", segment_bytes=64 * 1024, index_interval_bytes=512, sync=True)
        assert read_all(reopened).column("body").to_pylist() == [f"k-{i}".encode() for i in range(acked + 2)]
        assert reopened.cut_reports == []
        reopened.close()


def test_queues_hold_no_file_until_written(tmp_path):
    store = Store(tmp_path)
    store.create_topic("wide", 1000)
    assert open_fds(os.getpid(), tmp_path) == 0, "empty queues hold no open file"
    assert list((tmp_path / "topics" / "wide").glob("*/*.log")) == []
    store.queue("wide", 7).append(*batch(0, 1))
    assert open_fds(os.getpid(), tmp_path) == 1
    store.close()
    assert open_fds(os.getpid(), tmp_path) == 0
