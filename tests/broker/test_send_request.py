"""The hand-serialized SendRequest parses exactly like one built by protobuf, the broker's hand
parser reads big ones exactly as protobuf does, and brokers store them."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from broker.proto import orderlymq_pb2 as pb
from broker.wire import codec
from broker.wire.errors import BadBatchError
from broker.wire.protowire import field_prefix
from broker.wire.send_request import (
    HAND_PARSED_BYTES,
    EncodedSend,
    SendRequestView,
    encode_send_request,
    parse_send_request,
    serialize_send,
)
from connector.client.connection import BrokerConnection

_FIELDS = [field.name for field in pb.SendRequest.DESCRIPTOR.fields]


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_384, 2_097_152])
@pytest.mark.parametrize("fields", [{}, {"txn_id": "t-1"}, {"producer_id": "p", "sequence": 1 << 40}])
def test_parses_as_the_protobuf_message(size, fields):
    batch = bytes(i % 251 for i in range(size))
    expected = pb.SendRequest(topic="orders", queue_id=7, batch=batch, **fields)
    for given in (batch, [batch[:1], memoryview(batch[1:])]):
        encoded = encode_send_request("orders", 7, given, **fields)
        assert pb.SendRequest.FromString(encoded.wire) == expected
        assert (encoded.topic, encoded.queue_id) == ("orders", 7)  # what routing reads


def test_either_form_serializes_to_the_same_bytes_the_broker_reads():
    request = pb.SendRequest(topic="t", queue_id=1, batch=b"abc", producer_id="p", sequence=2)
    encoded = encode_send_request("t", 1, b"abc", producer_id="p", sequence=2)
    assert isinstance(encoded, EncodedSend)
    assert pb.SendRequest.FromString(serialize_send(encoded)) == pb.SendRequest.FromString(serialize_send(request))


def test_a_broker_stores_encoded_sends_in_order_and_answers_idempotently(broker):
    rows = [{"key": f"k{i}", "body": f"m{i}".encode()} for i in range(1000)]
    conn = BrokerConnection(broker.address)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic="encoded", queue_count=1))
    for sequence, start in enumerate(range(0, 1000, 250)):
        parts = codec.encode_parts(codec.messages_to_batch(rows[start:start + 250]))
        answer = conn.call("Send", encode_send_request("encoded", 0, parts, producer_id="p", sequence=sequence))
        assert (answer.base_offset, answer.count, answer.duplicate) == (start, 250, False)
    again = conn.call("Send", encode_send_request("encoded", 0, parts, producer_id="p", sequence=3))
    assert (again.base_offset, again.duplicate) == (750, True)
    pulled = conn.call("Pull", pb.PullRequest(topic="encoded", queue_id=0, offset=0, max_messages=2000))
    table = codec.decode_many(pulled.batches)
    assert table.column("body").to_pylist() == [row["body"] for row in rows]
    conn.close()


def _same_request(parsed, expected: pb.SendRequest) -> None:
    assert {name: getattr(parsed, name) for name in _FIELDS} == {name: getattr(expected, name) for name in _FIELDS}


@pytest.mark.parametrize("fields", [
    {},
    {"txn_id": "t-1"},
    {"producer_id": "pröducer", "sequence": 1 << 40},
    {"queue_id": -3, "sequence": -1},  # negative varints: ten bytes, sign-extended
    {"queue_id": 2**31 - 1, "sequence": 2**63 - 1},
])
def test_big_requests_are_parsed_by_hand_as_protobuf_parses_them(fields):
    batch = bytes(i % 251 for i in range(HAND_PARSED_BYTES))
    fields = {"queue_id": 7, **fields}
    wire = pb.SendRequest(topic="orders", batch=batch, **fields).SerializeToString()
    parsed = parse_send_request(wire)
    assert isinstance(parsed, SendRequestView)
    assert isinstance(parsed.batch, memoryview)  # a view of the received bytes, not a copy
    _same_request(parsed, pb.SendRequest.FromString(wire))


def test_a_field_given_twice_keeps_its_last_value_as_in_protobuf():
    batch = b"b" * HAND_PARSED_BYTES
    first = pb.SendRequest(topic="a", queue_id=1, batch=batch, producer_id="p", sequence=5).SerializeToString()
    wire = first + pb.SendRequest(topic="b", sequence=6).SerializeToString() + field_prefix(3, 4) + b"last"
    parsed = parse_send_request(wire)
    assert isinstance(parsed, SendRequestView)
    _same_request(parsed, pb.SendRequest.FromString(wire))
    assert (parsed.topic, parsed.queue_id, parsed.sequence, bytes(parsed.batch)) == ("b", 1, 6, b"last")


def test_unusual_big_requests_get_protobufs_verdict():
    batch = b"b" * HAND_PARSED_BYTES
    wire = pb.SendRequest(topic="t", queue_id=1, batch=batch).SerializeToString()
    unknown_field = wire + b"\x38\x01"  # field 7, a varint: skipped by protobuf
    parsed = parse_send_request(unknown_field)
    assert type(parsed) is pb.SendRequest
    _same_request(parsed, pb.SendRequest.FromString(wire))
    not_utf8 = b"\x0a\x02\xff\xfe" + wire[len(b"\x0a\x01t"):]
    truncated = wire[:-1]
    for bad in (not_utf8, truncated):
        with pytest.raises(DecodeError):
            parse_send_request(bad)


def _big_rows(start: int, count: int) -> list[dict]:
    return [{"key": f"k{i % 7}", "body": f"m{i}".encode().ljust(1000, b".")} for i in range(start, start + count)]


def test_a_broker_stores_big_sends_and_staged_big_sends_in_order(broker):
    conn = BrokerConnection(broker.address)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic="big", queue_count=1))
    rows = _big_rows(0, 400)
    for sequence, start in enumerate(range(0, 400, 100)):
        batch = codec.encode(codec.messages_to_batch(rows[start:start + 100]))
        assert len(batch) > HAND_PARSED_BYTES
        answer = conn.call("Send", encode_send_request("big", 0, batch, producer_id="p", sequence=sequence))
        assert (answer.base_offset, answer.count, answer.duplicate) == (start, 100, False)
    again = conn.call("Send", encode_send_request("big", 0, batch, producer_id="p", sequence=3))
    assert (again.base_offset, again.duplicate) == (300, True)
    staged = _big_rows(400, 200)
    conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="big-txn"))
    for start in (0, 100):
        batch = codec.encode(codec.messages_to_batch(staged[start:start + 100]))
        assert conn.call("Send", encode_send_request("big", 0, batch, txn_id="big-txn")).base_offset == -1
    assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="big-txn")).count == 200
    with pytest.raises(BadBatchError, match="malformed"):  # a big batch that is not Arrow: refused, not stored
        conn.call("Send", encode_send_request("big", 0, b"x" * HAND_PARSED_BYTES))
    pulled = conn.call("Pull", pb.PullRequest(topic="big", queue_id=0, offset=0, max_messages=1000,
                                              max_bytes=16 << 20))
    table = codec.decode_many(pulled.batches)
    assert table.column("body").to_pylist() == [row["body"] for row in rows + staged]
    assert table.column("queue_offset").to_pylist() == list(range(600))
    conn.close()
