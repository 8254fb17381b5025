"""Consumers caught up on their queues wait on the broker (``AwaitMessages``) for the next message,
and consume what arrives complete and in order; against a broker without it they pull after pauses."""

from __future__ import annotations

import threading

from connector.client import Admin, Producer, PullConsumer
from connector.client.arrivals import ArrivalWait
from tests.support import served_calls, wait_until

from .helpers import OrderLog, send_keyed
from .test_orderly_consumer import start_consumer

# The last broker without AwaitMessages.
BROKER_BEFORE_AWAIT = "5f095a73ea82a693c28d069a0cdf37f5464db91b"


def _consume_trickle(address: str, topic: str, queues: int, rounds: int) -> None:
    """An orderly consumer caught up on ``queues`` queues gets ``rounds`` rounds of one message per
    key, each consumed before the next is sent; every key's messages must come complete and in order."""
    with Admin(address) as admin, Producer(address) as producer:
        admin.create_topic(topic, queues)
        log = OrderLog()
        consumer = start_consumer(address, topic, "g", log.listener("c1"), "c1")
        try:
            assert wait_until(lambda: len(consumer.table) == queues)
            sent: dict = {}
            for _ in range(rounds):
                sent = send_keyed(producer, topic, [f"order-{i}" for i in range(4)], 1, sent)
                assert wait_until(lambda expected=sent: log.has_all(expected))
            assert log.check(sent) == 0
        finally:
            consumer.shutdown()


def test_a_caught_up_orderly_consumer_waits_on_the_broker_for_what_arrives(fast_broker, topic_name):
    _consume_trickle(fast_broker.address, topic_name, 4, 5)
    assert served_calls(fast_broker, "AwaitMessages") >= 1


def test_poll_waits_on_the_broker_until_a_message_arrives(broker, topic_name):
    with Admin(broker.address) as admin, Producer(broker.address) as producer, \
            PullConsumer(broker.address, group="g") as consumer:
        admin.create_topic(topic_name, 4)
        consumer.assign(topic_name, start="earliest")
        polled: list = []
        poller = threading.Thread(target=lambda: polled.extend(consumer.poll(32, wait_ms=60_000)))
        poller.start()
        assert wait_until(lambda: served_calls(broker, "PullPort") + served_calls(broker, "Pull") >= 4)
        producer.send(topic_name, b"0", key="k")
        poller.join(timeout=60)
        assert [(m.key, m.body) for m in polled] == [("k", b"0")]
        assert served_calls(broker, "AwaitMessages") >= 1


def test_a_consumer_of_a_broker_without_await_messages_pulls_after_pauses(tmp_path, topic_name):
    from tests.support import older_broker

    old = older_broker(tmp_path, BROKER_BEFORE_AWAIT).start()
    try:
        _consume_trickle(old.address, topic_name, 2, 3)
    finally:
        old.stop()


def test_a_pull_loop_that_fails_unexpectedly_runs_again(fast_broker, topic_name, monkeypatch, caplog):
    """The consumer's pull thread once died of an error its loop did not expect (gRPC's "Channel
    closed" from a wait), and its queues were never pulled again: the loop now runs again."""
    raised: list[RuntimeError] = []
    wait = ArrivalWait.wait

    def failing_once(self, positions, timeout_s):
        if not raised:
            raised.append(RuntimeError("an unexpected failure of a wait"))
            raise raised[0]
        return wait(self, positions, timeout_s)

    monkeypatch.setattr(ArrivalWait, "wait", failing_once)
    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 4)
        log = OrderLog()
        consumer = start_consumer(fast_broker.address, topic_name, "g", log.listener("c1"), "c1")
        try:
            assert wait_until(lambda: raised and len(consumer.table) == 4)
            sent = send_keyed(producer, topic_name, [f"order-{i}" for i in range(8)], 25)
            assert wait_until(lambda: log.has_all(sent), timeout=30)
            assert log.check(sent) == 0
        finally:
            consumer.shutdown()
    assert "its pull loop failed; running it again" in caplog.text
