"""An orderly consumer whose queue lock came back at a new epoch (its lease freed, the broker
restarted): it goes on where it was when nobody consumed the queue meanwhile and the queue still
holds what it pulled, and starts over from the group's offset otherwise.

The consumer reaches a real broker through a TCP proxy that the test cuts while it changes what
the consumer will find (another client's lock and commit, a log cut back and written again), so
each case happens before the consumer looks, every time. The broker serves no lean port here: all
of the consumer's calls go through the proxy. Listeners commit by hand (``auto_commit=False``) at
chosen messages, so the consumer always holds messages it consumed but did not commit: a restart
hands those out again, going on does not.
"""

from __future__ import annotations

import threading

import pytest

from connector.client import Admin, OrderlyConsumer, Producer
from connector.client.connection import BrokerConnection, pb
from connector.client.listener import ConsumeOrderlyStatus
from connector.client.locking import try_lock
from tests.client.helpers import FAST, FAST_BROKER
from tests.faults.brokers import broker_process
from tests.faults.disk import records, segments, truncate
from tests.faults.tcp_proxy import TcpProxy
from tests.support import wait_until

GROUP = "billing"


class Deliveries:
    """What the listener was handed, as (key, seq) in order; it commits after the seqs in ``commit_at``."""

    def __init__(self, commit_at: set[int]) -> None:
        self.commit_at = commit_at
        self._lock = threading.Lock()
        self.seen: list[tuple[str, int]] = []

    def listener(self, messages, context) -> ConsumeOrderlyStatus:
        with self._lock:
            self.seen += [(m.key, int(m.body)) for m in messages]
        commit = any(int(m.body) in self.commit_at for m in messages)
        return ConsumeOrderlyStatus.COMMIT if commit else ConsumeOrderlyStatus.SUCCESS

    def of(self, key: str) -> list[int]:
        with self._lock:
            return [seq for k, seq in self.seen if k == key]


@pytest.fixture
def behind_proxy(tmp_path, topic_name):
    """A broker (no lean port), a proxy to it, a direct connection, a producer, and a started
    consumer of a one-queue topic behind the proxy."""
    broker = broker_process(tmp_path / "data", flush="sync", send_port=-1, **FAST_BROKER).start()
    proxy = TcpProxy(broker.address)
    deliveries = Deliveries(commit_at={4})
    conn = BrokerConnection(broker.address, retry_timeout=30)
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, 1)
    producer = Producer(broker.address, retry_timeout=30)
    consumer = OrderlyConsumer(proxy.address, GROUP, deliveries.listener, client_id="c", auto_commit=False,
                               **(FAST | dict(retry_timeout=30.0)))
    consumer.subscribe(topic_name)
    consumer.start()
    try:
        yield broker, proxy, conn, producer, consumer, deliveries
    finally:
        proxy.heal()
        consumer.shutdown()
        producer.close()
        conn.close()
        proxy.close()
        broker.kill9()


def send(producer: Producer, topic: str, key: str, seqs: range) -> None:
    for seq in seqs:
        producer.send(topic, str(seq).encode(), key=key, queue_id=0)


def committed(conn: BrokerConnection, topic: str) -> int:
    return conn.call("GetOffset", pb.GetOffsetRequest(group=GROUP, topic=topic, queue_id=0)).offset


def consume_ten(behind_proxy, topic: str) -> None:
    """The consumer was handed a:0..9 and committed after a:4 (offset 5)."""
    broker, proxy, conn, producer, consumer, deliveries = behind_proxy
    send(producer, topic, "a", range(10))
    assert wait_until(lambda: deliveries.of("a") == list(range(10)) and committed(conn, topic) == 5, 20), \
        (deliveries.of("a"), committed(conn, topic))


def free_and_lock(conn: BrokerConnection, topic: str) -> int:
    """Free the consumer's lock (as a lapsed lease does) and lock the queue as another client."""
    conn.call("UnlockBatch", pb.UnlockBatchRequest(group=GROUP, client_id="c", topic=topic, queue_ids=[0]))
    return try_lock(conn, GROUP, "rival", topic, [0])[0]


def unlock_rival(conn: BrokerConnection, topic: str) -> None:
    conn.call("UnlockBatch", pb.UnlockBatchRequest(group=GROUP, client_id="rival", topic=topic, queue_ids=[0]))


def test_goes_on_where_it_was_when_nobody_consumed_meanwhile(behind_proxy, topic_name):
    broker, proxy, conn, producer, consumer, deliveries = behind_proxy
    consume_ten(behind_proxy, topic_name)
    proxy.cut()
    free_and_lock(conn, topic_name)  # another client locks the queue but consumes nothing
    unlock_rival(conn, topic_name)
    send(producer, topic_name, "a", range(10, 20))
    proxy.heal()
    assert wait_until(lambda: len(deliveries.of("a")) >= 20, 20), deliveries.of("a")
    # a:5..9 (consumed, not committed) are not handed out again: the consumer went on at a new epoch.
    assert deliveries.of("a") == list(range(20))
    send(producer, topic_name, "z", [4])  # the listener commits after it: at the new epoch
    assert wait_until(lambda: committed(conn, topic_name) == 21, 20), committed(conn, topic_name)


def test_starts_over_from_the_offset_another_client_committed(behind_proxy, topic_name):
    broker, proxy, conn, producer, consumer, deliveries = behind_proxy
    consume_ten(behind_proxy, topic_name)
    proxy.cut()
    epoch = free_and_lock(conn, topic_name)
    send(producer, topic_name, "a", range(10, 20))
    conn.call("CommitOffset", pb.CommitOffsetRequest(group=GROUP, topic=topic_name, queue_id=0, offset=15,
                                                     client_id="rival", epoch=epoch))
    unlock_rival(conn, topic_name)
    proxy.heal()
    assert wait_until(lambda: deliveries.of("a")[-1:] == [19], 20), deliveries.of("a")
    # The rival consumed a:10..14 and committed 15: the consumer starts there, and the group's
    # offset never moves back below it.
    assert deliveries.of("a") == list(range(10)) + list(range(15, 20))
    assert committed(conn, topic_name) == 15


def test_starts_over_when_the_log_was_cut_back_and_written_again(behind_proxy, topic_name, tmp_path):
    broker, proxy, conn, producer, consumer, deliveries = behind_proxy
    consume_ten(behind_proxy, topic_name)
    proxy.cut()
    broker.kill9()
    [segment] = segments(tmp_path / "data" / "topics" / topic_name / "0")
    truncate(records(segment)[7], keep=1)  # a power cut's torn tail: offsets 7.. are gone
    broker.start()
    send(producer, topic_name, "b", range(10))  # stored at offsets 7..16
    proxy.heal()
    assert wait_until(lambda: deliveries.of("b") == list(range(10)), 20), deliveries.seen
    # Offsets 7..9 hold other messages now: going on at offset 10 would have skipped b:0..2. The
    # consumer starts over from the committed offset 5: a:5 and a:6 again, then all of b in order.
    assert deliveries.of("a") == list(range(10)) + [5, 6]
