"""RocketMQ 5 consumers reading orderlymq: our producer → the official SimpleConsumer and FIFO
PushConsumer, per key in order, nothing lost, nothing duplicated once acked; a message of a queue
is delivered only after the previous one was acked; acks move the group's committed offsets."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import grpc
import pytest

pytest.importorskip("rocketmq")

from rocketmq import ConsumeResult, FilterExpression, MessageListener, PushConsumer  # noqa: E402
from rocketmq.grpc_protocol import MessagingServiceStub, service_pb2  # noqa: E402
from rocketmq.grpc_protocol import definition_pb2 as definition  # noqa: E402
from rocketmq.v5.exception import BadRequestException  # noqa: E402

from connector.client import Admin, Producer  # noqa: E402
from connector.client.connection import BrokerConnection, pb  # noqa: E402
from connector.history import Delivery, Send, check  # noqa: E402
from tests.rocketmq import clients  # noqa: E402
from tests.support import pull_all, wait_until  # noqa: E402

QUEUES = 4


@pytest.fixture
def topic(broker, topic_name):
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, queues=QUEUES)
    return topic_name


def produce(address: str, topic: str, keys: int, per_key: int, tag=None) -> list[Send]:
    """Our producer: ``keys`` keys interleaved, ``per_key`` messages each, numbered per key."""
    sends = []
    with Producer(address) as producer:
        for seq in range(per_key):
            for k in range(keys):
                body = json.dumps({"key": f"k{k}", "seq": seq})
                producer.send(topic, body, key=f"k{k}", tag=tag(k, seq) if tag else None)
                sends.append(Send(f"k{k}", seq, True))
    return sends


def test_simple_consumer_reads_our_producer_in_order(broker, topic):
    sends = produce(broker.address, topic, keys=8, per_key=12)
    with clients.simple_consumer(broker.address, "simple-group", topic) as consumer:
        deliveries = clients.drain(consumer, len(sends))
    verdict = check(sends, deliveries)
    assert verdict.ok and verdict.deliveries == len(sends), str(verdict)
    with Admin(broker.address) as admin, BrokerConnection(broker.address) as conn:  # acks → group offsets
        committed = {q: admin.committed_offset("simple-group", topic, q) for q in range(QUEUES)}
        ends = {q: pull_all(conn, topic, q).num_rows for q in range(QUEUES)}
    assert committed == ends


def test_next_message_only_after_ack(broker, topic):
    """FIFO: while a message is in flight its queue delivers nothing new; when its invisibility
    runs out it comes again (attempt 2), and its old receipt no longer acks it."""
    sends = produce(broker.address, topic, keys=1, per_key=3)
    deliveries = []
    with clients.simple_consumer(broker.address, "fifo-group", topic) as consumer:
        first = wait_until(lambda: consumer.receive(1, 30))
        deliveries += [Delivery(*clients.event(m)) for m in first]
        assert consumer.receive(5, 30) == [], "the queue waits for the ack of its message in flight"
        consumer.change_invisible_duration(first[0], 1)
        again = wait_until(lambda: consumer.receive(1, 30), timeout=10)
        deliveries += [Delivery(*clients.event(m)) for m in again]
        assert [clients.event(m) for m in again] == [("k0", 0)] and again[0].delivery_attempt == 2
        with pytest.raises(BadRequestException):
            consumer.ack(first[0])  # the receipt of the first attempt
        consumer.ack(again[0])
        deliveries += clients.drain(consumer, 2)
    verdict = check(sends, deliveries)
    assert (verdict.lost, verdict.out_of_order, verdict.unexpected, verdict.duplicated) == (0, 0, 0, 1), str(verdict)


def test_fifo_push_consumer_per_key_in_order(broker, topic):
    sends = produce(broker.address, topic, keys=10, per_key=20)
    deliveries, lock = [], threading.Lock()

    class Listener(MessageListener):
        def consume(self, message):
            with lock:
                deliveries.append(Delivery(*clients.event(message), "push", -1, -1))
            return ConsumeResult.SUCCESS

    consumer = PushConsumer(clients.configuration(broker.address), "push-group", Listener(),
                            {topic: FilterExpression("*")})
    consumer.startup()
    try:
        assert consumer.fifo, "the broker tells consumers every group is FIFO"
        assert wait_until(lambda: len({(d.key, d.seq) for d in deliveries}) >= len(sends), timeout=60)
    finally:
        consumer.shutdown()
    with lock:
        verdict = check(sends, list(deliveries))
    assert verdict.ok and verdict.deliveries == len(sends), str(verdict)


def test_tag_filter_skips_and_commits_the_rest(broker, topic):
    sends = produce(broker.address, topic, keys=4, per_key=6, tag=lambda k, seq: "TagA" if seq % 2 else "TagB")
    wanted = [s for s in sends if s.seq % 2]
    with clients.simple_consumer(broker.address, "tag-group", topic, tags="TagA") as consumer:
        deliveries = clients.drain(consumer, len(wanted))
    verdict = check(wanted, deliveries)
    assert verdict.ok and verdict.deliveries == len(wanted), str(verdict)


def test_dead_letter_queue(broker, topic):
    produce(broker.address, topic, keys=1, per_key=2)
    with clients.simple_consumer(broker.address, "dlq-group", topic) as consumer:
        [message] = wait_until(lambda: consumer.receive(1, 30))
        request = service_pb2.ForwardMessageToDeadLetterQueueRequest(receipt_handle=message.receipt_handle,
                                                                     message_id=message.message_id)
        request.group.name, request.topic.name = "dlq-group", topic
        with grpc.insecure_channel(broker.address) as channel:
            answer = MessagingServiceStub(channel).ForwardMessageToDeadLetterQueue(request)
        assert answer.status.code == definition.Code.OK, answer.status.message
        rest = clients.drain(consumer, 1)
    assert [(d.key, d.seq) for d in rest] == [("k0", 1)], "dead-lettered counts as consumed"
    with BrokerConnection(broker.address) as conn:
        [row] = pull_all(conn, "%DLQ%dlq-group", 0).to_pylist()
    assert json.loads(row["body"]) == {"key": "k0", "seq": 0} and row["key"] == "k0"
    assert dict(row["properties"])["rocketmq.dlq_origin"].startswith(f"{topic}/")


def test_our_consumers_of_the_group_wait_for_the_queue_lock(broker, topic):
    """RocketMQ consumers read under the group's queue locks: the locks name their holder."""
    produce(broker.address, topic, keys=4, per_key=1)
    with clients.simple_consumer(broker.address, "shared-group", topic) as consumer:
        clients.drain(consumer, 4)
        with Admin(broker.address) as admin:
            holders = {lock.client_id for lock in admin.lock_holders("shared-group", topic)}
    assert holders == {"rocketmq-clients"}


def test_two_simple_consumers_of_a_group_keep_each_key_in_order(broker, topic):
    sends = produce(broker.address, topic, keys=6, per_key=15)
    deliveries, lock = [], threading.Lock()
    seen: set[tuple[str, int]] = set()

    def consume(consumer, name: str) -> None:
        deadline = time.monotonic() + 30
        while len(seen) < len(sends) and time.monotonic() < deadline:
            for message in consumer.receive(4, 20):
                with lock:  # recorded before the ack: the next of its queue cannot come earlier
                    deliveries.append(Delivery(*clients.event(message), name))
                    seen.add(clients.event(message))
                consumer.ack(message)

    # Started here, received from on threads: the client opens its telemetry stream on the thread that
    # starts it, where gRPC may look for an asyncio event loop. A plain thread has none: once in CI
    # both consumers then failed to fetch the topic's route and received nothing.
    with contextlib.ExitStack() as started:
        consumers = [started.enter_context(clients.simple_consumer(broker.address, "pair-group", topic))
                     for _ in range(2)]
        workers = [threading.Thread(target=consume, args=(consumer, f"consumer-{i}"))
                   for i, consumer in enumerate(consumers)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    verdict = check(sends, deliveries)
    assert verdict.ok and verdict.deliveries == len(sends), str(verdict)


def test_a_consumer_that_leaves_gives_its_messages_back_in_order(broker, topic):
    """Unacked messages of a consumer that shuts down go to the next consumer first, in order."""
    sends = produce(broker.address, topic, keys=1, per_key=6)
    with clients.simple_consumer(broker.address, "relay-group", topic) as first:
        taken = wait_until(lambda: first.receive(3, 60))
        first.ack(taken[0])  # the other two are left unacked
    deliveries = [Delivery(*clients.event(m), "first") for m in taken]
    with clients.simple_consumer(broker.address, "relay-group", topic) as second:
        deliveries += clients.drain(second, 5)
    verdict = check(sends, deliveries)
    assert (verdict.lost, verdict.out_of_order, verdict.unexpected) == (0, 0, 0), str(verdict)
    assert verdict.duplicated == len(taken) - 1 and verdict.distinct_delivered == len(sends), str(verdict)


def test_broker_restart_redelivers_only_what_was_not_acked(broker_factory, tmp_path, topic_name):
    data = tmp_path / "restarted"
    first = broker_factory(data)
    with Admin(first.address) as admin:
        admin.create_topic(topic_name, queues=QUEUES)
    sends = produce(first.address, topic_name, keys=4, per_key=5)
    with clients.simple_consumer(first.address, "restart-group", topic_name) as consumer:
        deliveries = clients.drain(consumer, 12, batch=4)  # acked
        acked = len(deliveries)
        unacked = wait_until(lambda: consumer.receive(8, 60))
        deliveries += [Delivery(*clients.event(m), "before restart") for m in unacked]
        first.stop()
    second = broker_factory(data)
    with clients.simple_consumer(second.address, "restart-group", topic_name) as consumer:
        deliveries += clients.drain(consumer, len(sends) - acked)
    verdict = check(sends, deliveries)
    assert (verdict.lost, verdict.out_of_order, verdict.unexpected) == (0, 0, 0), str(verdict)
    assert verdict.duplicated <= len(unacked) and verdict.distinct_delivered == len(sends), str(verdict)


def _one_queue_topic(address: str, topic: str, messages: int) -> list[Send]:
    with Admin(address) as admin:
        admin.create_topic(topic, queues=1)
    return produce(address, topic, keys=1, per_key=messages)


def test_a_lapsed_lock_nobody_took_is_taken_back(broker_factory, topic_name):
    running = broker_factory(lock_lease_ms=300)
    sends = _one_queue_topic(running.address, topic_name, 2)
    with clients.simple_consumer(running.address, "lapse-group", topic_name) as consumer:
        [message] = wait_until(lambda: consumer.receive(1, 30))
        time.sleep(0.6)  # the lease lapses (heartbeats come every 10 s)
        consumer.ack(message)
        deliveries = [Delivery(*clients.event(message))] + clients.drain(consumer, 1)
    verdict = check(sends, deliveries)
    assert verdict.ok and verdict.deliveries == 2, str(verdict)


def test_ack_after_our_consumer_took_the_queue_is_refused(broker_factory, topic_name):
    """The queue lock fences RocketMQ acks too: once an orderlymq consumer of the group holds the
    queue, a RocketMQ consumer's ack no longer moves the group's offset."""
    running = broker_factory(lock_lease_ms=300)
    _one_queue_topic(running.address, topic_name, 2)
    with clients.simple_consumer(running.address, "fenced-group", topic_name) as consumer:
        [message] = wait_until(lambda: consumer.receive(1, 30))
        time.sleep(0.6)
        with BrokerConnection(running.address) as conn:
            locked = conn.call("LockBatch", pb.LockBatchRequest(group="fenced-group", client_id="ours",
                                                                topic=topic_name, queue_ids=[0]))
            assert [lock.queue_id for lock in locked.locked] == [0]
            with pytest.raises(BadRequestException, match="taken by another consumer"):
                consumer.ack(message)
    with Admin(running.address) as admin:
        assert admin.committed_offset("fenced-group", topic_name, 0) in (-1, 0)
