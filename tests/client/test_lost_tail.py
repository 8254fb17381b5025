"""A concurrent consumer, and a pull consumer's ``poll``, reading from a broker that came back
with a shorter log (a power cut with flush = "async" cut its tail) and other messages stored at
those offsets since: they read those too, rather than go on at the offset they had reached (or,
where the log now ends below it, at its end) and skip them.

The concurrent consumer reaches a real broker through a TCP proxy the test cuts while the broker
restarts and producers write again, so the new messages are there before it pulls again, every
time. An orderly consumer's re-lock does the same check (``test_relock``).
"""

from __future__ import annotations

import threading

import pytest

from connector.client import Admin, ConcurrentConsumer, Producer, PullConsumer
from connector.client.connection import BrokerConnection, pb
from connector.client.listener import ConsumeConcurrentlyStatus
from tests.client.helpers import CONCURRENT, FAST_BROKER
from tests.faults.brokers import broker_process
from tests.faults.disk import records, segments, truncate
from tests.faults.tcp_proxy import TcpProxy
from tests.support import wait_until

GROUP = "billing"


def _power_cut(broker, tmp_path, topic: str) -> None:
    """Kill the broker and cut its one queue's log inside its eighth record (one message each):
    offsets 7.. are gone, as a power cut's torn tail leaves them; start it again."""
    broker.kill9()
    [segment] = segments(tmp_path / "data" / "topics" / topic / "0")
    truncate(records(segment)[7], keep=1)
    broker.start()


@pytest.mark.parametrize("before_heal", [10, 3, 1], ids=["past-its-offset", "up-to-it", "short-of-it"])
def test_reads_what_was_stored_again_below_where_it_was(tmp_path, topic_name, before_heal):
    """b:0.. are stored at offsets 7..; the consumer, at offset 10, pulls again once ``before_heal``
    of them are: past its offset, up to it (the log ends where it was: only the broker's new start
    tells), or short of it (the log then ends below where it was)."""
    broker = broker_process(tmp_path / "data", flush="sync", send_port=-1, **FAST_BROKER).start()
    proxy = TcpProxy(broker.address)
    conn = BrokerConnection(broker.address, retry_timeout=30)
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, 1)
    producer = Producer(broker.address, retry_timeout=30)
    lock, seen = threading.Lock(), []

    def listener(messages, context):
        with lock:
            seen.extend((m.key, int(m.body)) for m in messages)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def send(key, seqs):
        for seq in seqs:  # one record each
            producer.send(topic_name, str(seq).encode(), key=key, queue_id=0)

    def committed():
        return conn.call("GetOffset", pb.GetOffsetRequest(group=GROUP, topic=topic_name, queue_id=0)).offset

    consumer = ConcurrentConsumer(proxy.address, GROUP, listener, client_id="c", **(CONCURRENT | {"retry_timeout": 30.0}))
    consumer.subscribe(topic_name)
    consumer.start()
    try:
        send("a", range(10))
        assert wait_until(lambda: len(seen) == 10 and committed() == 10, 20), (seen, committed())
        proxy.cut()
        _power_cut(broker, tmp_path, topic_name)
        send("b", range(before_heal))
        proxy.heal()
        assert wait_until(lambda: ("b", before_heal - 1) in seen, 20), seen
        send("b", range(before_heal, 10))
        assert wait_until(lambda: [s for k, s in seen if k == "b"] == list(range(10)), 20), seen
        assert wait_until(lambda: committed() == 17, 20), committed()
    finally:
        proxy.heal()
        consumer.shutdown()
        producer.close()
        conn.close()
        proxy.close()
        broker.kill9()
    # Going on at offset 10 skipped b:0..2, and going on at the log's end (8) skipped b:0;
    # nothing read before the cut is read again (the broker moved the group's offset back to
    # the cut on start).
    # (A concurrent consumer keeps no order: each message once is what it promises here.)
    assert sorted(seen) == [(key, seq) for key in "ab" for seq in range(10)], seen


@pytest.mark.parametrize("refill", [1, 5], ids=["short-of-its-position", "past-it"])
def test_poll_reads_what_was_stored_again_below_its_position(tmp_path, topic_name, refill):
    broker = broker_process(tmp_path / "data", flush="sync", send_port=-1, **FAST_BROKER).start()
    try:
        with Admin(broker.address) as admin:
            admin.create_topic(topic_name, 1)
        with Producer(broker.address, retry_timeout=30) as producer, \
                PullConsumer(broker.address, retry_timeout=30) as consumer:

            def send(key, seqs):
                for seq in seqs:  # one record each
                    producer.send(topic_name, str(seq).encode(), key=key, queue_id=0)

            def poll_all():
                polled = []
                while batch := consumer.poll(4):
                    polled += [(m.key, int(m.body)) for m in batch]
                return polled

            send("a", range(10))
            consumer.assign(topic_name, start="earliest")
            assert poll_all() == [("a", seq) for seq in range(10)]
            _power_cut(broker, tmp_path, topic_name)
            send("b", range(refill))  # stored at offsets 7..
            # Going on at its position 10 skipped b:0..2 (refill 5); the log ending at 8, below
            # it, the poll failed (refill 1).
            assert poll_all() == [("b", seq) for seq in range(refill)]
            assert consumer.position(topic_name, 0) == 7 + refill
    finally:
        broker.kill9()
