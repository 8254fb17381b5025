"""The driver's check of a log's tail (``connector.spark.lost_tails``) against a real broker: no
Spark. The power cuts themselves are in ``test_source_reliability``."""

from __future__ import annotations

import time

from connector.client.connection import BrokerConnection, pb
from connector.spark.lost_tails import LostTails
from connector.spark.offsets import to_json
from tests.support import send_rows


def offset_at(conn: BrokerConnection, topic: str) -> dict:
    """A source offset at the end of queue 0, as latestOffset builds it."""
    state = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic, queue_id=0))
    return to_json("c1", {(topic, 0): state.max_offset}, read_at={(topic, 0): state.now_ms})


def test_an_intact_tail_or_one_removed_by_retention_leaves_the_position(broker_factory, topic_name):
    broker = broker_factory(segment_bytes=4096, retention_ms=200, retention_check_interval_ms=100)
    conn = BrokerConnection(broker.address, retry_timeout=2)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
    ref = (topic_name, 0)
    for _ in range(5):
        send_rows(conn, topic_name, 0, [{"body": b"x" * 200}])
    offset = offset_at(conn, topic_name)  # at 5
    tails = LostTails(conn)
    tails.check({ref: 1}, offset)
    for _ in range(25):  # stored after the offset was read, above it: not a cut
        send_rows(conn, topic_name, 0, [{"body": b"x" * 200}])
    tails.check({ref: 2}, offset)  # a new epoch: looked at again
    assert tails.effective({ref: 5}, {ref: 0}) == {ref: 5}

    # Retention removes the message below the position: nothing to compare, and no failure.
    deadline = time.monotonic() + 10
    while conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0)).min_offset < 5:
        assert time.monotonic() < deadline, "retention never ran"
        time.sleep(0.1)
    tails.check({ref: 3}, offset)
    assert tails.effective({ref: 5}, {ref: 0}) == {ref: 5}
    conn.close()
