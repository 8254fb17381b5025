"""The driver's check of a log's tail (``connector.spark.lost_tails``), and the sink's hand-over of
the group's offsets after one, against a real broker: no Spark. The power cuts of running queries
are in ``test_source_reliability``."""

from __future__ import annotations

import json
import time

from connector.client.connection import BrokerConnection, pb
from connector.spark.handoff import advance_group_offsets
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


def test_the_sinks_hand_over_moves_the_group_no_further_than_where_the_log_was_written_again(tmp_path, topic_name):
    """A batch whose end (10) was read before a power cut, committed by the sink after it: the log
    was cut to 7 and written again to 15. The group's offset moves to 7, where the query reads
    on, not to 10 (which would skip the new 7..9 for the group's next consumer). An intact tail
    moves it to the batch's end."""
    broker = broker_process(tmp_path / "data", flush="sync", send_port=-1).start()
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)

    def batch(batch_id: int, offset: dict) -> None:  # Spark's offsets log: version, metadata, one line per source
        text = "\n".join(["v1", json.dumps({"batchWatermarkMs": 0}), json.dumps(offset)])
        (checkpoint / "offsets" / str(batch_id)).write_text(text)

    def hand_over(batch_id: int) -> int:
        conn.call("LockBatch", pb.LockBatchRequest(group="g", client_id="c1", topic=topic_name, queue_ids=[0]))
        advance_group_offsets(str(checkpoint), batch_id)
        return conn.call("GetOffset", pb.GetOffsetRequest(group="g", topic=topic_name, queue_id=0)).offset

    try:
        conn = BrokerConnection(broker.address, retry_timeout=30)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        for _ in range(4):
            send_rows(conn, topic_name, 0, [{"body": b"x"}])
        batch(0, {**offset_at(conn, topic_name), "group": "g", "brokers": broker.address})  # at 4
        assert hand_over(0) == 4
        for _ in range(6):
            send_rows(conn, topic_name, 0, [{"body": b"x"}])
        batch(1, {**offset_at(conn, topic_name), "group": "g", "brokers": broker.address})  # at 10
        broker.kill9()
        [segment] = segments(tmp_path / "data" / "topics" / topic_name / "0")
        truncate(records(segment)[7], keep=1)
        broker.start()
        for _ in range(8):
            send_rows(conn, topic_name, 0, [{"body": b"x"}])
        assert hand_over(1) == 7
        conn.close()
    finally:
        broker.kill9()


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
