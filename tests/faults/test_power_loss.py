"""Break 11: durability under power loss, not just under ``kill -9``.

A killed process loses nothing the kernel already has, so crash tests cannot tell a broker that
fsyncs before acknowledging from one that does not. Here the data dir sits on a FUSE file system
that keeps everything not fsynced in memory (file data, and creations, renames and removals not
made durable by an fsync of their directory) and forgets it on a power cut, while the broker is
killed with SIGKILL at the same moment; the broker then restarts on what survived. After every cut
the whole log is read back and judged with ``connector.history`` against every send made before it.

- ``flush = "sync"``: no acknowledged message may be lost, duplicated or reordered, on any cut.
- ``flush = "async"`` with a flush interval never reached between two cuts: acknowledged messages
  *are* lost on every cut. This is the proof that the harness sees an acknowledgement given before
  the fsync, so the sync result means something.
- ``flush = "async"`` with a short interval: the loss is measured and reported beside the number
  of acknowledgements given within one flush interval before each cut (its expected bound); it is
  not asserted, being a matter of timing. Order and uniqueness still hold.
"""

from __future__ import annotations

import os
import statistics

import pytest

from connector.client.connection import BrokerConnection, pb
from tests.faults.fault_profile import PROFILE
from tests.faults.lazymount import LazyMount, fuse_missing
from tests.faults.power_loss import PowerRun, broker_on, power_loss_run
from tests.support import pull_all, send_rows, wait_until

SHORT_FLUSH_MS = 200
SMALL_SEGMENT_BYTES = 4096  # a roll every few sends
NEVER_FLUSH_MS = 3_600_000  # far longer than any run: nothing acknowledged is fsynced between two cuts


@pytest.fixture(autouse=True)
def _fuse_available():
    missing = fuse_missing()
    if missing:  # CI installs FUSE (make test); a machine without it must not pass silently
        pytest.fail(f"the power-loss scenarios need FUSE: {missing}")


def _write(path, data: bytes, *, sync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def test_the_lazy_file_system_keeps_only_what_was_fsynced(tmp_path):
    fs = LazyMount(tmp_path).mount()
    try:
        mnt = fs.mountpoint
        (mnt / "d").mkdir()
        _write(mnt / "d" / "kept", b"durable", sync=True)
        fs.fsync_dir(mnt / "d")
        fs.fsync_dir(mnt)
        with open(mnt / "d" / "kept", "ab") as f:
            f.write(b" and volatile")  # data never fsynced
        _write(mnt / "d" / "unlinked-dir", b"x", sync=True)  # the file is fsynced, its directory never
        _write(mnt / "d" / "tmp", b"replacement", sync=True)
        os.replace(mnt / "d" / "tmp", mnt / "d" / "renamed")  # a rename never made durable
        (mnt / "lost-dir").mkdir()
        assert (mnt / "d" / "kept").read_bytes() == b"durable and volatile"  # live view before the cut
        dropped = fs.power_cut()
        assert dropped["dirty_files"] >= 1 and dropped["dirty_dirs"] == 2
        fs.mount()
        assert sorted(os.listdir(mnt)) == ["d"]
        assert os.listdir(mnt / "d") == ["kept"]
        assert (mnt / "d" / "kept").read_bytes() == b"durable"

        _write(mnt / "d" / "tmp", b"replacement", sync=True)
        os.replace(mnt / "d" / "tmp", mnt / "d" / "kept")
        fs.fsync_dir(mnt / "d")  # now the rename is durable: write-new + fsync + rename + fsync dir
        fs.power_cut()
        fs.mount()
        assert os.listdir(mnt / "d") == ["kept"]
        assert (mnt / "d" / "kept").read_bytes() == b"replacement"
    finally:
        fs.unmount()


def _run(tmp_path, cuts: int, **settings) -> PowerRun:
    return power_loss_run(tmp_path, cuts=cuts, acks_per_cut=PROFILE.power_cut_acks, producers=PROFILE.producers,
                          keys_per_producer=PROFILE.keys_per_producer, rate=PROFILE.send_rate * 2, **settings)


def _figures(run: PowerRun) -> dict:
    restarts = [c.restart_s for c in run.cuts]
    return {
        "cuts": len(run.cuts),
        "lost_per_cut": [c.new_lost for c in run.cuts],
        "restart_s_median": round(statistics.median(restarts), 3),
        "restart_s_max": round(max(restarts), 3),
        "remount_s_max": round(max(c.remount_s for c in run.cuts), 3),
        "dirty_pages_dropped": sum(c.dropped.get("dirty_pages", 0) for c in run.cuts),
        "send_failures": len(run.send_failures),
    }


def _assert_order_and_uniqueness(run: PowerRun) -> None:
    for i, cut in enumerate(run.cuts):
        v = cut.verdict
        assert (v.duplicated, v.out_of_order, v.unexpected) == (0, 0, 0), f"cut {i}: {v}"
    assert (run.final.duplicated, run.final.out_of_order, run.final.unexpected) == (0, 0, 0), str(run.final)


def test_power_cuts_with_sync_flush_lose_no_acknowledged_message(tmp_path, fault_report):
    run = _run(tmp_path, PROFILE.power_cuts_sync, flush="sync")
    fault_report("11 power cuts, sync flush", {"log": run.final}, **_figures(run))
    assert len(run.cuts) >= PROFILE.power_cuts_sync
    for i, cut in enumerate(run.cuts):
        assert cut.verdict.ok, f"cut {i} of {len(run.cuts)}: {cut.verdict}"
    assert run.final.ok, str(run.final)
    assert run.final.acked >= PROFILE.power_cuts_sync * PROFILE.power_cut_acks
    assert run.send_failures == []


def test_power_cuts_lose_what_async_flush_acknowledged_before_fsync(tmp_path, fault_report):
    run = _run(tmp_path, PROFILE.power_cuts_async, flush="async", flush_interval_ms=NEVER_FLUSH_MS)
    fault_report("11 power cuts, async flush never reached (harness check)", {"log": run.final}, **_figures(run))
    lost = [c.new_lost for c in run.cuts]
    assert all(n > 0 for n in lost), f"every cut must lose what was acknowledged without fsync, lost {lost}"
    assert run.final.lost >= sum(lost), str(run.final)
    _assert_order_and_uniqueness(run)


@pytest.mark.parametrize("segment_bytes", [None, SMALL_SEGMENT_BYTES], ids=["one-segment", "small-segments"])
def test_power_cuts_with_async_flush_report_loss_against_the_flush_interval(tmp_path, fault_report, segment_bytes):
    """With small segments, each cut finds segments rolled since the last flush, neither fsynced
    nor indexed: the restart checks them all, and order and uniqueness hold."""
    sizes = {} if segment_bytes is None else {"segment_bytes": segment_bytes}
    run = _run(tmp_path, PROFILE.power_cuts_async, flush="async", flush_interval_ms=SHORT_FLUSH_MS, **sizes)
    bound = [c.acks_in_flush_window for c in run.cuts]
    fault_report(f"11 power cuts, async flush every {SHORT_FLUSH_MS} ms, segments of {segment_bytes or 'default'} "
                 "bytes", {"log": run.final},
                 acks_within_flush_interval_before_each_cut=bound, **_figures(run))
    assert len(run.cuts) >= PROFILE.power_cuts_async
    _assert_order_and_uniqueness(run)


def test_a_committed_transaction_is_still_committed_after_a_power_cut(tmp_path):
    fs = LazyMount(tmp_path / "lazy").mount()
    proc = None
    try:
        proc = broker_on(fs, tmp_path, flush="sync")
        with BrokerConnection(proc.address) as conn:
            conn.call("CreateTopic", pb.CreateTopicRequest(topic="sink", queue_count=1))
            conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="query-1/batch-7"))
            send_rows(conn, "sink", 0, [{"key": "k", "body": b"row"}], txn_id="query-1/batch-7")
            conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="query-1/batch-7"))  # acknowledged
        fs.power_cut(proc.pid)
        proc.kill9()
        fs.mount()
        proc.start()
        with BrokerConnection(proc.address) as conn:
            assert pull_all(conn, "sink", 0).num_rows == 1
            # A sink replaying batch 7 asks first: an OPEN answer would make it write the batch twice.
            assert conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="query-1/batch-7")).state == "COMMITTED"
    finally:
        if proc is not None:
            proc.kill9()
        fs.unmount()


def test_segments_removed_by_retention_stay_removed_after_a_power_cut(tmp_path):
    fs = LazyMount(tmp_path / "lazy").mount()
    proc = None
    try:
        # Retention first runs after the sends (2 s): its removals are the last change of the directory.
        proc = broker_on(fs, tmp_path, flush="sync", segment_bytes=4096, retention_bytes=8192,
                         retention_check_interval_ms=2000)
        with BrokerConnection(proc.address) as conn:
            conn.call("CreateTopic", pb.CreateTopicRequest(topic="trail", queue_count=1))
            for seq in range(200):
                send_rows(conn, "trail", 0, [{"key": "k", "body": f"k:{seq}".encode() * 8}])
            bounds = pb.QueryOffsetsRequest(topic="trail", queue_id=0)
            assert wait_until(lambda: conn.call("QueryOffsets", bounds).min_offset > 0, 30), "retention never ran"
            removed_up_to = conn.call("QueryOffsets", bounds).min_offset
        fs.power_cut(proc.pid)
        proc.kill9()
        fs.mount()
        proc.start()
        with BrokerConnection(proc.address) as conn:
            after = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic="trail", queue_id=0))
            # Deleted segments coming back would move the queue's start back to data already removed.
            assert after.min_offset >= removed_up_to and after.max_offset == 200
            table = pull_all(conn, "trail", 0, offset=after.min_offset)
            assert table.column("queue_offset").to_pylist() == list(range(after.min_offset, 200))
    finally:
        if proc is not None:
            proc.kill9()
        fs.unmount()
