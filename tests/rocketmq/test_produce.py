"""RocketMQ 5 producers writing to orderlymq: FIFO message groups keep their order and land in
the queue our routing function gives the same key, whoever wrote it; a retried send is stored once."""

from __future__ import annotations

import json

import grpc
import pytest

pytest.importorskip("rocketmq")

from rocketmq.grpc_protocol import MessagingServiceStub, service_pb2  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2 as definition  # noqa: E402

from broker.wire.routing import queue_for_key  # noqa: E402
from connector.client import Admin, Producer  # noqa: E402
from connector.client.connection import BrokerConnection  # noqa: E402
from connector.history import Delivery, Send, check  # noqa: E402
from tests.rocketmq import clients  # noqa: E402
from tests.support import pull_all  # noqa: E402

QUEUES = 4


@pytest.fixture
def topic(broker, topic_name):
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, queues=QUEUES)
    return topic_name


def stored_events(address: str, topic: str) -> dict[int, list[dict]]:
    """``{queue: [row, ...]}`` of the whole topic in queue order (our wire API)."""
    with BrokerConnection(address, retry_timeout=5) as conn:
        return {q: pull_all(conn, topic, q).to_pylist() for q in range(QUEUES)}


def test_fifo_producer_groups_read_back_in_order(broker, topic):
    groups, per_group = 6, 15
    sends = []
    with clients.producer(broker.address, topic) as producer:
        for seq in range(per_group):
            for g in range(groups):
                receipt = producer.send(clients.keyed_message(topic, f"group-{g}", seq, tag="TagA"))
                assert receipt.message_id
                sends.append(Send(f"group-{g}", seq, True))
    stored = stored_events(broker.address, topic)
    deliveries = []
    for queue_id, rows in sorted(stored.items()):
        for row in rows:
            body = json.loads(row["body"])
            assert queue_id == queue_for_key(row["key"], QUEUES), "a message group is routed like our keys"
            assert row["key"] == body["key"] and row["tag"] == "TagA"
            assert dict(row["properties"])["rocketmq.keys"] == f"{body['key']}#{body['seq']}"
            deliveries.append(Delivery(body["key"], body["seq"], "pull", queue_id, row["queue_offset"]))
    verdict = check(sends, deliveries)
    assert verdict.ok and verdict.deliveries == groups * per_group, str(verdict)


def test_same_key_same_queue_through_both_producers(broker, topic):
    keys = [f"order-{i}" for i in range(12)]
    with clients.producer(broker.address, topic) as rocketmq_producer, Producer(broker.address) as ours:
        for key in keys:
            rocketmq_producer.send(clients.keyed_message(topic, key, 0))
            ours.send(topic, json.dumps({"key": key, "seq": 1}), key=key)
            rocketmq_producer.send(clients.keyed_message(topic, key, 2))
    sends = [Send(key, seq, True) for key in keys for seq in range(3)]
    deliveries = []
    for queue_id, rows in sorted(stored_events(broker.address, topic).items()):
        for row in rows:
            body = json.loads(row["body"])
            assert queue_id == queue_for_key(body["key"], QUEUES), f"{body} landed in queue {queue_id}"
            deliveries.append(Delivery(body["key"], body["seq"], "pull", queue_id, row["queue_offset"]))
    verdict = check(sends, deliveries)
    assert verdict.ok and verdict.deliveries == len(sends), str(verdict)


def _send_request(topic: str, message_id: str, body: bytes) -> service_pb2.SendMessageRequest:
    message = definition.Message(body=body)
    message.topic.name = topic
    message.system_properties.message_id = message_id
    message.system_properties.message_type = definition.MessageType.NORMAL
    return service_pb2.SendMessageRequest(messages=[message])


def test_retried_send_is_stored_once(broker, topic):
    """The client keeps a message's id across retries: the broker stores it once."""
    message_id = "01" + "0A1B2C3D4E5F" + "1234" + "00ABCDEF" + "00000007"
    with grpc.insecure_channel(broker.address) as channel:
        stub = MessagingServiceStub(channel)
        client = (("x-mq-client-id", "host@77@0@x1"),)
        first = stub.SendMessage(_send_request(topic, message_id, b"once"), metadata=client)
        again = stub.SendMessage(_send_request(topic, message_id, b"once"), metadata=client)
    assert first.status.code == again.status.code == definition.Code.OK
    assert first.entries[0].offset == again.entries[0].offset
    stored = [row for rows in stored_events(broker.address, topic).values() for row in rows]
    assert [dict(row["properties"])["rocketmq.message_id"] for row in stored] == [message_id]


def test_a_batch_of_messages_is_routed_per_message_group(broker, topic):
    """Clients may send several messages in one SendMessage (the Java client's batches): each is
    routed by its own group, in order, and a bad one gets its own status."""
    request = service_pb2.SendMessageRequest()
    for i, group in enumerate(["a", "b", "a", "b"]):
        message = request.messages.add(body=json.dumps({"key": group, "seq": i // 2}).encode())
        message.topic.name = topic
        message.system_properties.message_group = group
        message.system_properties.message_type = definition.MessageType.FIFO
    bad = request.messages.add(body=b"")
    bad.topic.name = topic
    with grpc.insecure_channel(broker.address) as channel:
        answer = MessagingServiceStub(channel).SendMessage(request)
    assert answer.status.code == definition.Code.MULTIPLE_RESULTS and "1 of 5" in answer.status.message
    assert [e.status.code for e in answer.entries] == [definition.Code.OK] * 4 + [definition.Code.MESSAGE_BODY_EMPTY]
    deliveries = []
    for queue_id, rows in sorted(stored_events(broker.address, topic).items()):
        for row in rows:
            assert queue_id == queue_for_key(row["key"], QUEUES)
            body = json.loads(row["body"])
            deliveries.append(Delivery(body["key"], body["seq"], "pull", queue_id, row["queue_offset"]))
    verdict = check([Send(g, s, True) for g in "ab" for s in range(2)], deliveries)
    assert verdict.ok and verdict.deliveries == 4, str(verdict)
