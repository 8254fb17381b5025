"""The hand-serialized SendRequest parses exactly like one built by protobuf, and brokers store it."""

from __future__ import annotations

import pytest

from broker.proto import orderlymq_pb2 as pb
from broker.wire import codec
from broker.wire.send_request import EncodedSend, encode_send_request, serialize_send
from connector.client.connection import BrokerConnection


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
