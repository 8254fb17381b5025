"""The streaming source under ordinary operations: hand-over between queries of a group, locks
that lapse or pass through another client, stops with a batch in flight, broker restarts and
freezes. Real broker (a subprocess where it must be killed or frozen), real Spark; every output
is judged per key in emission order by ``connector.history``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from connector.client import locking
from connector.client.connection import BrokerConnection, pb
from connector.spark.diagnostics import failure_reasons
from tests.faults.disk import records, segments, truncate
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
    topic_delivered,
    topic_events,
)
from tests.support import wait_until

pytestmark = pytest.mark.spark


def held_locks(conn, group, topic) -> dict[int, pb.QueueLock]:
    locks = conn.call("QueryLocks", pb.QueryLocksRequest(group=group, topic=topic)).locks
    return {lock.queue_id: lock for lock in locks if lock.client_id}


def client_of(query) -> str:
    end = query.lastProgress["sources"][0]["endOffset"]
    return (json.loads(end) if isinstance(end, str) else end)["clientId"]


def start_available_now(df, checkpoint, collector):
    query = df.writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
    return query.trigger(availableNow=True).start()


# -- break 1: hand-over between two queries of one group ------------------------------------------


def test_restart_from_older_checkpoint_after_another_query_consumed(ospark, broker, conn, topic_name, tmp_path):
    create_topic(conn, topic_name, 2)
    first, second, third = keyed_events(4, 5), keyed_events(4, 5, start=5), keyed_events(4, 5, start=10)
    produce(conn, topic_name, 2, first)
    c1 = Collector()
    q1 = run_available_now(stream(ospark, broker, topic_name, "h1"), tmp_path / "ck1", c1)
    produce(conn, topic_name, 2, second)
    c2 = Collector()
    q2 = run_available_now(stream(ospark, broker, topic_name, "h1"), tmp_path / "ck2", c2)  # from the group's
    rival, group_ends = client_of(q2), committed(conn, "h1", topic_name)
    produce(conn, topic_name, 2, third)
    shutil.copytree(tmp_path / "ck1", tmp_path / "ck1-copy")

    again = start_available_now(stream(ospark, broker, topic_name, "h1"), tmp_path / "ck1", Collector())
    with pytest.raises(Exception, match="groupOffsetConflict"):
        again.awaitTermination(120)
    message = str(again.exception())
    assert rival in message and client_of(q1) in message
    assert all(f"group at offset {group_ends[q]}" in message for q in group_ends)  # both positions named

    # Following the group's offsets: q1 reads on exactly where q2 stopped.
    c3 = Collector()
    run_available_now(stream(ospark, broker, topic_name, "h1", groupOffsetConflict="group"), tmp_path / "ck1", c3)
    assert_delivered(first + second + third, row_events(c1.rows() + c2.rows() + c3.rows()))

    # Keeping the checkpoint's: q1 reads again what q2 read (asked for explicitly).
    c4 = Collector()
    df = stream(ospark, broker, topic_name, "h1", groupOffsetConflict="checkpoint")
    run_available_now(df, tmp_path / "ck1-copy", c4)
    assert_delivered(second + third, row_events(c4.rows()))


def copy_query(ospark, broker, source, group, checkpoint, trigger):
    df = stream(ospark, broker, source, group)
    writer = (df.select("key", "body").writeStream.format("orderlymq").option("brokers", broker.address)
              .option("topic", f"{source}-out").option("shardingKey", "key").option("checkpointLocation", str(checkpoint)))
    return writer.trigger(**trigger).start()


def test_next_holder_starts_exactly_after_what_the_stopped_query_made_visible(ospark, broker, conn, topic_name,
                                                                              tmp_path):
    create_topic(conn, topic_name, 2)
    create_topic(conn, f"{topic_name}-out", 2)
    first, second = keyed_events(4, 10), keyed_events(4, 10, start=10)
    produce(conn, topic_name, 2, first)
    # A long trigger interval: the query is stopped right after its second batch became visible,
    # before the next trigger, when Spark has not yet told the source that the batch is done.
    q1 = copy_query(ospark, broker, topic_name, "v1", tmp_path / "ck1", {"processingTime": "8 seconds"})
    out = f"{topic_name}-out"
    try:
        assert wait_until(lambda: len(topic_delivered(topic_events(conn, out))) == len(first) or q1.exception(), 120)
        produce(conn, topic_name, 2, second)
        assert wait_until(lambda: len(topic_delivered(topic_events(conn, out))) == 2 * len(first) or q1.exception(), 120)
        assert q1.exception() is None
    finally:
        q1.stop()
    assert q1.exception() is None
    assert sum(committed(conn, "v1", topic_name).values()) == 2 * len(first)  # right after what became visible
    third = keyed_events(4, 10, start=20)
    produce(conn, topic_name, 2, third)
    q2 = copy_query(ospark, broker, topic_name, "v1", tmp_path / "ck2", {"availableNow": True})
    q2.awaitTermination(120)
    assert q2.exception() is None
    assert_delivered(first + second + third, topic_delivered(topic_events(conn, out)))


# -- break 2: a lock that passed through another client fences the batch ---------------------------


def test_batch_planned_before_the_lock_passed_through_another_client_is_fenced(
        ospark, restartable, topic_name, tmp_path):
    proc, conn = restartable
    create_topic(conn, topic_name, 2)
    produce(conn, topic_name, 2, keyed_events(4, 20))
    intruder = "intruder-client"

    def intrude(batch_id):
        if batch_id == 1:
            # The broker restarts; the query's locks, kept for it, are freed as lapsed leases would be;
            # another client takes them, consumes and leaves.
            proc.kill9()
            proc.start()
            locks = conn.call("QueryLocks", pb.QueryLocksRequest(group="f2", topic=topic_name)).locks
            for lock in [lock for lock in locks if lock.client_id]:
                conn.call("UnlockBatch", pb.UnlockBatchRequest(group="f2", client_id=lock.client_id, topic=topic_name,
                                                               queue_ids=[lock.queue_id]))
            held = locking.lock_queues(conn, "f2", intruder, [(topic_name, 0), (topic_name, 1)], 10, advice="")
            for (topic, queue_id), epoch in held.items():
                end = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic, queue_id=queue_id)).max_offset
                conn.call("CommitOffset", pb.CommitOffsetRequest(group="f2", topic=topic, queue_id=queue_id,
                                                                 offset=end, client_id=intruder, epoch=epoch))
            conn.call("UnlockBatch", pb.UnlockBatchRequest(group="f2", client_id=intruder, topic=topic_name,
                                                           queue_ids=[0, 1]))

    collector = Collector(before=intrude)
    df = stream(ospark, proc, topic_name, "f2", maxMessagesPerTrigger=40, startingOffsets="earliest")
    query = start_available_now(df, tmp_path / "ck", collector)
    with pytest.raises(Exception, match=intruder):
        query.awaitTermination(180)
    assert "FencedError" in str(query.exception())
    assert sorted(collector.batches) == [0]  # the fenced batch delivered nothing


# -- break 3: queues held while waiting for the rest are renewed -----------------------------------


def test_queues_held_while_waiting_for_the_rest_do_not_lapse(ospark, broker_factory, topic_name, tmp_path):
    running = broker_factory(lock_lease_ms=3000)
    conn = BrokerConnection(running.address, retry_timeout=5)
    create_topic(conn, topic_name, 2)
    events = keyed_events(6, 5)
    produce(conn, topic_name, 2, events)
    rival_done = threading.Event()

    def rival():  # holds queue 1 (renewing it) until told to leave
        while not rival_done.is_set():
            locking.try_lock(conn, "p3", "rival", topic_name, [1])
            rival_done.wait(0.5)
        conn.call("UnlockBatch", pb.UnlockBatchRequest(group="p3", client_id="rival", topic=topic_name, queue_ids=[1]))

    holder = threading.Thread(target=rival, daemon=True)
    holder.start()
    assert wait_until(lambda: 1 in held_locks(conn, "p3", topic_name), 10)
    collector = Collector()
    query = start_available_now(stream(ospark, running, topic_name, "p3", lockTimeoutMs=60000), tmp_path / "ck",
                                collector)
    try:
        first = wait_until(lambda: held_locks(conn, "p3", topic_name).get(0), 60)
        assert first and first.client_id != "rival"
        # Explicit wait past the end of the lease the query first got for queue 0.
        assert wait_until(lambda: time.time() * 1000 > first.expires_at_ms + 1000, 10)
    finally:
        rival_done.set()
        holder.join()
    query.awaitTermination(120)
    assert query.exception() is None
    assert_delivered(events, row_events(collector.rows()))
    conn.close()


# -- break 4: q.stop() with a batch in flight releases the locks ---------------------------------


def test_stop_with_a_batch_in_flight_releases_the_locks_every_time(ospark, broker, conn, topic_name, tmp_path):
    from pyspark.sql import functions as F

    create_topic(conn, topic_name, 4)
    produce(conn, topic_name, 4, keyed_events(8, 10))
    for round_ in range(3):
        marks = tmp_path / f"marks-{round_}"
        marks.mkdir()
        df = stream(ospark, broker, topic_name, "s4", lockTimeoutMs=0)
        slow = F.udf(_held_until(str(marks)), "binary")
        query = (df.select("key", slow("body").alias("body")).writeStream.foreachBatch(Collector())
                 .option("checkpointLocation", str(tmp_path / f"ck-{round_}"))
                 .trigger(processingTime="100 milliseconds").start())
        try:
            assert wait_until(lambda: (marks / "started").exists() or query.exception(), 120)  # noqa: B023
            assert query.exception() is None
            assert held_locks(conn, "s4", topic_name)
        finally:
            query.stop()
            (marks / "release").touch()
        # The lease is 60 s: locks gone within seconds were released, not expired.
        assert wait_until(lambda: not held_locks(conn, "s4", topic_name), 15), held_locks(conn, "s4", topic_name)


def _held_until(marks: str):
    def hold(body):  # no type hints: they would make Spark look for a pandas UDF
        open(os.path.join(marks, "started"), "a").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(marks, "release")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return body

    return hold


# -- a query that died in its first micro-batch ---------------------------------------------------


def _fail_first_batch(batch_id):
    if batch_id == 0:
        raise RuntimeError("injected failure of the first micro-batch")



@pytest.mark.parametrize("starting", ["earliest", "latest"])
def test_a_query_failed_in_its_first_batch_restarts_it_from_where_it_started(ospark, broker, conn, topic_name,
                                                                            tmp_path, starting):
    """Spark replays a first batch that never completed from the source's initial offset, asked
    again in a new reader process: the replay must start where the failed run started (for
    ``latest``, not at the end as it is now) and under that run's identity."""
    create_topic(conn, topic_name, 2)
    before, after = keyed_events(4, 5), keyed_events(4, 5, start=5)
    produce(conn, topic_name, 2, before)
    failed = start_available_now(stream(ospark, broker, topic_name, "first", startingOffsets=starting),
                                 tmp_path / "ck", Collector(before=_fail_first_batch))
    with pytest.raises(Exception, match="injected failure"):
        failed.awaitTermination(120)
    assert (tmp_path / "ck" / "offsets" / "0").exists() and not (tmp_path / "ck" / "commits" / "0").exists()
    produce(conn, topic_name, 2, after)

    again = Collector()
    run_available_now(stream(ospark, broker, topic_name, "first", startingOffsets=starting), tmp_path / "ck", again)
    assert_delivered((before if starting == "earliest" else []) + after, row_events(again.rows()))
    assert committed(conn, "first", topic_name) == queue_ends(conn, topic_name, 2)


def test_a_first_batch_planned_by_an_earlier_connector_starts_at_the_groups_offsets(broker, conn, topic_name):
    """The end of a first batch written by a connector that did not record the start: the replay
    starts at the group's offsets, which that batch's planning committed under the query's identity,
    and refuses when another client moved them since."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connector.spark.offsets import positions_of
    from connector.spark.source import OrderlyMQDataSource

    create_topic(conn, topic_name, 2)
    produce(conn, topic_name, 2, keyed_events(4, 5))
    source = OrderlyMQDataSource({"brokers": broker.address, "topic": topic_name, "consumerGroup": "early",
                                  "startingOffsets": "earliest", "maxMessagesPerTrigger": "6"})
    with ThreadPoolExecutor(1) as driver:  # not the main thread, as in Spark's reader process

        def call(method, *args):
            return driver.submit(method, *args).result()

        first = source.streamReader(source.schema())
        end = call(first.latestOffset, call(first.initialOffset), ReadAllAvailable())
        call(first.stop)  # the run dies; its end as the earlier connector wrote it
        end.pop("initial")

        again = source.streamReader(source.schema())
        planned = call(again.partitions, call(again.initialOffset), end)
        call(again.stop)
        ends = {queue_id: pos for (_, queue_id), pos in positions_of(end).items()}
        assert [(p.queue_id, p.start, p.end, p.client_id) for p in planned] == [
            (queue_id, 0, pos, end["clientId"]) for queue_id, pos in sorted(ends.items()) if pos]

        conn.call("CommitOffset", pb.CommitOffsetRequest(group="early", topic=topic_name, queue_id=1, offset=2))
        moved = source.streamReader(source.schema())
        with pytest.raises(Exception, match="did not record where the query started.*use a new checkpointLocation"):
            call(moved.partitions, call(moved.initialOffset), end)
        call(moved.stop)


# -- break 5: broker restarts and freezes ---------------------------------------------------------


def test_broker_restart_mid_stream_reads_on_without_loss(ospark, restartable, topic_name, tmp_path):
    proc, conn = restartable
    create_topic(conn, topic_name, 2)
    events = keyed_events(4, 30)
    produce(conn, topic_name, 2, events)
    restarts = []

    def restart(batch_id):
        if batch_id in (1, 2) and batch_id not in restarts:
            proc.kill9()
            proc.start()
            restarts.append(batch_id)

    collector = Collector(before=restart)
    df = stream(ospark, proc, topic_name, "r5", maxMessagesPerTrigger=30, startingOffsets="earliest")
    run_available_now(df, tmp_path / "ck", collector)
    assert restarts == [1, 2]
    assert_delivered(events, row_events(collector.rows()))
    assert sum(committed(conn, "r5", topic_name).values()) == len(events)


def test_broker_frozen_past_poll_timeout_fails_with_the_cause(ospark, restartable, topic_name, tmp_path):
    from pyspark.sql import functions as F

    proc, conn = restartable
    create_topic(conn, topic_name, 2)
    create_topic(conn, f"{topic_name}-out", 2)
    produce(conn, topic_name, 2, keyed_events(4, 10))
    df = stream(ospark, proc, topic_name, "z5", startingOffsets="earliest", pollTimeoutMs=3000)
    freeze = F.udf(_freezing(proc.pid, str(tmp_path / "frozen")), "binary")
    query = (df.select("key", freeze("key", "body").alias("body")).writeStream.format("orderlymq")
             .option("brokers", proc.address).option("topic", f"{topic_name}-out").option("shardingKey", "key")
             .option("requestTimeoutMs", "3000")
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="100 milliseconds").start())
    try:
        assert wait_until(lambda: sum(committed(conn, "z5", topic_name).values()) == 40 or query.exception(), 120)
        assert query.exception() is None
        produce(conn, topic_name, 2, [("freeze", 0)] + keyed_events(4, 10, start=10))  # frozen mid-batch
        # Spark rethrows the failed task's error once the sink's abort has run; only an abort that
        # failed too ends the query with its own words instead, the task's error down the causes.
        with pytest.raises(Exception, match="BrokerUnavailableError|Writing job failed"):
            query.awaitTermination(180)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        query.stop()
    assert (tmp_path / "frozen").exists()
    reasons = failure_reasons(query)
    assert any("BrokerUnavailableError" in r and proc.address in r for r in reasons), reasons


def test_a_frozen_broker_fails_the_sinks_write_naming_its_timeout_option(ospark, restartable, topic_name, tmp_path):
    """The sink's calls wait ``requestTimeoutMs`` for a broker's answer; a write whose broker froze
    fails after it, with an error that names the broker and the option."""
    from pyspark.sql import functions as F

    proc, conn = restartable
    create_topic(conn, topic_name, 2)
    freeze = F.udf(_freezing(proc.pid, str(tmp_path / "frozen")), "binary")
    rows = ospark.createDataFrame([("freeze", b"0"), ("k", b"1")], "key string, body binary").coalesce(1)
    try:
        with pytest.raises(Exception) as failed:  # noqa: PT011 - Spark wraps the task's error in its own
            (rows.select("key", freeze("key", "body").alias("body")).write.format("orderlymq")
             .option("brokers", proc.address).option("topic", topic_name).option("shardingKey", "key")
             .option("requestTimeoutMs", "2000").mode("append").save())
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    assert (tmp_path / "frozen").exists()
    assert "BrokerUnavailableError" in str(failed.value) and proc.address in str(failed.value), failed.value
    assert "requestTimeoutMs=2000" in str(failed.value), failed.value


def _freezing(pid: int, marker: str):
    def forward(key, body):  # freezes the broker (SIGSTOP) the first time it sees key "freeze"
        if key == "freeze" and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(pid, signal.SIGSTOP)
        return body

    return forward


# -- a log that lost its tail after the query read it --------------------------------------------


def power_cut(proc, tmp_path, topic: str) -> None:
    """Kill the broker and cut its one queue's log inside its second record, as a power cut with
    flush = "async" leaves it; start it again."""
    proc.kill9()
    [segment] = segments(tmp_path / "broker" / "topics" / topic / "0")
    truncate(records(segment)[1], keep=1)
    proc.start()


def first_and_lost(conn, topic: str) -> tuple[list, list]:
    first, lost = keyed_events(1, 5), keyed_events(1, 5, start=5)
    produce(conn, topic, 1, first)  # one record: offsets 0..4
    produce(conn, topic, 1, lost)  # another: 5..9, lost in the cut
    return first, lost


@pytest.mark.parametrize("refill", [3, 5, 8], ids=["short-of-the-checkpoint", "up-to-it", "past-it"])
def test_restart_after_a_power_cut_reads_what_was_stored_again_below_its_checkpoint(
        ospark, restartable, topic_name, tmp_path, refill):
    proc, conn = restartable
    create_topic(conn, topic_name, 1)
    first, lost = first_and_lost(conn, topic_name)
    c1 = Collector()
    run_available_now(stream(ospark, proc, topic_name, "cut"), tmp_path / "ck", c1)
    power_cut(proc, tmp_path, topic_name)
    stored_again = [("k1", seq) for seq in range(refill)]  # at offsets 5.., below or past the checkpoint's 10
    produce(conn, topic_name, 1, stored_again)

    c2 = Collector()
    run_available_now(stream(ospark, proc, topic_name, "cut"), tmp_path / "ck", c2)
    # The query read 0..9 before the cut; it reads on from offset 5, where the new messages are:
    # going on from its checkpoint's offset 10 skipped all or some of them.
    assert_delivered(first + lost + stored_again, row_events(c1.rows() + c2.rows()))
    assert committed(conn, "cut", topic_name) == {0: 5 + refill}


def test_running_query_reads_what_was_stored_again_after_a_power_cut(ospark, restartable, topic_name, tmp_path):
    proc, conn = restartable
    create_topic(conn, topic_name, 1)
    first, lost = first_and_lost(conn, topic_name)
    collector = Collector()
    query = (stream(ospark, proc, topic_name, "cut").writeStream.foreachBatch(collector)
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="100 milliseconds").start())
    try:
        assert wait_until(lambda: len(collector.rows()) == 10, 60), query.lastProgress
        power_cut(proc, tmp_path, topic_name)
        stored_again = [("k1", seq) for seq in range(8)]  # offsets 5..12: past where the query was
        produce(conn, topic_name, 1, stored_again)
        assert wait_until(lambda: len(collector.rows()) >= 18, 60), (query.exception(), collector.rows())
        assert wait_until(lambda: committed(conn, "cut", topic_name) == {0: 13}, 30)
    finally:
        query.stop()
    assert query.exception() is None
    assert_delivered(first + lost + stored_again, row_events(collector.rows()))


def test_a_restarted_brokers_first_answer_sends_the_driver_looking_below_its_position(
        restartable, topic_name, tmp_path, monkeypatch):
    """The driver plans a batch from the first answer of a broker that came back from a power cut
    and stored 8 messages again (offsets 5..12), before its lock keeper (renewing every 20 s here)
    learns the lock's new epoch: that answer names another start of the broker, so the driver looks
    below its position 10 and plans the batch from the cut, 5. The driver-side reader's calls as
    Spark makes them, without Spark: the race of a running query, made certain."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from connector.spark import locks
    from connector.spark.source import OrderlyMQDataSource

    monkeypatch.setattr(locks, "MAX_RENEW_S", 600.0)
    proc, conn = restartable
    create_topic(conn, topic_name, 1)
    first_and_lost(conn, topic_name)
    source = OrderlyMQDataSource({"brokers": proc.address, "topic": topic_name, "consumerGroup": "cut"})
    reader = source.streamReader(source.schema())
    with ThreadPoolExecutor(1) as driver:  # not the main thread, as in Spark's reader process

        def call(method, *args):
            return driver.submit(method, *args).result()

        start = call(reader.initialOffset)
        end = call(reader.latestOffset, start, ReadAllAvailable())
        assert call(reader.latestOffset, end, ReadAllAvailable()) == end  # idle at 10, committed
        power_cut(proc, tmp_path, topic_name)
        produce(conn, topic_name, 1, [("k1", seq) for seq in range(8)])
        following = call(reader.latestOffset, end, ReadAllAvailable())
        planned = call(reader.partitions, end, following)
        call(reader.stop)
    # Planned from 10 (the lock's epoch unchanged as far as the driver knew), it read k1:5..7 and
    # skipped k1:0..4 (what a running query did once in a test run).
    assert [(part.start, part.end) for part in planned] == [(5, 13)]


def test_batch_in_flight_over_a_power_cut_fails_and_the_restart_reads_what_was_stored_again(
        ospark, restartable, topic_name, tmp_path):
    proc, conn = restartable
    create_topic(conn, topic_name, 1)
    first, _ = first_and_lost(conn, topic_name)
    stored_again = [("k1", seq) for seq in range(8)]

    def cut_before_reading(batch_id):
        if batch_id == 1:  # planned as offsets 5..9, then those are lost and written again
            power_cut(proc, tmp_path, topic_name)
            produce(conn, topic_name, 1, stored_again)

    c1 = Collector(before=cut_before_reading)
    df = stream(ospark, proc, topic_name, "cut", maxMessagesPerTrigger=5)
    query = start_available_now(df, tmp_path / "ck", c1)
    with pytest.raises(Exception, match="lost the tail"):
        query.awaitTermination(120)

    c2 = Collector()
    run_available_now(stream(ospark, proc, topic_name, "cut", maxMessagesPerTrigger=5), tmp_path / "ck", c2)
    # 5..9 were lost before the query read them (the broker's loss, not the query's); the
    # messages stored there since are read once, none taken for the batch planned before the cut.
    assert_delivered(first + stored_again, row_events(c1.rows() + c2.rows()))
    assert committed(conn, "cut", topic_name) == {0: 13}
