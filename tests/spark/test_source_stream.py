"""Streaming reads against a real broker: order, completeness, offsets, locks, restarts."""

from __future__ import annotations

import json

import pytest

from connector.client.connection import pb
from tests.spark.helpers import (
    Collector,
    assert_delivered,
    committed,
    create_topic,
    keyed_events,
    produce,
    queue_ends,
    row_events,
    run_available_now,
    stream,
)
from tests.support import wait_until

pytestmark = pytest.mark.spark


def end_positions(query) -> dict[int, int]:
    end = query.lastProgress["sources"][0]["endOffset"]
    end = json.loads(end) if isinstance(end, str) else end
    return {int(q): pos for queues in end["queues"].values() for q, pos in queues.items()}



def held_locks(conn, group, topic):
    locks = conn.call("QueryLocks", pb.QueryLocksRequest(group=group, topic=topic)).locks
    return [lock.client_id for lock in locks if lock.client_id]


@pytest.fixture
def leased(broker_factory):
    """A broker with a short lock lease: a lock not released on stop expires within seconds."""
    from connector.client.connection import BrokerConnection

    running = broker_factory(lock_lease_ms=3000)
    with BrokerConnection(running.address, retry_timeout=5) as connection:
        yield running, connection


def test_stream_reads_events_produced_while_running_in_order(ospark, leased, topic_name, tmp_path):
    broker, conn = leased
    create_topic(conn, topic_name, 3)
    collector = Collector()
    df = stream(ospark, broker, topic_name, "g1")
    query = (
        df.writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        produced = []
        for round_ in range(3):
            events = keyed_events(6, 5, start=round_ * 5)
            produce(conn, topic_name, 3, events)
            produced += events
            expected = len(produced)
            assert wait_until(lambda: len(collector.rows()) >= expected or query.exception(), 60)  # noqa: B023
        assert query.exception() is None
        assert_delivered(produced, row_events(collector.rows()))
        # The group's offsets reach the end of every queue once the batch that read it has completed.
        ends = queue_ends(conn, topic_name, 3)
        assert sum(ends.values()) == len(produced)
        assert wait_until(lambda: committed(conn, "g1", topic_name) == ends or query.exception(), 60)
        assert query.exception() is None
    finally:
        query.stop()
    assert query.exception() is None
    # The locks do not outlive the query: released by stop(), or else expired with their lease.
    assert wait_until(lambda: not held_locks(conn, "g1", topic_name), timeout=30)


def test_restart_from_checkpoint_neither_loses_nor_duplicates(ospark, broker, conn, topic_name, tmp_path):
    create_topic(conn, topic_name, 2)
    first = keyed_events(4, 6)
    produce(conn, topic_name, 2, first)
    collector = Collector()
    df = stream(ospark, broker, topic_name, "g2", maxMessagesPerTrigger=10, lockTimeoutMs=0)
    q1 = run_available_now(df, tmp_path / "ck", collector)
    client = json.loads(q1.lastProgress["sources"][0]["endOffset"])["clientId"]
    second = keyed_events(4, 5, start=6)
    produce(conn, topic_name, 2, second)
    q2 = run_available_now(df, tmp_path / "ck", collector)
    # Same consumer identity after the restart (lockTimeoutMs=0: it never waited for a lock).
    assert json.loads(q2.lastProgress["sources"][0]["endOffset"])["clientId"] == client
    assert_delivered(first + second, row_events(collector.rows()))
    assert all(len(rows) <= 10 for rows in collector.batches.values())
    assert committed(conn, "g2", topic_name) == end_positions(q2)


def test_second_query_of_the_group_is_refused_until_the_first_stops(ospark, leased, topic_name, tmp_path):
    broker, conn = leased
    create_topic(conn, topic_name, 2)
    produce(conn, topic_name, 2, keyed_events(3, 2))
    holder = Collector()
    first = (
        stream(ospark, broker, topic_name, "g3")
        .writeStream.foreachBatch(holder)
        .option("checkpointLocation", str(tmp_path / "a"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        assert wait_until(lambda: len(holder.rows()) >= 6 or first.exception(), 60)
        holders = wait_until(lambda: held_locks(conn, "g3", topic_name), 60)
        assert holders
        holder_id = holders[0]
        rival = stream(ospark, broker, topic_name, "g3", lockTimeoutMs=300)
        query = rival.writeStream.foreachBatch(Collector()).option("checkpointLocation", str(tmp_path / "b"))
        query = query.trigger(availableNow=True).start()
        with pytest.raises(Exception, match=f"held by client '{holder_id}'"):
            query.awaitTermination(120)
        assert "lockTimeoutMs" in str(query.exception())
    finally:
        first.stop()
    assert first.exception() is None
    late = Collector()
    run_available_now(stream(ospark, broker, topic_name, "g3", lockTimeoutMs=30000), tmp_path / "c", late)
    assert late.rows() == []  # it starts from the offsets the first query committed


def test_tag_filter_and_new_queues(ospark, broker, conn, topic_name, tmp_path):
    create_topic(conn, topic_name, 2)
    events = keyed_events(4, 6)
    produce(conn, topic_name, 2, events, tag=lambda key, seq: "even" if seq % 2 == 0 else "odd")
    collector = Collector()
    df = stream(ospark, broker, topic_name, "g4", tags="even", startingOffsets="earliest")
    q1 = run_available_now(df, tmp_path / "ck", collector)
    assert_delivered([e for e in events if e[1] % 2 == 0], row_events(collector.rows()))
    assert {r["tag"] for r in collector.rows()} == {"even"}
    # End offsets are queue offsets: the filtered-out messages are skipped, not left behind.
    assert end_positions(q1) == {
        0: sum(1 for k, _ in events if _queue(k, 2) == 0),
        1: sum(1 for k, _ in events if _queue(k, 2) == 1),
    }
    conn.call("UpdateTopic", pb.UpdateTopicRequest(topic=topic_name, queue_count=3))
    late = [("late", 0), ("late", 2)]
    batch = [{"key": k, "tag": "even", "body": json.dumps({"key": k, "seq": s}).encode()} for k, s in late]
    from broker.wire import codec

    conn.call("Send", pb.SendRequest(topic=topic_name, queue_id=2, batch=codec.encode(codec.messages_to_batch(batch))))
    q2 = run_available_now(df, tmp_path / "ck", collector)
    assert_delivered([e for e in events if e[1] % 2 == 0] + late, row_events(collector.rows()))
    assert end_positions(q2)[2] == 2


def _queue(key, n):
    from broker.wire.routing import queue_for_key

    return queue_for_key(key, n)
