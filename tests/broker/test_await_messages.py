"""``AwaitMessages`` against a real broker: the queues ready at once, the first to become ready
while it waits, every queue for positions read from another start of the broker, nothing within
the wait, and clear errors on bad requests."""

from __future__ import annotations

import threading

import pytest

from broker.service import MAX_AWAITED_QUEUES
from broker.wire.errors import InvalidRequestError, QueueOutOfRangeError, TopicNotFoundError
from connector.client.connection import BrokerConnection, pb
from tests.support import arrow_batch, wait_until


@pytest.fixture
def conn(broker):
    with BrokerConnection(broker.address) as c:
        yield c


def _create(conn, topic: str, queues: int) -> None:
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=queues))


def _send(conn, topic: str, queue_id: int, n: int = 1) -> None:
    from broker.wire import codec

    batch = codec.encode(arrow_batch([{"key": "k", "body": b"x"}] * n))
    conn.call("Send", pb.SendRequest(topic=topic, queue_id=queue_id, batch=batch))


def _await(conn, positions: list[tuple[str, int, int]], wait_ms: int, boot_id: int = 0) -> list[tuple[str, int, int]]:
    request = pb.AwaitMessagesRequest(positions=[pb.QueuePosition(topic=t, queue_id=q, offset=o)
                                                 for t, q, o in positions], wait_ms=wait_ms, boot_id=boot_id)
    return [(p.topic, p.queue_id, p.offset) for p in conn.call("AwaitMessages", request).ready]


def test_queues_holding_messages_past_their_position_are_ready_at_once(conn, topic_name):
    _create(conn, topic_name, 3)
    _send(conn, topic_name, 1, 2)
    _send(conn, topic_name, 2)
    positions = [(topic_name, 0, 0), (topic_name, 1, 0), (topic_name, 2, 1)]  # queue 2: its end
    assert _await(conn, positions, 60_000) == [(topic_name, 1, 2)]
    # A position past the end is no position of the queue: a pull answers it at once (with the error).
    assert _await(conn, [(topic_name, 0, 5)], 60_000) == [(topic_name, 0, 0)]


def test_the_first_queue_written_while_waiting_is_answered(conn, broker, topic_name):
    other = topic_name + "-b"
    _create(conn, topic_name, 2)
    _create(conn, other, 2)
    _send(conn, other, 1)
    positions = [(topic_name, 0, 0), (topic_name, 1, 0), (other, 0, 0), (other, 1, 1)]
    answered: list = []
    waiter = threading.Thread(target=lambda: answered.append(_await(conn, positions, 60_000)))
    waiter.start()
    arrivals = broker.service.store.queue(other, 0)._appended
    assert wait_until(lambda: arrivals._futures)  # the call waits on the queue's arrivals
    _send(conn, other, 0, 3)
    waiter.join(timeout=60)
    assert answered == [[(other, 0, 3)]]


def test_positions_read_from_another_start_of_the_broker_are_all_ready_at_once(conn, topic_name):
    """Its log may have lost its tail since (a power cut with flush = "async"): a pull tells."""
    _create(conn, topic_name, 2)
    _send(conn, topic_name, 1)
    this_start = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0)).boot_id
    positions = [(topic_name, 0, 0), (topic_name, 1, 1)]  # both at their end
    assert _await(conn, positions, 100, boot_id=this_start) == []
    assert _await(conn, positions, 60_000, boot_id=this_start + 1) == [(topic_name, 0, 0), (topic_name, 1, 1)]


def test_nothing_within_the_wait_answers_no_queue(conn, topic_name):
    _create(conn, topic_name, 2)
    assert _await(conn, [(topic_name, 0, 0), (topic_name, 1, 0)], 100) == []


def test_bad_requests_get_clear_errors_and_the_broker_serves_on(conn, topic_name):
    _create(conn, topic_name, 2)
    with pytest.raises(InvalidRequestError, match="names no queue"):
        _await(conn, [], 100)
    with pytest.raises(InvalidRequestError, match="wait_ms must not be negative"):
        _await(conn, [(topic_name, 0, 0)], -1)
    with pytest.raises(TopicNotFoundError, match="'missing' does not exist"):
        _await(conn, [(topic_name, 0, 0), ("missing", 0, 0)], 100)
    with pytest.raises(QueueOutOfRangeError, match="queue id 2 is out of range"):
        _await(conn, [(topic_name, 2, 0)], 100)
    with pytest.raises(InvalidRequestError, match=f"more than the {MAX_AWAITED_QUEUES}"):
        _await(conn, [(topic_name, 0, 0)] * (MAX_AWAITED_QUEUES + 1), 100)
    _send(conn, topic_name, 1)
    assert _await(conn, [(topic_name, 0, 0), (topic_name, 1, 0)], 100) == [(topic_name, 1, 1)]
