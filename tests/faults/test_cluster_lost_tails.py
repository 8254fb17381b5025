"""Cluster scenario: every broker of a group loses the tail of a queue's log at once (a power cut
of the whole group with ``flush = "async"``), past an offset a consumer group had committed.

The broker elected master afterwards moves that offset back to its log's end when it is promoted
(a single broker does so on start), so the consumer group receives every message stored at those
offsets from then on, in order and once, instead of skipping them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from broker.launcher import BrokerProcess
from connector.client.connection import BrokerConnection, pb
from connector.history import History
from tests.faults.disk import records, segments, truncate
from tests.faults.workload import body, shutdown_all, start_orderly_group
from tests.support import send_rows, wait_until

TOPIC, GROUP = "ledger", "g"


def committed(broker: BrokerProcess) -> int | None:
    """The group's offset of queue 0 in ``broker``'s own table (a slave answers no GetOffset)."""
    path = Path(broker.data_dir) / "offsets.db"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT offset FROM offsets WHERE grp = ? AND topic = ? AND queue_id = 0",
                             (GROUP, TOPIC)).fetchone()
    except sqlite3.Error:
        return None
    return row[0] if row else None


def cut_at(broker: BrokerProcess, offset: int) -> None:
    """Cut the queue's log inside the record of ``offset``, as a power cut takes an unflushed tail."""
    [segment] = segments(Path(broker.data_dir) / "topics" / TOPIC / "0")
    [record] = [r for r in records(segment) if r.base_offset == offset]
    truncate(record, keep=1)


def test_an_offset_past_the_tail_the_whole_group_lost_moves_back_when_a_master_is_elected(broker_group,
                                                                                         fault_report):
    group = broker_group(2, flush="async")
    with BrokerConnection(group.addresses, retry_timeout=30) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=TOPIC, queue_count=1))
        for seq in range(10):
            send_rows(conn, TOPIC, 0, [{"key": "a", "body": body("a", seq)}])
        conn.call("CommitOffset", pb.CommitOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0, offset=10))
    assert wait_until(lambda: all(committed(b) == 10 for b in group.brokers)), "the slave holds the offset too"
    group.kill_all()
    for broker in group.brokers:
        cut_at(broker, 7)  # offsets 7..9 are gone from every copy
        broker.start()
    master = group.wait_for_master()
    assert f"its committed offset 10 of {TOPIC}/0 is past the end of the queue's log (7)" in master.log_text()
    history = History()  # of the messages sent after the cut: the group must get each, once, in order
    with BrokerConnection(group.addresses, retry_timeout=30) as conn:
        assert conn.call("GetOffset", pb.GetOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0)).offset == 7
        for seq in range(5):
            send_rows(conn, TOPIC, 0, [{"key": "b", "body": body("b", seq)}])  # stored at offsets 7..11
            history.sent("b", seq, acked=True)
    consumers = start_orderly_group(group.addresses, TOPIC, GROUP, 1, history)
    try:
        assert wait_until(history.delivered_all_acked, 30), history.check()
    finally:
        shutdown_all(consumers)
    verdict = history.check()  # a message below offset 7 ("a", ...) would be unexpected
    fault_report("cluster: a tail the whole group lost, below a committed offset", {"consumed after the cut": verdict},
                 committed_before=10, log_end_after=7)
    assert verdict.ok, str(verdict)
    assert wait_until(lambda: all(committed(b) == 12 for b in group.brokers)), "the slave follows the master"
