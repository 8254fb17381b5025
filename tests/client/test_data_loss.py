"""Break 10: messages removed by retention before an orderly consumer read them are never skipped
silently. Without ``on_data_loss`` the queue stops and ``data_losses`` names the range; with it, the
callback gets the exact range and consumption continues, in order, from the first message kept."""

from __future__ import annotations

import threading

import pytest

from connector.client import Admin, ConsumeOrderlyStatus, OrderlyConsumer, Producer, PullConsumer
from connector.client.connection import BrokerConnection, pb
from connector.errors import MessagesLostError
from connector.history import History
from tests.support import wait_until

from .helpers import FAST, FAST_BROKER

# Every send is one record of ~100 bytes: 512-byte segments roll every few messages, and retention
# keeps about 2 KB per queue, checked every 50 ms.
TINY_RETENTION = dict(segment_bytes=512, retention_bytes=2048, retention_check_interval_ms=50)


@pytest.fixture
def small_broker(broker_factory):
    return broker_factory(**FAST_BROKER, **TINY_RETENTION)


def first_kept(address: str, topic: str) -> int:
    with BrokerConnection(address) as conn:
        return conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic, queue_id=0)).min_offset


def send_until_retention_removes(address: str, topic: str, history: History, start: int, past: int) -> int:
    """Send ``k:<seq>`` messages from ``start`` until retention removed offsets below ``past``."""
    seq = start
    with Producer(address) as producer:
        while first_kept(address, topic) <= past:
            producer.send(topic, f"k:{seq}", key="k")
            history.sent("k", seq, acked=True)
            seq += 1
            if seq % 20 == 0:
                wait_until(lambda: first_kept(address, topic) > past, timeout=1.0)
    return seq


def recorder(history: History, gate: threading.Event | None = None):
    def listen(messages, context):
        for m in messages:
            history.delivered(m.key, int(m.body.decode().rpartition(":")[2]), queue_id=m.queue_id,
                              offset=m.queue_offset)
        if gate is not None:
            gate.wait(60)
        return ConsumeOrderlyStatus.SUCCESS

    return listen


def start(address, topic, listener, **options) -> OrderlyConsumer:
    consumer = OrderlyConsumer(address, "g", listener, client_id="c1", **{**FAST, **options})
    consumer.subscribe(topic)
    consumer.start()
    return consumer


def test_a_committed_offset_removed_by_retention_stops_the_queue_and_names_the_range(small_broker, topic_name):
    with Admin(small_broker.address) as admin:
        admin.create_topic(topic_name, 1)
    with PullConsumer(small_broker.address, group="g") as pc:
        pc.commit(topic_name, 0, 0)  # the group has consumed nothing yet
    history = History()
    sent = send_until_retention_removes(small_broker.address, topic_name, history, 0, 0)
    kept = first_kept(small_broker.address, topic_name)
    consumer = start(small_broker.address, topic_name, recorder(history))
    try:
        losses = wait_until(lambda: consumer.data_losses, 30)
    finally:
        consumer.shutdown()
    (lost,) = losses
    assert isinstance(lost, MessagesLostError)
    assert (lost.topic, lost.queue_id, lost.first_lost) == (topic_name, 0, 0)
    assert lost.first_kept >= kept and lost.lost == lost.first_kept
    assert "on_data_loss" in str(lost)
    assert history.deliveries == [], "nothing after the gap may be consumed as if nothing was lost"
    with PullConsumer(small_broker.address, group="g") as pc:
        assert pc.committed(topic_name, 0) == 0  # the gap stays visible to the next instance too
    assert sent > lost.first_kept


def test_on_data_loss_gets_the_range_of_a_gap_met_while_consuming_and_consumption_goes_on(small_broker, topic_name):
    with Admin(small_broker.address) as admin:
        admin.create_topic(topic_name, 1)
    history, gaps, gate = History(), [], threading.Event()
    consumer = start(small_broker.address, topic_name, recorder(history, gate), on_data_loss=gaps.append,
                     pull_batch_size=1, pull_threshold_per_queue=1)
    try:
        with Producer(small_broker.address) as producer:
            producer.send(topic_name, "k:0", key="k")
            history.sent("k", 0, acked=True)
        assert wait_until(lambda: len(history.deliveries) == 1, 30)  # the listener now holds message 0
        sent = send_until_retention_removes(small_broker.address, topic_name, history, 1, 2)
        gate.set()
        assert wait_until(lambda: gaps, 30)
        kept = gaps[0].first_kept
        assert wait_until(lambda: {("k", s) for s in range(kept, sent)} <= {(d.key, d.seq) for d in
                                                                         history.deliveries}, 30)
    finally:
        gate.set()
        consumer.shutdown()
    (gap,) = gaps
    delivered = [d.seq for d in history.deliveries]
    assert (gap.topic, gap.queue_id, gap.first_lost) == (topic_name, 0, 1)
    assert delivered[:2] == [0, gap.first_kept]  # right after the gap, the first message kept
    assert consumer.data_losses == []
    # Judge only what retention kept, plus what was consumed before the gap.
    verdict = History()
    for s in list(range(0, gap.first_lost)) + list(range(gap.first_kept, sent)):
        verdict.sent("k", s, acked=True)
    verdict.extend_deliveries(history.deliveries)
    result = verdict.check()
    assert result.ok and result.duplicated == 0, result
