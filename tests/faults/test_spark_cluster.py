"""Spark across broker groups: an exactly-once ``orderlymq -> orderlymq`` query whose source and
sink topics are spread over three groups of two brokers each (real ZooKeeper, real broker
processes, the shared local[2] SparkSession), under keyed producers.

The output is read back with a Spark batch read (each queue one partition, in queue order) and
judged by the strict checker in the order it was emitted: nothing acknowledged lost, nothing
twice, every key in order. The second scenario kills one group's master with SIGKILL while the
query runs (the long form: several kills, each group in turn): the query must go on by itself,
taking its queue locks back on the new master (nobody else consumed), and its output must stay
exact; the time from each kill until output resumes is reported.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from broker.proto import orderlymq_pb2 as pb
from broker.wire import codec
from broker.wire.errors import FencedError
from connector.client import Admin
from connector.client.routed import RoutedConnection
from connector.history import Delivery, History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.spark_queries import copy_query, visible
from tests.faults.workload import KeyedProducer, body, parse_body, stored_deliveries
from tests.spark.helpers import route_each_batch_alone
from tests.support import wait_until

SOURCE, SINK, GROUP, QUEUES = "trades", "trades-copy", "copier", 6
KEYS_PER_PRODUCER = 16
KILLS = 1 if PROFILE.name == "short" else 6
SENDS_PER_PRODUCER = 600 if PROFILE.name == "short" else 3_000  # the first scenario's traffic
pytestmark = pytest.mark.spark


def _bootstrap(groups) -> str:
    return ",".join(g.addresses for g in groups)


def _start(broker_cluster, history: History, limit: int | None = None) -> tuple[list, str, list[KeyedProducer]]:
    groups = broker_cluster(3, 2)
    bootstrap = _bootstrap(groups)
    with Admin(bootstrap) as admin:
        for topic in (SOURCE, SINK):
            info = admin.create_topic(topic, QUEUES)
            assert sorted(g.broker_name for g in info.groups) == ["broker-a", "broker-b", "broker-c"], info
    producers = [KeyedProducer(bootstrap, SOURCE, [f"p{p}-k{k}" for k in range(KEYS_PER_PRODUCER)], history,
                               rate=PROFILE.send_rate, limit=limit) for p in range(PROFILE.producers)]
    return groups, bootstrap, producers


def _copy(spark, bootstrap: str, checkpoint, max_per_trigger: int):
    return copy_query(spark, bootstrap, SOURCE, SINK, GROUP, checkpoint, trigger={"processingTime": "200 milliseconds"},
                      startingOffsets="earliest", maxMessagesPerTrigger=max_per_trigger)


def _all_acked_copied(conn: RoutedConnection, history: History) -> bool:
    acked = history.acked()
    return visible(conn, SINK) >= len(acked) and acked <= {(d.key, d.seq) for d in stored_deliveries(conn, SINK)}


def _read_back(spark, conn: RoutedConnection, bootstrap: str) -> list[Delivery]:
    """The sink read by a Spark batch read, rows in the order it emits them (queue by queue); each
    row's ``broker`` column names the group holding its queue."""
    rows = (spark.read.format("orderlymq").option("brokers", bootstrap).option("topic", SINK).load()
            .select("broker", "queue_id", "queue_offset", "body").collect())
    route = conn.routes.route(SINK, refresh=True)
    misplaced = [(row.queue_id, row.broker) for row in rows if row.broker != route.group_of(row.queue_id)]
    assert not misplaced, misplaced[:5]
    return [Delivery(*parse_body(row.body), consumer="spark", queue_id=row.queue_id, offset=row.queue_offset)
            for row in rows]


def _locks(conn: RoutedConnection, group_name: str) -> list[pb.QueueLock]:
    """The source group's live queue locks held on broker group ``group_name``'s master."""
    answer = conn.for_group(group_name).call("QueryLocks", pb.QueryLocksRequest(group=GROUP, topic=SOURCE))
    return [lock for lock in answer.locks if lock.client_id]


def _left_locked(conn: RoutedConnection, timeout: float = 30.0) -> dict[str, list[int]]:
    """The source queues per broker group whose lock was not released after the query stopped:
    still held after ``timeout``, or gone only when its lease ran out.

    Spark stops the reader's process without waiting for it, so the release lands a moment after
    ``query.stop()`` returns; a lock counts as released when it disappears before its lease ends.
    """
    lease_ends: dict[tuple[str, int], float] = {}
    expired: dict[str, list[int]] = {}

    def all_released() -> bool:
        polled = time.monotonic()
        held = {(name, lock.queue_id): polled + lock.expires_in_ms / 1000
                for name in conn.groups() for lock in _locks(conn, name)}
        for gone in set(lease_ends) - set(held):
            if lease_ends.pop(gone) <= polled:
                expired.setdefault(gone[0], []).append(gone[1])
        lease_ends.update(held)
        return not held

    wait_until(all_released, timeout)
    for name, queue_id in lease_ends:
        expired.setdefault(name, []).append(queue_id)
    return expired


def _stop_producers(producers: list[KeyedProducer]) -> None:
    for producer in producers:
        producer.stop.set()
    for producer in producers:
        producer.join()


def test_exactly_once_query_across_three_groups(spark, broker_cluster, fault_report, tmp_path):
    history = History()
    groups, bootstrap, producers = _start(broker_cluster, history, limit=SENDS_PER_PRODUCER)
    conn = RoutedConnection(bootstrap, retry_timeout=60)
    query = _copy(spark, bootstrap, tmp_path / "checkpoint", 300)  # many micro-batches: many boundaries
    try:
        for producer in producers:
            producer.start()
        for producer in producers:
            producer.join()
        caught_up = wait_until(lambda: _all_acked_copied(conn, history) or query.exception(), 300, interval=1.0)
        groups_locked = {name: len(_locks(conn, name)) for name in conn.groups()}
    finally:
        _stop_producers(producers)
        query.stop()
    failure = query.exception()
    output = check(history.sends, _read_back(spark, conn, bootstrap))
    committed = {q: conn.call("GetOffset", pb.GetOffsetRequest(group=GROUP, topic=SOURCE, queue_id=q)).offset
                 for q in range(QUEUES)}
    ends = {q: conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=SOURCE, queue_id=q)).max_offset
            for q in range(QUEUES)}
    left_locked = _left_locked(conn)
    conn.close()
    fault_report("Spark exactly-once query over 3 groups x 2 brokers", {"output": output},
                 locks_per_group=groups_locked, source_committed=sum(committed.values()),
                 failed=None if failure is None else str(failure)[:300])
    assert failure is None, str(failure)[:3000]
    assert caught_up and output.ok, str(output)
    assert all(count == QUEUES // 3 for count in groups_locked.values()), groups_locked  # each group's own locks
    assert committed == ends, (committed, ends)  # the group's offsets follow the output on every group
    assert not left_locked, left_locked  # released on stop (not left to expire), on every group


def test_exactly_once_query_rides_out_a_group_master_kill(spark, broker_cluster, fault_report, tmp_path):
    history = History()
    groups, bootstrap, producers = _start(broker_cluster, history)
    conn = RoutedConnection(bootstrap, retry_timeout=60)
    query = _copy(spark, bootstrap, tmp_path / "checkpoint", 2_000)  # catches up on what piled up meanwhile
    elections, resumed, group_resumed, epochs = [], [], [], {}
    try:
        for producer in producers:
            producer.start()
        for i in range(KILLS):
            group = groups[(1 + i) % len(groups)]
            before = visible(conn, SINK)
            assert wait_until(lambda: visible(conn, SINK) > before or query.exception(), 120)  # noqa: B023
            assert query.exception() is None, str(query.exception())[:3000]
            sink_route = conn.routes.route(SINK, refresh=True)
            killed_queues = sink_route.queues_by_group()[group.name]
            at_kill = visible(conn, SINK)
            at_kill_group = _visible_in(conn, killed_queues)
            master = group.wait_for_master()
            master.kill9()
            killed = time.monotonic()
            promoted = group.wait_for_master(exclude=master)
            elections.append(round(time.monotonic() - killed, 2))
            epochs[group.name] = group.health(promoted).group_epoch
            master.start()  # back as a slave: with min_sync_replicas = 2 the new master needs it to acknowledge
            assert wait_until(lambda: visible(conn, SINK) > at_kill or query.exception(), 180, 0.1)  # noqa: B023
            resumed.append(round(time.monotonic() - killed, 2))
            assert wait_until(lambda: _visible_in(conn, killed_queues) > at_kill_group  # noqa: B023
                              or query.exception(), 180, 0.1)
            group_resumed.append(round(time.monotonic() - killed, 2))
            assert query.exception() is None, str(query.exception())[:3000]
        _stop_producers(producers)
        caught_up = wait_until(lambda: _all_acked_copied(conn, history) or query.exception(), 300, interval=1.0)
        relocked = {name: [lock.epoch >> 32 for lock in _locks(conn, name)] for name in epochs}
    finally:
        _stop_producers(producers)
        query.stop()
    failure = query.exception()
    output = check(history.sends, _read_back(spark, conn, bootstrap))
    log = check(history.sends, stored_deliveries(conn, SINK))
    conn.close()
    fault_report(f"Spark exactly-once query over 3 groups, {KILLS} group master(s) killed -9", {"output": output},
                 election_s=elections, output_resumed_s=resumed, killed_group_output_resumed_s=group_resumed,
                 group_epochs=epochs, relocked_at_group_epoch=relocked,
                 send_failures=sum(len(p.failures) for p in producers),
                 failed=None if failure is None else str(failure)[:300])
    assert failure is None, str(failure)[:3000]
    assert caught_up and output.ok and log.ok, f"{output}\n{log}"
    # The killed groups' locks are held again, granted by their new masters (epoch above group epoch << 32).
    assert all(relocked[name] and all(e >= epochs[name] for e in relocked[name]) for name in epochs), relocked


def _visible_in(conn: RoutedConnection, queue_ids: list[int]) -> int:
    return sum(conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=SINK, queue_id=q)).max_offset
               for q in queue_ids)


# -- the sink's transactions across groups, driven task by task (no Spark scheduling) -------------

def _stream_writer(bootstrap: str, **options):
    from pyspark.sql.types import StructField, StructType

    from connector.spark import OrderlyMQDataSource
    from connector.spark.schema import source_schema

    schema = StructType([StructField("key", source_schema()["key"].dataType), source_schema()["body"]])
    return OrderlyMQDataSource({"brokers": bootstrap, "topic": SINK, "shardingKey": "key", **options}).streamWriter(
        schema, False)


def _rows(keys: int, seqs: range) -> pa.RecordBatch:
    events = [(f"k{k}", s) for s in seqs for k in range(keys)]
    return pa.record_batch([pa.array([k for k, _ in events]), pa.array([body(k, s) for k, s in events], pa.binary())],
                           ["key", "body"])


def _task(writer, partition: int, batches):
    """One write task's commit message, as partition ``partition`` of the batch."""
    message = writer.write(iter(batches))
    return type(message)(message.query_id, message.batch_id, partition, message.parts, message.rows)


def _sent(keys: int, seqs: range, history: History) -> None:
    for s in seqs:
        for k in range(keys):
            history.sent(f"k{k}", s, acked=True)


def test_commit_plan_replayed_exactly_on_every_group(broker_cluster):
    """The driver recorded its plan, committed one group's part of partition 0 and died; the broker
    aborted partition 1's part on another group (timeout): the replay commits the plan on every
    group, that part replaced by the replay's own part of the same partition and group."""
    from connector.spark import transactions

    groups = broker_cluster(3, 2)
    bootstrap = _bootstrap(groups)
    with Admin(bootstrap) as admin:
        admin.create_topic(SINK, QUEUES)
    writer, history = _stream_writer(bootstrap), History()
    inputs = [[_rows(12, range(0, 3))], [_rows(12, range(3, 5))]]
    _sent(12, range(0, 5), history)
    first = [_task(writer, p, batches) for p, batches in enumerate(inputs)]
    assert all(len(m.parts) == 3 for m in first), [m.parts for m in first]  # 12 keys reach all three groups
    plan = [(m.partition_id, group, txn) for m in first for group, txn in m.parts]
    with RoutedConnection(bootstrap) as conn:
        conn.groups()
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=transactions.SINK_LOG_TOPIC, queue_count=1,
                                                       if_not_exists=True))
        transactions._record_plan(conn, first[0].query_id, 7, plan)  # noqa: SLF001 - the crashed driver's plan
        committed_group, committed_txn = first[0].parts[0]
        conn.for_group(committed_group).call("CommitTxn", pb.CommitTxnRequest(txn_id=committed_txn))
        aborted_group, aborted_txn = first[1].parts[2]
        conn.for_group(aborted_group).call("AbortTxn", pb.AbortTxnRequest(txn_id=aborted_txn))
        writer.commit([_task(writer, p, batches) for p, batches in enumerate(inputs)], 7)  # the replay
        output = check(history.sends, stored_deliveries(conn, SINK))
    assert output.ok and output.deliveries == output.acked, str(output)


def test_task_goes_on_through_a_master_kill_and_stages_again_a_lost_part(broker_cluster, monkeypatch):
    """A task stages rows on three groups. One group's master is killed -9 between two of its sends:
    its new master had copied every staged send, so the task's next send goes on in the same part.
    Another group loses the task's part (aborted behind its back): that part is abandoned and its
    rows staged again, in order, in a new transaction. Committed, the output holds every row once,
    each key in order."""
    import threading

    route_each_batch_alone(monkeypatch)
    groups = broker_cluster(3, 2)
    bootstrap = _bootstrap(groups)
    with Admin(bootstrap) as admin:
        admin.create_topic(SINK, QUEUES)
    writer, history = _stream_writer(bootstrap, maxBatchBytes="1024"), History()
    victim, losing = groups[1], groups[2]
    _sent(12, range(0, 60), history)

    def batches():
        yield _rows(12, range(0, 30))  # over maxBatchBytes per queue: staged on every group at once
        master = victim.wait_for_master()
        master.kill9()
        # With min_sync_replicas = 2 the new master acknowledges once the old one is back as its slave.
        threading.Thread(target=lambda: (victim.wait_for_master(exclude=master), master.start()), daemon=True).start()
        with RoutedConnection(bootstrap) as conn:
            conn.groups()  # learn every group's master
            losing_master = conn.for_group(losing.name)
            open_txns = losing_master.call("ListTransactions", pb.ListTransactionsRequest()).transactions
            for txn in open_txns:
                losing_master.call("AbortTxn", pb.AbortTxnRequest(txn_id=txn.txn_id))
        assert len(open_txns) == 1
        yield _rows(12, range(30, 60))

    message = _task(writer, 0, batches())  # the kill happens between the task's sends
    parts = dict(message.parts)
    renewed = sorted(group for group, txn in parts.items() if ".r" in txn)
    assert len(parts) == 3 and renewed == [losing.name], parts
    writer.commit([message], 0)
    with RoutedConnection(bootstrap) as conn:
        output = check(history.sends, stored_deliveries(conn, SINK))
    assert output.ok and output.deliveries == output.acked, str(output)


def test_locks_are_taken_back_after_a_failover_unless_another_client_consumed(broker_cluster):
    """The driver's LockKeeper holds every queue; one group's master is killed -9. On its new master
    a rival consumes one of that group's queues meanwhile: renewing takes the group's other queues
    back at the new master's epochs, fences that one naming the rival, and leaves the other
    groups' locks as they were."""
    from connector.spark.locks import LockKeeper

    groups = broker_cluster(3, 2)
    bootstrap = _bootstrap(groups)
    with Admin(bootstrap) as admin:
        admin.create_topic(SOURCE, QUEUES)
    conn = RoutedConnection(bootstrap, retry_timeout=60)
    refs = [(SOURCE, q) for q in range(QUEUES)]
    for _, q in refs:  # a message in every queue, so that an offset can move
        batch = codec.encode(codec.messages_to_batch([{"key": f"q{q}", "body": body(f"q{q}", 0)}]))
        conn.call("Send", pb.SendRequest(topic=SOURCE, queue_id=q, batch=batch))
    left: dict = {}
    keeper = LockKeeper(conn, GROUP, "me", 1000, left_at=left.get)
    before = keeper.epochs(refs)
    keeper._stop.set()  # noqa: SLF001 - renewals by hand below, so the rival gets in first
    for ref, epoch in before.items():
        conn.call("CommitOffset", pb.CommitOffsetRequest(group=GROUP, topic=SOURCE, queue_id=ref[1], offset=0,
                                                         client_id="me", epoch=epoch))
        left[ref] = 0
    victim = groups[1]
    taken, kept = conn.routes.route(SOURCE).queues_by_group()[victim.name]
    master = victim.wait_for_master()
    master.kill9()
    epoch = victim.health(victim.wait_for_master(exclude=master)).group_epoch
    rival = conn.call("LockBatch", pb.LockBatchRequest(group=GROUP, client_id="rival", topic=SOURCE,
                                                       queue_ids=[taken])).locked[0].epoch
    conn.call("CommitOffset", pb.CommitOffsetRequest(group=GROUP, topic=SOURCE, queue_id=taken, offset=1,
                                                     client_id="rival", epoch=rival))  # it consumed the queue
    conn.call("UnlockBatch", pb.UnlockBatchRequest(group=GROUP, client_id="rival", topic=SOURCE, queue_ids=[taken]))
    keeper.renew()
    after = keeper.epochs([ref for ref in refs if ref != (SOURCE, taken)])
    with pytest.raises(FencedError, match="'rival'"):
        keeper.epochs([(SOURCE, taken)])
    assert after[(SOURCE, kept)] >> 32 == epoch and before[(SOURCE, kept)] >> 32 < epoch, (before, after)
    assert all(after[ref] == before[ref] for ref in after if ref[1] not in (taken, kept)), (before, after)
    assert keeper.release()
    assert not any(lock.client_id == "me" for name in conn.groups() for lock in _locks(conn, name))
    conn.close()
