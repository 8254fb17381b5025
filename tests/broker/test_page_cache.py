"""The broker leaves only the log written last in the page cache (``broker.storage.page_cache``):
older log, once on disk, is dropped from it, reads back whole and in order from disk, and a
restart finds all of it. Residency is read with util-linux's ``fincore`` (``resident_bytes``)."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time
from pathlib import Path

import pytest

from broker.storage import page_cache
from broker.storage.page_cache import (
    CHUNK_BYTES,
    WRITE_UNIT_BYTES,
    PageCacheWindow,
    _largest_folio_bytes,
    reports_free_pages,
    window_bytes,
)
from broker.storage.queue_log import QueueLog
from broker.wire import codec
from connector.client.connection import BrokerConnection, pb
from connector.history import check_keyed
from tests.faults.brokers import broker_process
from tests.faults.workload import body, parse_body
from tests.support import pull_all, resident_bytes, send_rows, wait_until

MIB = 1 << 20
QUEUES, KEYS, ROUNDS = 2, 8, 3_000  # 24,000 messages of about 1 KiB: 12 MiB per queue
PADDING = b"|" + b"x" * 1_000


def _resident_bytes(logs: Path) -> int:
    """Bytes of the queue logs under ``logs`` (a topic's directory) in the page cache."""
    return resident_bytes(logs.glob("*/*.log"))


def _send_keyed(conn: BrokerConnection, topic: str, rows_per_send: int = 250) -> dict[str, int]:
    """``ROUNDS`` messages of each key, bodies ``"<key>:<seq>|xxx..."``, key ``k<i>`` on queue ``i % QUEUES``."""
    for first in range(0, ROUNDS, rows_per_send):
        for k in range(KEYS):
            rows = [{"key": f"k{k}", "body": body(f"k{k}", seq) + PADDING}
                    for seq in range(first, min(first + rows_per_send, ROUNDS))]
            send_rows(conn, topic, k % QUEUES, rows)
    return {f"k{k}": ROUNDS for k in range(KEYS)}


def _stored(conn: BrokerConnection, topic: str) -> list[tuple[str, int]]:
    return [parse_body(raw.split(b"|", 1)[0]) for q in range(QUEUES)
            for raw in pull_all(conn, topic, q).column("body").to_pylist()]


def _written(logs: Path) -> int:
    return sum(path.stat().st_size for path in logs.glob("*/*.log"))


@pytest.mark.parametrize(("flush", "rows_per_send", "segment_mib", "files"), [
    ("async", 250, 4, 6), ("sync", 250, 4, 6),
    ("async", 2_500, 16, 2),  # writes of 2.5 MB: the kernel caches them in its largest folios
])
def test_log_older_than_the_window_leaves_the_page_cache_and_still_reads_back(tmp_path, topic_name, flush,
                                                                              rows_per_send, segment_mib, files):
    """A 4 MiB window over 24 MiB of log (2 queues): what stays cached is at most the window, the
    unflushed tail and each file's last partial chunk; every key reads back complete and in order,
    and again after a restart. Old log is dropped as new log is written (its pages are then reused
    at once), so the wait writes a message to another topic at each look."""
    data = tmp_path / "data"
    broker = broker_process(data / "broker", page_cache_bytes=4 * MIB, segment_bytes=segment_mib * MIB,
                            flush=flush, flush_interval_ms=50).start()
    try:
        with BrokerConnection(broker.address) as conn:
            conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=QUEUES))
            sent = _send_keyed(conn, topic_name, rows_per_send)
            logs = data / "broker" / "topics" / topic_name
            written = _written(logs)
            assert written > 20 * MIB and len(list(logs.glob("*/*.log"))) == files
            conn.call("CreateTopic", pb.CreateTopicRequest(topic="nudges", queue_count=1))

            def mostly_dropped() -> bool:
                send_rows(conn, "nudges", 0, [{"key": "n", "body": b"x"}])
                return _resident_bytes(logs) <= 4 * MIB + files * CHUNK_BYTES

            assert wait_until(mostly_dropped, timeout=30, interval=0.1), \
                f"{_resident_bytes(logs)} of {written} bytes still cached"
            verdict = check_keyed(sent, _stored(conn, topic_name))  # read from disk
            assert verdict.ok and verdict.duplicated == 0, verdict
        broker.stop()
        broker.start()
        with BrokerConnection(broker.address) as conn:
            verdict = check_keyed(sent, _stored(conn, topic_name))
            assert verdict.ok and verdict.duplicated == 0, verdict
    finally:
        broker.stop()


def test_with_no_window_the_kernel_keeps_the_log_cached(tmp_path, topic_name):
    """``page_cache_bytes = 0``: nothing is dropped, so what the test above finds uncached was dropped
    by the broker, not by the kernel."""
    data = tmp_path / "data"
    broker = broker_process(data, page_cache_bytes=0, segment_bytes=4 * MIB, flush_interval_ms=50).start()
    try:
        with BrokerConnection(broker.address) as conn:
            conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=QUEUES))
            sent = _send_keyed(conn, topic_name)
            time.sleep(0.5)  # ten flushes: a window wrongly kept would have dropped by now
            conn.call("CreateTopic", pb.CreateTopicRequest(topic="nudges", queue_count=1))
            send_rows(conn, "nudges", 0, [{"key": "n", "body": b"x" * 1000}] * 1000)
            logs = data / "topics" / topic_name
            written = _written(logs)
            assert _resident_bytes(logs) >= written * 0.9
            verdict = check_keyed(sent, _stored(conn, topic_name))
            assert verdict.ok and verdict.duplicated == 0, verdict
    finally:
        broker.stop()


def _virtio_device(devices: Path, name: str, device_id: str, features: str) -> None:
    (devices / name).mkdir(parents=True)
    (devices / name / "device").write_text(device_id + "\n")
    (devices / name / "features").write_text(features + "\n")


def test_the_default_window_is_kept_where_a_balloon_reports_free_pages(tmp_path):
    """What ``page_cache_bytes = -1`` reads: a virtio balloon (device 0x0005) with feature bit 5
    (free page reporting) set; the bits of this machine's balloon and of one without reporting."""
    reporting, plain, none = tmp_path / "reporting", tmp_path / "plain", tmp_path / "none"
    _virtio_device(reporting, "virtio0", "0x0005", "0110010100000000000000000000000010" + "0" * 94)
    _virtio_device(reporting, "virtio1", "0x0002", "0010001001100100000000000000000100" + "0" * 94)
    _virtio_device(plain, "virtio0", "0x0005", "0110000100000000000000000000000010" + "0" * 94)
    _virtio_device(none, "virtio0", "0x0001", "1100010110111011000000000000000100" + "0" * 94)
    assert [reports_free_pages(devices) for devices in (reporting, plain, none, tmp_path / "absent")] == \
        [True, False, False, False]
    assert window_bytes(0) == 0 and window_bytes(4 * MIB) == 4 * MIB


def test_chunks_are_the_page_cache_s_largest_folio(tmp_path):
    """A drop frees only the folios it covers whole, so a chunk is a huge page where the kernel says
    how large one is, and 2 MiB where it does not."""
    limit = tmp_path / "hpage_pmd_size"
    limit.write_text("2097152\n")
    assert _largest_folio_bytes(limit) == 2 * MIB
    limit.write_text("536870912\n")  # 64 KiB pages
    assert _largest_folio_bytes(limit) == 512 * MIB
    assert _largest_folio_bytes(tmp_path / "absent") == 2 * MIB


def _queue(directory: Path, window: PageCacheWindow | None, sync: bool = True) -> QueueLog:
    return QueueLog(directory, segment_bytes=64 * MIB, index_interval_bytes=4096, sync=sync, page_cache=window)


def _append_chunks(queue: QueueLog, chunks: int) -> None:
    batch = codec.encode(codec.messages_to_batch([{"key": "k", "body": b"x" * 1000}] * (CHUNK_BYTES // 1024)))
    for _ in range(chunks):
        queue.append(batch, CHUNK_BYTES // 1024)


def test_a_window_smaller_than_a_chunk_keeps_one_chunk(tmp_path):
    """The window is rounded up to whole chunks: one asked for less than a chunk used to keep none."""
    assert [PageCacheWindow(size).budget_chunks for size in (1, CHUNK_BYTES, CHUNK_BYTES + 1)] == [1, 1, 2]
    queue = _queue(tmp_path / "t" / "0", PageCacheWindow(1))
    _append_chunks(queue, 4)
    last_whole_chunk = (queue.segments[-1].synced_size // CHUNK_BYTES - 1) * CHUNK_BYTES
    assert resident_bytes([queue.segments[-1].path]) >= queue.segments[-1].size - last_whole_chunk


def test_what_a_drop_frees_is_counted_as_the_kernel_reports_it(tmp_path):
    """Each chunk dropped from a cache that held it counts whole; one dropped again counts nothing."""
    queue = _queue(tmp_path / "t" / "0", window := PageCacheWindow(CHUNK_BYTES))
    _append_chunks(queue, 4)
    assert window.dropped_bytes > 0 and window.dropped_bytes % CHUNK_BYTES == 0
    segment = queue.segments[-1]
    assert segment.drop_cached(0, CHUNK_BYTES) == (0, 0)  # the window dropped it already
    kept = segment.size - window.dropped_bytes
    assert resident_bytes([segment.path]) == -(-kept // 4096) * 4096  # whole pages


def test_a_drop_that_frees_nothing_of_a_cached_chunk_is_logged_once(tmp_path, caplog):
    """Pages mapped by a process stay cached through a drop, as pages of folios larger than a chunk
    do: the broker says so, once for the two queues whose first chunk is mapped, instead of counting
    them dropped."""
    window = PageCacheWindow(2 * CHUNK_BYTES)  # room for both first chunks
    first, second = _queue(tmp_path / "t" / "0", window), _queue(tmp_path / "t" / "1", window)
    _append_chunks(first, 1)
    _append_chunks(second, 1)
    with contextlib.ExitStack() as stack:
        for queue in (first, second):
            file = stack.enter_context(open(queue.segments[-1].path, "rb"))
            mapped = stack.enter_context(mmap.mmap(file.fileno(), CHUNK_BYTES, access=mmap.ACCESS_READ))
            assert sum(mapped[i] for i in range(0, CHUNK_BYTES, 4096)) > 0  # every page of the first chunk mapped
        with caplog.at_level(logging.WARNING, logger="broker.storage.page_cache"):
            _append_chunks(first, 4)
        warnings = [r.getMessage() for r in caplog.records if "freed nothing" in r.getMessage()]
        assert len(warnings) == 1 and str(first.segments[-1].path) in warnings[0], warnings
        assert resident_bytes([second.segments[-1].path]) >= CHUNK_BYTES  # dropped, and still cached
    assert 0 < window.dropped_bytes <= first.segments[-1].size - 2 * CHUNK_BYTES  # neither the window's nor the first


def test_consecutive_chunks_of_a_segment_are_dropped_in_one_run(tmp_path):
    """A commit's append frees dozens of chunks at once: those that follow each other in one segment
    go in one drop (one system call, not one per chunk); a gap or another segment starts a new one."""
    first, second = (_queue(tmp_path / "t" / str(q), None).segments[-1] for q in (0, 1))
    chunks = [(first, 0), (first, 1), (first, 2), (second, 0), (second, 1), (first, 4), (first, 5), (second, 2)]
    assert page_cache._runs(chunks) == [(first, 0, 3), (second, 0, 2), (first, 4, 2), (second, 2, 1)]
    assert page_cache._runs([]) == []


def test_without_cachestat_a_drop_counts_what_it_asked_for(tmp_path, monkeypatch):
    """Where the kernel cannot say what is cached (older than 6.5), a drop counts its whole range."""
    monkeypatch.setattr(page_cache, "_libc", None)
    path = tmp_path / "file"
    path.write_bytes(b"x" * CHUNK_BYTES)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert page_cache.cached_bytes(fd, 0, CHUNK_BYTES) is None
        assert page_cache.drop_from_cache(fd, 0, CHUNK_BYTES) == (CHUNK_BYTES, CHUNK_BYTES)
    finally:
        os.close(fd)


def test_a_file_closed_for_room_is_opened_for_its_drop(tmp_path):
    """A segment whose file ``OpenFiles`` closed still has its chunks dropped: they used to stay cached."""
    queue = _queue(tmp_path / "t" / "0", PageCacheWindow(64 * MIB))
    _append_chunks(queue, 2)
    segment = queue.segments[-1]
    assert segment.close_if_idle()
    assert segment.drop_cached(0, CHUNK_BYTES) == (CHUNK_BYTES, CHUNK_BYTES)
    assert segment.cached_chunks(CHUNK_BYTES) == [1]


def test_log_not_yet_durable_counts_so_a_burst_of_appends_takes_freed_pages(tmp_path):
    """Between two flushes, appends beyond the window drop as much older log as they write. The window
    used to count only durable log: an exactly-once commit (hundreds of megabytes inside one flush
    interval) found little to drop and took pages nobody had used, several times slower on a virtual
    machine that hands free pages back to its host."""
    window = PageCacheWindow(4 * CHUNK_BYTES)
    queue = _queue(tmp_path / "t" / "0", window, sync=False)
    _append_chunks(queue, 4)
    queue.flush()
    assert window.dropped_bytes == 0 and window.unsynced_bytes == 0  # the window is full, none beyond it
    _append_chunks(queue, 3)  # no flush: none of it durable yet
    assert window.unsynced_bytes >= 3 * CHUNK_BYTES
    assert window.dropped_bytes >= 2 * CHUNK_BYTES  # the oldest, to make room for the burst
    queue.flush()
    assert window.unsynced_bytes == 0


def test_a_closed_segment_s_unsynced_log_no_longer_counts(tmp_path):
    """A segment closed with log not yet durable (its topic deleted) would otherwise shrink the window for good."""
    window = PageCacheWindow(4 * CHUNK_BYTES)
    queue = _queue(tmp_path / "t" / "0", window, sync=False)
    _append_chunks(queue, 1)
    assert window.unsynced_bytes > 0
    queue.segments[-1].close()
    assert window.unsynced_bytes == 0


@pytest.mark.parametrize(("window", "burst"), [(True, True), (True, False), (False, True)],
                         ids=["commit-with-window", "send-with-window", "commit-without-window"])
def test_a_commit_s_append_is_written_a_write_unit_at_a_time_where_a_window_is_kept(tmp_path, monkeypatch, window,
                                                                                    burst):
    """Where the window is kept, no write of a commit's append (``burst``) takes more than
    ``WRITE_UNIT_BYTES``: a write of megabytes gets new pages in 2 MiB folios, which came from memory
    the host had taken back. Any other record is one write. Either way every message reads back, in order."""
    sizes: list[int] = []
    pwritev = os.pwritev

    def recorded(fd, buffers, offset):
        sizes.append(sum(memoryview(buffer).nbytes for buffer in buffers))
        return pwritev(fd, buffers, offset)

    queue = _queue(tmp_path / "t" / "0", PageCacheWindow(64 * MIB) if window else None)
    bodies = [f"{i:07d}".encode() * 150 for i in range(6_000)]  # a record of about 6.3 MB
    batch = codec.encode(codec.messages_to_batch([{"key": f"k{i % 7}", "body": b} for i, b in enumerate(bodies)]))
    monkeypatch.setattr(os, "pwritev", recorded)
    for _ in range(2):
        queue.append(batch, len(bodies), burst=burst)
    monkeypatch.undo()
    assert sum(sizes) == queue.segments[-1].size
    if window and burst:
        assert max(sizes) <= WRITE_UNIT_BYTES < queue.segments[-1].size // 2
    else:
        assert sizes == [queue.segments[-1].size // 2] * 2
    read = queue.read(0, 1_000_000, 1 << 30).table
    assert read.column("body").to_pylist() == bodies * 2
    assert read.column("queue_offset").to_pylist() == list(range(2 * len(bodies)))


def test_log_cached_before_a_restart_is_dropped_in_its_turn(tmp_path, topic_name):
    """Log the page cache still holds from before a restart (written here with no window) joins the
    window at start: log written after it pushes it out, and it still reads back whole and in order."""
    data = tmp_path / "data"
    config = {"segment_bytes": 16 * MIB, "flush_interval_ms": 50}
    broker = broker_process(data, page_cache_bytes=0, **config).start()
    try:
        with BrokerConnection(broker.address) as conn:
            conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=QUEUES))
            sent = _send_keyed(conn, topic_name)
    finally:
        broker.stop()
    logs = data / "topics" / topic_name
    assert _resident_bytes(logs) >= _written(logs) * 0.9
    broker = broker_process(data, page_cache_bytes=4 * MIB, **config).start()
    try:
        with BrokerConnection(broker.address) as conn:
            conn.call("CreateTopic", pb.CreateTopicRequest(topic="nudges", queue_count=1))

            def mostly_dropped() -> bool:
                send_rows(conn, "nudges", 0, [{"key": "n", "body": b"x" * 1000}] * 1000)
                return _resident_bytes(logs) <= QUEUES * CHUNK_BYTES  # each file's last, partial chunk

            assert wait_until(mostly_dropped, timeout=30, interval=0.1), \
                f"{_resident_bytes(logs)} of {_written(logs)} bytes still cached"
            verdict = check_keyed(sent, _stored(conn, topic_name))
            assert verdict.ok and verdict.duplicated == 0, verdict
    finally:
        broker.stop()
