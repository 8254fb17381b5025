"""Streaming queries of the Spark fault scenarios: ``orderlymq`` topic -> ``orderlymq`` topic,
exactly once, keyed by the same sharding key, in the test's own SparkSession; the keyed producers
that feed them and the check that the output caught up."""

from __future__ import annotations

from pathlib import Path

from connector.client import Admin
from connector.client.connection import BrokerConnection, pb
from connector.history import History
from tests.faults import workload
from tests.faults.workload import KeyedProducer, stored_deliveries

__all__ = ["all_acked_copied", "copy_query", "keyed_producers", "visible"]


def keyed_producers(address: str, source: str, sink: str, queues: int, history: History) -> list[KeyedProducer]:
    """Create ``source`` and ``sink`` with ``queues`` queues; the (not started) producers of the
    fault profile, each with its own keys, sending to ``source`` and recording in ``history``."""
    with Admin(address) as admin:
        admin.create_topic(source, queues)
        admin.create_topic(sink, queues)
    return workload.keyed_producers(address, source, history)


def all_acked_copied(conn: BrokerConnection, sink: str, history: History) -> bool:
    """Whether ``sink`` holds every acknowledged send of ``history``."""
    acked = history.acked()
    return visible(conn, sink) >= len(acked) and acked <= {(d.key, d.seq) for d in stored_deliveries(conn, sink)}


def copy_query(spark, address: str, source: str, sink: str, group: str, checkpoint: Path, *, trigger: dict,
               **source_options):
    """Start copying ``source`` to ``sink`` for consumer group ``group`` (rows keep their key)."""
    from connector.spark import register

    register(spark)
    reader = (spark.readStream.format("orderlymq").option("brokers", address).option("topic", source)
              .option("consumerGroup", group))
    for name, value in source_options.items():
        reader = reader.option(name, str(value))
    writer = (reader.load().select("key", "body").writeStream.format("orderlymq").option("brokers", address)
              .option("topic", sink).option("shardingKey", "key").option("checkpointLocation", str(checkpoint)))
    return writer.trigger(**trigger).start()


def visible(conn: BrokerConnection, topic: str) -> int:
    """Messages visible in ``topic`` (committed sink transactions only)."""
    count = conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic)).queue_count
    return sum(conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic, queue_id=q)).max_offset
               for q in range(count))
