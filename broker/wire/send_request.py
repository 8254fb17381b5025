"""A ``SendRequest`` with one copy of its batch on the way out, and none on the way in.

Setting the ``batch`` of a ``pb.SendRequest`` copies megabytes into the message and
``SerializeToString`` copies them again (1.9 ms per 1.3 MB batch, against 0.3 ms for this; each
fresh megabyte buffer is also page-faulted in). ``encode_send_request`` serializes the small
fields with protobuf and appends the batch field by hand (``broker.wire.protowire``); the stubs
of ``connector.client.connection`` send its ``wire`` bytes as they are (``serialize_send``).

The broker parses a big request by hand (``parse_send_request``): reading ``batch`` out of a
parsed ``pb.SendRequest`` copies it into fresh memory (0.75 ms per 1.3 MB), where
``SendRequestView.batch`` is a view of the bytes gRPC received.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor

from broker.proto import orderlymq_pb2 as pb
from broker.wire.protowire import LENGTH_DELIMITED, VARINT, field_prefix, read_varint

__all__ = ["EncodedSend", "SendRequestView", "encode_send_request", "parse_send_request", "send_request_parts",
           "serialize_send"]

# Below this a request is parsed by protobuf's C parser, faster than any Python loop on few bytes.
HAND_PARSED_BYTES = 64 * 1024
_FIELDS = {field.number: (field.name, field.type) for field in pb.SendRequest.DESCRIPTOR.fields}
_STRING, _BYTES, _INT32 = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES, FieldDescriptor.TYPE_INT32
_WIRE_TYPES = {_STRING: LENGTH_DELIMITED, _BYTES: LENGTH_DELIMITED, _INT32: VARINT, FieldDescriptor.TYPE_INT64: VARINT}


class EncodedSend:
    """A serialized ``SendRequest`` and the fields that decide where it goes."""

    __slots__ = ("topic", "queue_id", "wire")

    def __init__(self, topic: str, queue_id: int, wire: bytes) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.wire = wire


def encode_send_request(topic: str, queue_id: int, batch: bytes | Sequence[bytes | pa.Buffer], *, txn_id: str = "",
                        producer_id: str = "", sequence: int = 0) -> EncodedSend:
    """``pb.SendRequest(topic=..., batch=..., ...)`` serialized; ``batch`` is the Arrow IPC stream,
    or the parts that concatenate to it (``codec.encode_parts``)."""
    parts = send_request_parts(topic, queue_id, batch, txn_id=txn_id, producer_id=producer_id, sequence=sequence)
    return EncodedSend(topic, queue_id, b"".join(parts))


def send_request_parts(topic: str, queue_id: int, batch: bytes | Sequence[bytes | pa.Buffer], *, txn_id: str = "",
                       producer_id: str = "", sequence: int = 0) -> list[bytes | pa.Buffer]:
    """``encode_send_request``'s bytes as parts (the small fields, then the batch's own parts), for a
    socket that writes them one after the other: the batch is never copied into one request."""
    parts = [batch] if isinstance(batch, bytes) else batch
    head = pb.SendRequest(topic=topic, queue_id=queue_id, txn_id=txn_id, producer_id=producer_id,
                          sequence=sequence).SerializeToString()
    return [head + field_prefix(pb.SendRequest.BATCH_FIELD_NUMBER, sum(len(p) for p in parts)), *parts]


def serialize_send(request: pb.SendRequest | EncodedSend) -> bytes:
    """The wire bytes of either form of a send request: the serializer of the Send stubs."""
    return request.wire if type(request) is EncodedSend else request.SerializeToString()


class SendRequestView:
    """A ``pb.SendRequest`` parsed by hand: the same fields, ``batch`` a view of the received bytes."""

    __slots__ = ("topic", "queue_id", "batch", "txn_id", "producer_id", "sequence")

    def __init__(self) -> None:
        self.topic = self.txn_id = self.producer_id = ""
        self.queue_id = self.sequence = 0
        self.batch: bytes | memoryview = b""


def parse_send_request(raw: bytes | memoryview) -> pb.SendRequest | SendRequestView:
    """The request in ``raw``: a big one parsed by hand when it has the usual shape (only known
    fields, each of its own wire type); anything else by protobuf, whose verdict then stands
    (``DecodeError`` for bytes that are not a ``SendRequest``)."""
    if len(raw) >= HAND_PARSED_BYTES:
        try:
            return _parse(raw)
        except (ValueError, UnicodeDecodeError):
            pass
    return pb.SendRequest.FromString(raw)


def _parse(raw: bytes | memoryview) -> SendRequestView:
    view, request, position = memoryview(raw), SendRequestView(), 0
    while position < len(raw):
        key, position = read_varint(raw, position)
        name, kind = _FIELDS.get(key >> 3, (None, None))
        if name is None or key & 7 != _WIRE_TYPES[kind]:
            raise ValueError(f"field {key >> 3} with wire type {key & 7}: not one of a usual SendRequest")
        value, position = read_varint(raw, position)
        if kind in (_STRING, _BYTES):
            if position + value > len(raw):
                raise ValueError(f"field {name} runs past the end")
            field = view[position:position + value]
            position += value
            setattr(request, name, str(field, "utf-8") if kind == _STRING else field)
        else:  # int32 keeps the low 32 bits and int64 all 64, both two's complement
            bits = 32 if kind == _INT32 else 64
            value &= (1 << bits) - 1
            setattr(request, name, value - (1 << bits) if value >> (bits - 1) else value)
    return request
