"""The sink against a real broker: order and completeness, exactly-once replays, bad input."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import threading

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from broker.wire.errors import OrderlyMQError, TopicGrewError
from connector.client.connection import pb
from connector.spark import OrderlyMQDataSource
from connector.spark.schema import source_schema
from tests.spark.helpers import (
    assert_delivered,
    create_topic,
    keyed_events,
    produce,
    route_each_batch_alone,
    topic_delivered,
    topic_events,
)

pytestmark = pytest.mark.spark


def check_routed_in_order(conn, topic, queues, expected):
    """Every key sits in its routed queue, with all its events in produce order."""
    from broker.wire.routing import queue_for_key

    out = topic_events(conn, topic)
    for queue_id, events in out.items():
        assert all(queue_for_key(key, queues) == queue_id for key, _ in events)
    assert_delivered(expected, topic_delivered(out))


def copy_stream(ospark, broker, source, target, checkpoint, **sink_options):
    writer = _copy_query(ospark, broker, source, target, checkpoint, {"maxMessagesPerTrigger": 25}, **sink_options)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(180)
    assert query.exception() is None
    return query


def test_stream_copy_keeps_per_key_order_and_completeness(ospark, broker, conn, topic_name, tmp_path):
    source, target = topic_name, topic_name + "-out"
    create_topic(conn, source, 3)
    create_topic(conn, target, 2)
    events = keyed_events(7, 9)
    produce(conn, source, 3, events)
    query = copy_stream(ospark, broker, source, target, tmp_path / "ck")
    check_routed_in_order(conn, target, 2, events)
    # Only the run's first commit looks for plans of earlier attempts: each later one would read one.
    batches = sum(1 for progress in query.recentProgress if progress["numInputRows"])
    assert batches >= 3
    assert _plans_read(broker) < batches - 1


def test_topic_grown_under_a_running_query_stops_it_until_restarted(ospark, broker, conn, topic_name, tmp_path):
    """The topic grows from 2 to 4 queues while a query writes to it: the next batch fails with
    TopicGrewError and shows nothing; restarted, the query writes that batch over 4 queues."""
    from tests.support import wait_until

    source, target = topic_name, topic_name + "-out"
    create_topic(conn, source, 2)
    create_topic(conn, target, 2)
    first, later = keyed_events(6, 2), keyed_events(6, 2, start=2)
    produce(conn, source, 2, first)
    query = _copy_query(ospark, broker, source, target, tmp_path / "ck").trigger(processingTime="200 milliseconds")
    query = query.start()
    try:
        wait_until(lambda: sum(map(len, topic_events(conn, target).values())) == len(first), timeout=120)
        conn.call("UpdateTopic", pb.UpdateTopicRequest(topic=target, queue_count=4))
        produce(conn, source, 2, later)
        wait_until(lambda: query.exception() is not None, timeout=120)
    finally:
        query.stop()
    assert "now has 4 queues, but this query routed keys over the 2" in str(query.exception())
    check_routed_in_order(conn, target, 2, first)
    restarted = _copy_query(ospark, broker, source, target, tmp_path / "ck").trigger(availableNow=True).start()
    restarted.awaitTermination(180)
    assert restarted.exception() is None
    _check_placed(conn, target, {2: first, 4: later})
    assert_delivered(first + later, topic_delivered(topic_events(conn, target)))


def _copy_query(ospark, broker, source, target, checkpoint, source_options=(), **sink_options):
    """A query copying ``source`` to ``target`` by key, not started."""
    reader = (ospark.readStream.format("orderlymq").option("brokers", broker.address).option("topic", source)
              .option("consumerGroup", "copier"))
    df = reader.options(**{key: str(value) for key, value in dict(source_options).items()}).load()
    writer = (df.writeStream.format("orderlymq").option("brokers", broker.address).option("topic", target)
              .option("shardingKey", "key").option("checkpointLocation", str(checkpoint)))
    return writer.options(**{key: str(value) for key, value in sink_options.items()})


def _plans_read(broker) -> float:
    """Messages of the sink's commit log the (in-process) broker has answered pulls with."""
    from connector.spark.transactions import SINK_LOG_TOPIC

    return broker.service.metrics.registry.get_sample_value(
        "orderlymq_messages_out_total", {"topic": SINK_LOG_TOPIC, "queue": "0"}) or 0


def test_replayed_batch_is_committed_once(ospark, broker, conn, topic_name, tmp_path):
    """The driver 'dies' after the sink committed but before Spark's commit log: Spark replays."""
    source, target = topic_name, topic_name + "-out"
    create_topic(conn, source, 2)
    create_topic(conn, target, 3)
    events = keyed_events(5, 6)
    produce(conn, source, 2, events)
    checkpoint = tmp_path / "ck"
    query = copy_stream(ospark, broker, source, target, checkpoint)
    last = query.lastProgress["batchId"]
    (checkpoint / "commits" / str(last)).unlink()
    shutil.rmtree(checkpoint / "commits" / f".{last}.crc", ignore_errors=True)
    (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
    replay = copy_stream(ospark, broker, source, target, checkpoint)
    assert replay.lastProgress["batchId"] == last  # the batch ran again ...
    check_routed_in_order(conn, target, 3, events)  # ... and is visible once


def test_exactly_once_false_sends_directly_in_order(ospark, broker, conn, topic_name, tmp_path):
    source, target = topic_name, topic_name + "-out"
    create_topic(conn, source, 2)
    create_topic(conn, target, 2)
    events = keyed_events(4, 5)
    produce(conn, source, 2, events)
    copy_stream(ospark, broker, source, target, tmp_path / "ck", exactlyOnce="false")
    check_routed_in_order(conn, target, 2, events)


def _rpcs(broker, method: str) -> float:
    return broker.service.metrics.registry.get_sample_value(
        "orderlymq_rpc_duration_seconds_count", {"method": method}) or 0


@pytest.mark.parametrize("exactly_once", ["true", "false"])
@pytest.mark.parametrize("lean_port", [True, False])
def test_tasks_send_over_the_lean_port_when_served_else_grpc(ospark, broker_factory, topic_name, tmp_path,
                                                             exactly_once, lean_port):
    from connector.client.connection import BrokerConnection

    broker = broker_factory(send_port=0 if lean_port else -1)
    source, target = topic_name, topic_name + "-out"
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, source, 2)
        create_topic(conn, target, 3)
        events = keyed_events(6, 20)
        produce(conn, source, 2, events)
        produced = _rpcs(broker, "Send")
        copy_stream(ospark, broker, source, target, tmp_path / "ck", exactlyOnce=exactly_once, maxBatchBytes=1024)
        check_routed_in_order(conn, target, 3, events)
    over_port, over_grpc = _rpcs(broker, "SendPort"), _rpcs(broker, "Send") - produced
    if not lean_port:
        assert over_port == 0 and over_grpc >= 6
    elif exactly_once == "true":
        assert over_port >= 6  # each batch's plan goes over gRPC (connector.spark.transactions)
    else:
        assert over_port >= 6 and over_grpc == 0


@pytest.mark.parametrize("exactly_once", [True, False])
def test_a_task_whose_lean_port_closes_sends_on_over_grpc(broker_factory, topic_name, exactly_once, caplog,
                                                          monkeypatch):
    """The port's connections are closed under a writing task: what it sent next, it resends over
    gRPC under the same number (the broker stores one producer sequence once, and stages one
    staged send's number once), into the same transaction; every row once, in order."""
    from connector.client.connection import BrokerConnection

    route_each_batch_alone(monkeypatch)
    caplog.set_level(logging.INFO, logger="connector.spark.writer")
    broker = broker_factory()
    events = keyed_events(4, 30)
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, topic_name, 2)
        writer = _writer(broker, topic_name, maxBatchBytes="1024", exactlyOnce=str(exactly_once).lower())

        def batches():
            for start in range(0, len(events), 10):  # each batch fills every queue's 1024 bytes: a send each
                if start == 50:
                    broker._loop.call(broker.send_port.close())
                yield _batch(events[start:start + 10], pad=200)

        message = writer.write(batches())
        assert "sending it over gRPC" in caplog.text
        if exactly_once:  # the task's own transaction, not a renewed one (``<id>.r1``)
            assert [txn_id.rsplit("/", 1)[1].isalnum() for _group, txn_id in message.parts] == [True]
        else:
            assert not message.parts
        writer.commit([message], 0)
        check_routed_in_order(conn, topic_name, 2, events)
    assert _rpcs(broker, "SendPort") >= 8 and _rpcs(broker, "Send") >= 8


def test_a_task_stages_again_in_a_new_transaction_on_a_broker_older_than_numbering(tmp_path, topic_name, monkeypatch):
    """A broker from before numbered staging would stage a resent send twice. Frozen as a task's
    send reaches it, then killed -9 and started again, it cannot be sent that send again (it may
    have staged it): the task stages everything again in a new transaction (``<id>.r1``) and the
    old one is never committed; every row once, in order."""
    from connector.client.connection import BrokerConnection
    from tests.support import BROKER_BEFORE_NUMBERED_STAGING, older_broker

    route_each_batch_alone(monkeypatch)
    broker = older_broker(tmp_path, BROKER_BEFORE_NUMBERED_STAGING).start()
    events = keyed_events(4, 30)

    def restart():
        broker.kill9()
        broker.start()

    try:
        with BrokerConnection(broker.address) as conn:
            create_topic(conn, topic_name, 2)
            writer = _writer(broker, topic_name, maxBatchBytes="1024")

            def batches():
                for start in range(0, len(events), 10):  # each batch fills every queue's 1024 bytes: a send each
                    if start == 50:  # the next send is written to a frozen broker, which is then killed
                        os.kill(broker.pid, signal.SIGSTOP)
                        threading.Timer(0.5, restart).start()
                    yield _batch(events[start:start + 10], pad=200)

            message = writer.write(batches())
            assert [txn_id.rsplit("/", 1)[1].endswith(".r1") for _group, txn_id in message.parts] == [True]
            writer.commit([message], 0)
            check_routed_in_order(conn, topic_name, 2, events)
    finally:
        broker.kill9()


def test_commit_replay_in_process(broker, conn, topic_name):
    """``commit`` of one batch id twice (new attempts, new transactions) makes each row visible once."""
    create_topic(conn, topic_name, 2)
    writer = _writer(broker, topic_name)
    part0, part1 = keyed_events(3, 2), keyed_events(3, 2, start=2)
    writer.commit([_attempt(writer, 0, part0), _attempt(writer, 1, part1)], 7)
    writer.commit([_attempt(writer, 0, part0), _attempt(writer, 1, part1)], 7)
    check_routed_in_order(conn, topic_name, 2, part0 + part1)


def test_bad_input_fails_the_batch_with_nothing_visible(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, 2)
    base = ospark.createDataFrame([("a", "x"), (None, "y"), (None, "z")], "key string, body string")

    def write(df, **options):
        writer = df.write.format("orderlymq").option("brokers", broker.address).option("topic", topic_name)
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.mode("append").save()

    with pytest.raises(Exception, match=r"2 of 3 row\(s\) have a null sharding key in column 'key'"):
        write(base.coalesce(1), shardingKey="key")
    with pytest.raises(Exception, match=r"column 'nope' \(option 'shardingKey'\) is not in the DataFrame"):
        write(base, shardingKey="nope")
    with pytest.raises(Exception, match=r"column 'n' \(option 'bodyColumn'\) has type int; a body must be binary"):
        write(base.withColumn("n", F.lit(1)), shardingKey="key", bodyColumn="n")
    with pytest.raises(Exception, match="option 'shardingKey' is required"):
        write(base)
    with pytest.raises(Exception, match=r"topic 'missing-topic' \(option 'topic'\) does not exist"):
        base.write.format("orderlymq").option("brokers", broker.address).option("topic", "missing-topic").option(
            "shardingKey", "key"
        ).mode("append").save()
    assert all(events == [] for events in topic_events(conn, topic_name).values())


def _sink(broker, topic_name, **options):
    return OrderlyMQDataSource({"brokers": broker.address, "topic": topic_name, "shardingKey": "key", **options})


def _writer(broker, topic_name, sink=None, **options):
    """A stream writer, as Spark makes one to plan each micro-batch's write (from a new instance of
    the data source), or from ``sink`` (as it makes each commit's, from the instance of the run)."""
    schema = StructType([StructField("key", source_schema()["key"].dataType), source_schema()["body"]])
    return (sink or _sink(broker, topic_name, **options)).streamWriter(schema, False)


def _batch(events, pad: int = 0):
    bodies = [json.dumps({"key": k, "seq": s, "pad": "x" * pad}).encode() for k, s in events]
    return pa.record_batch([pa.array([k for k, _ in events]), pa.array(bodies, pa.binary())], ["key", "body"])


def _attempt(writer, partition, events, run_id=""):
    """A task's commit message for ``partition`` (``run_id``: the query's run, as Spark's tasks know it)."""
    return dataclasses.replace(writer.write(iter([_batch(events)])), partition_id=partition, run_id=run_id)


def test_commit_cut_short_is_finished_by_the_replay(broker, conn, topic_name):
    """The driver recorded its plan and committed partition 0 only, then died: the replay completes it,
    and stores the plan's position as the query's last plan (which the dead driver had no time to do)."""
    from connector.spark import transactions

    create_topic(conn, topic_name, 2)
    writer = _writer(broker, topic_name)
    part0, part1 = keyed_events(3, 2), keyed_events(3, 2, start=2)
    first = [_attempt(writer, 0, part0), _attempt(writer, 1, part1)]
    conn.call(
        "CreateTopic", pb.CreateTopicRequest(topic=transactions.SINK_LOG_TOPIC, queue_count=1, if_not_exists=True)
    )
    planned_at = transactions._record_plan(conn, first[0].query_id, 3,
                                           [(m.partition_id, group, txn) for m in first for group, txn in m.parts])
    conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=first[0].parts[0][1]))
    writer.commit([_attempt(writer, 0, part0), _attempt(writer, 1, part1)], 3)
    check_routed_in_order(conn, topic_name, 2, part0 + part1)
    last_plan = pb.GetOffsetRequest(group=f"spark-sink/{writer.write_id}/planned", topic=transactions.SINK_LOG_TOPIC,
                                    queue_id=0)
    assert conn.call("GetOffset", last_plan).offset == planned_at


def _plan(conn, batch_id, messages):
    from connector.spark import transactions

    conn.call(
        "CreateTopic", pb.CreateTopicRequest(topic=transactions.SINK_LOG_TOPIC, queue_count=1, if_not_exists=True)
    )
    transactions._record_plan(conn, messages[0].query_id, batch_id,
                              [(m.partition_id, group, txn) for m in messages for group, txn in m.parts])


def test_an_aborted_batch_keeps_its_planned_transactions_for_the_replay(broker, conn, topic_name):
    """The commit was cut short after the plan: Spark aborts the batch, which must not abort what
    the plan names (the replay commits it as it is, substituting nothing)."""
    create_topic(conn, topic_name, 2)
    writer = _writer(broker, topic_name)
    part0, part1 = keyed_events(3, 2), keyed_events(3, 2, start=2)
    first = [_attempt(writer, 0, part0), _attempt(writer, 1, part1)]
    _plan(conn, 5, first)
    conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=first[0].parts[0][1]))
    writer.abort(first, 5)
    assert conn.call("BeginTxn", pb.BeginTxnRequest(txn_id=first[1].parts[0][1])).state == "OPEN"
    replay = [_attempt(writer, 0, part0), _attempt(writer, 1, part1)]
    writer.commit(replay, 5)
    check_routed_in_order(conn, topic_name, 2, part0 + part1)
    for message in replay:  # the replay's own transactions were not needed: aborted
        assert conn.call("BeginTxn", pb.BeginTxnRequest(txn_id=message.parts[0][1])).state == "ABORTED"


def test_a_substitute_is_recorded_so_a_second_replay_does_not_substitute_again(broker, conn, topic_name):
    """Planned transactions of partitions 1 and 2 were aborted by the broker. A first replay
    commits its own partition 1 in place of the planned one, then fails (it has no partition 2).
    A second replay must commit that substitute, not another copy of partition 1."""
    from broker.wire.errors import TransactionError

    create_topic(conn, topic_name, 3)
    writer = _writer(broker, topic_name)
    parts = [keyed_events(3, 2, start=2 * p) for p in range(3)]
    first = [_attempt(writer, p, parts[p]) for p in range(3)]
    _plan(conn, 6, first)
    conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=first[0].parts[0][1]))
    for message in first[1:]:
        conn.call("AbortTxn", pb.AbortTxnRequest(txn_id=message.parts[0][1]))
    with pytest.raises(TransactionError, match="no rows for that partition"):
        writer.commit([_attempt(writer, p, parts[p]) for p in range(2)], 6)
    writer.commit([_attempt(writer, p, parts[p]) for p in range(3)], 6)
    check_routed_in_order(conn, topic_name, 3, [event for part in parts for event in part])


def test_a_planned_transaction_the_broker_forgot_fails_the_commit_instead_of_being_replaced(broker, conn,
                                                                                           topic_name):
    """Forgotten (finished over 24 h ago) may mean committed: replacing it could write its rows twice."""
    from broker.wire.errors import TransactionError

    create_topic(conn, topic_name, 1)
    writer = _writer(broker, topic_name)
    events = keyed_events(2, 2)
    planned = _attempt(writer, 0, events)
    forgotten = type(planned)(planned.query_id, planned.batch_id, 0, (("", "spark-sink/forgotten"),), planned.rows)
    _plan(conn, 8, [forgotten])
    with pytest.raises(TransactionError, match="unknown to the broker.*cannot be told"):
        writer.commit([planned], 8)
    assert all(stored == [] for stored in topic_events(conn, topic_name).values())


def test_tasks_keep_their_transactions_past_the_brokers_timeout(broker_factory, topic_name):
    """The broker aborts a transaction idle for txn_timeout_ms (here 600 ms). A task that waits
    longer than that for its first rows keeps its transaction alive meanwhile, and a task that
    finished long before the batch's last one still has its rows when the driver commits."""
    import time

    from connector.client.connection import BrokerConnection

    broker = broker_factory(txn_timeout_ms=600, flush_interval_ms=50)
    conn = BrokerConnection(broker.address, retry_timeout=2)
    create_topic(conn, topic_name, 2)
    writer = _writer(broker, topic_name)
    early, late = keyed_events(3, 4), keyed_events(3, 4, start=4)
    finished_early = _attempt(writer, 0, early)

    def rows_after_a_wait():
        time.sleep(2.0)  # upstream works before its first row: three timeouts
        yield _batch(late)

    message = writer.write(rows_after_a_wait())
    waited_late = type(message)(message.query_id, message.batch_id, 1, message.parts, message.rows)
    time.sleep(1.5)  # the driver commits long after the last task
    writer.commit([finished_early, waited_late], 1)
    check_routed_in_order(conn, topic_name, 2, early + late)
    conn.close()


def test_topic_grown_under_a_running_writer_fails_clearly(broker, conn, topic_name):
    create_topic(conn, topic_name, 2)
    writer = _writer(broker, topic_name)
    conn.call("UpdateTopic", pb.UpdateTopicRequest(topic=topic_name, queue_count=4))
    with pytest.raises(TopicGrewError, match="now has 4 queues, but this query routes keys over the 2"):
        _attempt(writer, 0, keyed_events(2, 1))
    assert all(events == [] for events in topic_events(conn, topic_name).values())


@pytest.mark.parametrize("exactly_once", [True, False])
def test_topic_grown_between_micro_batches_fails_the_commit(broker, conn, topic_name, exactly_once):
    """Each micro-batch's tasks route over the count read when it was planned; the run's commits
    remember the count its first batch routed over, so the batch after the topic grew fails its
    commit. Exactly once, nothing of it shows and its transaction is aborted."""
    options = {"exactlyOnce": str(exactly_once).lower()}
    create_topic(conn, topic_name, 2)
    run = _sink(broker, topic_name, **options)
    first, later = keyed_events(6, 2), keyed_events(6, 2, start=2)
    _writer(broker, topic_name, run).commit([_attempt(_writer(broker, topic_name, **options), 0, first)], 0)
    conn.call("UpdateTopic", pb.UpdateTopicRequest(topic=topic_name, queue_count=4))
    message = _attempt(_writer(broker, topic_name, **options), 0, later)
    with pytest.raises(TopicGrewError, match="now has 4 queues, but this query routed keys over the 2"):
        _writer(broker, topic_name, run).commit([message], 1)
    if exactly_once:
        with pytest.raises(OrderlyMQError):  # aborted: it can never show
            conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=message.parts[0][1]))
        check_routed_in_order(conn, topic_name, 2, first)
    else:  # already written, over 4 queues, as the error says
        _check_placed(conn, topic_name, {2: first, 4: later})


def test_topic_of_a_topic_column_grown_between_micro_batches_fails_the_commit(broker, conn, topic_name):
    """Rows naming their topic in a ``topic`` column: the tasks read its count at their first row,
    and the run's commits hold them to the first batch's as with the ``topic`` option."""
    create_topic(conn, topic_name, 2)
    schema = StructType([StructField("topic", StringType()), StructField("key", source_schema()["key"].dataType),
                         source_schema()["body"]])
    options = {"brokers": broker.address, "shardingKey": "key"}
    run = OrderlyMQDataSource(options)

    def attempt(events):
        rows = _batch(events)
        batch = pa.record_batch([pa.array([topic_name] * rows.num_rows), *rows.columns], ["topic", "key", "body"])
        return OrderlyMQDataSource(options).streamWriter(schema, False).write(iter([batch]))

    first, later = keyed_events(6, 2), keyed_events(6, 2, start=2)
    run.streamWriter(schema, False).commit([attempt(first)], 0)
    conn.call("UpdateTopic", pb.UpdateTopicRequest(topic=topic_name, queue_count=4))
    with pytest.raises(TopicGrewError, match="now has 4 queues, but this query routed keys over the 2"):
        run.streamWriter(schema, False).commit([attempt(later)], 1)
    check_routed_in_order(conn, topic_name, 2, first)


def test_a_restarted_query_routes_over_the_grown_count(broker, conn, topic_name):
    """A new run (a new instance of the data source) routes over the count of its start."""
    create_topic(conn, topic_name, 2)
    first, later = keyed_events(6, 2), keyed_events(6, 2, start=2)
    _writer(broker, topic_name, _sink(broker, topic_name)).commit([_attempt(_writer(broker, topic_name), 0, first)], 0)
    conn.call("UpdateTopic", pb.UpdateTopicRequest(topic=topic_name, queue_count=4))
    _writer(broker, topic_name, _sink(broker, topic_name)).commit([_attempt(_writer(broker, topic_name), 0, later)], 1)
    _check_placed(conn, topic_name, {2: first, 4: later})
    assert_delivered(first + later, topic_delivered(topic_events(conn, topic_name)))


def _check_placed(conn, topic, routed_over):
    """The topic holds exactly the events of ``{queue count: events}``, each in its key's queue
    among that many queues; some key has moved between the counts."""
    from broker.wire.routing import queue_for_key

    placed = {event: queue_id for queue_id, events in topic_events(conn, topic).items() for event in events}
    assert sorted(placed) == sorted(event for events in routed_over.values() for event in events)
    for count, events in routed_over.items():
        assert all(placed[(key, seq)] == queue_for_key(key, count) for key, seq in events), count
    keys = {key for events in routed_over.values() for key, _ in events}
    assert any(len({queue_for_key(key, count) for count in routed_over}) > 1 for key in keys)


def test_replay_is_found_after_this_process_committed_the_batch_before(broker, conn, topic_name):
    """Batch 4 is committed here; an attempt elsewhere plans batch 5 and commits partition 0 only, then
    dies. This process's lookup of batch 5 starts at batch 4's plan, finds batch 5's and completes it."""
    from connector.spark import transactions

    create_topic(conn, topic_name, 2)
    writer = _writer(broker, topic_name)
    first = keyed_events(2, 2)
    writer.commit([_attempt(writer, 0, first)], 4)
    part0, part1 = keyed_events(3, 2, start=10), keyed_events(3, 2, start=12)
    elsewhere = [_attempt(writer, 0, part0), _attempt(writer, 1, part1)]
    transactions._record_plan(conn, elsewhere[0].query_id, 5,
                              [(m.partition_id, group, txn) for m in elsewhere for group, txn in m.parts])
    conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=elsewhere[0].parts[0][1]))
    writer.commit([_attempt(writer, 0, part0), _attempt(writer, 1, part1)], 5)
    check_routed_in_order(conn, topic_name, 2, first + part0 + part1)


def test_a_later_batch_of_the_same_run_is_committed_without_a_lookup(broker, conn, topic_name):
    """After this process committed batch 4 of a run, batch 5 of that run cannot have been planned
    before: its commit reads no plans. Batch 6 of another run (a restart) looks them up again."""
    from connector.spark.transactions import SINK_LOG_TOPIC
    from tests.support import served_calls

    create_topic(conn, topic_name, 2)
    create_topic(conn, SINK_LOG_TOPIC, 1)  # as an earlier query left it: a lookup reads it
    writer = _writer(broker, topic_name)
    batches = [keyed_events(2, 2, start=10 * b) for b in range(3)]
    for batch_id, run_id, events in ((4, "run-1", batches[0]), (5, "run-1", batches[1]), (6, "run-2", batches[2])):
        messages = [_attempt(writer, 0, events, run_id)]
        pulls = served_calls(broker, "Pull")
        writer.commit(messages, batch_id)
        looked_up = served_calls(broker, "Pull") > pulls
        assert looked_up == (batch_id != 5), batch_id
    check_routed_in_order(conn, topic_name, 2, [event for events in batches for event in events])


def test_a_replay_in_a_new_run_is_found_after_this_process_committed_the_batch_before(broker, conn, topic_name):
    """Batch 4 is committed here in one run; that run plans batch 5 elsewhere, commits partition 0
    only and dies. The next run's replay of batch 5 here finds that plan and completes it."""
    from connector.spark import transactions

    create_topic(conn, topic_name, 2)
    writer = _writer(broker, topic_name)
    first = keyed_events(2, 2)
    writer.commit([_attempt(writer, 0, first, "run-1")], 4)
    part0, part1 = keyed_events(3, 2, start=10), keyed_events(3, 2, start=12)
    elsewhere = [_attempt(writer, 0, part0, "run-1"), _attempt(writer, 1, part1, "run-1")]
    transactions._record_plan(conn, elsewhere[0].query_id, 5,
                              [(m.partition_id, group, txn) for m in elsewhere for group, txn in m.parts])
    conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=elsewhere[0].parts[0][1]))
    writer.commit([_attempt(writer, 0, part0, "run-2"), _attempt(writer, 1, part1, "run-2")], 5)
    check_routed_in_order(conn, topic_name, 2, first + part0 + part1)


def _retention_removes_plans_from(conn, position: int) -> None:
    """Another query's plans roll the sink log's segments until retention (1 ms) has removed ``position``."""
    from connector.spark import transactions
    from tests.support import wait_until

    for batch in range(60):
        transactions._record_plan(conn, "another-query", batch, [])

    def log_start() -> int:
        request = pb.QueryOffsetsRequest(topic=transactions.SINK_LOG_TOPIC, queue_id=0)
        return conn.call("QueryOffsets", request).min_offset

    assert wait_until(lambda: log_start() > position)
    transactions._committed_here.clear()  # a new driver process: the lookup starts at the stored position


@pytest.mark.parametrize("before", ["stopped", "cut short", "older version"])
def test_plans_removed_by_retention(broker_factory, topic_name, caplog, before):
    """Batch 4 is committed, then retention removes the plans. A query that merely stopped goes on
    with batch 5. A replay of batch 5, whose commit made part of it visible before it was cut short,
    fails rather than write it again (which of its rows are visible cannot be told). A query whose
    batch 4 was committed by a version that kept no planned position writes batch 5, with a warning."""
    from broker.wire.errors import TransactionError
    from connector.client.connection import BrokerConnection
    from connector.spark import transactions

    broker = broker_factory(segment_bytes=4096, retention_ms=1, retention_check_interval_ms=50)
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, topic_name, 2)
        writer = _writer(broker, topic_name)
        first = keyed_events(2, 2)
        if before == "older version":  # its commit: the plan and the visible batch's position, nothing else
            attempt = _attempt(writer, 0, first)
            _plan(conn, 4, [attempt])
            conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=attempt.parts[0][1]))
            conn.call("CommitOffset", pb.CommitOffsetRequest(group=f"spark-sink/{writer.write_id}",
                                                             topic=transactions.SINK_LOG_TOPIC, queue_id=0, offset=0))
        else:
            writer.commit([_attempt(writer, 0, first)], 4)
        part0, part1 = keyed_events(3, 2, start=10), keyed_events(3, 2, start=12)
        visible = first
        if before == "cut short":  # partition 1's transaction is aborted: the commit stops after partition 0's
            cut = [_attempt(writer, 0, part0), _attempt(writer, 1, part1)]
            conn.call("AbortTxn", pb.AbortTxnRequest(txn_id=cut[1].parts[0][1]))
            with pytest.raises(TransactionError, match="was aborted by the broker"):
                writer.commit(cut, 5)
            visible = first + part0
        stored = conn.call("GetOffset", pb.GetOffsetRequest(group=f"spark-sink/{writer.write_id}",
                                                            topic=transactions.SINK_LOG_TOPIC, queue_id=0)).offset
        _retention_removes_plans_from(conn, max(stored, 0) + 1)
        replay = [_attempt(writer, 0, part0), _attempt(writer, 1, part1)]
        with caplog.at_level(logging.WARNING, logger="connector.spark.transactions"):
            if before == "cut short":
                with pytest.raises(TransactionError, match="batch 5 .*cut short.*retention.*cannot be told"):
                    writer.commit(replay, 5)
            else:
                writer.commit(replay, 5)
                visible = first + part0 + part1
        assert ("retention removed commit plans" in caplog.text) == (before == "older version")
        check_routed_in_order(conn, topic_name, 2, visible)


@pytest.mark.parametrize(("options", "batch_rows", "pad", "expected"), [
    ({}, 10_000, 0, [40_000, 20_000]),
    # A small maxBatchBytes cuts the sends, not the gathering: routing stays as cheap per row.
    ({"maxBatchBytes": "1048576"}, 10_000, 0, [40_000, 20_000]),
    # Large rows are gathered up to the bytes' bound: here each batch (about 5 MB) alone.
    ({}, 1_000, 5_000, [1_000] * 6),
], ids=["default", "small maxBatchBytes", "large rows"])
def test_input_batches_are_routed_a_few_at_a_time_each_queue_in_order(broker, conn, topic_name, monkeypatch,
                                                                      options, batch_rows, pad, expected):
    """A task routes Spark's input batches gathered (``_ROUTE_ROWS`` rows or ``_ROUTE_BYTES`` at
    most, the last fewer; empty ones skipped): every row reaches its queue once, each key's in
    input order."""
    from connector.spark import writer as writer_module

    routed: list[int] = []
    route = writer_module._Router.route
    monkeypatch.setattr(writer_module._Router, "route", lambda self, rows: (routed.append(rows.num_rows),
                                                                           route(self, rows))[1])
    create_topic(conn, topic_name, 4)
    writer = _writer(broker, topic_name, **options)
    events = keyed_events(50, sum(expected) // 50)  # in batches of batch_rows, as Spark hands them
    batches = [_batch(events[start:start + batch_rows], pad) for start in range(0, len(events), batch_rows)]
    batches.insert(3, batches[0].slice(0, 0))
    message = writer.write(iter(batches))
    assert routed == expected
    writer.commit([message], 0)
    check_routed_in_order(conn, topic_name, 4, events)


def test_keys_that_seldom_repeat_reach_their_queues_in_order(broker, conn, topic_name):
    """Keys that seldom repeat in what a task routes at once (an order's events, a batch apart) are
    hashed row by row, not once per distinct key: every row reaches its key's queue once, each
    key's in input order."""
    from broker.wire import routing

    create_topic(conn, topic_name, 4)
    writer = _writer(broker, topic_name)
    events = keyed_events(10_000, 2)
    assert routing._mostly_distinct(pa.array([key for key, _ in events]))  # the way this test is about
    writer.commit([writer.write(iter([_batch(events[:10_000]), _batch(events[10_000:])]))], 0)
    check_routed_in_order(conn, topic_name, 4, events)


def test_routed_queues_carry_their_rows_in_order_and_their_size(broker, conn, topic_name):
    """The router's groups: every row once, each queue's in input order, sized by their bytes (keys
    and bodies exactly), with null properties that carry no entries to the broker."""
    from broker.wire import codec
    from broker.wire.routing import queue_for_key
    from connector.spark.writer import _Router

    create_topic(conn, topic_name, 4)
    writer = _writer(broker, topic_name)
    events = keyed_events(9, 40)
    batch = _batch(events, pad=50)
    groups = list(_Router(conn, writer.options, writer.columns, writer.queue_counts).route(batch))
    assert sorted(queue for _topic, queue, _table, _size in groups) == sorted({queue for _t, queue, _, _ in groups})
    for _topic, queue, table, size in groups:
        mine = [e for e in events if queue_for_key(e[0], 4) == queue]
        assert [(k, json.loads(b)["seq"]) for k, b in zip(table.column("key").to_pylist(),
                                                          table.column("body").to_pylist(), strict=True)] == mine
        exact = sum(len(k.encode()) + len(b) for k, b in zip(table.column("key").to_pylist(),
                                                             table.column("body").to_pylist(), strict=True))
        assert exact < size <= exact + 40 * table.num_rows
        properties = table.column("properties").combine_chunks()
        assert properties.null_count == table.num_rows and len(properties.keys) == 0
        stored_properties = codec.decode(codec.encode(table)).column("properties").combine_chunks()
        assert len(stored_properties.keys) == 0


def test_commit_waves_put_each_part_after_the_earlier_parts_of_its_queues():
    """A part comes after every earlier part it shares a queue with; one of unknown queues (planned
    by an earlier attempt) after all earlier parts, and all later parts after it."""
    from connector.spark.transactions import _waves

    a, b, c = ("t", 0), ("t", 1), ("u", 0)
    parts = [(0, "p0"), (1, "p1"), (2, "p2"), (3, "p3"), (4, "p4"), (5, "p5"), (6, "p6")]
    queues = {"p0": frozenset({a}), "p1": frozenset({b}), "p2": frozenset({a, b}), "p3": frozenset({c}),
              "p4": frozenset({a}), "p6": frozenset({c})}  # p5's are unknown
    assert _waves(parts, lambda part: queues.get(part[1])) == [[(0, "p0"), (1, "p1"), (3, "p3")], [(2, "p2")],
                                                               [(4, "p4")], [(5, "p5")], [(6, "p6")]]
    assert _waves(parts[:2], lambda part: None) == [[(0, "p0")], [(1, "p1")]]  # nothing known: one after the other
    assert _waves([], lambda part: None) == []


def test_the_queues_of_a_tasks_parts_are_told_apart_by_broker_group():
    """In a cluster a task's parts on several groups share its transaction id: each keeps its own queues."""
    from connector.spark.writer import SinkCommitMessage, queues_of_parts

    message = SinkCommitMessage("q", 0, 0, (("a", "x"), ("b", "x")), 4,
                                staged_queues=(("a", "x", (("t", 0),)), ("b", "x", (("t", 1), ("t", 2)))))
    assert queues_of_parts([message]) == {("a", "x"): frozenset({("t", 0)}), ("b", "x"): frozenset({("t", 1), ("t", 2)})}


def test_parts_with_no_queue_in_common_are_committed_side_by_side_each_queue_in_partition_order(
        broker, conn, topic_name):
    """Partitions 0 and 1 staged into queues 0 and 1 alone: the broker has both commits under way
    at once (each waits for the other before it appends). Partition 2 staged into both queues and
    partition 3 into queue 0 again: each is committed after the earlier ones of its queues, so that
    every key keeps its order across the partitions."""
    from broker.wire.routing import queue_for_key

    create_topic(conn, topic_name, 2)
    keys = {}
    for n in range(100):
        keys.setdefault(queue_for_key(f"k{n}", 2), f"k{n}")
    first, second = keys[0], keys[1]
    events = {0: [(first, s) for s in range(3)], 1: [(second, s) for s in range(3)],
              2: [(first, 3), (second, 3), (first, 4), (second, 4)], 3: [(first, s) for s in range(5, 8)]}
    writer = _writer(broker, topic_name)
    messages = [_attempt(writer, partition, rows) for partition, rows in events.items()]
    partition_of = {txn_id: m.partition_id for m in messages for _, txn_id in m.parts}
    both_under_way = threading.Barrier(2, timeout=30)
    seen, lock = [], threading.Lock()
    apply_commit = broker.service._apply_commit

    def observed(txn_id):
        with lock:
            seen.append(("start", partition_of[txn_id]))
        if partition_of[txn_id] in (0, 1):
            both_under_way.wait()  # broken (and the commit failed) if the other is not under way too
        try:
            return apply_commit(txn_id)
        finally:
            with lock:
                seen.append(("end", partition_of[txn_id]))

    broker.service._apply_commit = observed
    try:
        writer.commit(messages, 0)
    finally:
        del broker.service._apply_commit
    assert not both_under_way.broken
    assert seen.index(("start", 2)) > max(seen.index(("end", 0)), seen.index(("end", 1)))
    assert seen.index(("start", 3)) > seen.index(("end", 2))
    check_routed_in_order(conn, topic_name, 2, [event for rows in events.values() for event in rows])


def test_rows_all_of_one_queue_are_sent_as_they_came(broker, conn, topic_name):
    """Input whose keys all route to one queue (a pipeline that keeps its keys' queues) is not
    gathered: its one group carries the input's own buffers, every row in input order, sized as
    the others are; written and committed, each key keeps its order."""
    from broker.wire.routing import queue_for_key
    from connector.spark.writer import _Router

    create_topic(conn, topic_name, 4)
    keys = [f"k{n}" for n in range(200) if queue_for_key(f"k{n}", 4) == 2][:7]
    events = [(key, seq) for seq in range(30) for key in keys]
    batches = [_batch(events[start:start + 50], pad=50) for start in range(0, len(events), 50)]
    writer = _writer(broker, topic_name)
    router = _Router(conn, writer.options, writer.columns, writer.queue_counts)
    [(_topic, queue, table, size)] = list(router.route(pa.Table.from_batches(batches)))
    assert queue == 2
    bodies = table.column("body")
    assert [chunk.buffers()[2].address for chunk in bodies.chunks] == [b.column(1).buffers()[2].address for b in batches]
    assert [(k, json.loads(b)["seq"]) for k, b in zip(table.column("key").to_pylist(), bodies.to_pylist(),
                                                      strict=True)] == events
    exact = sum(len(k.encode()) + len(b) for k, b in zip(table.column("key").to_pylist(), bodies.to_pylist(), strict=True))
    assert exact < size <= exact + 40 * table.num_rows
    writer.commit([writer.write(iter(batches))], 0)
    check_routed_in_order(conn, topic_name, 4, events)
