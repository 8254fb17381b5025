"""A concurrent consumer pulling from a broker that came back with a shorter log (a power cut
with flush = "async" cut its tail) and other messages stored at those offsets since: it reads
those too, rather than go on at the offset it had reached and skip them.

The consumer reaches a real broker through a TCP proxy the test cuts while the broker restarts
and producers write again, so the new messages are there before the consumer pulls again, every
time. An orderly consumer's re-lock does the same check (``test_relock``).
"""

from __future__ import annotations

import threading

from connector.client import Admin, ConcurrentConsumer, Producer
from connector.client.connection import BrokerConnection, pb
from connector.client.listener import ConsumeConcurrentlyStatus
from tests.client.helpers import CONCURRENT, FAST_BROKER
from tests.faults.brokers import broker_process
from tests.faults.disk import records, segments, truncate
from tests.faults.tcp_proxy import TcpProxy
from tests.support import wait_until

GROUP = "billing"


def test_reads_what_was_stored_again_below_where_it_was(tmp_path, topic_name):
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
        broker.kill9()
        [segment] = segments(tmp_path / "data" / "topics" / topic_name / "0")
        truncate(records(segment)[7], keep=1)  # a power cut's torn tail: offsets 7.. are gone
        broker.start()
        send("b", range(10))  # stored at offsets 7..16
        proxy.heal()
        assert wait_until(lambda: [s for k, s in seen if k == "b"] == list(range(10)), 20), seen
        assert wait_until(lambda: committed() == 17, 20), committed()
    finally:
        proxy.heal()
        consumer.shutdown()
        producer.close()
        conn.close()
        proxy.close()
        broker.kill9()
    # Going on at offset 10 skipped b:0..2; nothing read before the cut is read again (the
    # broker moved the group's offset back to the cut on start).
    # (A concurrent consumer keeps no order: each message once is what it promises here.)
    assert sorted(seen) == [(key, seq) for key in "ab" for seq in range(10)], seen
