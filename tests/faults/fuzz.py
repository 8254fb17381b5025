"""Bad requests for every RPC: raw garbage, well-formed messages with hostile field values,
byte-mutated valid messages, and Send batches that are not the Arrow the broker expects.

``BadRequests`` never touches what the good traffic of a scenario relies on: requests that would
change a protected topic (Send, SendStream, UpdateTopic, DeleteTopic) are aimed at a fuzz topic
instead, and no request names a protected consumer group. Everything else may name them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc
import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor

from broker.proto import orderlymq_pb2 as pb
from broker.wire import codec

__all__ = ["BROKER_FAILURES", "METHODS", "SERVICE", "BadRequests", "Outcome", "call_once"]

SERVICE = pb.DESCRIPTOR.services_by_name["OrderlyMQ"]
METHODS = list(SERVICE.methods)
_CHANGES_TOPIC = frozenset({"Send", "SendStream", "UpdateTopic", "DeleteTopic"})
# Statuses that mean the broker failed rather than refused: never acceptable for a bad request.
BROKER_FAILURES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE})


@dataclass(frozen=True)
class Outcome:
    method: str
    kind: str
    code: grpc.StatusCode
    details: str

    @property
    def broker_failed(self) -> bool:
        """A crash-like answer: an internal error, no status text, or no answer at all."""
        return self.code in BROKER_FAILURES or (self.code != grpc.StatusCode.OK and not self.details)


class BadRequests:
    """Random bad requests from one seeded generator."""

    def __init__(self, seed: int, *, topics: list[str], protected_topics: set[str], groups: list[str]) -> None:
        self.rng = random.Random(seed)
        self.topics = topics
        self.protected = protected_topics
        self.fuzz_topics = [t for t in topics if t not in protected_topics] or ["fuzz"]
        self.groups = groups

    # -- values --------------------------------------------------------------------------------

    def _string(self) -> str:
        rng = self.rng
        return rng.choice(self.topics + self.groups + [
            # within the name limits (reaching deeper checks), then beyond them, up to 100 KB
            "", "x" * rng.randint(1, 127), "x" * rng.randint(128, 100_000), "é∑\u0000\ud7ff", "TagA || ", "TagA || || *", "../../etc/passwd",
            "%DLQ%g", "%RETRY%g", " ", "a/b", "\n", "*",
        ])

    def _int(self, bits: int) -> int:
        top = 2 ** (bits - 1)
        return self.rng.choice([0, 1, -1, 3, top - 1, -top, self.rng.randint(-10, 10), self.rng.randint(0, 1 << 20)])

    def _value(self, field):
        t = field.type
        if t == FieldDescriptor.TYPE_STRING:
            # Half the names are real ones, so requests get past name checks to the deeper ones
            # (fencing, offsets, transaction states).
            known = {"topic": self.topics, "group": self.groups, "client_id": ["fuzz-client"]}.get(field.name)
            return self.rng.choice(known) if known and self.rng.random() < 0.5 else self._string()
        if t == FieldDescriptor.TYPE_BYTES:
            return self.bad_batch() if self.rng.random() < 0.5 else self.rng.randbytes(self.rng.randint(0, 400))
        if t == FieldDescriptor.TYPE_BOOL:
            return self.rng.random() < 0.5
        if field.name in ("queue_id", "offset", "epoch") and self.rng.random() < 0.5:
            return self.rng.randint(0, 2)  # in range: past the range checks
        if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32):
            return self._int(32)
        return self._int(64)

    # -- Arrow batches ---------------------------------------------------------------------------

    def good_batch(self) -> bytes:
        """A valid batch using every column: non-ASCII keys, tags, property maps, born timestamps."""
        rng = self.rng
        rows = []
        for i in range(rng.randint(1, 5)):
            row = {"key": f"fz{i}-é", "body": rng.randbytes(rng.randint(0, 50)), "born_timestamp": 1_700_000_000_000 + i}
            if rng.random() < 0.7:
                row["tag"] = rng.choice(["TagA", "TagB", "标签"])
            if rng.random() < 0.7:
                row["properties"] = {f"p{j}-ü": rng.choice(["v", "wert-ä", ""]) for j in range(rng.randint(0, 3))}
            rows.append(row)
        return codec.encode(codec.messages_to_batch(rows))

    def mutated_batch(self) -> bytes:
        """A valid batch with 1 to 4 bytes flipped, inserted or deleted anywhere in it."""
        return self._mutate(self.good_batch())

    def bad_batch(self) -> bytes:
        """Bytes in the ``batch`` field that a careless decoder could choke on."""
        rng = self.rng
        n = rng.randint(0, 4)
        choice = rng.randrange(9)
        if choice == 0:
            return codec.encode(pa.table({"x": pa.array(range(n), pa.int64())}))
        if choice == 1:
            return codec.encode(pa.table({"body": pa.array(range(n), pa.int32())}))
        if choice == 2:
            return codec.encode(pa.table({"body": pa.array([None] * n, pa.binary())}))
        if choice == 3:
            return codec.encode(pa.table({"body": pa.array([b"b"] * n), "key": pa.array(range(n), pa.int64())}))
        if choice == 4:
            return codec.encode(pa.table({"body": pa.array([b"b"] * n),
                                          "properties": pa.array([[1, 2]] * n, pa.list_(pa.int8()))}))
        if choice == 5:
            good = self.good_batch()
            return good[: rng.randint(0, len(good) - 1)]
        if choice == 6:
            return self._mutate(self.good_batch())
        if choice == 7:
            return codec.encode(pa.table({"body": pa.array([b"b"] * n),
                                          "born_timestamp": pa.array(["yesterday"] * n)}))
        return b""

    # -- requests --------------------------------------------------------------------------------

    def _mutate(self, raw: bytes) -> bytes:
        data = bytearray(raw)
        for _ in range(self.rng.randint(1, 4)):
            op = self.rng.randrange(3)
            at = self.rng.randint(0, len(data))
            if op == 0 and data and at < len(data):
                data[at] ^= 1 << self.rng.randrange(8)
            elif op == 1:
                data[at:at] = self.rng.randbytes(self.rng.randint(1, 8))
            else:
                del data[at : at + self.rng.randint(1, 8)]
        return bytes(data)

    def message(self, method):
        """A well-formed request of ``method`` with hostile values (or a valid Send)."""
        request = getattr(pb, method.input_type.name)()
        for field in method.input_type.fields:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                continue
            if field.is_repeated:
                getattr(request, field.name).extend(self._value(field) for _ in range(self.rng.randint(0, 5)))
            elif self.rng.random() < 0.8:
                setattr(request, field.name, self._value(field))
        if method.input_type.name == "SendRequest" and self.rng.random() < 0.3:
            request.batch = self.good_batch()
        if method.name in _CHANGES_TOPIC and request.topic in self.protected:
            request.topic = self.rng.choice(self.fuzz_topics)
        return request

    def payload(self, method) -> tuple[str, bytes]:
        """``(kind, serialized request)``: garbage, hostile values, or a mutated message."""
        roll = self.rng.random()
        if roll < 0.25:
            return "garbage", self.rng.randbytes(self.rng.randint(0, 300))
        raw = self.message(method).SerializeToString()
        if roll < 0.6:
            return "hostile", raw
        return "mutated", self._mutate(raw)


def call_once(channel: grpc.Channel, method, requests: list[bytes], timeout: float = 10.0) -> list[Outcome]:
    """Send raw requests to ``method`` (several on one stream for SendStream); the outcomes."""
    path = f"/{SERVICE.full_name}/{method.name}"
    ok = grpc.StatusCode.OK
    try:
        if method.client_streaming:
            stream = channel.stream_stream(path, request_serializer=None, response_deserializer=pb.SendResponse.FromString)
            outcomes = []
            for response in stream(iter(requests), timeout=timeout):
                code = ok if not response.error_code else _code(response.error_code)
                outcomes.append(Outcome(method.name, "stream", code, response.error_message))
            return outcomes or [Outcome(method.name, "stream", ok, "")]
        call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
        call(requests[0], timeout=timeout)
        return [Outcome(method.name, "unary", ok, "")]
    except grpc.RpcError as err:
        return [Outcome(method.name, "unary", err.code(), err.details() or "")]


def _code(value: int) -> grpc.StatusCode:
    return next((c for c in grpc.StatusCode if c.value[0] == value), grpc.StatusCode.UNKNOWN)
