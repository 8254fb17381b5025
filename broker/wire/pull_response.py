"""Serialize a ``PullResponse`` with one copy of its batches.

A pull moves megabytes of Arrow batches. Building a ``pb.PullResponse`` copies every batch into
the message and ``SerializeToString`` copies it again; writing the ``batches`` fields by hand after
the serialized scalar fields, straight from the parts of the encoded batch, copies it once.
Protobuf parsers merge concatenated messages (repeated fields append), so the result parses as
the same ``PullResponse``.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from broker.proto import orderlymq_pb2 as pb

__all__ = ["encode_pull_response"]

_BATCHES_TAG = bytes([pb.PullResponse.BATCHES_FIELD_NUMBER << 3 | 2])  # length-delimited


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_pull_response(batches: Sequence[Sequence[bytes | pa.Buffer]], *, next_offset: int, count: int,
                         min_offset: int, max_offset: int) -> bytes:
    """The wire bytes of ``PullResponse(batches=..., next_offset=..., ...)``, each batch given as
    the parts that concatenate to it (``codec.encode_parts``)."""
    parts = [pb.PullResponse(next_offset=next_offset, count=count, min_offset=min_offset,
                             max_offset=max_offset).SerializeToString()]
    for batch in batches:
        parts += (_BATCHES_TAG, _varint(sum(len(p) for p in batch)), *batch)
    return b"".join(parts)
