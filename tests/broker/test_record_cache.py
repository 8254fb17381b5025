"""A big record a pull read in part is served from memory to the next pull; a segment cut back or
closed forgets its own."""

from __future__ import annotations

import pytest

from broker.storage import QueueLog
from broker.storage.record import HEADER
from broker.storage.record_cache import RECENT_RECORDS, RecordCache
from broker.wire import codec
from broker.wire.errors import DamagedRecordError

BIG = 10_000  # messages of one record: its body is far over the smallest kept


def big_record(tag: str, start: int = 0) -> tuple[bytes, int]:
    table = codec.messages_to_batch([{"key": f"k{i % 7}", "body": f"{tag}-{i}".encode()}
                                     for i in range(start, start + BIG)])
    return codec.message_batch(codec.encode(table))


def bodies(q: QueueLog, offset: int, n: int) -> list[bytes]:
    return q.read(offset, n, 1 << 30).table.column("body").to_pylist()


@pytest.fixture
def log(tmp_path):
    q = QueueLog(tmp_path / "t" / "0", segment_bytes=64 << 20, index_interval_bytes=4096, sync=False)
    yield q
    q.close()


def test_the_cache_keeps_big_bodies_within_its_budget_least_recently_used_first():
    cache = RecordCache(budget_bytes=400, smallest_bytes=50)
    header = None
    cache.put("s", 0, header, b"x" * 49)  # too small to be worth it
    cache.put("s", 1, header, b"x" * 101)  # over a quarter of the budget
    assert cache.cached_bytes == 0
    for position in range(4):
        cache.put("s", 10 + position, header, b"x" * 100)
    assert cache.get("s", 10) is not None  # now the most recently used
    cache.put("t", 0, header, b"y" * 100)
    assert cache.get("s", 11) is None, "the least recently used went first"
    assert [cache.get("s", p) is not None for p in (10, 12, 13)] == [True, True, True]
    assert cache.cached_bytes == 400
    cache.forget("s")
    assert (cache.cached_bytes, cache.get("s", 10), cache.get("t", 0)[1]) == (100, None, b"y" * 100)
    assert (cache.holds("s"), cache.holds("t")) == (False, True)
    cache.put("t", 1, header, b"z" * 100, valid=lambda: False)  # a read that began before a cut
    assert (cache.get("t", 1), cache.cached_bytes) == (None, 100)


def test_small_reads_inside_a_big_record_come_from_memory_in_order(log):
    """After the first read the record is served from memory: the file's copy is damaged here
    and the reads go on, each message once and in order."""
    log.append(*big_record("a"))
    assert bodies(log, 0, 32) == [f"a-{i}".encode() for i in range(32)]
    segment = log.segments[-1]
    with open(segment.path, "r+b") as f:
        f.seek(HEADER.size + 100)
        f.write(b"\xff" * 16)
    got, offset = [], 32
    while offset < BIG:
        result = log.read(offset, 32, 1 << 30)
        got += result.table.column("body").to_pylist()
        offset = result.next_offset
    assert got == [f"a-{i}".encode() for i in range(32, BIG)]
    RECENT_RECORDS.forget(segment)
    with pytest.raises(DamagedRecordError, match="damaged on disk"):
        log.read(40, 32, 1 << 30)


def test_a_segment_cut_back_forgets_its_records_before_others_take_their_place(log):
    """A replica dropping a tail its group never had: the next record written at the same place
    is served, not the one cached there."""
    log.append(*big_record("a"))
    log.append(*big_record("b", BIG))
    assert bodies(log, BIG + 5, 3) == [f"b-{i}".encode() for i in range(BIG + 5, BIG + 8)]
    segment = log.segments[-1]
    cuts = segment.cuts
    segment.truncate_at(BIG)
    assert segment.cuts == cuts + 1, "a read that began before the cut keeps nothing it read"
    log.append(*big_record("c", BIG))
    assert bodies(log, BIG + 5, 3) == [f"c-{i}".encode() for i in range(BIG + 5, BIG + 8)]
    assert bodies(log, 5, 3) == [b"a-5", b"a-6", b"a-7"]


def test_a_reader_of_whole_records_keeps_none(log):
    """The Spark source reads whole records: caching them would only hold memory."""
    log.append(*big_record("a"))
    log.append(*big_record("b", BIG))
    before = RECENT_RECORDS.cached_bytes
    assert len(bodies(log, 0, 2 * BIG)) == 2 * BIG
    assert len(bodies(log, BIG, 1_000_000)) == BIG
    assert RECENT_RECORDS.cached_bytes == before
    bodies(log, 0, 10)
    assert RECENT_RECORDS.cached_bytes > before, "a read ending inside a record keeps it"
