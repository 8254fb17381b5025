"""The concurrent consumer: every message consumed, retries through the retry topic, then the DLQ."""

from __future__ import annotations

import threading
import time
from collections import Counter

from connector.client import (
    Admin,
    ConcurrentConsumer,
    ConsumeConcurrentlyStatus,
    Producer,
    PullConsumer,
    dlq_topic,
    retry_topic,
)
from tests.support import wait_until

from .helpers import CONCURRENT, FAST_BROKER, send_keyed

OK = ConsumeConcurrentlyStatus.CONSUME_SUCCESS
LATER = ConsumeConcurrentlyStatus.RECONSUME_LATER


def start(address, topic, group, listener, client_id, **options) -> ConcurrentConsumer:
    consumer = ConcurrentConsumer(
        address, group, listener, client_id=client_id, retry_delay_ms=50, **CONCURRENT, **options
    )
    consumer.subscribe(topic)
    consumer.start()
    return consumer


def test_two_instances_consume_everything_and_retry_through_the_retry_topic(broker_factory, topic_name):
    broker = broker_factory(**FAST_BROKER)
    lock = threading.Lock()
    attempts: Counter = Counter()
    done: dict[tuple[str, int], str] = {}
    retried_views = []

    def listener_for(name):
        def listener(messages, context):
            with lock:
                for m in messages:
                    ident = (m.key, int(m.body))
                    attempts[ident] += 1
                    if ident[1] % 10 == 3 and attempts[ident] == 1:
                        return LATER
                    if ident[1] % 10 == 7 and attempts[ident] == 1:
                        raise RuntimeError("a failing listener means: later")
                    if attempts[ident] > 1:
                        retried_views.append((m.topic, m.reconsume_times))
                    done[ident] = name
            return OK

        return listener

    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic(topic_name, 4)
        consumers = [start(broker.address, topic_name, "cg", listener_for(n), n) for n in ("a", "b")]
        try:
            # Settle the rebalance first: without order, a queue moved mid-stream may replay messages
            # that were in flight, which would blur the attempt counts this test checks.
            assert wait_until(lambda: [len(c.assignment()) for c in consumers] == [3, 2])
            expected = send_keyed(producer, topic_name, [f"k{i}" for i in range(10)], 20)
            total = sum(expected.values())
            assert wait_until(lambda: len(done) == total)
            assert wait_until(lambda: all(p.lag == 0 for p in admin.consumer_progress("cg", topic_name)))
        finally:
            for c in consumers:
                c.shutdown()
        assert set(done) == {(k, s) for k, n in expected.items() for s in range(n)}
        assert set(done.values()) == {"a", "b"}
        assert {ident for ident, n in attempts.items() if n == 2} == {
            (k, s) for k, n in expected.items() for s in range(n) if s % 10 in (3, 7)
        }
        assert set(retried_views) == {(topic_name, 1)}  # shown with the original topic
        assert sum(s.count for s in admin.topic_status(retry_topic("cg"))) == 40


def test_dead_letter_queue_after_max_reconsume_times(broker, topic_name):
    attempts: Counter = Counter()

    def listener(messages, context):
        for m in messages:
            attempts[m.body] += 1
            if m.body == b"poison":
                return LATER
        return OK

    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic(topic_name, 1)
        producer.send(topic_name, b"fine", key="a")
        producer.send(topic_name, b"poison", key="a", tag="T")
        consumer = start(broker.address, topic_name, "dg", listener, "c", max_reconsume_times=2)
        try:
            assert wait_until(lambda: sum(s.count for s in admin.topic_status(dlq_topic("dg"))) == 1)
        finally:
            consumer.shutdown()
        with PullConsumer(broker.address) as reader:
            (dead,) = reader.pull(dlq_topic("dg"), 0, 0, 10)
    assert attempts == {b"fine": 1, b"poison": 3}
    assert (dead.body, dead.key, dead.tag) == (b"poison", "a", "T")
    assert dead.properties["ORIGIN_TOPIC"] == topic_name
    assert dead.properties["ORIGIN_OFFSET"] == "1"
    assert dead.properties["RECONSUME_TIMES"] == "2"


def test_a_message_sent_back_by_a_clock_far_ahead_waits_no_longer_than_its_delay(broker, topic_name):
    """``RETRY_AT`` is on the clock of the consumer that sent the message back: another machine's
    clock an hour ahead of this one (or this one set back an hour) must not hold the message for
    an hour. It waits at most the delay it was sent back with, or, sent back by a version that did
    not record that delay, the consumer's ``retry_delay_ms``. One whose time is not a number is
    consumed at once."""
    consumed: list[bytes] = []

    def listener(messages, context):
        consumed.extend(m.body for m in messages)
        return OK

    an_hour_ahead = str(int(time.time() * 1000) + 3_600_000)
    with Admin(broker.address) as admin, Producer(broker.address) as producer:
        admin.create_topic(topic_name, 1)
        admin.create_topic(retry_topic("cg"), 1)
        sent_back = ((b"with its delay", {"RETRY_AT": an_hour_ahead, "RETRY_DELAY_MS": "50"}),
                     (b"without", {"RETRY_AT": an_hour_ahead}), (b"malformed", {"RETRY_AT": "soon"}))
        for body, retry in sent_back:
            producer.send(retry_topic("cg"), body, key="k", queue_id=0,
                          properties={"ORIGIN_TOPIC": topic_name, "RECONSUME_TIMES": "1", **retry})
        producer.send(topic_name, b"fresh", key="k")
        consumer = start(broker.address, topic_name, "cg", listener, "c")
        try:
            assert wait_until(lambda: len(consumed) == 4, timeout=30), consumed
        finally:
            consumer.shutdown()
    assert sorted(consumed) == [b"fresh", b"malformed", b"with its delay", b"without"]
