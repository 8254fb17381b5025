"""Arrow IPC codec for message batches: pure functions, no I/O, no state.

A batch on the wire is one Arrow IPC stream with the message columns of ``MESSAGE_SCHEMA``;
the broker stores and returns batches with the ``STORED_SCHEMA`` columns (``queue_offset`` and
``store_timestamp`` added). Neither side loops over messages in Python on the hot path.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker.wire.errors import BadBatchError

__all__ = [
    "MESSAGE_SCHEMA",
    "STORED_SCHEMA",
    "decode",
    "decode_many",
    "empty_stored_table",
    "encode",
    "messages_to_batch",
    "normalize",
    "now_ms",
    "with_store_columns",
]

PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
TIMESTAMP_MS = pa.timestamp("ms")

MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("tag", pa.string()),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("properties", PROPERTIES_TYPE),
        pa.field("born_timestamp", TIMESTAMP_MS),
    ]
)
STORED_SCHEMA = MESSAGE_SCHEMA.append(pa.field("queue_offset", pa.int64(), nullable=False)).append(
    pa.field("store_timestamp", TIMESTAMP_MS)
)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def encode(data: pa.RecordBatch | pa.Table) -> bytes:
    """One Arrow IPC stream holding ``data``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return sink.getvalue().to_pybytes()


def decode(payload: bytes | pa.Buffer) -> pa.Table:
    """The table in one Arrow IPC stream; ``BadBatchError`` when the bytes are not one."""
    if not payload:
        raise BadBatchError("empty batch: the request carries no Arrow IPC stream")
    try:
        return pa.ipc.open_stream(pa.py_buffer(payload) if isinstance(payload, bytes) else payload).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise BadBatchError(f"malformed Arrow IPC stream ({len(payload)} bytes): {exc}") from None


def decode_many(payloads: Iterable[bytes]) -> pa.Table:
    """Concatenate stored-schema batches (a pull response) into one table."""
    tables = [decode(p) for p in payloads]
    if not tables:
        return empty_stored_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def empty_stored_table() -> pa.Table:
    return STORED_SCHEMA.empty_table()


def _column_or_nulls(table: pa.Table, name: str, typ: pa.DataType) -> pa.Array | pa.ChunkedArray:
    if name in table.column_names:
        return table.column(name)
    return pa.nulls(table.num_rows, typ)


def _as_string_keys(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    typ = col.type
    if pa.types.is_string(typ):
        return col
    if pa.types.is_large_string(typ) or pa.types.is_string_view(typ) or pa.types.is_integer(typ) or pa.types.is_null(typ):
        return pc.cast(col, pa.string())
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ):
        try:
            return pc.cast(col, pa.string())
        except pa.ArrowInvalid:
            raise BadBatchError("column 'key' holds binary keys that are not valid UTF-8") from None
    raise BadBatchError(f"column 'key' has type {typ}; expected string, binary or integer")


def _as_binary_body(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    typ = col.type
    if pa.types.is_binary(typ):
        out = col
    elif typ in (pa.string(), pa.large_string(), pa.large_binary(), pa.string_view(), pa.binary_view()):
        out = pc.cast(col, pa.binary())
    else:
        raise BadBatchError(f"column 'body' has type {typ}; expected binary or string")
    if out.null_count:
        raise BadBatchError(f"column 'body' has {out.null_count} null value(s); every message needs a body")
    return out


def _as_timestamp(col: pa.ChunkedArray | pa.Array, name: str) -> pa.ChunkedArray | pa.Array:
    typ = col.type
    if typ == TIMESTAMP_MS:
        return col
    if pa.types.is_timestamp(typ) or pa.types.is_integer(typ) or pa.types.is_null(typ):
        try:
            return pc.cast(col, TIMESTAMP_MS, safe=False) if not pa.types.is_integer(typ) else pc.cast(
                pc.cast(col, pa.int64()), TIMESTAMP_MS
            )
        except pa.ArrowInvalid as exc:
            raise BadBatchError(f"column '{name}': {exc}") from None
    raise BadBatchError(f"column '{name}' has type {typ}; expected timestamp or integer milliseconds")


def _typed(col, name: str, typ: pa.DataType):
    if col.type == typ:
        return col
    try:
        return pc.cast(col, typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise BadBatchError(f"column '{name}' has type {col.type}; expected {typ}") from None


def normalize(data: pa.Table | pa.RecordBatch, *, default_born_ms: int | None = None) -> pa.Table:
    """Conform a user batch to ``MESSAGE_SCHEMA``: fill optional columns, cast keys and bodies.

    ``body`` is required; ``key``, ``tag``, ``properties`` and ``born_timestamp`` may be absent.
    Extra columns are an error (they would be silently lost).
    """
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    if table.num_rows == 0:
        raise BadBatchError("empty batch: send at least one message")
    if "body" not in table.column_names:
        raise BadBatchError(f"batch has no 'body' column (columns: {', '.join(table.column_names)})")
    extra = [c for c in table.column_names if c not in MESSAGE_SCHEMA.names]
    if extra:
        raise BadBatchError(
            f"unknown column(s) {', '.join(map(repr, extra))}; message columns are {', '.join(MESSAGE_SCHEMA.names)}"
        )
    if table.schema.equals(MESSAGE_SCHEMA, check_metadata=False):
        born = table.column("born_timestamp")
        if born.null_count == 0:
            return table
    born = _as_timestamp(_column_or_nulls(table, "born_timestamp", TIMESTAMP_MS), "born_timestamp")
    if born.null_count:
        fill = pa.scalar(default_born_ms if default_born_ms is not None else now_ms(), TIMESTAMP_MS)
        born = pc.fill_null(born, fill)
    columns = [
        _as_string_keys(_column_or_nulls(table, "key", pa.string())),
        _typed(_column_or_nulls(table, "tag", pa.string()), "tag", pa.string()),
        _as_binary_body(table.column("body")),
        _typed(_column_or_nulls(table, "properties", PROPERTIES_TYPE), "properties", PROPERTIES_TYPE),
        born,
    ]
    return pa.Table.from_arrays(columns, schema=MESSAGE_SCHEMA)


def messages_to_batch(messages: Sequence[Mapping[str, Any]]) -> pa.Table:
    """A normalized table from message dicts (``body`` and optionally the other columns).

    Integer keys are stored as their decimal string; properties as a string map.
    """
    if not messages:
        raise BadBatchError("empty batch: send at least one message")
    keys, tags, bodies, props, born = [], [], [], [], []
    for i, m in enumerate(messages):
        body = m.get("body")
        if body is None:
            raise BadBatchError(f"message {i} has no body")
        bodies.append(body.encode("utf-8") if isinstance(body, str) else bytes(body))
        key = m.get("key")
        if isinstance(key, (bytes, bytearray, memoryview)):
            try:
                key = bytes(key).decode("utf-8")
            except UnicodeDecodeError:
                raise BadBatchError(f"message {i}: binary key is not valid UTF-8") from None
        keys.append(None if key is None else str(key))
        tags.append(m.get("tag"))
        p = m.get("properties")
        props.append(None if p is None else [(str(k), str(v)) for k, v in p.items()])
        born.append(m.get("born_timestamp"))
    default_born = now_ms()
    table = pa.Table.from_arrays(
        [
            pa.array(keys, pa.string()),
            pa.array(tags, pa.string()),
            pa.array(bodies, pa.binary()),
            pa.array(props, PROPERTIES_TYPE),
            pa.array([default_born if b is None else b for b in born], pa.int64()).cast(TIMESTAMP_MS),
        ],
        schema=MESSAGE_SCHEMA,
    )
    return table


def with_store_columns(table: pa.Table, base_offset: int, store_ms: int) -> pa.Table:
    """Append ``queue_offset`` (base_offset, base_offset+1, ...) and ``store_timestamp``."""
    n = table.num_rows
    offsets = pa.array(np.arange(base_offset, base_offset + n, dtype=np.int64))
    stamps = pa.repeat(pa.scalar(store_ms, TIMESTAMP_MS), n)
    return table.append_column(STORED_SCHEMA.field("queue_offset"), offsets).append_column(
        STORED_SCHEMA.field("store_timestamp"), stamps
    )
