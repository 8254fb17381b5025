"""Bad RocketMQ requests get a RocketMQ status code with a message a person can act on, and the
broker keeps serving both protocols."""

from __future__ import annotations

import grpc
import pytest

pytest.importorskip("rocketmq")

from rocketmq.grpc_protocol import MessagingServiceStub, service_pb2  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2 as definition  # noqa: E402

from connector.client import Admin  # noqa: E402
from tests.rocketmq import clients  # noqa: E402

Code = definition.Code
CLIENT = (("x-mq-client-id", "test-client"),)


@pytest.fixture
def stub(broker):
    with grpc.insecure_channel(broker.address) as channel:
        yield MessagingServiceStub(channel), channel


@pytest.fixture
def topic(broker, topic_name):
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, queues=2)
    return topic_name


def _message(topic: str, **system) -> definition.Message:
    message = definition.Message(body=system.pop("body", b"x"))
    message.topic.name = topic
    for name, value in system.items():
        setattr(message.system_properties, name, value)
    return message


def _send(stub, message) -> definition.Status:
    return stub.SendMessage(service_pb2.SendMessageRequest(messages=[message])).status


def test_unknown_topic(stub, broker):
    messaging, _ = stub
    request = service_pb2.QueryRouteRequest()
    request.topic.name = "no-such-topic"
    request.endpoints.addresses.add(host="127.0.0.1", port=broker.port)
    answer = messaging.QueryRoute(request)
    assert answer.status.code == Code.TOPIC_NOT_FOUND
    assert "'no-such-topic' does not exist" in answer.status.message and "topic create" in answer.status.message
    with clients.producer(broker.address) as producer, pytest.raises(Exception, match="no-such-topic"):
        producer.send(clients.keyed_message("no-such-topic", "k", 0))


@pytest.mark.parametrize(("system", "code", "words"), [
    ({"message_type": definition.MessageType.TRANSACTION}, Code.ILLEGAL_MESSAGE_ID, "message id"),
    ({"message_type": definition.MessageType.TRANSACTION, "message_group": "g", "message_id": "m"},
     Code.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "message group"),
    ({"message_type": definition.MessageType.DELAY}, Code.UNSUPPORTED, "DELAY"),
    ({"message_type": definition.MessageType.FIFO}, Code.ILLEGAL_MESSAGE_GROUP, "message group"),
    ({"body": b""}, Code.MESSAGE_BODY_EMPTY, "empty"),
    ({"body_encoding": definition.Encoding.GZIP}, Code.MESSAGE_CORRUPTED, "GZIP"),
])
def test_refused_sends(stub, topic, system, code, words):
    status = _send(stub[0], _message(topic, **system))
    assert status.code == code and words in status.message, status


def test_consumer_mistakes(stub, topic):
    messaging, _ = stub
    receive = service_pb2.ReceiveMessageRequest(batch_size=1)
    receive.message_queue.topic.name = topic
    receive.long_polling_timeout.seconds = 1
    [answer] = list(messaging.ReceiveMessage(receive, metadata=CLIENT))
    assert answer.status.code == Code.ILLEGAL_CONSUMER_GROUP and "group" in answer.status.message
    receive.group.name = "g"
    [answer] = list(messaging.ReceiveMessage(receive))
    assert answer.status.code == Code.CLIENT_ID_REQUIRED
    receive.filter_expression.type = definition.FilterType.SQL
    receive.filter_expression.expression = "a > 1"
    [answer] = list(messaging.ReceiveMessage(receive, metadata=CLIENT))
    assert answer.status.code == Code.ILLEGAL_FILTER_EXPRESSION and "SQL92" in answer.status.message
    ack = service_pb2.AckMessageRequest(entries=[service_pb2.AckMessageEntry(receipt_handle="forged")])
    ack.group.name, ack.topic.name = "g", topic
    answer = messaging.AckMessage(ack)
    assert answer.status.code == Code.INVALID_RECEIPT_HANDLE and "not issued by this broker" in answer.status.message


def test_unsupported_and_malformed(stub, broker, topic):
    messaging, channel = stub
    assert messaging.EndTransaction(service_pb2.EndTransactionRequest()).status.code == Code.INVALID_TRANSACTION_ID
    unknown = messaging.EndTransaction(service_pb2.EndTransactionRequest(
        transaction_id="rocketmq:nope", resolution=definition.TransactionResolution.COMMIT))
    assert unknown.status.code == Code.INVALID_TRANSACTION_ID and "rocketmq:nope" in unknown.status.message
    [pulled] = list(messaging.PullMessage(service_pb2.PullMessageRequest()))
    assert pulled.status.code == Code.UNSUPPORTED and "SimpleConsumer" in pulled.status.message
    raw = channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage")
    answer = service_pb2.SendMessageResponse.FromString(raw(b"\xff\xff\xff"))
    assert answer.status.code == Code.BAD_REQUEST and "malformed request" in answer.status.message
    # Still serving both protocols.
    with clients.producer(broker.address, topic) as producer:
        assert producer.send(clients.keyed_message(topic, "k", 0)).message_id
    with Admin(broker.address) as admin:
        assert admin.health()["status"] == "SERVING"


def test_every_rpc_answers_with_a_status(stub):
    """No RPC of the service is left to gRPC's UNIMPLEMENTED: an empty request gets a RocketMQ status."""
    messaging, channel = stub
    for method in service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods:
        path = f"/apache.rocketmq.v2.MessagingService/{method.name}"
        response_type = getattr(service_pb2, method.output_type.name)
        if method.client_streaming:
            call = channel.stream_stream(path, request_serializer=service_pb2.TelemetryCommand.SerializeToString,
                                         response_deserializer=response_type.FromString)
            answers = list(call(iter([service_pb2.TelemetryCommand(settings=definition.Settings())]), metadata=CLIENT,
                                timeout=10))
        elif method.server_streaming:
            call = channel.unary_stream(path, response_deserializer=response_type.FromString)
            answers = list(call(b"", metadata=CLIENT, timeout=10))
        else:
            call = channel.unary_unary(path, response_deserializer=response_type.FromString)
            answers = [call(b"", metadata=CLIENT, timeout=10)]
        assert answers and answers[-1].status.code != Code.CODE_UNSPECIFIED, method.name
