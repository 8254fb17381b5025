"""Serialize a ``PullResponse`` with one copy of its batches, and parse one with none.

A pull moves megabytes of Arrow batches: its ``batches`` fields are written by hand after the
serialized scalar fields, straight from the parts of each encoded batch (``broker.wire.protowire``).
On the way in, ``PullResponse.FromString`` would copy every batch into the message and reading the
field would copy it again; ``decode_pull_response`` walks the few fields by hand and leaves each
batch a slice of the received bytes.

On the lean port (``broker.pull_port``) a failed pull is answered with a ``PullResponse`` whose
``error_*`` fields name the failure (``encode_pull_error``); ``PullReply.raise_error`` raises it as
the gRPC call's status would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from broker.proto import orderlymq_pb2 as pb
from broker.wire.errors import DamagedRecordError, InternalBrokerError, from_answer, to_status
from broker.wire.protowire import FIXED32, FIXED64, LENGTH_DELIMITED, VARINT, field_prefix, read_varint

__all__ = ["PullReply", "decode_pull_response", "encode_pull_error", "encode_pull_response"]

_FIELDS = pb.PullResponse.DESCRIPTOR.fields_by_name
_BATCHES = pb.PullResponse.BATCHES_FIELD_NUMBER
_SCALARS = {_FIELDS[name].number: name
            for name in ("next_offset", "min_offset", "max_offset", "count", "error_code", "error_next_offset",
                         "boot_id")}
_STRINGS = {_FIELDS[name].number: name for name in ("error_kind", "error_message")}
_WIRE_TYPES = {_BATCHES: LENGTH_DELIMITED, **dict.fromkeys(_SCALARS, VARINT), **dict.fromkeys(_STRINGS, LENGTH_DELIMITED)}


def encode_pull_response(batches: Sequence[Sequence[bytes | pa.Buffer]], *, next_offset: int, count: int,
                         min_offset: int, max_offset: int, boot_id: int = 0) -> list[bytes | pa.Buffer]:
    """The parts whose concatenation is the wire bytes of ``PullResponse(batches=..., next_offset=...,
    ...)``, each batch given as the parts that concatenate to it (``codec.encode_parts``): a socket
    writes them as they are, gRPC's answer joins them (one copy)."""
    parts: list[bytes | pa.Buffer] = [pb.PullResponse(next_offset=next_offset, count=count, min_offset=min_offset,
                                                      max_offset=max_offset, boot_id=boot_id).SerializeToString()]
    for batch in batches:
        parts += (field_prefix(_BATCHES, sum(len(p) for p in batch)), *batch)
    return parts


def encode_pull_error(exc: BaseException) -> bytes:
    """The wire bytes of the ``PullResponse`` that answers a pull failed with ``exc`` on the lean port."""
    code, message, kind = to_status(exc)
    next_offset = exc.next_offset if isinstance(exc, DamagedRecordError) else -1
    return pb.PullResponse(error_code=code.value[0], error_kind=kind, error_message=message,
                           error_next_offset=next_offset).SerializeToString()


@dataclass
class PullReply:
    """A ``PullResponse`` whose ``batches`` are slices of the received bytes (same field names)."""

    batches: list[pa.Buffer] = field(default_factory=list)
    next_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    count: int = 0
    error_code: int = 0
    error_kind: str = ""
    error_message: str = ""
    error_next_offset: int = -1
    boot_id: int = 0

    def raise_error(self) -> None:
        """Raise the failure a lean port's answer carries, as the gRPC call's status would."""
        if self.error_code:
            raise from_answer(self.error_code, self.error_message, self.error_kind, self.error_next_offset)


def decode_pull_response(raw: bytes) -> PullReply:
    """Parse the wire bytes of a ``PullResponse`` as protobuf does (unknown fields skipped, the
    last value of a scalar wins); ``InternalBrokerError`` naming the fault when they are not one."""
    try:
        return _parse(raw)
    except ValueError as exc:
        raise InternalBrokerError(f"malformed Pull reply from the broker ({len(raw)} bytes): {exc}; is the "
                                  "address an orderlymq broker of a compatible version?") from None


def _parse(raw: bytes) -> PullReply:
    data, reply, position = pa.py_buffer(raw), PullReply(), 0
    while position < len(raw):
        start = position
        key, position = read_varint(raw, position)
        number, wire_type = key >> 3, key & 7
        if number == 0 or wire_type != _WIRE_TYPES.get(number, wire_type):
            raise ValueError(f"field {number} at byte {start} has wire type {wire_type}")
        if wire_type == VARINT:
            value, position = read_varint(raw, position)
            if number in _SCALARS:  # int64 and int32 fields: negative values are sign-extended to 64 bits
                setattr(reply, _SCALARS[number], value - (1 << 64) if value >> 63 else value)
        elif wire_type == LENGTH_DELIMITED:
            size, position = read_varint(raw, position)
            if position + size > len(raw):
                raise ValueError(f"field {number} of {size} bytes runs past the end at byte {position}")
            if number == _BATCHES:
                reply.batches.append(data.slice(position, size))
            elif number in _STRINGS:
                setattr(reply, _STRINGS[number], bytes(raw[position:position + size]).decode())
            position += size
        elif wire_type in (FIXED64, FIXED32):
            position += 8 if wire_type == FIXED64 else 4
            if position > len(raw):
                raise ValueError(f"field {number} at byte {start} runs past the end")
        else:
            raise ValueError(f"field {number} at byte {start} has wire type {wire_type}")
    return reply
