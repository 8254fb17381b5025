"""Message dicts as one Arrow IPC stream, laid out directly: what a pipelining producer sends,
and how ``codec.messages_to_batch`` makes its tables.

Building Arrow arrays from Python lists (``pa.array`` of each column, a table, a serializer) cost
about 150 µs a batch before its first row, and the first ``pa.array`` of a list imports pandas into
the process. A pipelining producer turns every message it sends into a row of such a batch.
``encode_rows`` writes the buffers pyarrow would write, each padded to 8 bytes, with ``bytes.join``,
numpy and ``array``, behind the metadata ``broker.wire.ipc_layout`` packs: byte for byte what
pyarrow writes for the same rows (tested), so the broker checks and keeps it as it does any batch.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from broker.wire import codec
from broker.wire.errors import BadBatchError
from broker.wire.ipc_layout import FIXED_0, FIXED_1, FIXED_2, FIXED_3, FIXED_4, HEAD

__all__ = ["encode_rows"]

_PAD = [b"\x00" * n for n in range(8)]
_NAMES = ("key", "tag", "body", "properties", "born_timestamp")
_FIELDS = [itemgetter(name) for name in _NAMES]
_TEXT = {str, type(None)}
_BYTES = {bytes}
_LITTLE_ENDIAN = sys.byteorder == "little"  # Arrow's buffers are little-endian; array() writes the machine's order


def _numbers(code: str, values) -> bytes:
    numbers = array(code, values)
    if not _LITTLE_ENDIAN:
        numbers.byteswap()
    return numbers.tobytes()


class _Body:
    """The record batch's body as it is written: buffers padded to 8 bytes, their spans, the nodes."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.spans: list[int] = []
        self.nodes: list[int] = []
        self.at = 0

    def buffer(self, data: bytes) -> None:
        size = len(data)
        self.spans += (self.at, size)
        if size:
            pad = -size % 8
            self.parts += (data, _PAD[pad])
            self.at += size + pad

    def validity(self, values: Sequence) -> int:
        """The validity bitmap of ``values`` (none when no value is None); returns the null count."""
        nulls = values.count(None)
        if not nulls:
            self.spans += (self.at, 0)
        elif nulls == len(values):
            self.buffer(bytes(-(-len(values) // 8)))
        else:
            present = np.fromiter((value is not None for value in values), bool, len(values))
            self.buffer(np.packbits(present, bitorder="little").tobytes())
        return nulls

    def strings(self, values: Sequence[bytes | None], *, node: bool = True) -> None:
        """A string or binary column (a node of its own unless ``node`` is False: the caller adds it)."""
        nulls = self.validity(values)
        if nulls == len(values):
            self.buffer(bytes(4 * (len(values) + 1)))
            self.buffer(b"")
        else:
            present = values if not nulls else [b"" if value is None else value for value in values]
            self.buffer(codec.value_offsets(present))
            self.buffer(b"".join(present))
        if node:
            self.nodes += (len(values), nulls)

    def texts(self, values: Sequence, what: str, *, node: bool = True) -> None:
        """A string column of ``values`` (str, None, or anything else as its ``str``); all of them
        ``str`` (the usual case) are encoded at once."""
        if values.count(None) == len(values):  # none at all (tags, properties): no need to look at them
            self.strings(values, node=node)
            return
        try:
            joined = "".join(values)
            data = joined.encode()
        except (TypeError, UnicodeEncodeError):  # a None, another type, or a lone surrogate (named there)
            self.strings(_texts(values, what), node=node)
            return
        self.spans += (self.at, 0)  # no nulls: no validity bitmap
        self.buffer(codec.value_offsets(values if len(data) == len(joined) else _texts(values, what)))  # ASCII: as many bytes
        self.buffer(data)
        if node:
            self.nodes += (len(values), 0)


def _utf8(i: int, value: str, what: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadBatchError(f"message {i}: {what} is not valid UTF-8 text (it holds a lone surrogate)") from None


def _texts(values: Sequence, what: str) -> list[bytes | None]:
    """Strings as UTF-8 (None kept); anything else as its ``str`` (an int key: its decimal string)."""
    try:
        if None not in values:
            return list(map(str.encode, values))
        return [None if value is None else value.encode() for value in values]
    except (TypeError, AttributeError, UnicodeEncodeError):
        return [None if value is None else _utf8(i, value if isinstance(value, str) else str(value), what)
                for i, value in enumerate(values)]


def _key_text(i: int, key: Any) -> str | None:
    if isinstance(key, bytes | bytearray | memoryview):
        try:
            return bytes(key).decode("utf-8")
        except UnicodeDecodeError:
            raise BadBatchError(f"message {i}: binary key is not valid UTF-8") from None
    return None if key is None else str(key)


def _keys(keys: Sequence) -> Sequence[str | None]:
    if not set(map(type, keys)) <= _TEXT:
        return [_key_text(i, key) for i, key in enumerate(keys)]
    return keys


def _tags(tags: Sequence) -> Sequence[str | None]:
    if not set(map(type, tags)) <= _TEXT:
        for i, tag in enumerate(tags):
            if tag is not None and not isinstance(tag, str):
                raise BadBatchError(f"message {i}: tag must be a string, got {type(tag).__name__}")
    return tags


def _bodies(bodies: Sequence) -> Sequence[bytes]:
    if set(map(type, bodies)) == _BYTES:
        return bodies
    bodies = list(bodies)
    for i, body in enumerate(bodies):
        if body is None:
            raise BadBatchError(f"message {i} has no body")
        bodies[i] = _utf8(i, body, "the body") if isinstance(body, str) else bytes(body)
    return bodies


def _properties(body: _Body, maps: Sequence) -> None:
    """The properties map column: its validity and offsets, the entries' struct, their keys and values."""
    nulls = body.validity(maps)
    if nulls == len(maps):
        body.buffer(bytes(4 * (len(maps) + 1)))
        pairs = []
    else:
        body.buffer(codec.value_offsets([entries or () for entries in maps]))
        pairs = [(str(k), str(v)) for entries in maps if entries for k, v in entries.items()]
    body.spans += (body.at, 0)  # the entries' struct: never null
    body.texts([k for k, _ in pairs], "a property key", node=False)
    body.texts([v for _, v in pairs], "a property value", node=False)
    body.nodes += (len(maps), nulls, len(pairs), 0, len(pairs), 0, len(pairs), 0)


def _born(born: Sequence) -> bytes:
    if None in born:
        default = codec.now_ms()
        born = [default if stamp is None else stamp for stamp in born]
    try:
        return _numbers("q", born)
    except (TypeError, OverflowError):
        for i, stamp in enumerate(born):
            try:
                array("q", [stamp])
            except (TypeError, OverflowError):
                raise BadBatchError(f"message {i}: born_timestamp {stamp!r} is not a 64-bit integer of "
                                    "milliseconds") from None
        raise


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[Sequence]:
    """key, tag, body, properties and born_timestamp of every row, column by column. Read a column
    at a time: transposing row tuples made two objects per row for Python's cyclic collector (a
    tuple, and ``zip``'s iterator over it), which a pipelining producer paid per message."""
    return [_column(rows, name, field) for name, field in zip(_NAMES, _FIELDS, strict=True)]


def _column(rows: Sequence[Mapping[str, Any]], name: str, field: itemgetter) -> list:
    try:
        return list(map(field, rows))
    except (KeyError, TypeError):  # a dict without it (usually the first: no tag), or another mapping
        return [row.get(name) for row in rows]


def encode_rows(rows: Sequence[Mapping[str, Any]]) -> bytes:
    """The Arrow IPC stream of message dicts (``body`` and optionally ``key``, ``tag``,
    ``properties``, ``born_timestamp``: now when absent)."""
    if not rows:
        raise BadBatchError("empty batch: send at least one message")
    keys, tags, bodies, properties, born = _columns(rows)
    body = _Body()
    try:  # 32-bit offsets
        body.texts(_keys(keys), "the key")
        body.texts(_tags(tags), "the tag")
        body.strings(_bodies(bodies))
        _properties(body, properties)
    except OverflowError:
        raise BadBatchError("the batch is over 2 GiB: send smaller batches") from None
    body.spans += (body.at, 0)  # the born timestamps: no validity bitmap
    body.buffer(_born(born))
    body.nodes += (len(rows), 0)
    head = HEAD.pack(FIXED_0, body.at, FIXED_1, len(rows), FIXED_2, *body.spans, FIXED_3, *body.nodes, FIXED_4)
    return b"".join([head, *body.parts, codec.END_OF_STREAM])
