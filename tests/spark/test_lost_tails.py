"""The driver's check of a log's tail (``connector.spark.lost_tails``) against a real broker: no
Spark. The power cuts themselves are in ``test_source_reliability``."""

from __future__ import annotations

import time

from connector.client.connection import BrokerConnection, pb
from connector.spark.lost_tails import LostTails
from connector.spark.offsets import positions_of, read_at_of, to_json
from tests.faults.brokers import broker_process
from tests.faults.disk import records, segments, truncate
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


def test_cuts_one_after_another_each_move_the_positions_read_before_them(tmp_path, topic_name):
    """Two power cuts: the log cut to 7 and written again to 15, then cut to 12 and written again.
    A position read before the first (10) goes back to 7; one read between them (15) to 12 only:
    its messages below 12 are the new log's, which the query already read."""
    broker = broker_process(tmp_path / "data", flush="sync", send_port=-1).start()
    ref = (topic_name, 0)

    def send(count: int) -> None:
        for _ in range(count):  # one record each
            send_rows(conn, topic_name, 0, [{"body": b"x"}])

    def power_cut(keep_records: int) -> None:
        broker.kill9()
        [segment] = segments(tmp_path / "data" / "topics" / topic_name / "0")
        truncate(records(segment)[keep_records], keep=1)
        broker.start()

    try:
        conn = BrokerConnection(broker.address, retry_timeout=30)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        tails = LostTails(conn)
        send(10)
        before = offset_at(conn, topic_name)  # at 10
        power_cut(7)
        send(8)
        tails.check({ref: 1}, before)
        between = offset_at(conn, topic_name)  # at 15
        power_cut(12)
        send(5)
        tails.check({ref: 2}, between)
        positions = [(positions_of(at)[ref], read_at_of(at)) for at in (before, between)]
        assert [tails.effective({ref: pos}, read_at)[ref] for pos, read_at in positions] == [7, 12]
        conn.close()
    finally:
        broker.kill9()
