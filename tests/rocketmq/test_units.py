"""The pure parts of the RocketMQ service: delivery states, receipts, message mapping."""

from __future__ import annotations

import gzip

import pytest

pytest.importorskip("rocketmq")

from broker.rocketmq import mapping  # noqa: E402
from broker.rocketmq.deliveries import QueueDeliveries  # noqa: E402
from broker.rocketmq.protocol import Code, definition  # noqa: E402
from broker.rocketmq.receipts import Receipt  # noqa: E402
from broker.rocketmq.statuses import RocketMQStatusError, status_for  # noqa: E402
from broker.wire.errors import BadTagExpressionError, TopicNotFoundError  # noqa: E402
from broker.wire.routing import queue_for_key  # noqa: E402


def test_acks_move_the_committed_offset_only_when_contiguous():
    state = QueueDeliveries(committed=10, epoch=3)
    attempts = [state.deliver(o, "c1", visible_at_ms=100, auto_renew=False) for o in (10, 11, 12)]
    assert attempts == [1, 1, 1] and state.next_offset == 13 and state.blocked(now_ms=50)
    assert state.ack(11, 1) and state.committed == 10
    assert state.ack(10, 1) and state.committed == 12
    assert not state.ack(10, 1), "acked twice"
    assert not state.ack(12, 2), "not the current attempt"


def test_expired_messages_come_again_first():
    state = QueueDeliveries(committed=0, epoch=1)
    for offset in (0, 1):
        state.deliver(offset, "c1", visible_at_ms=100, auto_renew=False)
    assert state.due(now_ms=99) == [] and state.due(now_ms=100) == [0, 1] and not state.blocked(now_ms=100)
    assert state.deliver(0, "c2", visible_at_ms=200, auto_renew=False) == 2
    assert not state.ack(0, 1) and state.ack(0, 2)


def test_auto_renewed_messages_follow_their_clients():
    state = QueueDeliveries(committed=0, epoch=1)
    state.deliver(0, "push", visible_at_ms=100, auto_renew=True)
    state.deliver(1, "simple", visible_at_ms=100, auto_renew=False)
    state.renew("push", 500)
    assert state.due(now_ms=200) == [1]
    assert state.release("push", now_ms=200) == 1 and state.due(now_ms=200) == [0, 1]


def test_receipts_round_trip_and_forgeries_are_refused():
    receipt = Receipt("orders", 3, 42, 2, 7, "client-1")
    assert Receipt.decode(receipt.encode()) == receipt
    for forged in ("", "abc", "omq1.!!!", "omq1." + "e30="):
        with pytest.raises(RocketMQStatusError) as info:
            Receipt.decode(forged)
        assert info.value.code == Code.INVALID_RECEIPT_HANDLE


def test_statuses_of_our_errors():
    assert status_for(TopicNotFoundError("x")).code == Code.TOPIC_NOT_FOUND
    assert status_for(BadTagExpressionError("x")).code == Code.ILLEGAL_FILTER_EXPRESSION
    assert status_for(RuntimeError("boom")).code == Code.INTERNAL_ERROR


def _message(**system) -> definition.Message:
    message = definition.Message(body=system.pop("body", b"payload"), user_properties={"region": "eu"})
    for name, value in system.items():
        if name == "keys":
            message.system_properties.keys.extend(value)
        else:
            setattr(message.system_properties, name, value)
    return message


def test_message_group_is_our_key_and_routes_like_it():
    message = _message(message_group="order-7", tag="TagA", keys=["a", "b"], message_id="m-1",
                       message_type=definition.MessageType.FIFO)
    row = mapping.to_row(message)
    assert row["key"] == "order-7" and row["tag"] == "TagA" and row["body"] == b"payload"
    assert row["properties"] == {"region": "eu", "rocketmq.message_id": "m-1", "rocketmq.keys": "a b"}
    assert mapping.target_queue(message, 8, fallback=0) == queue_for_key("order-7", 8)
    back = mapping.to_rocketmq({**row, "queue_offset": 5, "born_timestamp": 1000, "store_timestamp": 2000},
                               "orders", 3, receipt_handle="r", delivery_attempt=1, invisible_ms=30_000)
    props = back.system_properties
    assert (props.message_group, props.tag, list(props.keys), props.message_id) == ("order-7", "TagA", ["a", "b"], "m-1")
    assert dict(back.user_properties) == {"region": "eu"} and props.queue_offset == 5


def test_gzip_bodies_are_stored_plain():
    message = _message(body=gzip.compress(b"big body"), body_encoding=definition.Encoding.GZIP)
    assert mapping.to_row(message)["body"] == b"big body"


def test_producer_identity_from_v1_message_ids():
    message_id = "01" + "0A1B2C3D4E5F" + "1234" + "00ABCDEF" + "00000007"
    producer, sequence = mapping.producer_identity(message_id, "host@77@0@x1")
    assert producer == "rocketmq:host@77@0@x1:0A1B2C3D4E5F1234" and sequence == (0x00ABCDEF << 32) | 7
    assert mapping.producer_identity("not-a-v1-id", "host@77@0@x1") == ("", -1)
    assert mapping.producer_identity(message_id, "") == ("", -1), "no client id: no check"


def test_retention_jump_forgets_what_was_removed():
    state = QueueDeliveries(committed=0, epoch=1)
    for offset in (0, 1, 2):
        state.deliver(offset, "c1", visible_at_ms=100, auto_renew=False)
    assert state.ack(2, 1)
    state.jump(2)
    assert state.committed == 3 and state.in_flight == {} and state.next_offset == 3
