"""One message as an Arrow IPC stream, laid out directly: the synchronous send's encoding.

Building Arrow arrays for a single row costs far more than the row's bytes (five arrays, a table,
a serializer), and a synchronous send pays it for every message. The record batch of one
``MESSAGE_SCHEMA`` row always has the same shape: 8 field nodes and 20 buffers, so its metadata
is the metadata pyarrow writes for any one-row batch with those numbers changed. This module
finds where they sit in a template once, then writes body and metadata with ``struct`` alone.
The result is byte for byte what ``codec.encode(codec.messages_to_batch([row]))`` gives (tested),
so the broker stores it as sent.

The broker checks such a payload the same way round (``decode_one``): it reads the message out
of the places ``encode_one`` puts it and accepts the payload only when encoding that message gives
the very same bytes. Whatever else arrives (other layouts, damaged or crafted bytes) takes the
general path: a full Arrow decode and validation.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from broker.wire import codec
from broker.wire.errors import BadBatchError

__all__ = ["decode_one", "encode_one"]

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
_MESSAGE_PREFIX = _PREFIX.pack(0xFFFFFFFF, len(_METADATA))


_I32_PAIR = struct.Struct("<ii")
_NULL_OFFSETS = b"\x00" * 8  # a null row's string offsets: 0, 0


def _string_buffers(value: bytes | None) -> tuple[bytes, bytes, bytes]:
    """Validity, offsets and data of a one-row string column (no bitmap when the row is not null)."""
    if value is None:
        return _NULL_ROW, _NULL_OFFSETS, b""
    return b"", _I32_PAIR.pack(0, len(value)), value


def _offsets(values: list[bytes]) -> bytes:
    offsets, end = [0], 0
    for value in values:
        end += len(value)
        offsets.append(end)
    return struct.pack(f"<{len(offsets)}i", *offsets)


def _map_buffers(entries: list[tuple[bytes, bytes]] | None) -> list[bytes]:
    """The 9 buffers of a one-row map column: map validity and offsets, the entries' validity,
    then validity, offsets and data of the keys and of the values."""
    if not entries:
        empty = [b"", _EMPTY_OFFSETS, b""]
        return [_NULL_ROW if entries is None else b"", _NULL_OFFSETS, b"", *empty, *empty]
    keys, values = [k for k, _ in entries], [v for _, v in entries]
    return [b"", _I32_PAIR.pack(0, len(entries)), b"", b"", _offsets(keys), b"".join(keys), b"", _offsets(values),
            b"".join(values)]


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
    key, tag, props, born = _key_bytes(row.get("key")), row.get("tag"), row.get("properties"), row.get("born_timestamp")
    tag = None if tag is None else _utf8(tag, "the tag")
    entries = None if props is None else [
        (_utf8(str(k), "a property key"), _utf8(str(v), "a property value")) for k, v in props.items()]
    n = len(entries) if entries else 0
    try:
        stamp = _I64.pack(codec.now_ms() if born is None else born)
    except struct.error:
        raise BadBatchError(f"born_timestamp {born!r} is not a 64-bit integer of milliseconds") from None
    buffers = [*_string_buffers(key), *_string_buffers(tag),
               *_string_buffers(body.encode("utf-8") if isinstance(body, str) else bytes(body)),
               *_map_buffers(entries), b"", stamp]
    nodes = (1, key is None, 1, tag is None, 1, 0, 1, entries is None, n, 0, n, 0, n, 0, 1, 0)
    spans, parts, size = [], [], 0
    for data in buffers:  # each buffer padded to 8 bytes, as pyarrow lays them out
        length = len(data)
        spans += (size, length)
        if length:
            parts.append(data)
            pad = -length % 8
            if pad:
                parts.append(_PAD[pad])
            size += length + pad
    metadata = bytearray(_METADATA)
    _I64.pack_into(metadata, _BODY_LENGTH_AT, size)
    struct.pack_into("<16q", metadata, _NODES_AT, *nodes)
    struct.pack_into("<40q", metadata, _BUFFERS_AT, *spans)
    return b"".join([codec.MESSAGE_SCHEMA_IPC, _MESSAGE_PREFIX, metadata, *parts, codec.END_OF_STREAM])


_META_START = len(codec.MESSAGE_SCHEMA_IPC) + _PREFIX.size


def decode_one(payload: bytes) -> dict | None:
    """The message of ``payload`` when it is exactly ``encode_one``'s encoding of a message (so a
    valid Arrow IPC stream of one row); None for anything else."""
    body_at = _META_START + len(_METADATA)
    if (len(payload) < body_at + len(codec.END_OF_STREAM) or not payload.startswith(codec.MESSAGE_SCHEMA_IPC)
            or payload[len(codec.MESSAGE_SCHEMA_IPC):_META_START] != _MESSAGE_PREFIX):
        return None
    nodes = struct.unpack_from("<16q", payload, _META_START + _NODES_AT)
    if nodes[0] != 1:  # a batch of many messages has the same layout: not one to read here
        return None
    spans = struct.unpack_from("<40q", payload, _META_START + _BUFFERS_AT)
    body = memoryview(payload)[body_at:]
    try:
        key = None if nodes[1] else _one_string(body, spans, 1).decode("utf-8")
        tag = None if nodes[3] else _one_string(body, spans, 4).decode("utf-8")
        entries = None
        if not nodes[7]:  # the properties map is not null
            keys, values = _strings(body, spans, 13, nodes[8]), _strings(body, spans, 16, nodes[8])
            entries = {k.decode("utf-8"): v.decode("utf-8") for k, v in zip(keys, values, strict=True)}
        row = {"key": key, "tag": tag, "body": _one_string(body, spans, 7), "properties": entries,
               "born_timestamp": _I64.unpack_from(body, spans[38])[0]}
        return row if encode_one(row) == payload else None
    except (struct.error, UnicodeDecodeError, ValueError, MemoryError, BadBatchError):
        return None


def _one_string(body: memoryview, spans: tuple[int, ...], offsets: int) -> bytes:
    """The value of a one-row string array whose offsets are buffer ``offsets`` (its data the next)."""
    start, end = _I32_PAIR.unpack_from(body, spans[2 * offsets])
    data = spans[2 * offsets + 2]
    return bytes(body[data + start:data + end])  # bounds that make no sense fail the re-encoding


def _strings(body: memoryview, spans: tuple[int, ...], offsets: int, n: int) -> list[bytes]:
    """The ``n`` values of a string array whose offsets are buffer ``offsets`` (its data the next)."""
    bounds = struct.unpack_from(f"<{n + 1}i", body, spans[2 * offsets])
    data = bytes(body[spans[2 * offsets + 2]:spans[2 * offsets + 2] + spans[2 * offsets + 3]])
    return [data[bounds[i]:bounds[i + 1]] for i in range(n)]
