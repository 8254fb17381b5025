"""TransactionManager: life cycle, idempotent commit, abort, expiry, restart recovery, torn frames."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import crc32c
import pytest

from broker.staged_files import FRAME_HEADER, split_frames
from broker.transactions import ABORTED, COMMITTED, COMMITTING, OPEN, TransactionManager, staged_file_name
from broker.wire.errors import InternalBrokerError, InvalidRequestError, TransactionError, TransactionNotFoundError
from tests.support import FakeClock
from tests.tmpfs import Ballast, mounted_tmpfs

TIMEOUT = 1_000


@pytest.fixture
def clock():
    return FakeClock(5_000_000)


@pytest.fixture
def directory(tmp_path):
    return tmp_path / "txn"


@pytest.fixture
def open_manager(directory, clock):
    opened = []

    def make(**kwargs):
        kwargs.setdefault("timeout_ms", TIMEOUT)
        manager = TransactionManager(directory, clock=clock, steady=clock, **kwargs)
        opened.append(manager)
        return manager

    yield make
    for manager in opened:
        manager.close()


@pytest.fixture
def txns(open_manager):
    return open_manager()


def staged_files(directory):
    """The live transactions' staged-data files (not the pool of finished ones)."""
    return sorted(p.name for p in (directory / "staged").iterdir() if not p.name.startswith("free-"))


def pooled_files(directory):
    return sorted(p for p in (directory / "staged").iterdir() if p.name.startswith("free-"))


def test_begin_stage_commit_in_send_order(txns):
    assert txns.begin("t1") == OPEN
    txns.stage("t1", "orders", 2, b"a")
    txns.stage("t1", "orders", 0, memoryview(b"xbx")[1:2])
    txns.stage("t1", "audit", 2, memoryview(b""))
    txns.stage("t1", "orders", 2, bytearray(b"c" * 10_000))
    already, entries = txns.prepare_commit("t1")
    assert not already
    assert entries == [("orders", 2, b"a"), ("orders", 0, b"b"), ("audit", 2, b""), ("orders", 2, b"c" * 10_000)]
    assert txns.state("t1") == COMMITTING
    txns.mark_committed("t1")
    assert txns.state("t1") == COMMITTED


def test_staged_rows_are_known_only_while_every_send_told_its_count(txns, open_manager):
    txns.begin("told")
    txns.stage("told", "orders", 0, b"a", rows=3)
    txns.stage("told", "orders", 1, b"b", rows=5)
    txns.stage("told", "orders", 0, b"a", sequence=0, rows=3)  # a resend: not staged again
    assert txns.staged_rows("told") == [3, 5]
    txns.begin("untold")
    txns.stage("untold", "orders", 0, b"a", rows=3)
    txns.stage("untold", "orders", 0, b"b")  # a slave replaying its master's stage does not know
    txns.stage("untold", "orders", 0, b"c", rows=1)
    assert txns.staged_rows("untold") is None
    txns.prepare_commit("told")
    assert txns.staged_rows("told") == [3, 5]  # a retried commit still has them
    txns.close()
    assert open_manager().staged_rows("told") is None  # staged before a restart: the commit counts them


def test_empty_transaction_commits(txns, directory):
    txns.begin("t")
    assert txns.prepare_commit("t") == (False, [])
    txns.mark_committed("t")
    assert txns.state("t") == COMMITTED
    assert staged_files(directory) == []


def test_committed_data_is_dropped(txns, directory):
    txns.begin("t")
    txns.stage("t", "x", 0, b"payload")
    assert len(staged_files(directory)) == 1
    txns.prepare_commit("t")
    txns.mark_committed("t")
    assert staged_files(directory) == []


def test_replayed_commit_is_idempotent(txns):
    txns.begin("t")
    txns.stage("t", "x", 0, b"1")
    txns.prepare_commit("t")
    txns.mark_committed("t")
    assert txns.prepare_commit("t") == (True, [])
    txns.mark_committed("t")  # no-op
    assert txns.begin("t") == COMMITTED  # a begin of a finished id reports it, unchanged
    assert txns.state("t") == COMMITTED


def test_the_queue_ends_at_prepare_are_recorded_once_and_survive_a_restart(open_manager):
    """Where a re-applied commit looks for what its first attempt appended: the ends of its
    queues when it moved to COMMITTING, not when it is re-applied."""
    txns = open_manager()
    txns.begin("t")
    for topic, queue_id in (("x", 1), ("y", 0), ("x", 1)):
        txns.stage("t", topic, queue_id, b"m")
    asked = []

    def ends(queues):
        asked.append(queues)
        return {queue: 10 * len(asked) + queue[1] for queue in queues}

    txns.prepare_commit("t", ends)
    txns.prepare_commit("t", ends)  # a retry: already COMMITTING, ends not asked again
    assert asked == [[("x", 1), ("y", 0)]]
    assert txns.commit_starts("t") == {("x", 1): 11, ("y", 0): 10}
    txns.close()
    assert open_manager().commit_starts("t") == {("x", 1): 11, ("y", 0): 10}


def test_prepare_twice_returns_the_entries_again(txns):
    txns.begin("t")
    txns.stage("t", "x", 1, b"1")
    assert txns.prepare_commit("t") == (False, [("x", 1, b"1")])
    assert txns.prepare_commit("t") == (False, [("x", 1, b"1")])


def test_begin_is_idempotent_while_open(txns):
    assert txns.begin("t") == OPEN
    txns.stage("t", "x", 0, b"1")
    assert txns.begin("t") == OPEN
    assert txns.prepare_commit("t") == (False, [("x", 0, b"1")])
    assert txns.begin("t") == COMMITTING


def test_transactions_are_independent(txns):
    txns.begin("a")
    txns.begin("b")
    txns.stage("a", "x", 0, b"a1")
    txns.stage("b", "x", 0, b"b1")
    txns.stage("a", "x", 0, b"a2")
    txns.abort("b")
    assert txns.prepare_commit("a") == (False, [("x", 0, b"a1"), ("x", 0, b"a2")])


def test_abort_drops_staged_data(txns, directory):
    txns.begin("t")
    txns.stage("t", "x", 0, b"1")
    txns.abort("t")
    assert txns.state("t") == ABORTED
    assert staged_files(directory) == []
    txns.abort("t")  # aborting an aborted id is a no-op
    assert txns.begin("t") == ABORTED
    with pytest.raises(TransactionError, match=r"'t' was aborted \(by AbortTxn\); begin a new transaction"):
        txns.prepare_commit("t")
    with pytest.raises(TransactionError, match="was aborted"):
        txns.stage("t", "x", 0, b"2")


def test_abort_rules(txns):
    with pytest.raises(TransactionNotFoundError, match="'nope' not found"):
        txns.abort("nope")
    txns.begin("t")
    txns.prepare_commit("t")
    with pytest.raises(TransactionError, match="being committed; it cannot be aborted"):
        txns.abort("t")
    txns.mark_committed("t")
    with pytest.raises(TransactionError, match="already committed; it cannot be aborted") as info:
        txns.abort("t")
    assert not isinstance(info.value, TransactionNotFoundError)


def test_unknown_ids(txns):
    for call in (lambda: txns.stage("nope", "x", 0, b""), lambda: txns.prepare_commit("nope")):
        with pytest.raises(TransactionNotFoundError, match="'nope' not found: begin it first"):
            call()
    with pytest.raises(TransactionNotFoundError):
        txns.mark_committed("nope")
    assert txns.state("nope") is None


def test_stage_requires_open(txns):
    txns.begin("t")
    txns.prepare_commit("t")
    with pytest.raises(TransactionError, match="cannot stage a send in transaction 't': it is COMMITTING"):
        txns.stage("t", "x", 0, b"")
    txns.mark_committed("t")
    with pytest.raises(TransactionError, match="it is COMMITTED"):
        txns.stage("t", "x", 0, b"")


def test_mark_committed_requires_prepare(txns):
    txns.begin("t")
    with pytest.raises(TransactionError, match="is OPEN, not COMMITTING; prepare_commit must come first"):
        txns.mark_committed("t")


def test_expire_aborts_idle_open_transactions(txns, clock, directory):
    txns.begin("idle")
    txns.begin("busy")
    txns.begin("long", timeout_ms=10 * TIMEOUT)
    txns.stage("idle", "x", 0, b"1")
    clock.now += TIMEOUT - 1
    txns.stage("busy", "x", 0, b"1")  # activity refreshes the timeout
    assert txns.expire() == []
    clock.now += 1
    assert txns.expire() == ["idle"]
    assert txns.state("idle") == ABORTED
    assert txns.state("busy") == OPEN and txns.state("long") == OPEN
    with pytest.raises(TransactionError, match=r"was aborted \(timed out after 1000 ms without activity\)"):
        txns.prepare_commit("idle")
    assert len(staged_files(directory)) == 1  # only "busy" keeps staged data
    clock.now += 10 * TIMEOUT
    assert sorted(txns.expire()) == ["busy", "long"]


def test_expire_leaves_committing_alone(txns, clock):
    txns.begin("t")
    txns.prepare_commit("t")
    clock.now += 100 * TIMEOUT
    assert txns.expire() == []
    assert txns.state("t") == COMMITTING


def test_timeout_is_enforced_without_waiting_for_expire(txns, clock):
    txns.begin("t")
    clock.now += TIMEOUT
    with pytest.raises(TransactionError, match="timed out after 1000 ms"):
        txns.stage("t", "x", 0, b"1")
    assert txns.state("t") == ABORTED
    txns.begin("u")
    clock.now += TIMEOUT
    with pytest.raises(TransactionError, match="timed out"):
        txns.prepare_commit("u")
    txns.begin("v")
    clock.now += TIMEOUT
    assert txns.begin("v") == ABORTED


def test_idle_timeouts_count_on_the_steady_clock_not_the_wall_clock(directory):
    """A step of the system clock (an NTP correction, ``date -s``) neither aborts an open
    transaction nor keeps an idle one: only the steady clock counts idle time."""
    wall, steady = FakeClock(5_000_000), FakeClock(0)
    txns = TransactionManager(directory, timeout_ms=TIMEOUT, clock=wall, steady=steady)
    try:
        txns.begin("t")
        txns.stage("t", "x", 0, b"1")
        wall.now += 3_600_000  # stepped an hour forward
        assert txns.expire() == [] and txns.state("t") == OPEN
        txns.stage("t", "x", 0, b"2")
        steady.now += TIMEOUT // 2
        assert txns.open_transactions() == [("t", OPEN, TIMEOUT // 2, TIMEOUT // 2, 2 * (8 + 2 + 1 + 4 + 1))]
        wall.now -= 7_200_000  # and two hours back
        steady.now += TIMEOUT // 2
        assert txns.expire() == ["t"]
    finally:
        txns.close()


def test_restart_keeps_open_transactions_and_staged_data(open_manager, clock):
    first = open_manager()
    first.begin("t", timeout_ms=5 * TIMEOUT)
    first.stage("t", "x", 3, b"one")
    first.stage("t", "y", 0, b"two")
    first.close()
    clock.now += 4 * TIMEOUT
    second = open_manager()
    assert second.state("t") == OPEN
    second.stage("t", "x", 3, b"three")
    clock.now += 5 * TIMEOUT - 1  # the timeout (as begun) counts from the last activity
    assert second.expire() == []
    assert second.prepare_commit("t") == (False, [("x", 3, b"one"), ("y", 0, b"two"), ("x", 3, b"three")])


def test_restart_gives_open_transactions_a_fresh_timeout(open_manager, clock):
    first = open_manager()
    first.begin("t")
    clock.now += TIMEOUT - 1
    first.close()
    second = open_manager()
    clock.now += TIMEOUT - 1
    assert second.expire() == []
    clock.now += 1
    assert second.expire() == ["t"]


def test_restart_keeps_committing_state_for_recovery(open_manager, clock):
    first = open_manager()
    for tid in ("c1", "c2"):
        first.begin(tid)
        first.stage(tid, "x", 0, tid.encode())
    first.prepare_commit("c2")
    clock.now += 1
    first.prepare_commit("c1")
    first.close()  # as if the broker died before mark_committed
    second = open_manager()
    assert second.committing() == ["c2", "c1"]
    assert second.prepare_commit("c1") == (False, [("x", 0, b"c1")])
    second.mark_committed("c1")
    assert second.committing() == ["c2"]


def test_restart_remembers_finished_ids(open_manager, directory):
    first = open_manager()
    first.begin("done")
    first.prepare_commit("done")
    first.mark_committed("done")
    first.begin("gone")
    first.abort("gone")
    first.close()
    second = open_manager()
    assert second.prepare_commit("done") == (True, [])
    assert second.begin("gone") == ABORTED
    assert staged_files(directory) == []


def test_state_survives_many_restarts_and_compactions(open_manager, directory):
    manager = open_manager()
    for i in range(1_500):  # past the compaction threshold at least once
        manager.begin(f"t{i}")
        if i % 2:
            manager.abort(f"t{i}")
        else:
            manager.prepare_commit(f"t{i}")
            manager.mark_committed(f"t{i}")
    manager.begin("open")
    manager.stage("open", "x", 0, b"kept")
    assert (directory / "txn-state.json").exists()  # the journal was folded into a snapshot
    manager.close()
    for _ in range(2):
        manager = open_manager()
        manager.close()
    manager = open_manager()
    assert manager.state("t0") == COMMITTED and manager.state("t1499") == ABORTED
    assert manager.prepare_commit("open") == (False, [("x", 0, b"kept")])


def test_torn_last_frame_is_cut_on_load(open_manager, directory):
    first = open_manager()
    first.begin("t")
    first.stage("t", "x", 0, b"acknowledged")
    first.stage("t", "x", 0, b"torn by the crash")
    first.close()
    [name] = staged_files(directory)
    path = directory / "staged" / name
    size = path.stat().st_size
    os.truncate(path, size - 3)  # the last append was cut short
    second = open_manager()
    assert path.stat().st_size < size - 3  # the partial frame is gone, so appends land after good data
    second.stage("t", "x", 0, b"after restart")
    assert second.prepare_commit("t") == (False, [("x", 0, b"acknowledged"), ("x", 0, b"after restart")])


def test_numbered_send_torn_by_a_crash_is_staged_when_sent_again(open_manager, directory):
    """The count of staged sends is rebuilt from the intact frames: the send whose frame a crash
    tore (never acknowledged) is staged when the producer sends it again, the one before is not."""
    first = open_manager()
    first.begin("t")
    assert first.stage("t", "x", 0, b"zero", sequence=0)
    assert first.stage("t", "x", 0, b"one", sequence=1)
    first.close()
    [name] = staged_files(directory)
    path = directory / "staged" / name
    os.truncate(path, path.stat().st_size - 2)
    second = open_manager()
    assert second.stage("t", "x", 0, b"zero", sequence=0) is False
    with pytest.raises(TransactionError, match="1 staged send.*number 2"):
        second.stage("t", "x", 0, b"two", sequence=2)
    assert second.stage("t", "x", 0, b"one", sequence=1) is True
    assert second.stage("t", "x", 0, b"one", sequence=1) is False
    assert second.prepare_commit("t") == (False, [("x", 0, b"zero"), ("x", 0, b"one")])


def test_garbage_tail_is_cut_on_load(open_manager, directory):
    first = open_manager()
    first.begin("t")
    first.stage("t", "x", 0, b"good")
    first.close()
    [name] = staged_files(directory)
    with open(directory / "staged" / name, "ab") as f:
        f.write(b"\x00\x00\x00\x05\x00\x00\x00\x00zeros")  # whole length, wrong CRC
    second = open_manager()
    assert second.prepare_commit("t") == (False, [("x", 0, b"good")])


def test_torn_journal_tail_is_cut_on_load(open_manager, directory):
    first = open_manager()
    first.begin("a")
    first.begin("b")
    first.close()
    journal = directory / "txn-journal.log"
    os.truncate(journal, journal.stat().st_size - 2)  # "b" was being written when the broker died
    second = open_manager()
    assert second.state("a") == OPEN
    assert second.state("b") is None
    assert second.begin("b") == OPEN


def test_orphan_staged_files_are_removed_on_load(open_manager, directory):
    first = open_manager()
    first.begin("t")
    first.close()
    (directory / "staged" / "left-over.stage").write_bytes(b"x")
    open_manager()
    assert staged_files(directory) == []


def _commit(txns, txn_id, sends):
    txns.begin(txn_id)
    for payload in sends:
        txns.stage(txn_id, "x", 0, payload)
    txns.prepare_commit(txn_id)
    txns.mark_committed(txn_id)


def test_a_finished_file_is_written_over_without_its_frames_coming_back(open_manager, directory):
    """The next transaction writes over a pooled file from its start: the previous one's frames
    past the new ones are never read, neither now nor after a restart."""
    first = open_manager()
    _commit(first, "a", [b"a" * 5_000, b"b" * 5_000, b"c" * 5_000])
    [pooled] = pooled_files(directory)
    inode, size = pooled.stat().st_ino, pooled.stat().st_size
    first.begin("b")
    first.stage("b", "x", 0, b"new")
    assert pooled_files(directory) == []
    [name] = staged_files(directory)
    path = directory / "staged" / name
    assert (path.stat().st_ino, path.stat().st_size) == (inode, size)  # the same file, the old frames behind
    assert first.staged("b") == [("x", 0, b"new")]
    first.close()
    second = open_manager()
    assert second.stage("b", "x", 0, b"one", sequence=0) is False  # one send staged, not four
    assert second.prepare_commit("b") == (False, [("x", 0, b"new")])


def test_a_pooled_file_taken_but_not_yet_written_holds_no_frames(open_manager, directory):
    """A crash between taking a pooled file and writing its first frame leaves the file under
    the new transaction's name with the old frames in it: they belong to nobody."""
    first = open_manager()
    _commit(first, "a", [b"old" * 100])
    first.begin("b")
    first.close()
    [pooled] = pooled_files(directory)
    pooled.rename(directory / "staged" / staged_file_name("b"))
    second = open_manager()
    assert second.staged("b") == []
    assert second.stage("b", "x", 0, b"b0", sequence=0)
    assert second.prepare_commit("b") == (False, [("x", 0, b"b0")])


def test_the_pool_keeps_no_more_than_its_bytes(open_manager, directory):
    txns = open_manager(stage_pool_bytes=30_000)
    for txn_id in "abc":  # open together: none can take another's file
        txns.begin(txn_id)
        txns.stage(txn_id, "x", 0, txn_id.encode() * 12_000)
    for txn_id in "abc":
        txns.prepare_commit(txn_id)
        txns.mark_committed(txn_id)
    assert len(pooled_files(directory)) == 2  # the third would pass 30,000 bytes: deleted
    txns.close()
    open_manager(stage_pool_bytes=13_000).close()
    assert len(pooled_files(directory)) == 1  # a smaller limit on load
    open_manager(stage_pool_bytes=0).close()
    assert pooled_files(directory) == []


def test_the_pool_gives_way_to_a_full_disk(tmp_path, clock):
    """A send refused for want of space empties the pool and is staged; a nearly full disk keeps
    no finished file."""
    with mounted_tmpfs(tmp_path / "disk", 2048) as disk:
        txns = TransactionManager(disk / "txn", clock=clock, steady=clock, stage_pool_bytes=500_000)
        try:
            for txn_id in ("a1", "a2"):  # open together: two pooled files
                txns.begin(txn_id)
                txns.stage(txn_id, "x", 0, b"a" * 200_000)
            for txn_id in ("a1", "a2"):
                txns.prepare_commit(txn_id)
                txns.mark_committed(txn_id)
            assert len(pooled_files(disk / "txn")) == 2
            Ballast(disk).fill()
            txns.begin("b")
            txns.stage("b", "x", 0, b"b" * 300_000)  # more than a pooled file holds: the pool is emptied
            assert pooled_files(disk / "txn") == []
            assert txns.prepare_commit("b") == (False, [("x", 0, b"b" * 300_000)])
            txns.mark_committed("b")
            assert pooled_files(disk / "txn") == []  # under twice the pool's bytes free: not kept
        finally:
            txns.close()


def test_a_staged_file_of_an_older_broker_is_read_and_appended_to(open_manager, directory):
    """Files written before the header and seeded CRCs: frames from byte 0, CRCs unseeded."""
    first = open_manager()
    first.begin("t")
    first.close()
    body = b"\x00\x01x" + (0).to_bytes(4, "big") + b"before upgrade"  # topic "x", queue 0, payload
    legacy_frame = FRAME_HEADER.pack(len(body), crc32c.crc32c(body)) + body
    (directory / "staged" / staged_file_name("t")).write_bytes(legacy_frame)
    second = open_manager()
    assert second.stage("t", "x", 0, b"after", sequence=1)
    second.close()
    assert open_manager().prepare_commit("t") == (False, [("x", 0, b"before upgrade"), ("x", 0, b"after")])


def test_corrupt_snapshot_is_named(open_manager, directory):
    open_manager().close()
    (directory / "txn-state.json").write_text("{oops")
    with pytest.raises(InternalBrokerError, match="txn-state.json is corrupt"):
        open_manager()


def test_corruption_inside_staged_data_is_reported_on_commit(txns, directory):
    txns.begin("t")
    txns.stage("t", "x", 0, b"first")
    [name] = staged_files(directory)
    with open(directory / "staged" / name, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"\xff")  # the payload's last byte
    with pytest.raises(InternalBrokerError, match="staged data of transaction 't'.*corrupt"):
        txns.prepare_commit("t")
    assert txns.state("t") == OPEN


def _frames(bodies: list[bytes], seed: int) -> bytes:
    return b"".join(FRAME_HEADER.pack(len(body), crc32c.crc32c(body, seed)) + body for body in bodies)


@pytest.mark.parametrize("damage", ["none", "first", "middle", "second share", "last", "torn", "garbage length"])
def test_staged_frames_checked_on_threads_stop_where_one_thread_stops(damage):
    """A commit checks the CRCs of megabytes of staged frames on several threads: it finds the same
    intact frames, up to the same byte, as a check one frame after the other, wherever the first
    damaged one is (later frames, intact or not, are never taken)."""
    seed = 12345
    bodies = [bytes([i]) * (300_000 + 7_001 * i) for i in range(24)]  # 8.9 MB: over _SPLIT_BYTES
    data = bytearray(_frames(bodies, seed))
    starts = [sum(FRAME_HEADER.size + len(b) for b in bodies[:i]) for i in range(len(bodies))]
    flip = {"first": 0, "middle": 9, "second share": 17, "last": 23}.get(damage)
    if flip is not None:
        data[starts[flip] + FRAME_HEADER.size + 5] ^= 0x40
    elif damage == "torn":
        data = data[:-1000]
    elif damage == "garbage length":
        data[starts[12]:starts[12] + 4] = (2**31 + 1).to_bytes(4, "big")
    expected_bodies, expected_end = split_frames(bytes(data), seed)
    with ThreadPoolExecutor(2) as checkers:
        found, end = split_frames(bytes(data), seed, checkers)
    assert (end, [bytes(b) for b in found]) == (expected_end, [bytes(b) for b in expected_bodies])
    intact = {"none": 24, "first": 0, "middle": 9, "second share": 17, "last": 23, "torn": 23, "garbage length": 12}
    assert len(found) == intact[damage] and [bytes(b) for b in found] == bodies[:intact[damage]]


def test_failed_append_leaves_no_partial_frame(txns, directory, monkeypatch):
    txns.begin("t")
    txns.stage("t", "x", 0, b"ok")
    real_fsync = os.fsync

    def failing_fsync(fd):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk on fire"):
        txns.stage("t", "x", 0, b"lost")
    monkeypatch.setattr(os, "fsync", real_fsync)
    txns.stage("t", "x", 0, b"next")
    assert txns.prepare_commit("t") == (False, [("x", 0, b"ok"), ("x", 0, b"next")])


def test_finished_ids_forgotten_only_past_both_limits(open_manager, clock):
    txns = open_manager(keep_finished=2, finished_retention_ms=10_000)
    for tid in ("a", "b", "c"):
        txns.begin(tid)
        txns.abort(tid)
        clock.now += 1
    txns.expire()
    assert [txns.state(t) for t in "abc"] == [ABORTED] * 3  # too young to forget
    clock.now += 10_000
    txns.expire()
    assert [txns.state(t) for t in "abc"] == [None, ABORTED, ABORTED]  # only beyond the newest 2
    txns.close()
    reopened = open_manager(keep_finished=2, finished_retention_ms=10_000)
    assert [reopened.state(t) for t in "abc"] == [None, ABORTED, ABORTED]


def test_default_timeout_and_bad_timeouts(open_manager, clock):
    txns = open_manager(timeout_ms=50)
    txns.begin("t")
    clock.now += 50
    assert txns.expire() == ["t"]
    with pytest.raises(InvalidRequestError, match="timeout_ms must be an integer >= 0, got -1"):
        txns.begin("u", timeout_ms=-1)
    with pytest.raises(InvalidRequestError, match="timeout_ms must be an integer >= 1"):
        open_manager(timeout_ms=0)


@pytest.mark.parametrize("bad", ["", "x" * 257, None, 5])
def test_invalid_txn_ids(txns, bad):
    with pytest.raises(InvalidRequestError, match="transaction id must be a string of 1 to 256 characters"):
        txns.begin(bad)


def test_longest_txn_id_and_any_characters(txns):
    for tid in ("x" * 256, "../../etc/passwd", "query-1/batch 7 ✓"):
        assert txns.begin(tid) == OPEN
        txns.stage(tid, "x", 0, b"1")
        assert txns.prepare_commit(tid) == (False, [("x", 0, b"1")])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", 0, b""), "topic must be a non-empty string"),
        (("x", -1, b""), "queue id must be an integer >= 0"),
        (("x", 0, "text"), "payload must be bytes, got str"),
    ],
)
def test_invalid_stage_arguments(txns, args, message):
    txns.begin("t")
    with pytest.raises(InvalidRequestError, match=message):
        txns.stage("t", *args)


def test_fsync_false_still_recovers_after_close(open_manager):
    first = open_manager(fsync=False)
    first.begin("t")
    first.stage("t", "x", 0, b"1")
    first.close()
    assert open_manager(fsync=False).prepare_commit("t") == (False, [("x", 0, b"1")])


def test_concurrent_staging_keeps_each_writer_in_order(txns):
    txns.begin("shared")
    txns.begin("other")

    def run(qid: int) -> None:
        for i in range(25):
            txns.stage("shared" if qid < 3 else "other", "x", qid, f"{qid}:{i}".encode())

    threads = [threading.Thread(target=run, args=(qid,)) for qid in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _, entries = txns.prepare_commit("shared")
    assert len(entries) == 75
    for qid in range(3):
        assert [p for _, q, p in entries if q == qid] == [f"{qid}:{i}".encode() for i in range(25)]
    assert len(txns.prepare_commit("other")[1]) == 50


def test_kill_9_while_staging_loses_nothing_acknowledged(directory):
    """A broker process killed mid-append keeps every acknowledged send, in order, and stays usable."""
    root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(root)!r})
        from broker.transactions import TransactionManager
        txns = TransactionManager({str(directory)!r})
        txns.begin("t", timeout_ms=3_600_000)
        i = 0
        while True:
            txns.stage("t", "x", i % 4, str(i).encode() * (1 + i % 300))
            print(i, flush=True)
            i += 1
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    acked = -1
    while acked < 200:
        acked = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    txns = TransactionManager(directory)
    try:
        _, entries = txns.prepare_commit("t")
        assert len(entries) > acked
        assert entries == [("x", i % 4, str(i).encode() * (1 + i % 300)) for i in range(len(entries))]
    finally:
        txns.close()
