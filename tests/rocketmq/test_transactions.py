"""RocketMQ transactional messages: a half message is invisible until committed, gone when rolled
back, and an orphaned one is resolved by asking its producer's transaction checker."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("rocketmq")

from rocketmq import Producer, TransactionChecker, TransactionResolution  # noqa: E402

from connector.client import Admin  # noqa: E402
from connector.client.connection import BrokerConnection  # noqa: E402
from connector.history import Delivery, Send, check  # noqa: E402
from tests.rocketmq import clients  # noqa: E402
from tests.support import pull_all, wait_until  # noqa: E402

QUEUES = 2


class Checker(TransactionChecker):
    """Commits what the broker asks about, and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def check(self, message):
        with self.lock:
            self.asked.append(clients.event(message))
        return TransactionResolution.COMMIT


@pytest.fixture
def topic(broker, topic_name):
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, queues=QUEUES)
    return topic_name


@pytest.fixture
def checker():
    return Checker()


@pytest.fixture
def producer(broker, topic, checker):
    client = Producer(clients.configuration(broker.address), (topic,), checker)
    client.startup()
    yield client
    client.shutdown()


def stored(address: str, topic: str) -> list[Delivery]:
    with BrokerConnection(address) as conn:
        rows = [row for q in range(QUEUES) for row in pull_all(conn, topic, q).to_pylist()]
    return [Delivery(*clients.event_of(row["body"])) for row in rows]


def test_commit_and_rollback(broker, topic, producer):
    committed = producer.begin_transaction()
    producer.send(clients.keyed_message(topic, "k", 0, fifo=False), committed)
    rolled_back = producer.begin_transaction()
    producer.send(clients.keyed_message(topic, "k", 1, fifo=False), rolled_back)
    assert stored(broker.address, topic) == [], "half messages are invisible"
    committed.commit()
    rolled_back.rollback()
    verdict = check([Send("k", 0, True), Send("k", 1, False)], stored(broker.address, topic))
    assert verdict.ok and verdict.deliveries == 1, str(verdict)


def test_orphaned_transaction_is_checked(broker, topic, producer, checker):
    orphan = producer.begin_transaction()
    producer.send(clients.keyed_message(topic, "k", 0, fifo=False), orphan)  # never committed by the sender
    assert wait_until(lambda: stored(broker.address, topic), timeout=20), "the checker's COMMIT applied"
    assert checker.asked[:1] == [("k", 0)]
    verdict = check([Send("k", 0, True)], stored(broker.address, topic))
    assert verdict.ok and verdict.deliveries == 1, str(verdict)
