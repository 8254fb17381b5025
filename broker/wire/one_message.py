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
_PREFIX = struct.Struct("<Ii")  # continuation marker, metadata length
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


def _head_struct() -> tuple[struct.Struct, list[bytes]]:
    """Schema, message prefix and metadata in one ``struct``: the template's fixed bytes around its
    body length (q), 20 buffer spans (40q) and 8 field nodes (16q), in the order pyarrow writes them."""
    fields = [(_BODY_LENGTH_AT, 8, "q"), (_BUFFERS_AT, 320, "40q"), (_NODES_AT, 128, "16q")]
    if sorted(fields) != fields:  # a pyarrow that writes another layout: found by the tests
        raise RuntimeError("unexpected one-row batch metadata: body length, buffers and nodes in another order")
    fixed, codes, at = [], [], 0
    for start, size, code in fields:
        fixed.append(_METADATA[at:start])
        codes.append(code)
        at = start + size
    fixed.append(_METADATA[at:])
    fixed[0] = codec.MESSAGE_SCHEMA_IPC + _MESSAGE_PREFIX + fixed[0]
    fmt = "<" + "".join(f"{len(part)}s{code}" for part, code in zip(fixed, [*codes, ""], strict=True))
    return struct.Struct(fmt), fixed


_HEAD, (_FIXED_0, _FIXED_1, _FIXED_2, _FIXED_3) = _head_struct()
_I32_PAIR = struct.Struct("<ii")
_NULL_STRING = b"\x00" * 16  # a null string row: its validity bitmap padded to 8 bytes, offsets 0, 0
_NULL_MAP = b"\x00" * 32  # a null map row: validity, offsets 0, 0, empty keys' and values' offsets (0)
_EMPTY_MAP = b"\x00" * 24  # an empty map row: offsets 0, 0, empty keys' and values' offsets


def _string_column(value: bytes | None, at: int, parts: list, spans: list) -> int:
    """Add a one-row string column's validity, offsets and data at ``at``; returns where it ends.
    Every buffer starts at a multiple of 8 bytes, as pyarrow lays them out."""
    if value is None:
        parts.append(_NULL_STRING)
        spans += (at, 1, at + 8, 8, at + 16, 0)
        return at + 16
    size = len(value)
    pad = -size % 8
    parts += (_I32_PAIR.pack(0, size), value, _PAD[pad])
    spans += (at, 0, at, 8, at + 8, size)
    return at + 8 + size + pad


def _offsets(values: list[bytes]) -> bytes:
    offsets, end = [0], 0
    for value in values:
        end += len(value)
        offsets.append(end)
    return struct.pack(f"<{len(offsets)}i", *offsets)


def _map_column(entries: list[tuple[bytes, bytes]] | None, at: int, parts: list, spans: list) -> int:
    """Add the 9 buffers of a one-row map column: map validity and offsets, the entries' validity,
    then validity, offsets and data of the keys and of the values."""
    if not entries:
        null = entries is None
        parts.append(_NULL_MAP if null else _EMPTY_MAP)
        at, start = at + 8 * null, at
        spans += (start, int(null), at, 8, at + 8, 0, at + 8, 0, at + 8, 4, at + 16, 0, at + 16, 0, at + 16, 4,
                  at + 24, 0)
        return at + 24
    parts.append(_I32_PAIR.pack(0, len(entries)))
    spans += (at, 0, at, 8, at + 8, 0)
    at += 8
    for column in ([k for k, _ in entries], [v for _, v in entries]):
        spans += (at, 0)
        for data in (_offsets(column), b"".join(column)):
            size = len(data)
            pad = -size % 8
            spans += (at, size)
            parts += (data, _PAD[pad])
            at += size + pad
    return at


def _utf8(value: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadBatchError(f"{what} is not valid UTF-8 text (it holds a lone surrogate)") from None


def _key_bytes(key: Any) -> bytes | None:
    if key is None:
        return None
    if type(key) is str:  # the usual case, quickest
        return _utf8(key, "the key")
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
    if type(body) is not bytes:
        body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    key, tag, props, born = _key_bytes(row.get("key")), row.get("tag"), row.get("properties"), row.get("born_timestamp")
    tag = None if tag is None else _utf8(tag, "the tag")
    entries = None if props is None else [
        (_utf8(str(k), "a property key"), _utf8(str(v), "a property value")) for k, v in props.items()]
    try:
        stamp = _I64.pack(codec.now_ms() if born is None else born)
    except struct.error:
        raise BadBatchError(f"born_timestamp {born!r} is not a 64-bit integer of milliseconds") from None
    parts: list[bytes] = []
    spans: list[int] = []
    at = _string_column(key, 0, parts, spans)
    at = _string_column(tag, at, parts, spans)
    at = _string_column(body, at, parts, spans)
    at = _map_column(entries, at, parts, spans)
    spans += (at, 0, at, 8)  # the born timestamp: no validity bitmap, 8 bytes
    n = len(entries) if entries else 0
    head = _HEAD.pack(_FIXED_0, at + 8, _FIXED_1, *spans, _FIXED_2, 1, key is None, 1, tag is None, 1, 0, 1,
                      entries is None, n, 0, n, 0, n, 0, 1, 0, _FIXED_3)
    return b"".join([head, *parts, stamp, codec.END_OF_STREAM])


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
