"""RocketMQ 5 clients against a broker group: a client pointed at the slave is routed to the
master, where its FIFO messages are stored (replicated before they are acknowledged) and consumed
in order; a state-changing RocketMQ call that reaches the slave is refused, naming the master."""

from __future__ import annotations

import grpc
import pytest

pytest.importorskip("rocketmq")

from rocketmq.grpc_protocol import MessagingServiceStub, service_pb2  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2 as definition  # noqa: E402

from connector.client import Admin  # noqa: E402
from connector.history import Send, check  # noqa: E402
from tests.rocketmq import clients  # noqa: E402
from tests.support import wait_until  # noqa: E402

TOPIC, GROUP, QUEUES = "orders", "rocketmq-readers", 3


def _route(address: str) -> service_pb2.QueryRouteResponse:
    request = service_pb2.QueryRouteRequest()
    request.topic.name = TOPIC
    host, port = address.rsplit(":", 1)
    request.endpoints.addresses.add(host=host, port=int(port))
    with grpc.insecure_channel(address) as channel:
        return MessagingServiceStub(channel).QueryRoute(request)


def test_rocketmq_clients_are_routed_to_the_master(broker_group):
    group = broker_group(2)
    master = group.wait_for_master()
    [slave] = [b for b in group.brokers if b is not master]
    group.wait_for_role(slave, "SLAVE")
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    assert wait_until(lambda: _route(slave.address).status.code == definition.Code.OK), "the slave copies topics"
    assert {q.broker.endpoints.addresses[0].port for q in _route(slave.address).message_queues} == {master.port}

    events = [(f"k{k}", seq) for seq in range(5) for k in range(4)]
    with clients.producer(slave.address, TOPIC) as producer:  # the slave's address: routes name the master
        for key, seq in events:
            producer.send(clients.keyed_message(TOPIC, key, seq))
    with clients.simple_consumer(slave.address, GROUP, TOPIC) as consumer:
        deliveries = clients.drain(consumer, len(events))
    verdict = check([Send(key, seq, True) for key, seq in events], deliveries)
    assert verdict.ok and verdict.deliveries == len(events), str(verdict)

    message = definition.Message(body=b"x")
    message.topic.name = TOPIC
    with grpc.insecure_channel(slave.address) as channel:
        answer = MessagingServiceStub(channel).SendMessage(service_pb2.SendMessageRequest(messages=[message]))
    assert answer.status.code == definition.Code.HA_NOT_AVAILABLE and master.address in answer.status.message
