"""Arrow IPC codec for message batches: pure functions, no I/O, no state.

A batch on the wire is one Arrow IPC stream with the message columns of ``MESSAGE_SCHEMA``. The
broker stores it as sent when it already has exactly those columns (``message_batch``), and adds
``queue_offset`` and ``store_timestamp`` on the way out (``with_store_columns``: the
``STORED_SCHEMA`` batches a pull returns). Neither side loops over messages in Python on the hot path.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from broker.wire.errors import BadBatchError
from broker.wire.limits import MAX_PROPERTY_KEY_BYTES, MAX_PROPERTY_VALUE_BYTES, MAX_TAG_BYTES

__all__ = [
    "COMPACTED_SCHEMA",
    "END_OF_STREAM",
    "MESSAGE_SCHEMA",
    "MESSAGE_SCHEMA_IPC",
    "STORED_SCHEMA",
    "decode",
    "decode_many",
    "compacted_body",
    "decode_records",
    "decode_stamped_records",
    "empty_stored_table",
    "int64_array",
    "numbers",
    "string_array",
    "value_offsets",
    "encode",
    "encode_parts",
    "first_stamped_at_or_after",
    "message_batch",
    "messages_to_batch",
    "normalize",
    "now_ms",
    "with_offsets_and_stamps",
    "with_store_columns",
]

PROPERTIES_TYPE = pa.map_(pa.string(), pa.string())
TIMESTAMP_MS = pa.timestamp("ms")
# Born timestamps readers can turn into dates (years 1 to 9999): any other value is garbage.
MIN_BORN_MS, MAX_BORN_MS = -62_135_596_800_000, 253_402_300_799_999

MESSAGE_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("tag", pa.string()),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("properties", PROPERTIES_TYPE),
        pa.field("born_timestamp", TIMESTAMP_MS),
    ]
)
_BODY, _BORN = MESSAGE_SCHEMA.get_field_index("body"), MESSAGE_SCHEMA.get_field_index("born_timestamp")
STORED_SCHEMA = MESSAGE_SCHEMA.append(pa.field("queue_offset", pa.int64(), nullable=False)).append(
    pa.field("store_timestamp", TIMESTAMP_MS)
)
# The body of a compacted record: the messages of many small records, each with its store timestamp.
COMPACTED_SCHEMA = MESSAGE_SCHEMA.append(pa.field("store_timestamp", TIMESTAMP_MS, nullable=False))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# The IPC stream framing of the two schemas every batch uses, serialized once: encoding or
# decoding a small batch then costs a few calls instead of a stream writer's or reader's setup.
MESSAGE_SCHEMA_IPC = MESSAGE_SCHEMA.serialize().to_pybytes()
COMPACTED_SCHEMA_IPC = COMPACTED_SCHEMA.serialize().to_pybytes()
_KNOWN_SCHEMAS = ((MESSAGE_SCHEMA, MESSAGE_SCHEMA_IPC), (STORED_SCHEMA, STORED_SCHEMA.serialize().to_pybytes()),
                  (COMPACTED_SCHEMA, COMPACTED_SCHEMA_IPC))
_LONGEST_SCHEMA_IPC = max(len(message) for _schema, message in _KNOWN_SCHEMAS)
_PARTS_FROM_ROWS, _PARTS_FROM_BYTES = 1_000, 64 * 1024  # a batch this big goes out as its buffers, uncopied
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_MAX_OFFSET = 2**31 - 1  # of a 32-bit offsets buffer
# Consecutive stored bodies under this size are read as one stream (one decode in C++, not one per
# record); bigger ones are decoded one by one, in place.
_JOINED_BODY_BYTES = 64 * 1024


def encode(data: pa.RecordBatch | pa.Table) -> bytes:
    """One Arrow IPC stream holding ``data``."""
    return b"".join(encode_parts(data))


def encode_parts(data: pa.RecordBatch | pa.Table) -> list[bytes | pa.Buffer]:
    """``encode(data)`` as parts whose concatenation is the stream, for callers that write them to
    a socket one after the other, or copy them into a larger message anyway (a pull response): a
    batch of megabytes goes out as its own buffers, never copied into one."""
    for schema, message in _KNOWN_SCHEMAS:
        if data.schema.equals(schema):
            batches = data.to_batches() if isinstance(data, pa.Table) else [data]
            return [message, *(part for batch in batches for part in _batch_parts(batch, message)), END_OF_STREAM]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return [sink.getvalue()]


class _Parts:
    """A file that keeps what is written to it as written: given to Arrow's IPC writer, it holds a
    record batch's message as the batch's own buffers (slices of them) between a few small bytes
    of framing, metadata and padding. The writer asks no more of it than this (``pa.PythonFile``
    reads ``closed``, then only writes)."""

    closed = False

    def __init__(self) -> None:
        self.parts: list[bytes | pa.Buffer] = []

    def write(self, data: bytes | pa.Buffer) -> int:
        self.parts.append(data)
        return len(data)


def _batch_parts(batch: pa.RecordBatch, schema_message: bytes) -> list[bytes | pa.Buffer]:
    """The IPC message of ``batch`` (``batch.serialize()``), as parts: a big batch's own buffers
    uncopied (a 4 MB batch in 0.04 ms, against 0.45 ms to serialize it), a small one serialized
    whole (cheaper than the writer's few dozen calls)."""
    # The size of a slice's buffers counts its parent's: the rows tell a small slice of a big batch.
    if batch.num_rows < _PARTS_FROM_ROWS or batch.get_total_buffer_size() < _PARTS_FROM_BYTES:
        return [batch.serialize()]
    sink = _Parts()
    pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), batch.schema).write_batch(batch)
    first, skipped = 0, 0
    while skipped < len(schema_message):  # the stream's schema message, written first
        skipped += len(sink.parts[first])
        first += 1
    if skipped != len(schema_message):  # not the known framing: the message as one buffer instead
        return [batch.serialize()]
    return sink.parts[first:]


def decode(payload: bytes | pa.Buffer) -> pa.Table:
    """The table in one Arrow IPC stream; ``BadBatchError`` when the bytes are not one."""
    if not payload:
        raise BadBatchError("empty batch: the request carries no Arrow IPC stream")
    try:
        buffer = payload if isinstance(payload, pa.Buffer) else pa.py_buffer(payload)
        head = buffer[:_LONGEST_SCHEMA_IPC].to_pybytes()
        for schema, message in _KNOWN_SCHEMAS:
            if head.startswith(message):
                return _read_batches(buffer[len(message):], schema)
        return pa.ipc.open_stream(buffer).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise BadBatchError(f"malformed Arrow IPC stream ({len(payload)} bytes): {exc}") from None


def _read_batches(messages: pa.Buffer, schema: pa.Schema) -> pa.Table:
    """The record batches after a known schema message (a stream that holds no dictionaries)."""
    # read_message of a BufferReader: half the cost of a MessageReader, whose opening alone
    # was a tenth of a small send's handling.
    reader = pa.BufferReader(messages)
    batches = []
    while True:
        try:
            message = pa.ipc.read_message(reader)
        except EOFError:  # the end-of-stream marker, or the end of the bytes
            return pa.Table.from_batches(batches, schema)
        batches.append(pa.ipc.read_record_batch(message, schema))


def decode_many(payloads: Iterable[bytes]) -> pa.Table:
    """Concatenate stored-schema batches (a pull response) into one table."""
    tables = [decode(p) for p in payloads]
    if not tables:
        return empty_stored_table()
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def empty_stored_table() -> pa.Table:
    # Not Schema.empty_table(): it imports pandas into the process on first use.
    return _EMPTY_STORED


_EMPTY_STORED = pa.Table.from_batches([pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in STORED_SCHEMA],
                                                                  schema=STORED_SCHEMA)])


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
    if (table.schema.equals(MESSAGE_SCHEMA, check_metadata=False) and table.column(_BORN).null_count == 0
            and table.column(_BODY).null_count == 0):
        return table  # already conforms (what our producers send): checked first, it is the hot path
    if "body" not in table.column_names:
        raise BadBatchError(f"batch has no 'body' column (columns: {', '.join(table.column_names)})")
    extra = [c for c in table.column_names if c not in MESSAGE_SCHEMA.names]
    if extra:
        raise BadBatchError(
            f"unknown column(s) {', '.join(map(repr, extra))}; message columns are {', '.join(MESSAGE_SCHEMA.names)}"
        )
    born = _as_timestamp(_column_or_nulls(table, "born_timestamp", TIMESTAMP_MS), "born_timestamp")
    if born.null_count:
        born = pc.fill_null(born, _int64_scalar(default_born_ms if default_born_ms is not None else now_ms(),
                                                TIMESTAMP_MS))
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

    Integer keys are stored as their decimal string; properties as a string map. The dicts are laid
    out as an Arrow IPC stream directly (``broker.wire.message_rows``) and read back: quicker than
    ``pa.array`` of each column's list, which also imports pandas into the process on first use.
    """
    return decode(message_rows.encode_rows(messages))


def message_batch(payload: bytes | memoryview) -> tuple[bytes | memoryview, int]:
    """A sent batch as the broker stores it, and its row count: an Arrow IPC stream of
    ``MESSAGE_SCHEMA`` columns, fully validated, laid out as ``encode`` lays it out.

    A payload already in that form (what our producers send) is kept byte for byte (the very
    object, so a view of a big request's bytes is not copied), so a send costs a decode and a
    validation, no re-encoding; any other is normalized and encoded.

    Raises
    ------
    BadBatchError
        For any payload that is not such a batch, whatever part of it is malformed (framing,
        offsets, UTF-8 in names or values, out-of-range timestamps) or over a size limit.
    """
    if isinstance(payload, bytes):
        row = one_message.decode_one(payload)
        if row is not None:  # one message as producers encode it: checked without Arrow
            _check_message_limits(row)
            return payload, 1
    try:
        return _message_batch(payload)
    except BadBatchError:
        raise
    except (UnicodeDecodeError, pa.ArrowException, OverflowError, ValueError, TypeError, KeyError) as exc:
        # Arrow decodes names and metadata lazily, so malformed bytes surface wherever they are first touched.
        raise BadBatchError(f"malformed batch ({len(payload)} bytes): {type(exc).__name__}: {exc}") from None


def _message_batch(payload: bytes | memoryview) -> tuple[bytes | memoryview, int]:
    table = decode(payload)
    # Decoding checks the framing only, not offsets, nulls or UTF-8 inside the data, and Arrow's
    # kernels may abort the process on invalid data: nothing touches the data before this check.
    _validate(table, len(payload))
    normalized = normalize(table)
    if normalized is not table:
        _validate(normalized, len(payload))
    batches = normalized.to_batches()
    _check_limits(normalized)
    if (normalized is table and payload[:len(MESSAGE_SCHEMA_IPC)] == MESSAGE_SCHEMA_IPC
            and payload[-len(END_OF_STREAM):] == END_OF_STREAM and len(payload) == len(MESSAGE_SCHEMA_IPC)
            + sum(map(pa.ipc.get_record_batch_size, batches)) + len(END_OF_STREAM)):
        return payload, table.num_rows
    return encode(normalized), normalized.num_rows


def _validate(table: pa.Table, size: int) -> None:
    try:
        table.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise BadBatchError(f"invalid Arrow data in the batch ({size} bytes): {exc}") from None


_FEW_VALUES = 64  # born timestamps up to this many are compared in Python: quicker than numpy's reductions


def _check_limits(table: pa.Table) -> None:
    """Tags, property keys and values within their size limits; born timestamps readable as dates.

    Read from the arrays' buffers with numpy: a compute kernel call costs more than a small
    batch's whole check, and a synchronous send checks a batch of one.
    """
    born = [_int64_values(chunk) for chunk in table.column("born_timestamp").chunks if len(chunk)]
    if len(born) == 1 and len(born[0]) <= _FEW_VALUES:
        values = born[0].tolist()
        _check_born(min(values), max(values))
    else:
        _check_born(min(int(values.min()) for values in born), max(int(values.max()) for values in born))
    for chunk in table.column("tag").chunks:
        _check_length("tag", _longest_value(chunk), MAX_TAG_BYTES)
    for chunk in table.column("properties").chunks:
        if chunk.null_count < len(chunk):  # most sends carry none
            _check_length("property key", _longest_value(chunk.keys), MAX_PROPERTY_KEY_BYTES)
            _check_length("property value", _longest_value(chunk.items), MAX_PROPERTY_VALUE_BYTES)


def _check_message_limits(row: Mapping[str, Any]) -> None:
    """``_check_limits`` of one message dict (``one_message.decode_one``'s)."""
    born = row["born_timestamp"]
    _check_born(born, born)
    properties = row["properties"]
    if properties is None and row["tag"] is None:
        return  # the usual synchronous send: nothing else to measure
    properties = properties or {}
    for what, limit, values in (
        ("tag", MAX_TAG_BYTES, [row["tag"] or ""]),
        ("property key", MAX_PROPERTY_KEY_BYTES, properties.keys()),
        ("property value", MAX_PROPERTY_VALUE_BYTES, properties.values()),
    ):
        _check_length(what, max((len(v.encode("utf-8")) for v in values), default=0), limit)


def _check_born(low: int, high: int) -> None:
    if low < MIN_BORN_MS or high > MAX_BORN_MS:
        raise BadBatchError(f"column 'born_timestamp' holds {low if low < MIN_BORN_MS else high}, not a time in "
                            f"years 1 to 9999 (ms since the Unix epoch, {MIN_BORN_MS} to {MAX_BORN_MS})")


def _check_length(what: str, longest: int, limit: int) -> None:
    if longest > limit:
        raise BadBatchError(f"a {what} in the batch is {longest} bytes long; the limit is {limit} bytes (UTF-8)")


def _int64_values(chunk: pa.Array) -> np.ndarray:
    """The values of a timestamp array, nulls as 0 (``normalize`` filled them)."""
    if chunk.null_count:
        chunk = pc.fill_null(chunk.cast(pa.int64()), _int64_scalar(0, pa.int64()))
    return numbers(chunk, np.int64)


def numbers(values: pa.Array | pa.ChunkedArray, dtype: type) -> np.ndarray:
    """The values of a fixed-width integer (or timestamp) array without nulls, as numpy: views of
    its buffers, copied only to join chunks. (``to_numpy`` imports pandas on first use.)"""
    chunks = [chunk for chunk in (values.chunks if isinstance(values, pa.ChunkedArray) else [values]) if len(chunk)]
    if any(chunk.null_count for chunk in chunks):
        raise ValueError("numbers() of an array with nulls")
    size = np.dtype(dtype).itemsize
    parts = [np.frombuffer(chunk.buffers()[1], dtype, len(chunk), chunk.offset * size) for chunk in chunks]
    return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype)


def _longest_value(chunk: pa.Array) -> int:
    """The byte length of the longest non-null value of a string array."""
    if chunk.null_count == len(chunk):  # a send's usual tag (or no value at all)
        return 0
    validity, offsets = chunk.buffers()[:2]
    lengths = np.diff(np.frombuffer(offsets, np.int32, len(chunk) + 1, chunk.offset * 4))
    if chunk.null_count:  # a null slot's offsets may span bytes that do not count
        valid = np.unpackbits(np.frombuffer(validity, np.uint8), bitorder="little")[chunk.offset:][:len(chunk)]
        lengths = lengths[valid.astype(bool)]
    return int(lengths.max()) if len(lengths) else 0


def join_records(bodies: Sequence[bytes | memoryview], rows: int | None = None) -> tuple[list[bytes | memoryview], int]:
    """Stored record bodies as one body, given as the parts that concatenate to it, and its
    message count (``rows``, where the caller knows it: counting reads every body's batches).

    Bodies laid out by ``message_batch`` are joined as they are (one schema message, every body's
    record batch messages, one end-of-stream marker): no batch is decoded into columns and encoded
    again, which is what committing a transaction of many staged sends would otherwise cost, and
    no byte is copied (the parts are views of the bodies).
    """
    prefix, end = MESSAGE_SCHEMA_IPC, END_OF_STREAM
    views = [memoryview(body) for body in bodies]
    if all(view[:len(prefix)] == prefix and view[len(view) - len(end):] == end for view in views):
        if rows is None:
            rows = sum(decode(view).num_rows for view in views)  # zero-copy reads of the batch headers
        return [prefix, *(view[len(prefix):len(view) - len(end)] for view in views), end], rows
    table = decode_records([bytes(view) for view in views])
    return encode_parts(table), table.num_rows


def decode_records(bodies: Sequence[bytes]) -> pa.Table:
    """Stored record bodies, in order, as one table of their message columns.

    Bodies stored by ``message_batch`` share one layout (schema message, record batch messages,
    end-of-stream marker), so consecutive ones are read as one stream: one decode, not one per
    record; so are compacted records (``compacted_body``). Records stored with the store columns
    (older data directories) are decoded one by one.
    """
    tables = [table for _kind, _records, table in _decoded_runs(bodies)]
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def decode_stamped_records(bodies: Sequence[bytes], store_timestamps: Sequence[int],
                           counts: Sequence[int]) -> tuple[pa.Table, np.ndarray]:
    """``decode_records``, and every message's store timestamp: its record's (``store_timestamps``,
    records of ``counts`` messages), or its own in a compacted record."""
    tables, stamps = [], []
    for compacted, records, table in _decoded_runs(bodies):
        if compacted:
            stamps.append(numbers(table.column("store_timestamp"), np.int64))
            table = table.select(MESSAGE_SCHEMA.names)
        else:
            stamps.append(np.repeat(np.asarray(store_timestamps[records], dtype=np.int64), counts[records]))
        tables.append(table)
    return (pa.concat_tables(tables) if len(tables) > 1 else tables[0]), np.concatenate(stamps)


def _decoded_runs(bodies: Sequence[bytes]) -> list[tuple[bool, slice, pa.Table]]:
    """Runs of consecutive small bodies of one layout, each decoded at once: (compacted, the run's
    records, their table; compacted runs keep their store_timestamp column). A body of
    ``_JOINED_BODY_BYTES`` or more is a run of its own, decoded in place: joined, it would be copied."""
    runs, start = [], 0
    while start < len(bodies):
        prefix = next((p for p in (MESSAGE_SCHEMA_IPC, COMPACTED_SCHEMA_IPC) if bodies[start].startswith(p)), None)
        end, joinable = start + 1, prefix is not None and len(bodies[start]) < _JOINED_BODY_BYTES
        while joinable and end < len(bodies) and len(bodies[end]) < _JOINED_BODY_BYTES and bodies[end].startswith(prefix):
            end += 1
        if prefix is not None and end - start > 1:
            messages = (memoryview(body)[len(prefix):-len(END_OF_STREAM)] for body in bodies[start:end])
            table = pa.ipc.open_stream(b"".join([prefix, *messages, END_OF_STREAM])).read_all()  # loops in C++
        else:
            table = decode(bodies[start])
            if prefix is None and table.num_columns != len(MESSAGE_SCHEMA):  # older records: header stamps
                table = table.select(MESSAGE_SCHEMA.names)
        runs.append((prefix is COMPACTED_SCHEMA_IPC, slice(start, end), table))
        start = end
    return runs


def compacted_body(table: pa.Table, store_timestamps: np.ndarray) -> bytes:
    """One record body for the messages of many small records (message columns) with each
    message's store timestamp, which the record header cannot hold (``broker.storage.compaction``)."""
    stamped = table.append_column(COMPACTED_SCHEMA.field("store_timestamp"), int64_array(
        np.ascontiguousarray(store_timestamps, dtype=np.int64), TIMESTAMP_MS))
    return encode(stamped.combine_chunks())


def first_stamped_at_or_after(body: bytes, timestamp: int) -> int:
    """In a compacted record's body, the index of the first message stored at or after
    ``timestamp``; 0 for any other record (all its messages share the header's timestamp)."""
    if not body.startswith(COMPACTED_SCHEMA_IPC):
        return 0
    stamps = numbers(decode(body).column("store_timestamp"), np.int64)
    return int(np.searchsorted(stamps, timestamp, side="left"))


def with_store_columns(table: pa.Table, first_offset: int, store_timestamps: Sequence[int],
                       counts: Sequence[int]) -> pa.Table:
    """``table`` (message columns of consecutive records holding ``counts`` rows each) with
    ``queue_offset`` (first_offset, first_offset+1, ...) and each record's ``store_timestamp``."""
    return with_offsets_and_stamps(table, first_offset, np.repeat(np.asarray(store_timestamps, dtype=np.int64), counts))


def with_offsets_and_stamps(table: pa.Table, first_offset: int, stamps: np.ndarray) -> pa.Table:
    """``table`` with ``queue_offset`` (first_offset, first_offset+1, ...) and ``store_timestamp``
    (one per message)."""
    offsets = np.arange(first_offset, first_offset + table.num_rows, dtype=np.int64)
    return table.append_column(STORED_SCHEMA.field("queue_offset"), int64_array(offsets, pa.int64())).append_column(
        STORED_SCHEMA.field("store_timestamp"), int64_array(np.ascontiguousarray(stamps, dtype=np.int64), TIMESTAMP_MS)
    )


def int64_array(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """An int64 (or timestamp) array wrapping the contiguous buffer of ``values`` as is:
    ``pa.array(ndarray)`` would also import pandas on first use, a quarter-second stall."""
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def _int64_scalar(value: int, typ: pa.DataType) -> pa.Scalar:
    # Not pa.scalar(value): it imports pandas on first use, as pa.array does.
    return int64_array(np.array([value], np.int64), typ)[0]


def string_array(values: Sequence[str | bytes], binary: bool = False) -> pa.Array:
    """A string (or ``binary``) array of ``values`` (no None), built from its buffers: ``pa.array``
    of a list imports pandas into the process on first use."""
    typ = pa.binary() if binary else pa.string()
    data = [value.encode() if isinstance(value, str) else value for value in values]
    return pa.Array.from_buffers(typ, len(data), [None, pa.py_buffer(value_offsets(data)), pa.py_buffer(b"".join(data))])


def value_offsets(values: Sequence) -> bytes:
    """The 32-bit offsets buffer of a column of ``values`` (anything with a ``len``: bytes, maps;
    ``str`` when all ASCII); ``OverflowError`` past 2 GiB."""
    ends = np.cumsum(np.fromiter(map(len, values), np.int64, len(values)))
    if len(ends) and ends[-1] > _MAX_OFFSET:
        raise OverflowError(f"{ends[-1]} bytes in one column")
    offsets = np.zeros(len(values) + 1, "<i4")
    offsets[1:] = ends
    return offsets.tobytes()


from broker.wire import message_rows, one_message  # noqa: E402 - a cycle: they lay out this module's schema
