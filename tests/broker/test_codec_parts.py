"""codec.encode_parts: a big batch goes out as its own buffers, byte for byte the stream encode gives."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from broker.wire import codec

ROWS = 30_000


def _messages(rows: int) -> pa.Table:
    """Message rows with every kind of column filled and null: keys, tags, bodies of 0-299 bytes,
    properties, born timestamps."""
    rng = np.random.default_rng(7)
    return pa.Table.from_arrays([
        pa.array([None if i % 7 == 0 else f"key-{i % 100}" for i in range(rows)], pa.string()),
        pa.array([None if i % 3 else "tag" for i in range(rows)], pa.string()),
        pa.array([rng.bytes(i % 300) for i in range(rows)], pa.binary()),
        pa.array([None if i % 5 else [("p", str(i))] for i in range(rows)], codec.PROPERTIES_TYPE),
        pa.array(np.arange(rows), codec.TIMESTAMP_MS),
    ], schema=codec.MESSAGE_SCHEMA)


def _serialized(data: pa.Table) -> bytes:
    """The stream as Arrow's own writer lays it out, each batch serialized whole."""
    schema = data.schema.serialize().to_pybytes()
    return schema + b"".join(batch.serialize().to_pybytes() for batch in data.to_batches()) + codec.END_OF_STREAM


@pytest.mark.parametrize(("first", "rows"), [(0, ROWS), (3, 20_001), (12_345, 1_500), (9, 2), (0, 1)])
def test_parts_join_to_the_stream_of_any_slice(first, rows):
    data = _messages(ROWS).slice(first, rows)
    joined = b"".join(codec.encode_parts(data))
    assert joined == _serialized(data)
    assert codec.decode(joined).equals(data)


def test_a_table_of_several_batches_and_stored_columns():
    batches = _messages(ROWS).to_batches(max_chunksize=9_000)
    data = codec.with_store_columns(pa.Table.from_batches(batches), 100, [1_700_000_000_000], [ROWS])
    assert data.schema.equals(codec.STORED_SCHEMA)
    joined = b"".join(codec.encode_parts(data))
    assert joined == _serialized(data)
    assert codec.decode(joined).equals(data)


def test_a_big_batch_goes_out_as_its_own_buffers_and_a_small_one_serialized_whole():
    data = _messages(ROWS).slice(1_000, 20_000)
    body = data.column("body").chunk(0)
    offsets, values = body.buffers()[1:]
    start = values.address + int(np.frombuffer(offsets, np.int32)[body.offset])  # the slice's first body byte
    parts = codec.encode_parts(data)
    assert start in {part.address for part in parts if isinstance(part, pa.Buffer)}, "the bodies copied"
    small = _messages(10)
    assert len(codec.encode_parts(small)) == 3  # schema, the batch, end of stream
