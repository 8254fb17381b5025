"""RocketMQ 5 clients and Spark: the official FIFO producer's message groups read back in order by
our source, and our sink's rows consumed in order by the official SimpleConsumer."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rocketmq")

from tests.rocketmq import clients  # noqa: E402
from tests.spark.helpers import assert_delivered, create_topic, keyed_events, row_events  # noqa: E402

QUEUES = 3


def test_fifo_producer_to_spark_source(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, QUEUES)
    events = keyed_events(keys=8, per_key=10)  # interleaved across message groups
    with clients.producer(broker.address, topic_name) as producer:
        for key, seq in events:
            producer.send(clients.keyed_message(topic_name, key, seq))
    rows = ospark.read.format("orderlymq").option("brokers", broker.address).option("topic", topic_name).load()
    collected = rows.select("key", "body").collect()  # queue by queue, each in queue order
    assert all(r["key"] == json.loads(r["body"])["key"] for r in collected), "message group is the key"
    assert_delivered(events, row_events(collected))


def test_spark_sink_to_simple_consumer(ospark, broker, conn, topic_name):
    create_topic(conn, topic_name, QUEUES)
    events = keyed_events(keys=6, per_key=8)
    df = ospark.createDataFrame([(key, json.dumps({"key": key, "seq": seq})) for key, seq in events], "key string, body string")
    (df.coalesce(1).write.format("orderlymq").option("brokers", broker.address).option("topic", topic_name)
       .option("shardingKey", "key").mode("append").save())
    with clients.simple_consumer(broker.address, "spark-readers", topic_name) as consumer:
        deliveries = clients.drain(consumer, len(events))
    assert_delivered(events, [(d.key, d.seq) for d in deliveries])
