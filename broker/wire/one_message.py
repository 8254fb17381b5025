"""One message as an Arrow IPC stream, laid out directly: the synchronous send's encoding.

Building Arrow arrays for a single row costs far more than the row's bytes (five arrays, a table,
a serializer), and a synchronous send pays it for every message. The record batch of one
``MESSAGE_SCHEMA`` row always has the same shape: 8 field nodes and 20 buffers, so its metadata
is the metadata pyarrow writes for any one-row batch with those numbers changed. This module
finds where they sit in a template once, then writes body and metadata with ``struct`` alone.
The result is byte for byte what ``codec.encode(codec.messages_to_batch([row]))`` gives (tested),
so the broker stores it as sent.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from broker.wire import codec
from broker.wire.errors import BadBatchError

__all__ = ["encode_one"]

_I64 = struct.Struct("<q")
_PAIR = struct.Struct("<qq")
_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length
_EMPTY_OFFSETS = struct.pack("<i", 0)
_NULL_ROW = b"\x00"  # a validity bitmap whose one row is null
_PAD = [b"\x00" * n for n in range(8)]


def _table_fields(fb: bytes, table: int) -> tuple[int, ...]:
    """The positions of a flatbuffer table's fields (0: absent)."""
    vtable = table - struct.unpack_from("<i", fb, table)[0]
    size = struct.unpack_from("<H", fb, vtable)[0]
    return tuple(table + f if f else 0 for f in struct.unpack_from(f"<{(size - 4) // 2}H", fb, vtable + 4))


def _vector(fb: bytes, field: int) -> tuple[int, int]:
    """Where a vector field's elements start, and how many there are."""
    start = field + struct.unpack_from("<I", fb, field)[0]
    return start + 4, struct.unpack_from("<I", fb, start)[0]


def _template() -> tuple[bytes, int, int, int]:
    """A one-row batch's metadata, and where its body length, field nodes and buffers sit in it."""
    row = {"key": "k", "tag": "t", "body": b"b", "properties": {"p": "v"}, "born_timestamp": 0}
    message = codec.messages_to_batch([row]).to_batches()[0].serialize().to_pybytes()
    size = _PREFIX.unpack_from(message)[1]
    fb = message[_PREFIX.size:_PREFIX.size + size]
    root = struct.unpack_from("<I", fb)[0]
    _version, _kind, header, body_length = _table_fields(fb, root)[:4]
    batch = header + struct.unpack_from("<I", fb, header)[0]
    _length, nodes_field, buffers_field = _table_fields(fb, batch)[:3]
    nodes, node_count = _vector(fb, nodes_field)
    buffers, buffer_count = _vector(fb, buffers_field)
    if (node_count, buffer_count) != (8, 20):  # a pyarrow that writes another layout: found by the tests
        raise RuntimeError(f"unexpected one-row batch layout: {node_count} nodes, {buffer_count} buffers")
    return fb, body_length, nodes, buffers


_METADATA, _BODY_LENGTH_AT, _NODES_AT, _BUFFERS_AT = _template()


class _Body:
    """The body's buffers, each padded to 8 bytes, and the nodes and buffer entries describing them."""

    __slots__ = ("parts", "buffers", "nodes", "size")

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.buffers: list[int] = []
        self.nodes: list[int] = []
        self.size = 0

    def buffer(self, data: bytes) -> None:
        n = len(data)
        self.buffers += (self.size, n)
        if n:
            pad = -n % 8
            self.parts.append(data)
            if pad:
                self.parts.append(_PAD[pad])
            self.size += n + pad

    def strings(self, values: list[bytes]) -> None:
        """The offsets and data buffers of non-null string or binary values (no validity bitmap)."""
        offsets, end = [0], 0
        for value in values:
            end += len(value)
            offsets.append(end)
        self.buffer(struct.pack(f"<{len(offsets)}i", *offsets))
        self.buffer(b"".join(values))

    def string_column(self, value: bytes | None) -> None:
        if value is None:
            self.nodes += (1, 1)
            self.buffer(_NULL_ROW)
            self.buffer(b"\x00" * 8)  # offsets 0, 0
            self.buffer(b"")
        else:
            self.nodes += (1, 0)
            self.buffer(b"")
            self.strings([value])

    def map_column(self, entries: list[tuple[bytes, bytes]] | None) -> None:
        n = len(entries) if entries is not None else 0
        self.nodes += (1, 0) if entries is not None else (1, 1)
        self.buffer(b"" if entries is not None else _NULL_ROW)
        self.buffer(struct.pack("<ii", 0, n))
        self.nodes += (n, 0)  # the entries struct
        self.buffer(b"")
        for side in (0, 1):  # keys, then values
            self.nodes += (n, 0)
            self.buffer(b"")
            if n:
                self.strings([entry[side] for entry in entries])
            else:
                self.buffer(_EMPTY_OFFSETS)
                self.buffer(b"")


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadBatchError(f"{what} is not valid UTF-8 text (it holds a lone surrogate)") from None


def _key_bytes(key: Any) -> bytes | None:
    if key is None:
        return None
    if isinstance(key, bytes | bytearray | memoryview):
        try:
            bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            raise BadBatchError("binary key is not valid UTF-8 (the key column is a string)") from None
        return bytes(key)
    return _utf8(str(key), "the key")


def encode_one(row: Mapping[str, Any]) -> bytes:
    """The Arrow IPC stream of one message dict (``body`` and optionally ``key``, ``tag``,
    ``properties``, ``born_timestamp``), as ``codec.messages_to_batch`` reads them."""
    body = row.get("body")
    if body is None:
        raise BadBatchError("message 0 has no body")
    tag, props, born = row.get("tag"), row.get("properties"), row.get("born_timestamp")
    out = _Body()
    out.string_column(_key_bytes(row.get("key")))
    out.string_column(None if tag is None else _utf8(tag, "the tag"))
    out.nodes += (1, 0)
    out.buffer(b"")
    out.strings([body.encode("utf-8") if isinstance(body, str) else bytes(body)])
    out.map_column(None if props is None else
                   [(_utf8(str(k), "a property key"), _utf8(str(v), "a property value")) for k, v in props.items()])
    out.nodes += (1, 0)
    out.buffer(b"")
    try:
        out.buffer(_I64.pack(codec.now_ms() if born is None else born))
    except struct.error:
        raise BadBatchError(f"born_timestamp {born!r} is not a 64-bit integer of milliseconds") from None
    metadata = bytearray(_METADATA)
    _I64.pack_into(metadata, _BODY_LENGTH_AT, out.size)
    struct.pack_into("<16q", metadata, _NODES_AT, *out.nodes)
    struct.pack_into("<40q", metadata, _BUFFERS_AT, *out.buffers)
    return b"".join([codec.MESSAGE_SCHEMA_IPC, _PREFIX.pack(0xFFFFFFFF, len(metadata)), metadata, *out.parts,
                     codec.END_OF_STREAM])
