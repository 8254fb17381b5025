"""The source's Spark schema and the Arrow conversion of pulled batches into it.

A pull returns ``STORED_SCHEMA`` tables (``broker.wire.codec``); ``to_spark_batch`` turns one into
a ``pyarrow.RecordBatch`` of exactly the Arrow schema Spark expects for ``source_schema()``, with
Arrow compute only: no Python loop over messages.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from broker.wire.errors import InvalidOptionError

__all__ = ["SOURCE_COLUMNS", "arrow_schema", "checked_schema", "source_schema", "to_spark_batch"]

SOURCE_COLUMNS = (
    "topic",
    "broker",
    "queue_id",
    "queue_offset",
    "key",
    "tag",
    "body",
    "properties",
    "born_timestamp",
    "store_timestamp",
)


def source_schema(include_properties: bool = True) -> StructType:
    """The rows a read yields; ``properties`` is left out when ``include_properties`` is false."""
    fields = [
        StructField("topic", StringType(), False),
        StructField("broker", StringType(), False),
        StructField("queue_id", IntegerType(), False),
        StructField("queue_offset", LongType(), False),
        StructField("key", StringType(), True),
        StructField("tag", StringType(), True),
        StructField("body", BinaryType(), False),
        StructField("properties", MapType(StringType(), StringType(), True), True),
        StructField("born_timestamp", TimestampType(), True),
        StructField("store_timestamp", TimestampType(), True),
    ]
    if not include_properties:
        fields = [f for f in fields if f.name != "properties"]
    return StructType(fields)


def checked_schema(schema: StructType) -> StructType:
    """A schema the reader was given (``spark.read.schema(...)``): any of the source's columns, in
    any order, each of its type (a read then builds only those). ``InvalidOptionError`` naming a
    column that is not one, or is typed otherwise."""
    types = {f.name: f.dataType for f in source_schema()}
    for f in schema:
        if f.name not in types:
            raise InvalidOptionError(f"the schema given to the orderlymq source has a column {f.name!r}, which it does "
                                     f"not read; its columns are {', '.join(SOURCE_COLUMNS)}")
        if f.dataType != types[f.name]:
            raise InvalidOptionError(
                f"the schema given to the orderlymq source types column {f.name!r} as {f.dataType.simpleString()}; "
                f"the source reads it as {types[f.name].simpleString()}: declare that, and cast it in the query")
    return schema


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks the batches of ``read()`` against."""
    return to_arrow_schema(schema, timezone="UTC")


def to_spark_batch(table: pa.Table, target: pa.Schema, *, topic: str, broker: str, queue_id: int) -> pa.RecordBatch:
    """Conform a pulled ``STORED_SCHEMA`` table to ``target`` (a projection of ``source_schema``)."""
    n = table.num_rows
    pulled = table.combine_chunks()  # one chunk per column, copying none that has one already (a pull's usual)
    constant = {"topic": pa.scalar(topic, pa.string()), "broker": pa.scalar(broker, pa.string()),
                "queue_id": pa.scalar(queue_id, pa.int32())}
    arrays = []
    for f in target:
        if f.name in constant:  # built only when selected: a repeated string costs as much as the other columns
            arrays.append(pa.repeat(constant[f.name], n))
            continue
        chunks = pulled.column(f.name)  # a column's own combine_chunks would copy even a single chunk
        column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()
        arrays.append(column if column.type == f.type else column.cast(f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)
