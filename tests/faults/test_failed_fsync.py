"""A disk that fails an fsync (EIO), as a failing disk or a lost SAN path does.

Linux marks the pages of a failed writeback clean: reads still see them, no later fsync writes
them, and the next fsync of the file succeeds. The data dir sits on the lazy file system of the
power-loss scenarios (``tests.faults.lazyfs``), told to fail the next fsync that way; a power cut
then shows what reached the disk.

- ``flush = "async"``: the broker stops at the failed flush (exit code 1) instead of calling the
  next, successful one durable. What it had acknowledged since its last good flush is dropped;
  everything before is kept, no hole is left for a later cut to turn into a loss, and the broker
  restarted on what the disk kept takes sends again, each key in order.
- ``flush = "sync"``: the send whose fsync failed is refused with an error naming the data dir,
  and stores nothing; the broker goes on, and nothing acknowledged is lost. So is a send into a new
  segment whose directory entry an fsync failed to make durable.
- The topic table's directory fsync: the renamed table is live, so the broker takes it and stops.
"""

from __future__ import annotations

import os
import re

import pytest

from broker.launcher import BrokerProcess
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.client.transaction import Transaction
from connector.errors import BrokerUnavailableError
from connector.history import check_keyed
from tests.faults.brokers import open_file_limit
from tests.faults.lazymount import LazyMount, fuse_missing
from tests.faults.power_loss import broker_on
from tests.support import send_keyed_rounds, stored_keyed, wait_until

TOPIC, QUEUES, KEYS = "ledger", 4, 8
FLUSH_MS = 200
PAGE = 4096
SEGMENT_BYTES = 8192  # a new segment every ten sends or so
REFUSED = r"data dir .* refused the write \(Input/output error\); nothing of it was stored"


@pytest.fixture
def fs(tmp_path):
    missing = fuse_missing()
    if missing:  # CI installs FUSE (make test); a machine without it must not pass silently
        pytest.fail(f"the failed-fsync scenarios need FUSE: {missing}")
    mount = LazyMount(tmp_path / "lazy").mount()
    yield mount
    mount.unmount()


def test_a_failed_fsync_loses_the_pages_it_was_to_write(fs):
    """The harness: the failed fsync's page is still read, a later fsync succeeds, and after a
    power cut the file has a hole where that page was."""
    path = fs.mountpoint / "file"
    with open(path, "wb") as f:
        f.write(b"A" * PAGE)
        f.flush()
        os.fsync(f.fileno())
    fs.fsync_dir(fs.mountpoint)
    fs.fail_fsyncs(1)
    with open(path, "r+b") as f:
        f.seek(PAGE)
        f.write(b"B" * PAGE)
        f.flush()
        with pytest.raises(OSError, match="Input/output error"):
            os.fsync(f.fileno())
        f.write(b"C" * PAGE)
        f.flush()
        os.fsync(f.fileno())
    assert path.read_bytes() == b"A" * PAGE + b"B" * PAGE + b"C" * PAGE
    fs.power_cut()
    fs.mount()
    assert path.read_bytes() == b"A" * PAGE + bytes(PAGE) + b"C" * PAGE


def _broker(fs: LazyMount, root, **settings) -> BrokerProcess:
    """A broker on the lazy mount with ``settings``, serving the topic."""
    proc = broker_on(fs, root, **settings)
    with Admin(proc.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    return proc


def _stored_after_power_cut(fs: LazyMount, proc: BrokerProcess, topic: str = TOPIC,
                            queues: int = QUEUES) -> list[tuple[str, int]]:
    """Cut the power (killing the broker if it still runs), mount what the disk kept, restart the
    broker on it: the ``(key, seq)`` it holds."""
    fs.power_cut(*([proc.pid] if proc.proc.poll() is None else []))
    proc.proc.wait()
    fs.mount()
    proc.start()
    with BrokerConnection(proc.address) as conn:
        return stored_keyed(conn, topic, queues)


def _send_rounds(producer: Producer, acked: dict[str, int], rounds: int, topic: str = TOPIC,
                 keys: int = KEYS) -> Exception | None:
    """``rounds`` more sends of every key, one at a time; the error of the first that fails (it is
    not counted in ``acked``)."""
    try:
        send_keyed_rounds(lambda key, body: producer.send(topic, body, key=key), acked, rounds, keys)
    except Exception as exc:  # noqa: BLE001 - the broker refused or stopped: what was acked is judged
        return exc
    return None


def _judge_stop(fs: LazyMount, proc: BrokerProcess, acked: dict[str, int], before: dict[str, int], why: str,
                fault_report, what: str, topic: str = TOPIC, queues: int = QUEUES) -> None:
    """The broker stopped at a failed fsync (exit 1, ``why`` in its log). After a power cut it holds
    everything acknowledged by ``before`` (taken after a whole flush), loses at most what was
    acknowledged after, nothing twice or out of order; restarted, it continues each key."""
    assert proc.proc.wait(timeout=30) == 1
    assert why in proc.log_text()
    stored = _stored_after_power_cut(fs, proc, topic, queues)
    survivors = {key: sum(1 for k, _ in stored if k == key) for key in acked}
    with Producer(proc.address) as producer:
        for key, n in survivors.items():  # the restarted broker continues each key after what it kept
            producer.send(topic, f"{key}:{n}", key=key)
    with BrokerConnection(proc.address) as conn:
        resumed = check_keyed({key: n + 1 for key, n in survivors.items()}, stored_keyed(conn, topic, queues))
    verdict = check_keyed(acked, stored)
    kept_before = check_keyed(before, [(key, seq) for key, seq in stored if seq < before[key]])
    acked_after = sum(acked.values()) - sum(before.values())
    fault_report(what, {"log": verdict}, acked_before_failure=sum(before.values()), acked_after_failure=acked_after)
    assert kept_before.ok, f"sends flushed before the failed fsync were lost: {kept_before}"
    assert (verdict.duplicated, verdict.out_of_order, verdict.unexpected) == (0, 0, 0), str(verdict)
    assert verdict.lost <= acked_after, str(verdict)
    assert resumed.ok and resumed.duplicated == 0, str(resumed)


def test_async_flush_stops_at_a_failed_fsync_and_leaves_no_hole(fs, tmp_path, fault_report):
    proc = _broker(fs, tmp_path, flush="async", flush_interval_ms=FLUSH_MS)
    acked: dict[str, int] = {}
    try:
        with Producer(proc.address, retry_timeout=5) as producer:
            _send_rounds(producer, acked, 20)
            before = dict(acked)
            fsyncs = fs.stats()["fsyncs"]
            assert wait_until(lambda: fs.stats()["fsyncs"] >= fsyncs + QUEUES, 30)  # a whole flush since the last ack
            fs.fail_fsyncs(1)
            # On until the broker refuses: it stops at its next flush.
            assert wait_until(lambda: _send_rounds(producer, acked, 1), 60), "the broker went on"
        _judge_stop(fs, proc, acked, before, "stopped: an fsync of", fault_report, "a failed fsync, async flush")
    finally:
        proc.kill9()


def test_async_flush_stops_at_a_failed_fsync_of_a_rolled_segment(fs, tmp_path, fault_report):
    """With ``flush = "async"`` a segment that filled up is fsynced by the next flush, not by the
    send that filled it. When that fsync fails, the broker stops as at any failed flush, and the
    segments rolled after it go too: kept, they would sit behind a hole. A segment per record
    here, so that the first fsync of the first flush after the restart is of a rolled segment."""
    proc = _broker(fs, tmp_path, flush="async", flush_interval_ms=FLUSH_MS, segment_bytes=1)
    acked: dict[str, int] = {}
    try:
        with Producer(proc.address, retry_timeout=5) as producer:
            _send_rounds(producer, acked, 3)
        before = dict(acked)
        assert proc.stop() == 0  # every file fsynced
        proc.start()
        fs.fail_fsyncs(1)
        with Producer(proc.address, retry_timeout=5) as producer:
            assert wait_until(lambda: _send_rounds(producer, acked, 1), 60), "the broker went on"
        # It refuses from the failed fsync on, and logs what it dropped just after: read the log once it exited.
        assert proc.proc.wait(timeout=30) == 1
        failed = re.search(r"an fsync of \S*?(\d+)\.log failed", proc.log_text())
        dropped = re.search(r"offsets (\d+)\.\.(\d+) were acknowledged but not fsynced", proc.log_text())
        assert failed and dropped, proc.log_text()[-2000:]
        assert int(dropped[2]) > int(failed[1]), "the segments rolled after the failed one were dropped too"
        _judge_stop(fs, proc, acked, before, "stopped: an fsync of", fault_report,
                    "a failed fsync of a rolled segment, async flush")
    finally:
        proc.kill9()


def test_async_flush_stops_at_a_failed_fsync_of_a_file_closed_for_room(fs, tmp_path, fault_report):
    """More queues written within one flush interval than the broker may keep files open
    (``broker.storage.open_files``): it fsyncs files early to close them. When such an fsync fails,
    the broker stops as at a failed flush. The flush interval is longer than the scenario, so
    that the failed fsync is one of those; a clean restart makes the first sends durable."""
    wide, queues, keys = "wide", 96, 384  # over a budget of 64 files (half the limit)
    proc = broker_on(fs, tmp_path, wrapper=open_file_limit(128), flush="async",
                     flush_interval_ms=600_000)
    acked: dict[str, int] = {}
    try:
        with Admin(proc.address) as admin:
            admin.create_topic(wide, queues)
        with Producer(proc.address, retry_timeout=5) as producer:
            _send_rounds(producer, acked, 2, wide, keys)
        before = dict(acked)
        assert proc.stop() == 0  # every file fsynced
        proc.start()
        fs.fail_fsyncs(1)
        with Producer(proc.address, retry_timeout=5) as producer:
            assert wait_until(lambda: _send_rounds(producer, acked, 1, wide, keys), 60), "the broker went on"
        _judge_stop(fs, proc, acked, before, "to close it within the open-file budget) failed", fault_report,
                    "a failed fsync of a file closed for room", wide, queues)
    finally:
        proc.kill9()


def test_sync_flush_refuses_the_send_whose_fsync_failed_and_goes_on(fs, tmp_path, fault_report):
    proc = _broker(fs, tmp_path, flush="sync")
    acked: dict[str, int] = {}
    try:
        with Producer(proc.address, retry_timeout=5) as producer:
            _send_rounds(producer, acked, 10)
            fs.fail_fsyncs(1)
            with pytest.raises(BrokerUnavailableError, match=REFUSED):
                producer.send(TOPIC, f"k0:{acked['k0']}", key="k0")
            assert _send_rounds(producer, acked, 10) is None  # sending again is safe
        assert proc.proc.poll() is None
        verdict = check_keyed(acked, _stored_after_power_cut(fs, proc))
    finally:
        proc.kill9()
    fault_report("a failed fsync, sync flush", {"log": verdict})
    assert verdict.ok and verdict.duplicated == 0, str(verdict)


def test_sync_flush_refuses_a_send_into_a_segment_whose_directory_fsync_failed(fs, tmp_path, fault_report):
    """A new segment is findable after a power cut only once its directory is fsynced: the send
    that failed to is refused, the next one makes it durable, and a cut right after loses nothing."""
    proc = _broker(fs, tmp_path, flush="sync", segment_bytes=SEGMENT_BYTES)
    acked: dict[str, int] = {}
    try:
        with Producer(proc.address, retry_timeout=5) as producer:
            _send_rounds(producer, acked, 5)
            fs.fail_fsyncs(1, directories=True)
            failed = wait_until(lambda: _send_rounds(producer, acked, 1) or fs.stats()["failed_dir_fsyncs"], 60)
            assert _send_rounds(producer, acked, 1) is None
        verdict = check_keyed(acked, _stored_after_power_cut(fs, proc))
    finally:
        proc.kill9()
    fault_report("a failed directory fsync, sync flush", {"log": verdict})
    assert isinstance(failed, BrokerUnavailableError) and re.search(REFUSED, str(failed)), failed
    assert verdict.ok and verdict.duplicated == 0, str(verdict)


def test_a_staged_send_whose_file_could_not_be_made_durable_is_staged_once(fs, tmp_path, fault_report):
    """A transaction's first staged send creates its file: when the directory fsync that makes the
    file findable fails, the send is refused and nothing of it kept, so the client's resend is
    staged once, and the commit stores every message once."""
    proc = _broker(fs, tmp_path, flush="sync")
    staged: dict[str, int] = {}
    try:
        with Producer(proc.address, retry_timeout=10) as producer:
            txn = Transaction(producer).begin()
            fs.fail_fsyncs(1, directories=True)
            send_keyed_rounds(lambda key, body: txn.send(TOPIC, body, key=key), staged, 5, KEYS)
            assert fs.stats()["failed_dir_fsyncs"] == 1
            assert txn.commit() == sum(staged.values())
        with BrokerConnection(proc.address) as conn:
            verdict = check_keyed(staged, stored_keyed(conn, TOPIC, QUEUES))
    finally:
        proc.kill9()
    fault_report("a failed directory fsync of a staged file", {"log": verdict})
    assert verdict.ok and verdict.duplicated == 0, str(verdict)


def test_a_topic_delete_whose_directory_fsync_failed_stops_the_broker(fs, tmp_path, fault_report):
    """The topic table is replaced by a rename. When the directory fsync after it fails, a restart
    reads the new table (a power cut might bring the old one back): the broker takes it as its
    table and stops, as at a failed flush. It never acknowledges a send into the deleted topic,
    which a restart would not have, and the other topic keeps everything acknowledged."""
    doomed, doomed_queues = "doomed", 2
    proc = _broker(fs, tmp_path, flush="sync")
    acked: dict[str, int] = {}
    into_doomed: dict[str, int] = {}
    try:
        with Admin(proc.address) as admin:
            admin.create_topic(doomed, doomed_queues)
        with Producer(proc.address, retry_timeout=5) as producer:
            assert _send_rounds(producer, acked, 3) is None
            assert _send_rounds(producer, into_doomed, 3, doomed) is None
            fs.fail_fsyncs(1, directories=True)
            with Admin(proc.address) as admin, pytest.raises(BrokerUnavailableError, match="topics.json"):
                admin.delete_topic(doomed)
            assert fs.stats()["failed_dir_fsyncs"] == 1
            refused = _send_rounds(producer, dict(into_doomed), 1, doomed)
        assert proc.proc.wait(timeout=30) == 1
        assert refused is not None, "a send into the deleted topic was acknowledged"
        proc.start()  # no power cut: the renamed table is the one on disk
        with Admin(proc.address) as admin:
            assert doomed not in {t.name for t in admin.list_topics()}
        with BrokerConnection(proc.address) as conn:
            verdict = check_keyed(acked, stored_keyed(conn, TOPIC, QUEUES))
    finally:
        proc.kill9()
    fault_report("a failed directory fsync of the topic table", {"log": verdict})
    assert verdict.ok and verdict.duplicated == 0, str(verdict)
