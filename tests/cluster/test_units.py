"""The cluster's parts without ZooKeeper or a network: settings, epoch truncation, the storage
calls replication makes (frames read and appended verbatim, tails cut), the lock epoch floor,
offset snapshots, the transaction table's changes and copies, and the promises a master counts."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from broker.cluster import replication
from broker.cluster.control import GroupState
from broker.cluster.epochs import EpochHistory, truncation_points
from broker.cluster.follower import CampaignPromise
from broker.cluster.replication import FetchStream, ReplicaSource
from broker.cluster.txnlog import TxnChangeLog, apply_changes, table_changes
from broker.config import BrokerConfig
from broker.locks import LockManager
from broker.offsets import OffsetStore
from broker.proto import orderlymq_pb2 as pb
from broker.service import BrokerService
from broker.storage import QueueLog
from broker.storage.record import HEADER, parse_header
from broker.transactions import ABORTED, COMMITTED, COMMITTING, TransactionManager, prepare_change
from broker.wire import codec
from broker.wire.errors import (
    DamagedRecordError,
    InvalidOptionError,
    InvalidRequestError,
    NotMasterError,
    OffsetOutOfRangeError,
    ReplicationTimeoutError,
)


def batch(start: int, n: int) -> tuple[bytes, int]:
    table = codec.messages_to_batch([{"key": "k", "body": f"m{i}".encode()} for i in range(start, start + n)])
    return codec.message_batch(codec.encode(table))


def bodies(q: QueueLog) -> list[bytes]:
    return q.read(0, 1_000_000, 1 << 40).table.column("body").to_pylist() if q.max_offset else []


def make_log(path, **kw) -> QueueLog:
    return QueueLog(path, segment_bytes=kw.pop("segment_bytes", 1 << 20), index_interval_bytes=256, sync=False, **kw)


# -- settings ------------------------------------------------------------------------------------


def test_no_zookeeper_is_a_single_broker():
    assert not BrokerConfig().clustered
    assert BrokerConfig(zookeeper="127.0.0.1:2181").clustered


@pytest.mark.parametrize(("setting", "value", "message"), [
    ("replication", "quorum", "replication must be 'sync' or 'async'"),
    ("min_sync_replicas", 0, "min_sync_replicas must be an integer in 1..16"),
    ("broker_id", -1, "broker_id must be an integer in 0..1000000"),
    ("zk_session_timeout_ms", 10, "zk_session_timeout_ms must be an integer in 1000..600000"),
    ("advertised_address", "nohost", "advertised_address must be host:port"),
    ("cluster_name", "a b", "cluster_name must be 1-128 characters"),
])
def test_cluster_settings_are_checked(setting, value, message):
    with pytest.raises(InvalidOptionError, match=message):
        BrokerConfig.from_mapping({setting: value})


# -- epochs --------------------------------------------------------------------------------------


def test_a_slave_of_the_current_epoch_keeps_its_log():
    assert truncation_points(2, {"t/0": 10}, [[1, {}], [2, {"t/0": 5}]]) == {}


def test_an_old_master_cuts_its_tail_at_the_next_epochs_start():
    history = [[1, {}], [2, {"t/0": 7, "t/1": 3}], [3, {"t/0": 9, "t/1": 9}]]
    # Its last epoch was 1; epoch 2 started where the new master's log ended: cut there.
    assert truncation_points(1, {"t/0": 10, "t/1": 3, "u/0": 4}, history) == {"t/0": 7, "u/0": 0}


def test_an_epoch_the_master_never_saw_is_judged_by_the_next_one_it_did():
    # The broker led epoch 3, which the master never followed (nobody replicated anything of it).
    assert truncation_points(3, {"t/0": 12}, [[2, {"t/0": 4}], [4, {"t/0": 8}]]) == {"t/0": 8}


def test_epoch_history_persists(tmp_path):
    history = EpochHistory(tmp_path / "cluster-epochs.json")
    history.begin_term(1, {"t/0": 0})
    history.follow(2, [[1, {"t/0": 0}], [2, {"t/0": 5}]])
    again = EpochHistory(tmp_path / "cluster-epochs.json")
    assert again.epoch == 2 and again.history == [[1, {"t/0": 0}], [2, {"t/0": 5}]]


def test_the_group_id_a_broker_served_in_persists_and_states_of_older_versions_have_none(tmp_path):
    history = EpochHistory(tmp_path / "cluster-epochs.json")
    assert history.group_id == ""  # a new broker, or one of an older version: no group recorded
    history.join_group("")  # a state of an older version: nothing to record
    history.join_group("5f0c")
    history.begin_term(1, {"t/0": 0})
    assert EpochHistory(tmp_path / "cluster-epochs.json").group_id == "5f0c"
    older = GroupState.decoded(b'{"epoch": 3, "master": 1, "master_address": "a:1", "sync_set": [1, 2]}', 7)
    assert older == GroupState(3, 1, "a:1", frozenset({1, 2}), 7, "")
    state = GroupState(4, 2, "b:2", frozenset({2}), group_id="5f0c")
    assert GroupState.decoded(state.encoded(), 8) == GroupState(4, 2, "b:2", frozenset({2}), 8, "5f0c")


def test_a_follower_counts_as_caught_up_only_once_marked_and_a_wiped_one_knows_no_epoch(tmp_path):
    history = EpochHistory(tmp_path / "cluster-epochs.json")
    assert history.epoch == 0  # a wiped data dir: no epoch, so it may not campaign
    history.follow(3, [[3, {"t/0": 0}]])
    assert not EpochHistory(tmp_path / "cluster-epochs.json").caught_up
    history.mark_caught_up()
    assert EpochHistory(tmp_path / "cluster-epochs.json").caught_up
    history.begin_term(4, {"t/0": 9})
    assert history.caught_up  # a master holds what it has


def test_a_campaign_promise_binds_from_the_start_renews_and_is_released():
    promise = CampaignPromise(60.0)
    assert not promise.kept  # a previous process may have promised just before it ended
    promise.release()
    assert promise.kept
    promise.renew()
    assert not promise.kept


# -- storage calls of replication ----------------------------------------------------------------


def test_a_promise_runs_from_an_answer_sent_on_the_stream_that_acknowledges_it(tmp_path):
    """A slave that dialed again (its old stream half-open) acknowledges, on each stream, only
    the answers it received there: an answer sent on the other may never have arrived."""
    service = BrokerService(BrokerConfig(data_dir=str(tmp_path / "master")))
    source = ReplicaSource(service, EpochHistory(tmp_path / "epochs.json"), 0, lambda: NotMasterError("stepped down"))
    source.activate(GroupState(1, 0, "", frozenset({0, 1})), {})
    handshake = pb.ReplicaFetch(broker_id=1, group_epoch=1, handshake=True)
    fetch = pb.ReplicaFetch(broker_id=1, group_epoch=1)
    _, old_sent = source._greet(handshake)  # the old stream's
    _, new_sent = source._greet(handshake)  # the new stream's, answered later
    source._take_acknowledgement(fetch, old_sent, {})  # on the old stream: the new stream's answer is not acknowledged
    assert source.promised_until(1.0) == old_sent + 1.0 < new_sent + 1.0
    source._take_acknowledgement(fetch, new_sent, {})
    assert source.promised_until(1.0) == new_sent + 1.0
    source.close()
    service.close()


def _acknowledge_up_to(source: ReplicaSource, offset: int) -> None:
    fetch = pb.ReplicaFetch(broker_id=1, group_epoch=1, ends=[pb.QueuePosition(topic="t", queue_id=0, offset=offset)])
    source._take_acknowledgement(fetch, None, {"t/0": offset})


def test_a_send_on_the_loop_awaits_the_fetch_that_acknowledges_it_and_fails_on_timeout_or_step_down(tmp_path):
    """``replicated`` on the event loop: answered once the slave's fetch reaches its end (taken on
    the loop or on another thread), not before, and acknowledged by then; a timed-out wait and one
    cut by a step-down fail with ``ReplicationTimeoutError``, and no waiter is left behind."""
    service = BrokerService(BrokerConfig(data_dir=str(tmp_path / "master"), replica_lag_timeout_ms=100))
    service.CreateTopic(pb.CreateTopicRequest(topic="t", queue_count=1))
    source = ReplicaSource(service, EpochHistory(tmp_path / "epochs.json"), 0, lambda: NotMasterError("stepped down"))
    source.activate(GroupState(1, 0, "", frozenset({0, 1})), {})
    source._greet(pb.ReplicaFetch(broker_id=1, group_epoch=1, handshake=True))

    async def scenario() -> None:
        waiting = source.replicated("t", 0, 5)
        _acknowledge_up_to(source, 4)
        await asyncio.sleep(0.05)
        assert not waiting.done(), "the slave is short of the send's end"
        taker = threading.Thread(target=_acknowledge_up_to, args=(source, 5))
        taker.start()
        await asyncio.wait_for(waiting, 5)
        taker.join()
        assert source._high_watermark == {"t/0": 5}, "acknowledged before the wait ends"
        assert source.replicated("t", 0, 5) is None  # held already: nothing to wait for
        with pytest.raises(ReplicationTimeoutError, match="not on its sync-state set"):
            await source.replicated("t", 0, 9)
        assert source._high_watermark == {"t/0": 5}, "a failed wait acknowledges nothing"
        cut = source.replicated("t", 0, 9)
        await asyncio.sleep(0.01)
        source.deactivate()
        with pytest.raises(ReplicationTimeoutError, match="stopped being master"):
            await cut
        assert source._loop_waiters == []

    asyncio.run(scenario())
    source.close()
    service.close()


def test_a_master_answers_fetches_of_moved_ends_from_the_queues_that_moved_or_were_left_behind(tmp_path,
                                                                                             monkeypatch):
    """After a whole fetch, a slave lists only the ends that moved: the master answers with the
    queues whose end moved since its last answer, and those an answer cut short left behind; a
    stream whose first fetch lists moved ends only is refused."""
    monkeypatch.setattr(replication, "FETCH_WAIT_S", 0.05)  # an answer with nothing to send comes back soon
    monkeypatch.setattr(replication, "MAX_RESPONSE_BYTES", 1)  # each answer ends after its first queue
    service = BrokerService(BrokerConfig(data_dir=str(tmp_path / "master")))
    service.CreateTopic(pb.CreateTopicRequest(topic="t", queue_count=4))
    source = ReplicaSource(service, EpochHistory(tmp_path / "epochs.json"), 0, lambda: NotMasterError("stepped down"))
    source.activate(GroupState(1, 0, "", frozenset({0})), {})
    queues = [service.store.queue("t", q) for q in range(4)]
    stream = FetchStream(source)

    def fetch(ends: dict[int, int], delta: bool) -> dict[int, int]:
        """The answer to a fetch listing ``ends``: the messages of the (one) record of each queue it carries."""
        positions = [pb.QueuePosition(topic="t", queue_id=q, offset=end) for q, end in ends.items()]
        answer = asyncio.run(stream.answer(pb.ReplicaFetch(broker_id=1, group_epoch=1, ends=positions, delta=delta)))
        return {r.queue_id: parse_header(r.frames[:HEADER.size]).count for r in answer.records}

    greeting = asyncio.run(stream.answer(pb.ReplicaFetch(broker_id=1, group_epoch=1, handshake=True)))
    assert greeting.delta_fetches
    queues[0].append(*batch(0, 2))
    queues[2].append(*batch(0, 3))
    assert fetch({q: 0 for q in range(4)}, delta=False) == {0: 2}  # cut short: queue 2 is left behind
    assert fetch({0: 2}, delta=True) == {2: 3}  # nothing moved since, the one left behind comes now
    assert fetch({2: 3}, delta=True) == {}
    queues[3].append(*batch(0, 1))
    assert fetch({}, delta=True) == {3: 1}  # only what moved is looked at
    assert fetch({3: 1}, delta=True) == {}
    stream.close()

    with pytest.raises(InvalidRequestError, match="before one listing every end"):
        fresh = FetchStream(source)
        asyncio.run(fresh.answer(pb.ReplicaFetch(broker_id=1, group_epoch=1, delta=True)))
    source.close()
    service.close()


def test_a_master_sends_its_topic_table_on_a_stream_only_when_it_changed(tmp_path, monkeypatch):
    """Answers carry the topic table the first time on a stream and after it changed, and leave
    it out in between, to a slave that takes that; to one that does not (an earlier version),
    every answer carries it. The first answer waits with nothing to send: the table it finally
    carries is not taken for sent by the looks before it."""
    monkeypatch.setattr(replication, "FETCH_WAIT_S", 0.05)  # an answer with nothing to send comes back soon
    service = BrokerService(BrokerConfig(data_dir=str(tmp_path / "master")))
    service.CreateTopic(pb.CreateTopicRequest(topic="t", queue_count=2))
    source = ReplicaSource(service, EpochHistory(tmp_path / "epochs.json"), 0, lambda: NotMasterError("stepped down"))
    source.activate(GroupState(1, 0, "", frozenset({0})), {})

    held = {"offsets_version": 0, "txn_seq": 0}  # what the slave holds: fetches ask for nothing else

    def answers(stream: FetchStream, on_change: bool) -> dict[str, int] | None:
        """The topic table the next answer carries (None: left out as unchanged)."""
        fetch = pb.ReplicaFetch(broker_id=1, group_epoch=1, topics_on_change=on_change, **held,
                                ends=[pb.QueuePosition(topic="t", queue_id=q) for q in range(2)])
        answer = asyncio.run(stream.answer(fetch))
        held["txn_seq"] = answer.txn_seq
        held["offsets_version"] = answer.offsets_version or held["offsets_version"]
        assert answer.topics_unchanged == (not answer.topics)
        return None if answer.topics_unchanged else dict(answer.topics)

    for on_change in (True, False):
        stream = FetchStream(source)
        asyncio.run(stream.answer(pb.ReplicaFetch(broker_id=1, group_epoch=1, handshake=True)))
        assert answers(stream, on_change) == {"t": 2}
        assert answers(stream, on_change) == (None if on_change else {"t": 2})
        service.CreateTopic(pb.CreateTopicRequest(topic=f"u{on_change}", queue_count=1))
        table = answers(stream, on_change)
        assert table is not None and table["t"] == 2 and f"u{on_change}" in table
        assert answers(stream, on_change) == (None if on_change else table)
        service.DeleteTopic(pb.DeleteTopicRequest(topic=f"u{on_change}"))
        assert answers(stream, on_change) == {"t": 2}
        stream.close()
        stream = FetchStream(source)
        assert answers(stream, on_change) == {"t": 2}  # a new stream starts with the table
        stream.close()
    source.close()
    service.close()


def test_a_slave_that_keeps_up_is_answered_on_the_loop_and_a_backlog_on_a_thread(tmp_path, monkeypatch):
    """A fetch with little to bring waits on the event loop and is answered there as soon as a
    send is stored (on the loop or on another thread); a step-down ends its wait at once. A
    backlog is read on a thread, and none of it is skipped on the way there."""
    monkeypatch.setattr(replication, "FETCH_WAIT_S", 5.0)  # a wait that ends early says what ended it
    service = BrokerService(BrokerConfig(data_dir=str(tmp_path / "master")))
    service.CreateTopic(pb.CreateTopicRequest(topic="t", queue_count=2))
    source = ReplicaSource(service, EpochHistory(tmp_path / "epochs.json"), 0, lambda: NotMasterError("stepped down"))
    source.activate(GroupState(1, 0, "", frozenset({0, 1})), {})
    queues = [service.store.queue("t", q) for q in range(2)]
    stream = FetchStream(source)
    on_thread = []  # the answers collected on a thread, not on the loop's
    loop_thread = threading.get_ident()
    collect = source._collect

    def collect_where(fetch, *args):
        if threading.get_ident() != loop_thread:
            on_thread.append(fetch)
        return collect(fetch, *args)

    monkeypatch.setattr(source, "_collect", collect_where)
    have = {0: 0, 1: 0}
    held = {"offsets_version": 0, "txn_seq": 0}  # what the slave holds besides records

    def fetch() -> pb.ReplicaFetch:
        return pb.ReplicaFetch(broker_id=1, group_epoch=1, **held,
                               ends=[pb.QueuePosition(topic="t", queue_id=q, offset=end) for q, end in have.items()])

    def take(answer: pb.ReplicaData) -> dict[int, int]:
        """The messages per queue ``answer`` brings, now held."""
        held["txn_seq"] = answer.txn_seq
        held["offsets_version"] = answer.offsets_version or held["offsets_version"]
        counts = {r.queue_id: parse_header(r.frames[:HEADER.size]).count for r in answer.records}
        for queue_id, count in counts.items():
            have[queue_id] += count
        return counts

    async def answered(store) -> dict[int, int]:
        """The messages per queue of the answer to a fetch made before ``store`` runs."""
        waiting = asyncio.ensure_future(stream.answer(fetch()))
        await asyncio.sleep(0.05)
        assert not waiting.done(), "nothing to bring yet: the fetch waits"
        started = time.monotonic()
        store()
        answer = await asyncio.wait_for(waiting, 2)
        assert time.monotonic() - started < 1, "answered when the send came, not at the end of the wait"
        return take(answer)

    def stored(queue_id: int, start: int, n: int) -> None:
        queues[queue_id].append(*batch(start, n))
        source.changed()

    async def scenario() -> None:
        await stream.answer(pb.ReplicaFetch(broker_id=1, group_epoch=1, handshake=True))
        assert take(await stream.answer(fetch())) == {}  # the first: offsets and transactions, on a thread
        on_thread.clear()
        assert await answered(lambda: stored(0, 0, 1)) == {0: 1}
        taker = threading.Thread(target=stored, args=(1, 0, 2))
        assert await answered(taker.start) == {1: 2}
        taker.join()
        assert on_thread == [], "a slave that keeps up is answered on the loop"
        stored(0, 1, replication.LOOP_ANSWER_MESSAGES)
        stored(1, 2, 1)
        assert take(await stream.answer(fetch())) == {0: replication.LOOP_ANSWER_MESSAGES, 1: 1}
        assert len(on_thread) == 1, "a backlog is read on a thread"
        waiting = asyncio.ensure_future(stream.answer(fetch()))
        await asyncio.sleep(0.05)
        source.deactivate()
        with pytest.raises(NotMasterError):
            await asyncio.wait_for(waiting, 1)
        assert source._change_waiters == []

    asyncio.run(scenario())
    stream.close()
    source.close()
    service.close()


def test_a_slave_stays_connected_while_any_of_its_streams_is_open(tmp_path):
    """A slave that dialed again has its new stream open before the old one ends: the old one's
    end does not make it look gone (out of reach of the sync-state set) until its next fetch. A
    stream opened just before this broker's term began counts in the term."""
    service = BrokerService(BrokerConfig(data_dir=str(tmp_path / "master")))
    source = ReplicaSource(service, EpochHistory(tmp_path / "epochs.json"), 0, lambda: NotMasterError("stepped down"))
    source.stream_opened(1)
    source.activate(GroupState(1, 0, "", frozenset({0, 1})), {})
    source._greet(pb.ReplicaFetch(broker_id=1, group_epoch=1, handshake=True))
    source.stream_opened(1)  # dialed again
    source.stream_closed(1)  # the old stream ends
    assert [r.connected for r in source.replica_status()] == [True]
    source.stream_closed(1)
    assert [r.connected for r in source.replica_status()] == [False]
    source.close()
    service.close()


def test_frames_appended_on_a_replica_read_back_the_same_with_their_producer_state(tmp_path):
    master, replica = make_log(tmp_path / "m", segment_bytes=600), make_log(tmp_path / "r", segment_bytes=600)
    for i in range(10):
        master.append(*batch(3 * i, 3), "producer-1", i)
    position = 0
    while position < master.max_offset:
        frames, position = master.read_frames(position, 500)
        replica.append_frames(frames)
    assert replica.max_offset == 30 and bodies(replica) == bodies(master)
    assert len(replica.segments) > 1
    again = replica.append(*batch(27, 3), "producer-1", 9)  # a resend after failover: not stored twice
    assert again.duplicate and again.base_offset == 27 and replica.max_offset == 30


def test_frames_that_do_not_continue_the_log_are_refused(tmp_path):
    master, replica = make_log(tmp_path / "m"), make_log(tmp_path / "r")
    master.append(*batch(0, 2))
    master.append(*batch(2, 2))
    frames, _ = master.read_frames(2, 1 << 20)
    with pytest.raises(DamagedRecordError, match="does not continue the log at offset 0"):
        replica.append_frames(frames)


def test_truncate_cuts_the_tail_across_segments_and_forgets_its_producers(tmp_path):
    q = make_log(tmp_path / "q", segment_bytes=600)
    for i in range(10):
        q.append(*batch(2 * i, 2), "p", i)
    assert len(q.segments) > 2
    assert q.truncate(7) == 6  # inside a record: the whole record goes
    assert [b.decode() for b in bodies(q)] == [f"m{i}" for i in range(6)]
    resent = q.append(*batch(6, 2), "p", 3)  # sequence 3 was cut: stored again, not a duplicate
    assert not resent.duplicate and resent.base_offset == 6
    reopened = make_log(tmp_path / "q", segment_bytes=600)
    assert reopened.max_offset == 8


def test_a_replica_behind_retention_restarts_at_the_masters_first_offset(tmp_path):
    master, replica = make_log(tmp_path / "m", segment_bytes=300), make_log(tmp_path / "r")
    for i in range(10):
        master.append(*batch(2 * i, 2), "p", i)
    replica.append_frames(master.read_frames(0, 200)[0])
    master.apply_retention(0, 700)  # the oldest segments go: the master now starts past the replica's end
    assert master.min_offset > replica.max_offset
    with pytest.raises(OffsetOutOfRangeError, match="cannot restart at 0"):
        replica.restart_at(0)
    replica.restart_at(master.min_offset)
    replica.append_frames(master.read_frames(master.min_offset, 1 << 20)[0])
    assert (replica.min_offset, replica.max_offset) == (master.min_offset, master.max_offset)
    assert replica.read(replica.min_offset, 100, 1 << 20).table.column("body").to_pylist() == \
        master.read(master.min_offset, 100, 1 << 20).table.column("body").to_pylist()
    assert make_log(tmp_path / "r").min_offset == master.min_offset  # so it reopens


# -- state the new master builds on --------------------------------------------------------------


def test_a_raised_floor_fences_every_earlier_epoch_and_survives_a_restart(tmp_path):
    locks = LockManager(tmp_path / "lock-epochs", lease_ms=60_000)
    before = locks.lock_batch("g", "c1", "t", [0])[0]
    locks.raise_floor(2 << 32)
    after = locks.lock_batch("g", "c2", "t", [0])[0]  # the old lease is not honoured by the new master
    assert after > 2 << 32 > before
    locks.close()
    reopened = LockManager(tmp_path / "lock-epochs", lease_ms=60_000)
    assert reopened.lock_batch("g", "c3", "t", [1])[1] > 2 << 32


def test_offsets_snapshot_replaces_a_replicas_offsets(tmp_path):
    master, replica = OffsetStore(tmp_path / "m"), OffsetStore(tmp_path / "r")
    master.commit("g", "t", 0, 5, "c1")
    replica.commit("g", "t", 1, 9)
    replica.replace(master.snapshot())
    assert replica.snapshot() == [("g", "t", 0, 5, "c1")]
    replica.close()
    assert OffsetStore(tmp_path / "r").committed("g", "t", 0) == (5, "c1")


# -- transactions ----------------------------------------------------------------------------------


def test_a_copied_transaction_table_holds_open_sends_and_finished_ids(tmp_path):
    master = TransactionManager(tmp_path / "master", fsync=False)
    master.begin("done")
    master.stage("done", "t", 0, b"x")
    master.prepare_commit("done")
    master.mark_committed("done")
    master.begin("open")
    master.stage("open", "t", 1, b"first")
    master.stage("open", "t", 0, b"second")
    replica = TransactionManager(tmp_path / "replica", fsync=False)
    apply_changes(replica, table_changes(master))
    assert replica.state("done") == COMMITTED
    assert replica.prepare_commit("open") == (False, [("t", 1, b"first"), ("t", 0, b"second")])


def test_a_commit_in_progress_reaches_slaves_as_committing_from_its_queue_ends(tmp_path):
    """Replayed or copied, a transaction the master moved to COMMITTING is COMMITTING on the
    slave, with the queue ends it started from; the slave's own idle clock does not abort it."""
    now = [0]
    master = TransactionManager(tmp_path / "master", fsync=False)
    master.begin("c", 1_000)
    master.stage("c", "t", 0, b"x")
    master.prepare_commit("c", lambda queues: dict.fromkeys(queues, 7))
    replayed = TransactionManager(tmp_path / "replayed", fsync=False, steady=lambda: now[0])
    Kind = pb.TxnChange.Kind
    apply_changes(replayed, [pb.TxnChange(kind=Kind.BEGIN, txn_id="c", timeout_ms=1_000),
                             pb.TxnChange(kind=Kind.STAGE, txn_id="c", topic="t", queue_id=0, payload=b"x")])
    now[0] = 5_000  # idle here past its timeout: the master, which decides, is committing it
    apply_changes(replayed, [prepare_change("c", master.commit_starts("c"))])
    copied = TransactionManager(tmp_path / "copied", fsync=False)
    apply_changes(copied, table_changes(master))
    for slave in (replayed, copied):
        assert slave.state("c") == COMMITTING
        assert slave.commit_starts("c") == {("t", 0): 7}
        assert slave.committing() == ["c"]  # finished by the slave once it is promoted


def test_replayed_changes_follow_the_master_and_a_commit_needs_no_records(tmp_path):
    replica = TransactionManager(tmp_path / "replica", fsync=False)
    Kind = pb.TxnChange.Kind
    apply_changes(replica, [
        pb.TxnChange(kind=Kind.BEGIN, txn_id="a", timeout_ms=5_000),
        pb.TxnChange(kind=Kind.STAGE, txn_id="a", topic="t", queue_id=0, payload=b"p"),
        pb.TxnChange(kind=Kind.BEGIN, txn_id="b"),
        pb.TxnChange(kind=Kind.ABORT, txn_id="b"),
        pb.TxnChange(kind=Kind.ABORT, txn_id="b"),  # replayed after a table copy: still aborted
        pb.TxnChange(kind=Kind.COMMIT, txn_id="a"),
        pb.TxnChange(kind=Kind.COMMIT, txn_id="c"),  # begun before this replica's copy of the table
    ])
    assert (replica.state("a"), replica.state("b"), replica.state("c")) == (COMMITTED, ABORTED, COMMITTED)


def test_the_change_log_answers_only_for_its_own_term():
    log = TxnChangeLog()
    log.begin_term(3)
    start = log.last
    assert log.since(start) == []
    first = log.append(pb.TxnChange(txn_id="a"))
    log.append(pb.TxnChange(txn_id="b"))
    assert [c.txn_id for c in log.since(start)] == ["a", "b"]
    assert [c.txn_id for c in log.since(first)] == ["b"]
    assert log.since(0) is None and log.since(2 << 32) is None  # another term: the whole table instead
    with log.copying() as last:
        assert last == first + 1


def test_held_back_messages_are_invisible_until_made_visible(tmp_path):
    q = make_log(tmp_path / "q")
    q.append(*batch(0, 2))
    q.hold_back()
    q.append(*batch(2, 3))
    assert (q.max_offset, q.visible_offset) == (5, 2)
    assert [b.decode() for b in bodies(q)] == ["m0", "m1"]
    assert not q.wait_for_data(2, 0.05)  # a long poll does not wake for what it may not see
    q.make_visible(5)
    assert q.wait_for_data(2, 0.05) and len(bodies(q)) == 5
    q.append(*batch(5, 1))
    q.truncate(5)  # a cut tail was never visible, and stays so
    assert (q.max_offset, q.visible_offset) == (5, 5)
