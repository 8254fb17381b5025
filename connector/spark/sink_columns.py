"""Which input columns make a message, checked against the DataFrame's schema when the write is
planned, and the Arrow conversion of input record batches into message batches.

+--------------------+------------------------------------------------------------------------+
| message field      | input                                                                  |
+====================+========================================================================+
| queue              | ``shardingKey`` column (integer, string, binary), else ``queue_id``    |
| topic              | option ``topic``, else a string ``topic`` column                       |
| key                | the sharding key as a string (integers in decimal)                     |
| body               | ``bodyColumn`` (default ``body``): binary, or string (UTF-8 encoded)   |
| tag                | ``tagColumn``, else a string ``tag`` column if present                 |
| properties         | ``propertiesColumns`` (values as strings), else a ``properties`` map   |
| born_timestamp     | a timestamp ``born_timestamp`` column if present, else the send time   |
+--------------------+------------------------------------------------------------------------+

Other columns are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from broker.wire import codec
from broker.wire.errors import BadBatchError, InvalidOptionError
from connector.spark.options import SinkOptions
from connector.spark.sharding import INTEGER_KEY_TYPES, is_key_type

__all__ = ["SinkColumns", "message_table"]

_SCALAR_PROPERTY_TYPES = (StringType, BinaryType, *INTEGER_KEY_TYPES, TimestampType)


@dataclass(frozen=True)
class SinkColumns:
    """The resolved input columns of a write (picklable, shipped to the tasks)."""

    sharding_key: str | None
    key_is_integer: bool
    queue_id: str | None
    topic: str | None
    body: str
    tag: str | None
    properties: tuple[str, ...]
    properties_map: str | None
    born_timestamp: str | None

    @classmethod
    def resolve(cls, options: SinkOptions, schema: StructType) -> SinkColumns:
        """Check ``options`` against ``schema``; ``InvalidOptionError`` naming the column and the fix."""
        types = {f.name: f.dataType for f in schema.fields}
        listing = ", ".join(types) or "none"

        def need(name: str, option: str) -> DataType:
            if name not in types:
                raise InvalidOptionError(
                    f"column {name!r} (option '{option}') is not in the DataFrame (columns: {listing}): "
                    f"select or alias a column named {name!r}, or set '{option}' to an existing column"
                )
            return types[name]

        key_type = None
        if options.sharding_key is not None:
            key_type = need(options.sharding_key, "shardingKey")
            if not is_key_type(key_type):
                raise InvalidOptionError(
                    f"column {options.sharding_key!r} (option 'shardingKey') has type {key_type.simpleString()}; a "
                    "sharding key must be an integer, string or binary column: cast it, e.g. "
                    f"col({options.sharding_key!r}).cast('string')"
                )
        queue_col = None
        if options.sharding_key is None:
            if "queue_id" not in types:
                raise InvalidOptionError(
                    "option 'shardingKey' is required: name the column whose value picks the queue (same key, same "
                    "queue, same order), e.g. .option('shardingKey', 'order_id'), or give a 'queue_id' column "
                    f"(columns: {listing})"
                )
            if not isinstance(types["queue_id"], INTEGER_KEY_TYPES):
                raise InvalidOptionError(
                    f"column 'queue_id' has type {types['queue_id'].simpleString()}; it must be an integer column, "
                    "or set option 'shardingKey'"
                )
            queue_col = "queue_id"

        topic_col = None
        if options.topic is None:
            if "topic" not in types:
                raise InvalidOptionError(
                    "option 'topic' is required (or a string 'topic' column naming each row's topic), e.g. "
                    ".option('topic', 'orders')"
                )
            if not isinstance(types["topic"], StringType):
                raise InvalidOptionError(
                    f"column 'topic' has type {types['topic'].simpleString()}; it must be a string column, or set "
                    "option 'topic'"
                )
            topic_col = "topic"

        body_type = need(options.body_column, "bodyColumn")
        if not isinstance(body_type, (BinaryType, StringType)):
            raise InvalidOptionError(
                f"column {options.body_column!r} (option 'bodyColumn') has type {body_type.simpleString()}; a body "
                f"must be binary or string: convert it, e.g. to_json(struct(*)) or col({options.body_column!r})"
                ".cast('string')"
            )

        tag = options.tag_column
        if tag is not None:
            if not isinstance(need(tag, "tagColumn"), StringType):
                raise InvalidOptionError(
                    f"column {tag!r} (option 'tagColumn') has type {types[tag].simpleString()}; a tag must be a "
                    f"string: cast it, e.g. col({tag!r}).cast('string')"
                )
        elif isinstance(types.get("tag"), StringType):
            tag = "tag"

        props_map = None
        for name in options.properties_columns:
            if not isinstance(need(name, "propertiesColumns"), _SCALAR_PROPERTY_TYPES):
                raise InvalidOptionError(
                    f"column {name!r} (option 'propertiesColumns') has type {types[name].simpleString()}; property "
                    f"values must be strings, numbers, binary or timestamps: cast it, e.g. col({name!r}).cast('string')"
                )
        if not options.properties_columns:
            candidate = types.get("properties")
            if (
                isinstance(candidate, MapType)
                and isinstance(candidate.keyType, StringType)
                and isinstance(candidate.valueType, StringType)
            ):
                props_map = "properties"

        born = "born_timestamp" if isinstance(types.get("born_timestamp"), (TimestampType, TimestampNTZType)) else None
        return cls(
            sharding_key=options.sharding_key,
            key_is_integer=isinstance(key_type, INTEGER_KEY_TYPES),
            queue_id=queue_col,
            topic=topic_col,
            body=options.body_column,
            tag=tag,
            properties=options.properties_columns,
            properties_map=props_map,
            born_timestamp=born,
        )


def message_columns(columns: SinkColumns) -> list[str]:
    """The input columns ``message_table`` reads."""
    names = [columns.sharding_key, columns.body, columns.tag, *columns.properties, columns.properties_map,
             columns.born_timestamp]
    return list(dict.fromkeys(name for name in names if name is not None))


def message_table(batch: pa.RecordBatch | pa.Table, columns: SinkColumns, born_ms: int) -> pa.Table:
    """The ``MESSAGE_SCHEMA`` table of an input batch (checked: keys and bodies present)."""
    n = batch.num_rows
    if columns.sharding_key is not None:
        key = batch.column(columns.sharding_key)
        if not pa.types.is_string(key.type):
            try:
                key = key.cast(pa.string())
            except pa.ArrowInvalid:
                raise BadBatchError(
                    f"column {columns.sharding_key!r} (option 'shardingKey') holds binary keys that are not valid "
                    "UTF-8; message keys are strings: hex-encode them, e.g. hex(col(...)), or use a string key"
                ) from None
    else:
        key = pa.nulls(n, pa.string())
    body = batch.column(columns.body)
    if not pa.types.is_binary(body.type):
        body = body.cast(pa.binary())
    tag = batch.column(columns.tag) if columns.tag else pa.nulls(n, pa.string())
    if columns.properties:
        properties = _properties_map(batch, columns.properties)
    elif columns.properties_map:
        properties = batch.column(columns.properties_map).cast(codec.PROPERTIES_TYPE)
    else:
        properties = _null_maps(n)
    if columns.born_timestamp:
        born = pc.cast(batch.column(columns.born_timestamp), pa.timestamp("ms", tz=None), safe=False)
        born = pc.fill_null(born, pa.scalar(born_ms, codec.TIMESTAMP_MS))
    else:
        born = pa.repeat(pa.scalar(born_ms, codec.TIMESTAMP_MS), n)
    return pa.Table.from_arrays([key, tag, body, properties, born], schema=codec.MESSAGE_SCHEMA)


def _null_maps(n: int) -> pa.MapArray:
    """``n`` null properties maps with no entries (``pa.nulls`` gives a map type ``n`` entries of
    children, which a batch then carries to the broker: 16 bytes more per row)."""
    no_entries = pa.array([], pa.string())
    return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), no_entries, no_entries,
                                   type=codec.PROPERTIES_TYPE, mask=pa.array(np.ones(n, dtype=bool)))


def _properties_map(batch: pa.RecordBatch | pa.Table, names: tuple[str, ...]) -> pa.MapArray:
    """A map<string,string> per row of the named columns (null values kept as null)."""
    n, k = batch.num_rows, len(names)
    values = []
    for name in names:
        column = batch.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_timestamp(column.type):
            column = pc.strftime(column, format="%Y-%m-%dT%H:%M:%S")
        values.append(column.cast(pa.string()))
    order = (np.arange(k)[None, :] * n + np.arange(n)[:, None]).ravel()
    items = pa.concat_arrays(values).take(pa.array(order))
    keys = pa.array(names, pa.string()).take(pa.array(np.tile(np.arange(k), n)))
    offsets = pa.array(np.arange(0, (n + 1) * k, k, dtype=np.int32))
    return pa.MapArray.from_arrays(offsets, keys, items, type=codec.PROPERTIES_TYPE)
