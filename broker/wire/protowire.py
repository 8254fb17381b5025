"""The protobuf wire format, for messages serialized or parsed by hand.

A message carrying megabytes in one bytes field costs a copy to build (setting the field) and
another to serialize. Writing the small fields with protobuf and that one field by hand, straight
from the parts that concatenate to it, costs a single copy: protobuf parsers accept fields in any
order and merge concatenated messages (a repeated field appends, a scalar's last value wins).
Parsing one by hand likewise leaves that field where it arrived, instead of copying it into the
message and again out of it.
"""

from __future__ import annotations

__all__ = ["FIXED32", "FIXED64", "LENGTH_DELIMITED", "VARINT", "field_prefix", "read_varint"]

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5  # the wire types of protobuf 3's fields


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_prefix(field_number: int, size: int) -> bytes:
    """The tag and length that come before a length-delimited field of ``size`` bytes."""
    return _varint(field_number << 3 | LENGTH_DELIMITED) + _varint(size)


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The unsigned 64-bit varint at ``position`` and the position after it; ``ValueError``
    when it is truncated or longer than 10 bytes."""
    value = shift = 0
    for index in range(position, min(position + 10, len(data))):
        byte = data[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & ((1 << 64) - 1), index + 1
        shift += 7
    raise ValueError(f"the varint at byte {position} is truncated or longer than 10 bytes")
