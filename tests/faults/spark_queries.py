"""Streaming queries of the Spark fault scenarios: ``orderlymq`` topic -> ``orderlymq`` topic,
exactly once, keyed by the same sharding key, in the test's own SparkSession."""

from __future__ import annotations

from pathlib import Path

from connector.client.connection import BrokerConnection, pb

__all__ = ["copy_query", "visible"]


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
