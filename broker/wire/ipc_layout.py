"""Where pyarrow puts the numbers of a ``MESSAGE_SCHEMA`` record batch's IPC metadata.

A record batch of ``MESSAGE_SCHEMA`` rows always has the same shape, however many rows it holds:
8 field nodes and 20 buffers. Its metadata is therefore the metadata pyarrow writes for a one-row
batch with a few numbers changed: the row count, the body length, the buffers' spans and the
nodes' lengths and null counts. This module finds where they sit in a template once (written by
pyarrow itself, so another layout of another pyarrow is found, not guessed) and packs a stream's
head (schema, message prefix and metadata) with one ``struct``: ``broker.wire.one_message``
encodes one message with it, ``broker.wire.message_rows`` many.

The template is built from buffers, never from Python lists: ``pa.array`` of a list imports pandas
into the process on first use (pyarrow looks for pandas objects), which made every broker and
client import it, and every full garbage collection of theirs walk its objects.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from broker.wire import codec

__all__ = ["BODY_AT", "FIXED_0", "FIXED_1", "FIXED_2", "FIXED_3", "FIXED_4", "HEAD", "NODES_AT", "SPANS_AT",
           "STREAM_START"]

_NODES = 8  # field nodes: key, tag, body, properties (map, entries, keys, values), born_timestamp
_SPANS = 20  # buffers: (offset, length) pairs in the body
_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length


def _table_fields(fb: bytes, table: int) -> tuple[int, ...]:
    """The positions of a flatbuffer table's fields (0: absent)."""
    vtable = table - struct.unpack_from("<i", fb, table)[0]
    size = struct.unpack_from("<H", fb, vtable)[0]
    return tuple(table + f if f else 0 for f in struct.unpack_from(f"<{(size - 4) // 2}H", fb, vtable + 4))


def _vector(fb: bytes, field: int) -> tuple[int, int]:
    """Where a vector field's elements start, and how many there are."""
    start = field + struct.unpack_from("<I", fb, field)[0]
    return start + 4, struct.unpack_from("<I", fb, start)[0]


def _one_row_batch() -> pa.RecordBatch:
    """``{"key": "k", "tag": "t", "body": b"b", "properties": {"p": "v"}, "born_timestamp": 0}``."""
    properties = codec.PROPERTIES_TYPE
    entries = pa.StructArray.from_arrays([codec.string_array(["p"]), codec.string_array(["v"])],
                                         fields=[properties.key_field, properties.item_field])
    columns = [codec.string_array(["k"]), codec.string_array(["t"]), codec.string_array([b"b"], binary=True),
               pa.Array.from_buffers(properties, 1, [None, pa.py_buffer(struct.pack("<ii", 0, 1))], children=[entries]),
               codec.int64_array(np.zeros(1, np.int64), codec.TIMESTAMP_MS)]
    return pa.RecordBatch.from_arrays(columns, schema=codec.MESSAGE_SCHEMA)


def _template() -> tuple[bytes, list[tuple[int, int, str]]]:
    """A one-row batch's metadata, and where its row count, body length, buffers and nodes sit in it
    (position, size, ``struct`` code) in the order pyarrow writes them."""
    message = _one_row_batch().serialize().to_pybytes()
    size = _PREFIX.unpack_from(message)[1]
    fb = message[_PREFIX.size:_PREFIX.size + size]
    root = struct.unpack_from("<I", fb)[0]
    _version, _kind, header, body_length = _table_fields(fb, root)[:4]
    batch = header + struct.unpack_from("<I", fb, header)[0]
    length, nodes_field, buffers_field = _table_fields(fb, batch)[:3]
    nodes, node_count = _vector(fb, nodes_field)
    buffers, buffer_count = _vector(fb, buffers_field)
    if (node_count, buffer_count) != (_NODES, _SPANS):  # a pyarrow that writes another layout: found by the tests
        raise RuntimeError(f"unexpected record batch layout: {node_count} nodes, {buffer_count} buffers")
    fields = [(body_length, 8, "q"), (length, 8, "q"), (buffers, 16 * _SPANS, f"{2 * _SPANS}q"),
              (nodes, 16 * _NODES, f"{2 * _NODES}q")]
    if sorted(fields) != fields:  # HEAD packs them in this order
        raise RuntimeError("unexpected record batch metadata: body length, length, buffers and nodes in another order")
    return fb, fields


_METADATA, _FIELDS = _template()
STREAM_START = codec.MESSAGE_SCHEMA_IPC + _PREFIX.pack(0xFFFFFFFF, len(_METADATA))
"""Every such stream's first bytes: the schema, then the record batch message's prefix."""
BODY_AT = len(STREAM_START) + len(_METADATA)  # where the record batch's body starts in the stream
SPANS_AT = len(STREAM_START) + _FIELDS[2][0]  # the buffers' spans in the stream: 40 int64
NODES_AT = len(STREAM_START) + _FIELDS[3][0]  # the field nodes in the stream: 16 int64


def _head_struct() -> tuple[struct.Struct, list[bytes]]:
    """The stream up to the body in one ``struct``: the template's fixed bytes around the numbers
    that change."""
    fixed, at = [], 0
    for start, size, _code in _FIELDS:
        fixed.append(_METADATA[at:start])
        at = start + size
    fixed.append(_METADATA[at:])
    fixed[0] = STREAM_START + fixed[0]
    codes = [code for _start, _size, code in _FIELDS] + [""]
    return struct.Struct("<" + "".join(f"{len(part)}s{code}" for part, code in zip(fixed, codes, strict=True))), fixed


HEAD, (FIXED_0, FIXED_1, FIXED_2, FIXED_3, FIXED_4) = _head_struct()
"""``HEAD.pack(FIXED_0, body length, FIXED_1, rows, FIXED_2, *40 span numbers, FIXED_3, *16 node
numbers, FIXED_4)``: the stream's bytes up to its record batch's body. Spans are (offset, length)
of each of the 20 buffers, nodes (length, null count) of each of the 8 field nodes."""
