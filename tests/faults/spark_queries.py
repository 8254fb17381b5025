"""Streaming queries of the Spark fault scenarios: ``orderlymq`` topic -> ``orderlymq`` topic,
exactly once, keyed by the same sharding key, in the test's own SparkSession; the keyed producers
that feed them and the check that the output caught up; ``CopyRun``, all of it running at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connector.client import Admin
from connector.client.connection import BrokerConnection, pb
from connector.history import History, Verdict, check
from tests.faults import workload
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import KeyedProducer, stored_deliveries
from tests.support import wait_until

__all__ = ["CopyRun", "all_acked_copied", "copy_query", "keyed_producers", "visible"]


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


@dataclass
class CopyRun:
    """A copy query from the start of ``source``, fed by the fault profile's keyed producers, and a
    connection that watches ``sink``. ``stop()`` it in a ``finally``."""

    history: History
    producers: list[KeyedProducer]
    conn: BrokerConnection
    query: Any  # a pyspark StreamingQuery
    sink: str

    @classmethod
    def start(cls, spark, address: str, source: str, sink: str, group: str, queues: int, checkpoint: Path) -> CopyRun:
        """Create the topics, start the query (200 ms triggers, the profile's rows per trigger), then
        the producers."""
        history = History()
        producers = keyed_producers(address, source, sink, queues, history)
        query = copy_query(spark, address, source, sink, group, checkpoint,
                           trigger={"processingTime": "200 milliseconds"}, startingOffsets="earliest",
                           maxMessagesPerTrigger=PROFILE.spark_max_per_trigger)
        for producer in producers:
            producer.start()
        return cls(history, producers, BrokerConnection(address, retry_timeout=60), query, sink)

    def advance(self, timeout: float) -> None:
        """Wait until ``sink`` shows more than now, or the query failed."""
        before = visible(self.conn, self.sink)
        assert wait_until(lambda: visible(self.conn, self.sink) > before or self.query.exception(), timeout)

    def catch_up(self) -> bool:
        """Stop the producers, then wait until ``sink`` holds every acknowledged send or the query
        failed; False when neither happened within 300 s."""
        workload.stop_all(self.producers)
        return bool(wait_until(lambda: all_acked_copied(self.conn, self.sink, self.history) or self.query.exception(),
                               300, interval=1.0))

    def output(self) -> Verdict:
        """The strict checker's verdict on ``sink`` against every send."""
        return check(self.history.sends, stored_deliveries(self.conn, self.sink))

    def stop(self) -> None:
        for producer in self.producers:
            producer.stop.set()
        self.query.stop()
