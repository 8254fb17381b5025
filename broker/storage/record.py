"""On-disk record framing: a fixed header, then one Arrow IPC stream (the stored batch).

The body holds the batch's message columns as sent (``codec.message_batch``); its messages'
offsets and store timestamp are in the header, and reads add them as columns. Records written
before that carry the two columns in the body too; reads accept both.

Header (little endian, 48 bytes)::

    magic u32 | body_len u32 | crc u32 | base_offset i64 | count i32 |
    store_ts i64 | producer_hash u64 | sequence i64

``crc`` is CRC32C over the header bytes after it plus the body, so a torn or bit-flipped record
is detected; ``producer_hash``/``sequence`` let recovery rebuild the idempotent-producer state.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c
import xxhash

__all__ = ["HEADER", "MAGIC", "Body", "RecordHeader", "body_parts", "frame", "header_for", "new_header",
           "parse_header", "producer_hash", "verify"]

MAGIC = 0x314D514F  # "OQM1"
HEADER = struct.Struct("<IIIqiqQq")
_HEAD, _TAIL = struct.Struct("<III"), struct.Struct("<qiqQq")  # the header's two parts: the crc covers the second
_CRC_FROM = 12  # the crc covers everything after magic, body_len and crc

Body = bytes | memoryview | Sequence[bytes | memoryview]  # a record's body, or the parts that concatenate to it


class RecordHeader(NamedTuple):  # a tuple: built on every append, where a frozen dataclass costs 1 µs more
    body_len: int
    crc: int
    base_offset: int
    count: int
    store_ts: int
    producer_hash: int
    sequence: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.count

    @property
    def size(self) -> int:
        return HEADER.size + self.body_len


def producer_hash(producer_id: str) -> int:
    """A stable 64-bit id for a producer id (0 means "no producer")."""
    return xxhash.xxh64_intdigest(producer_id.encode("utf-8")) or 1 if producer_id else 0


def header_for(body: Body, base_offset: int, count: int, store_ts: int, phash: int = 0,
               sequence: int = -1) -> bytes:
    """The header of a record holding ``body`` (bytes, or the parts that concatenate to them):
    written before it, the body needs no copy."""
    return new_header(body, base_offset, count, store_ts, phash, sequence)[0]


def new_header(body: Body, base_offset: int, count: int, store_ts: int, phash: int = 0,
               sequence: int = -1) -> tuple[bytes, RecordHeader]:
    """``header_for``'s bytes and the header they hold."""
    tail = _TAIL.pack(base_offset, count, store_ts, phash, sequence)
    crc, length = crc32c.crc32c(tail), 0
    for part in body_parts(body):
        crc, length = crc32c.crc32c(part, crc), length + len(part)
    return (_HEAD.pack(MAGIC, length, crc) + tail,
            RecordHeader(length, crc, base_offset, count, store_ts, phash, sequence))


def body_parts(body: Body) -> Sequence[bytes | memoryview]:
    """``body`` as a sequence of parts."""
    return (body,) if isinstance(body, bytes | bytearray | memoryview) else body


def frame(body: bytes, base_offset: int, count: int, store_ts: int, phash: int = 0, sequence: int = -1) -> bytes:
    """Header + body, ready to append."""
    return header_for(body, base_offset, count, store_ts, phash, sequence) + body


def parse_header(raw: bytes) -> RecordHeader | None:
    """The header in ``raw`` (48 bytes), or None if it is not a plausible one."""
    if len(raw) < HEADER.size:
        return None
    magic, body_len, crc, base, count, store_ts, phash, seq = HEADER.unpack_from(raw)
    if magic != MAGIC or count <= 0 or base < 0:
        return None
    return RecordHeader(body_len, crc, base, count, store_ts, phash, seq)


def verify(header_raw: bytes, body: bytes, header: RecordHeader) -> bool:
    """Whether ``body`` and the header fields match the header's CRC."""
    return crc32c.crc32c(body, crc32c.crc32c(header_raw[_CRC_FROM:HEADER.size])) == header.crc
