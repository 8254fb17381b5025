"""The protobuf wire format of a length-delimited field, for messages serialized by hand.

A message carrying megabytes in one bytes field costs a copy to build (setting the field) and
another to serialize. Writing the small fields with protobuf and that one field by hand, straight
from the parts that concatenate to it, costs a single copy: protobuf parsers accept fields in any
order and merge concatenated messages (a repeated field appends, a scalar's last value wins).
"""

from __future__ import annotations

__all__ = ["field_prefix"]

_LENGTH_DELIMITED = 2  # the wire type of bytes, strings and embedded messages


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_prefix(field_number: int, size: int) -> bytes:
    """The tag and length that come before a length-delimited field of ``size`` bytes."""
    return _varint(field_number << 3 | _LENGTH_DELIMITED) + _varint(size)
