"""Serialize a ``PullResponse`` with one copy of its batches.

A pull moves megabytes of Arrow batches: its ``batches`` fields are written by hand after the
serialized scalar fields, straight from the parts of each encoded batch (``broker.wire.protowire``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from broker.proto import orderlymq_pb2 as pb
from broker.wire.protowire import field_prefix

__all__ = ["encode_pull_response"]


def encode_pull_response(batches: Sequence[Sequence[bytes | pa.Buffer]], *, next_offset: int, count: int,
                         min_offset: int, max_offset: int) -> bytes:
    """The wire bytes of ``PullResponse(batches=..., next_offset=..., ...)``, each batch given as
    the parts that concatenate to it (``codec.encode_parts``)."""
    parts = [pb.PullResponse(next_offset=next_offset, count=count, min_offset=min_offset,
                             max_offset=max_offset).SerializeToString()]
    for batch in batches:
        parts += (field_prefix(pb.PullResponse.BATCHES_FIELD_NUMBER, sum(len(p) for p in batch)), *batch)
    return b"".join(parts)
