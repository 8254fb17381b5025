"""The ceilings of Spark's Python data source path, in memory.

``benchmem``: a streaming source that yields prebuilt Arrow batches of exactly the ``orderlymq``
source's schema and batch sizes. Options: ``partitions`` (like queues), ``rows`` (per partition),
``batchRows``, ``bodyBytes``; ``advancing`` ("true"): every trigger finds new rows, for a query
that runs micro-batches back to back (the floor of Spark's own micro-batch).

``benchdiscard``: a streaming sink whose Python Arrow writer (the ``orderlymq`` sink's base class)
takes every batch and drops it, so the sink is measured against the same JVM -> Python path
rather than against ``noop``, which never leaves the JVM.
"""

from __future__ import annotations

from functools import lru_cache

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from connector.spark.schema import arrow_schema, source_schema


@lru_cache(maxsize=4)
def _batch(rows: int, body_bytes: int) -> pa.RecordBatch:
    schema = arrow_schema(source_schema())
    now = pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC"))
    columns = {
        "topic": pa.repeat(pa.scalar("bench", pa.string()), rows),
        "broker": pa.repeat(pa.scalar("broker-a", pa.string()), rows),
        "queue_id": pa.repeat(pa.scalar(0, pa.int32()), rows),
        "queue_offset": pa.array(range(rows), pa.int64()),
        "key": pa.array([f"key-{i % 1000}" for i in range(rows)], pa.string()),
        "tag": pa.nulls(rows, pa.string()),
        "body": pa.array([b"x" * body_bytes] * rows, pa.binary()),
        "properties": pa.nulls(rows, schema.field("properties").type),
        "born_timestamp": pa.repeat(now, rows),
        "store_timestamp": pa.repeat(now, rows),
    }
    return pa.RecordBatch.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


class MemPartition(InputPartition):
    def __init__(self, index: int, rows: int) -> None:
        self.index, self.rows = index, rows


class MemStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options) -> None:
        self.partitions_n = int(options.get("partitions", "8"))
        self.rows = int(options.get("rows", "100000"))
        self.batch_rows = int(options.get("batchRows", "10000"))
        self.body_bytes = int(options.get("bodyBytes", "100"))
        self.advancing = options.get("advancing", "false") == "true"

    def initialOffset(self) -> dict:
        return {"done": 0}

    def latestOffset(self, start: dict, limit) -> dict:
        return {"done": start["done"] + 1 if self.advancing else 1}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict, end: dict):
        if start == end:
            return []
        return [MemPartition(i, self.rows) for i in range(self.partitions_n)]

    def read(self, partition: MemPartition):
        batch = _batch(self.batch_rows, self.body_bytes)
        left = partition.rows
        while left > 0:
            yield batch if left >= batch.num_rows else batch.slice(0, left)
            left -= batch.num_rows


class MemSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "benchmem"

    def schema(self):
        return source_schema()

    def streamReader(self, schema):
        return MemStreamReader(self.options)


class DiscardStreamWriter(DataSourceStreamArrowWriter):
    def write(self, iterator) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages, batchId) -> None:
        pass

    def abort(self, messages, batchId) -> None:
        pass


class DiscardSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "benchdiscard"

    def streamWriter(self, schema, overwrite: bool):
        return DiscardStreamWriter()
