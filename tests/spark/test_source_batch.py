"""Batch reads (``spark.read``) against a real broker: ranges, timestamps, tags, errors."""

from __future__ import annotations

import socket
import time

import pytest

from broker.wire import codec
from connector.client.connection import pb
from tests.spark.helpers import assert_delivered, create_topic, keyed_events, produce, row_events
from tests.support import wait_until

pytestmark = pytest.mark.spark


def read(ospark, address, topic, **options):
    reader = ospark.read.format("orderlymq").option("brokers", address).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def test_batch_read_whole_topic_in_queue_order(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, 3)
    events = keyed_events(6, 4)
    produce(conn, topic_name, 3, events)
    batch = codec.messages_to_batch([{"key": "p", "body": b"{}", "properties": {"a": "1"}, "tag": "T"}])
    conn.call("Send", pb.SendRequest(topic=topic_name, queue_id=0, batch=codec.encode(batch)))
    rows = read(ospark, broker.address, topic_name).collect()
    with_props = [r for r in rows if r["key"] == "p"]
    assert with_props[0]["properties"] == {"a": "1"} and with_props[0]["tag"] == "T"
    assert_delivered(events, row_events(r for r in rows if r["key"] != "p"))
    assert {r["broker"] for r in rows} == {"broker-a"}
    lean = read(ospark, broker.address, topic_name, includeProperties="false")
    assert "properties" not in lean.columns and lean.count() == len(events) + 1


def test_a_given_schema_reads_those_columns_and_a_wrong_one_fails_clearly(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, 3)
    events = keyed_events(6, 4)
    produce(conn, topic_name, 3, events)

    def load(schema: str):
        return (ospark.read.format("orderlymq").schema(schema).option("brokers", broker.address)
                .option("topic", topic_name).load())

    rows = load("body binary, queue_id int, key string, queue_offset long").collect()
    assert list(rows[0].asDict()) == ["body", "queue_id", "key", "queue_offset"]
    assert_delivered(events, row_events(rows))
    with pytest.raises(Exception, match=r"has a column 'colour', which it does not read; its columns are topic, "):
        load("key string, colour string").collect()
    with pytest.raises(Exception, match=r"types column 'body' as string; the source reads it as binary"):
        load("key string, body string").collect()


def _pulls(broker, method: str) -> float:
    return broker.service.metrics.registry.get_sample_value(
        "orderlymq_rpc_duration_seconds_count", {"method": method}) or 0


@pytest.mark.parametrize("lean_port", [True, False])
def test_tasks_pull_over_the_lean_port_when_served_else_grpc(ospark, broker_factory, topic_name, lean_port):
    from connector.client.connection import BrokerConnection

    broker = broker_factory(max_pull_messages=7, send_port=0 if lean_port else -1)  # many pulls per queue
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, topic_name, 3)
        events = keyed_events(6, 40)
        produce(conn, topic_name, 3, events)
    assert_delivered(events, row_events(read(ospark, broker.address, topic_name).collect()))
    used, unused = ("PullPort", "Pull") if lean_port else ("Pull", "PullPort")
    assert _pulls(broker, used) >= len(events) / 7 and _pulls(broker, unused) == 0


def test_a_task_whose_lean_port_closes_pulls_on_over_grpc(broker_factory, topic_name):
    from connector.client.connection import BrokerConnection
    from connector.spark.options import SourceOptions
    from connector.spark.partitions import QueuePartition, read_partition
    from connector.spark.schema import arrow_schema, source_schema

    broker = broker_factory(max_pull_messages=10)
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, topic_name, 1)
        events = keyed_events(3, 50)
        produce(conn, topic_name, 1, events)
    options = SourceOptions.from_options({"brokers": broker.address, "topic": topic_name}, streaming=False)
    partition = QueuePartition(topic=topic_name, broker="broker-a", queue_id=0, start=0, end=len(events))
    rows = []
    for batch in read_partition(options, partition, arrow_schema(source_schema())):
        rows += batch.to_pylist()
        if len(rows) == 10:  # one pull answered, the next issued ahead on the port
            broker._loop.call(broker.send_port.close())
    assert_delivered(events, row_events(rows))
    assert [row["queue_offset"] for row in rows] == list(range(len(events)))
    assert _pulls(broker, "PullPort") >= 1 and _pulls(broker, "Pull") >= len(events) / 10 - 2


def test_reads_of_a_process_share_one_lean_connection_and_skip_a_closed_one(broker_factory, topic_name, caplog):
    from connector.client.connection import BrokerConnection
    from connector.spark.options import SourceOptions
    from connector.spark.partitions import QueuePartition, read_partition
    from connector.spark.schema import arrow_schema, source_schema

    broker = broker_factory()
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, topic_name, 1)
        events = keyed_events(3, 20)
        produce(conn, topic_name, 1, events)
    options = SourceOptions.from_options({"brokers": broker.address, "topic": topic_name}, streaming=False)

    def read_all() -> list[dict]:
        partition = QueuePartition(topic=topic_name, broker="broker-a", queue_id=0, start=0, end=len(events))
        return [row for batch in read_partition(options, partition, arrow_schema(source_schema()))
                for row in batch.to_pylist()]

    for _ in range(3):
        assert_delivered(events, row_events(read_all()))
    assert len(broker.send_port.connections) == 1, "one pull connection, handed from read to read"
    assert _pulls(broker, "PullPort") == 3
    broker._loop.call(broker.send_port.close())  # the kept connection is closed under it
    assert_delivered(events, row_events(read_all()))
    assert _pulls(broker, "Pull") == 1, "the closed connection was left, the read went to gRPC"
    assert "lean port failed" not in caplog.text


def test_batch_read_offset_ranges_and_tags(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, 1)
    events = keyed_events(1, 10)
    produce(conn, topic_name, 1, events, tag=lambda key, seq: "A" if seq % 3 == 0 else "B")
    ranged = read(
        ospark,
        broker.address,
        topic_name,
        startingOffsets=f'{{"{topic_name}": {{"0": 2}}}}',
        endingOffsets=f'{{"{topic_name}": {{"0": 7}}}}',
    ).collect()
    assert [r["queue_offset"] for r in ranged] == [2, 3, 4, 5, 6]
    tagged = read(ospark, broker.address, topic_name, tags="A").collect()
    assert [r["queue_offset"] for r in tagged] == [0, 3, 6, 9]


def test_batch_read_by_timestamps(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, 2)
    early, late = keyed_events(4, 3), keyed_events(4, 3, start=3)
    produce(conn, topic_name, 2, early)
    time.sleep(0.05)  # store timestamps are in ms: make the two rounds distinct
    cut = codec.now_ms()
    time.sleep(0.05)
    produce(conn, topic_name, 2, late)
    after = read(ospark, broker.address, topic_name, startingTimestamp=cut).collect()
    before = read(ospark, broker.address, topic_name, endingTimestamp=cut).collect()
    assert_delivered(late, row_events(after))
    assert_delivered(early, row_events(before))


def test_retention_and_fail_on_data_loss(ospark, broker_factory, topic_name):
    from connector.client.connection import BrokerConnection

    broker = broker_factory(segment_bytes=256, retention_bytes=1, retention_check_interval_ms=50)
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, topic_name, 1)
        for start in range(0, 12, 3):
            produce(conn, topic_name, 1, keyed_events(1, 3, start=start))

        def settled_low() -> int:
            """The first offset kept once retention removed every segment it will (it checks every 50 ms)."""
            first = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0)).min_offset
            time.sleep(0.3)
            again = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0)).min_offset
            return first if first == again else 0

        low = wait_until(settled_low, 60)
        assert low, "retention never removed a segment"
    from_zero = f'{{"{topic_name}": {{"0": 0}}}}'
    with pytest.raises(Exception, match=r"removed by retention.*failOnDataLoss=false"):
        read(ospark, broker.address, topic_name, startingOffsets=from_zero).collect()
    rows = read(ospark, broker.address, topic_name, startingOffsets=from_zero, failOnDataLoss="false").collect()
    assert [r["queue_offset"] for r in rows] == list(range(low, 12))


def test_bad_input_errors_name_the_option(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, 2)
    produce(conn, topic_name, 2, keyed_events(2, 2))
    with pytest.raises(Exception, match=r"topic 'nope' \(option 'topic'\) does not exist"):
        read(ospark, broker.address, "nope").collect()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(Exception, match=r"cannot reach the broker named by option 'brokers'"):
        read(ospark, closed, topic_name, pollTimeoutMs=300).collect()
    with pytest.raises(Exception, match=r"option 'endingOffsets': offset 99 of queue .*/0 is past its end"):
        read(ospark, broker.address, topic_name, endingOffsets=f'{{"{topic_name}": {{"0": 99}}}}').collect()
    with pytest.raises(Exception, match=r"option 'startingOffsets' names queue 5 of topic"):
        read(ospark, broker.address, topic_name, startingOffsets=f'{{"{topic_name}": {{"5": 0}}}}').collect()
    with pytest.raises(Exception, match=r"option 'startingOffsets' is not valid JSON"):
        read(ospark, broker.address, topic_name, startingOffsets="{oops").collect()
    with pytest.raises(Exception, match=r"unknown option 'colour'"):
        read(ospark, broker.address, topic_name, colour="blue").collect()


def test_damaged_messages_fail_the_read_or_are_skipped(ospark, broker_factory, topic_name, tmp_path):
    from connector.client.connection import BrokerConnection
    from tests.faults.disk import flip_bit, records, segments

    data = tmp_path / "damaged"
    broker = broker_factory(data_dir=data, segment_bytes=4096)
    with BrokerConnection(broker.address) as conn:
        create_topic(conn, topic_name, 1)
        for start in range(12):
            produce(conn, topic_name, 1, keyed_events(1, 1, start=start))
    broker.stop()
    damaged = records(segments(data / "topics" / topic_name / "0")[0])[1]  # inside a closed segment
    flip_bit(damaged, damaged.size - 5)
    broker = broker_factory(data_dir=data, segment_bytes=4096)
    with pytest.raises(Exception, match=r"damaged on disk.*failOnDataLoss=false"):
        read(ospark, broker.address, topic_name).collect()
    rows = read(ospark, broker.address, topic_name, failOnDataLoss="false").collect()
    lost = set(range(damaged.base_offset, damaged.base_offset + damaged.count))
    assert [r["queue_offset"] for r in rows] == [o for o in range(12) if o not in lost]
