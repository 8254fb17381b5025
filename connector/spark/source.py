"""The ``orderlymq`` data source: names the source, states the schema, creates readers and writers.

Options are checked here, when Spark plans the query (``SourceOptions`` / ``SinkOptions``), so a
bad option fails before any task runs; see ``docs/spark.md`` for every option and its default.
"""

from __future__ import annotations

import functools
import uuid

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from connector.spark import metadata
from connector.spark.batch_reader import OrderlyMQBatchReader
from connector.spark.connections import shared_connection
from connector.spark.options import SinkOptions, SourceOptions
from connector.spark.schema import checked_schema, source_schema
from connector.spark.sink_columns import SinkColumns
from connector.spark.stream_reader import OrderlyMQStreamReader
from connector.spark.worker_gc import freeze_worker_objects
from connector.spark.writer import OrderlyMQStreamWriter, OrderlyMQWriter

__all__ = ["OrderlyMQDataSource"]


class OrderlyMQDataSource(DataSource):
    """Read and write orderlymq topics, keeping the order of every sharding key.

    Name: ``orderlymq``

    Source options (``spark.read`` / ``spark.readStream``): ``brokers`` (required), ``topic`` or
    ``topics`` (required), ``consumerGroup`` (required for streams), ``tags`` (``*``),
    ``startingOffsets`` (``committed`` for streams, ``earliest`` for batch reads; or ``latest`` or
    per-queue JSON), ``startingTimestamp``, ``endingOffsets`` (``latest``, batch reads),
    ``endingTimestamp``, ``maxMessagesPerTrigger`` (none), ``failOnDataLoss`` (true),
    ``lockTimeoutMs`` (65000), ``pollTimeoutMs`` (30000), ``includeProperties`` (true),
    ``groupOffsetConflict`` (``fail``; or ``group`` or ``checkpoint``, streams restarted from a
    checkpoint after another client moved the group's offsets).

    Sink options (``df.write`` / ``df.writeStream``): ``brokers`` (required), ``topic`` (or a
    ``topic`` column), ``shardingKey`` (or a ``queue_id`` column), ``bodyColumn`` (``body``),
    ``tagColumn``, ``propertiesColumns``, ``exactlyOnce`` (true), ``maxBatchBytes`` (4 MiB),
    ``transactionTimeoutMs`` (24 h: how long a task's staged rows wait for the commit).

    Both, for a broker with TLS or access control (``docs/security.md``): ``tls.caFile``,
    ``tls.certFile`` and ``tls.keyFile`` (mutual TLS), ``tls.serverName``, ``auth.accessKey`` and
    ``auth.secretKey`` (default: ``ORDERLYMQ_ACCESS_KEY`` / ``ORDERLYMQ_SECRET_KEY``).

    Examples
    --------
    >>> (spark.readStream.format("orderlymq")
    ...     .option("brokers", "127.0.0.1:9876").option("topic", "orders")
    ...     .option("consumerGroup", "billing").load()
    ...     .writeStream.format("orderlymq").option("brokers", "127.0.0.1:9876")
    ...     .option("topic", "orders-copy").option("shardingKey", "key")
    ...     .option("checkpointLocation", "/tmp/ckpt").start())
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.instance = uuid.uuid4().hex  # pickled along: the key of the queue counts read for it

    @classmethod
    def name(cls) -> str:
        return "orderlymq"

    def schema(self) -> StructType:
        value = str(self.options.get("includeProperties", "true")).strip().lower()
        return source_schema(include_properties=value not in ("false", "0", "no"))

    def reader(self, schema: StructType) -> DataSourceReader:
        return OrderlyMQBatchReader(SourceOptions.from_options(self.options, streaming=False), checked_schema(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return OrderlyMQStreamReader(SourceOptions.from_options(self.options, streaming=True), checked_schema(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options, columns = _plan_write(self.options, schema)
        return OrderlyMQWriter(options, columns, _queue_counts(self.instance, options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # Called every micro-batch in two reused workers of the driver (the write's planning, and
        # the commit), which run a full collection after each call: see connector.spark.worker_gc.
        freeze_worker_objects()
        options, columns = _plan_write(self.options, schema)
        return OrderlyMQStreamWriter(options, columns, _queue_counts(self.instance, options),
                                     checkpoint=self.options.get("checkpointLocation"), run=self.instance)


def _plan_write(raw, schema: StructType) -> tuple[SinkOptions, SinkColumns]:
    options = SinkOptions.from_options(raw)
    return options, SinkColumns.resolve(options, schema)


@functools.lru_cache(maxsize=64)
def _queue_counts(instance: str, options: SinkOptions) -> dict[str, int]:
    """``{topic: queue count}`` of the ``topic`` option, read once per instance of the data source.

    Spark makes a new instance to plan each micro-batch's write, so every write is planned with
    the count of now (and its tasks check that it still holds). It builds the writer of each
    micro-batch's commit from the instance it made when the query started, and that writer needs
    no count: one lookup for the query instead of one every micro-batch. Callers copy the answer.
    """
    if options.topic is None:
        return {}
    conn = shared_connection(options.brokers, options.security)
    return {t: r.queue_count for t, r in metadata.describe_topics(conn, [options.topic]).items()}
