"""Scenario 5: disk trouble. While the broker is down (after ``kill -9``), segments of four queues
are damaged in four ways and a fifth queue is left alone. On restart the broker must come up,
report exactly which bytes of which file it cut and why, and serve every message it kept, in
order and once; the messages lost are exactly those the damage took. Damage it cannot cut (a
closed segment) is named on read with the offset to continue from, and intact later segments
are kept."""

from __future__ import annotations

import re
from pathlib import Path

from broker.wire import codec
from broker.wire.errors import DamagedRecordError
from connector.client.connection import BrokerConnection, pb
from connector.history import History
from tests.faults.disk import Damage, Record, flip_bit, records, segments, truncate
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import body, parse_body
from tests.support import send_rows

TOPIC, QUEUES, KEYS_PER_QUEUE = "ledger", 5, 3
CUT_LINE = re.compile(r"recovered (\S+): cut (\d+) damaged bytes at byte (\d+) \((.*)\)")


def fill(conn: BrokerConnection, history: History) -> None:
    """``disk_messages`` one-message records per queue, keys ``q<queue>-k<n>`` in turn."""
    for queue_id in range(QUEUES):
        for i in range(PROFILE.disk_messages):
            key, seq = f"q{queue_id}-k{i % KEYS_PER_QUEUE}", i // KEYS_PER_QUEUE
            send_rows(conn, TOPIC, queue_id, [{"key": key, "body": body(key, seq)}])
            history.sent(key, seq, acked=True)


def damage(data: Path) -> dict[int, Damage]:
    """Four kinds of damage, one queue each; queue 4 stays intact."""
    queue = [segments(data / "topics" / TOPIC / str(q)) for q in range(QUEUES)]
    assert all(len(s) >= 4 for s in queue), "the queues must span several segments"
    tail0 = records(queue[0][-1])[-2]
    tail1, closed2, closed3 = (middle(queue[1][-1]), middle(queue[2][1]), middle(queue[3][1]))
    return {
        0: truncate(tail0, tail0.size // 2),  # a torn write at the tail
        1: flip_bit(tail1, tail1.size - 10),  # a flipped bit in the active segment
        2: truncate(closed2, 30),  # a closed segment cut short, inside a record header
        3: flip_bit(closed3, closed3.size - 10),  # a flipped bit in a closed segment
    }


def middle(segment: Path) -> Record:
    found = records(segment)
    return found[len(found) // 2]


def expected_cuts(damaged: dict[int, Damage]) -> set[tuple[str, int, int]]:
    """(file, byte, bytes cut) the broker must report: each damaged tail it can see on start (the
    active segments, and the closed segment cut short); later segments stay whole."""
    return {(str(d.path), d.position, d.size_after_damage - d.position) for q, d in damaged.items() if q != 3}


def segment_end_offset(data: Path, queue_id: int, damaged: Damage) -> int:
    """The first offset of the segment after ``damaged``'s (where reading resumes after a hole)."""
    later = [s for s in segments(data / "topics" / TOPIC / str(queue_id)) if s.name > damaged.path.name]
    return int(later[0].stem) if later else PROFILE.disk_messages


def read_back(conn: BrokerConnection, history: History) -> dict[int, list[str]]:
    """Deliver every readable message of every queue; damaged messages are skipped from the
    offset the error names, as a consumer would. Returns the errors per queue."""
    errors: dict[int, list[str]] = {q: [] for q in range(QUEUES)}
    for queue_id in range(QUEUES):
        offset = 0
        while True:
            request = pb.PullRequest(topic=TOPIC, queue_id=queue_id, offset=offset, max_messages=16)
            try:
                response = conn.call("Pull", request, retry=False)
            except DamagedRecordError as exc:
                errors[queue_id].append(f"offset {offset}: {exc}")
                assert exc.next_offset > offset, "the error names where to continue"
                offset = exc.next_offset
                continue
            table = codec.decode_many(response.batches)
            for raw, at in zip(table.column("body").to_pylist(), table.column("queue_offset").to_pylist(),
                               strict=True):
                key, seq = parse_body(raw)
                history.delivered(key, seq, consumer="reader", queue_id=queue_id, offset=at)
            offset = response.next_offset
            if offset >= response.max_offset:
                break
    return errors


def test_damaged_segments_are_cut_exactly_reported_and_the_rest_served(broker_proc, fault_report):
    proc = broker_proc(flush="sync", segment_bytes=8192)
    data = proc.data_dir
    history = History()
    with BrokerConnection(proc.address, retry_timeout=5) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=TOPIC, queue_count=QUEUES))
        fill(conn, history)
    proc.kill9()
    damaged = damage(data)
    cuts_expected = expected_cuts(damaged)
    hole_end = segment_end_offset(data, 2, damaged[2])

    proc.start()
    reported = {(m[0], int(m[2]), int(m[1])): m[3] for m in CUT_LINE.findall(proc.log_text())}
    with BrokerConnection(proc.address, retry_timeout=5) as conn:
        errors = read_back(conn, history)
        ends = {q: conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=q)).max_offset
                for q in range(QUEUES)}
        appended = {q: send_rows(conn, TOPIC, q, [{"key": "after", "body": b"after:0"}]).base_offset
                    for q in range(QUEUES)}
    verdict = history.check()
    lost_until = {0: PROFILE.disk_messages, 1: PROFILE.disk_messages, 2: hole_end,
                  3: damaged[3].first_lost_offset + 1}
    lost_expected = sorted(
        (f"q{q}-k{i % KEYS_PER_QUEUE}", i // KEYS_PER_QUEUE)
        for q, d in damaged.items()
        for i in range(d.first_lost_offset, lost_until[q])
    )
    fault_report("5 disk damage", {"log after restart": verdict}, damaged_queues=len(damaged),
                 cuts_reported=len(reported), cut_bytes=sum(c[2] for c in reported),
                 unreadable_records=sum(map(len, errors.values())),
                 served=ends)

    assert set(reported) == cuts_expected, f"reported {reported}, expected {cuts_expected}"
    reasons = {path_pos[0]: reason for path_pos, reason in reported.items()}
    assert reasons[str(damaged[0].path)] == "torn record body"
    assert reasons[str(damaged[1].path)] == "checksum mismatch"
    assert reasons[str(damaged[2].path)] == "torn record header"
    assert verdict.lost_messages == lost_expected
    assert (verdict.duplicated, verdict.out_of_order, verdict.unexpected) == (0, 0, 0), str(verdict)
    assert ends == {0: damaged[0].first_lost_offset, 1: damaged[1].first_lost_offset,
                    2: PROFILE.disk_messages, 3: PROFILE.disk_messages, 4: PROFILE.disk_messages}
    assert appended == ends, "appends go on right after what was kept"
    # The closed segment cut short leaves a hole up to the next (intact) segment, named on read.
    lost2 = damaged[2].first_lost_offset
    assert errors[2] == [errors[2][0]] and errors[2][0].startswith(f"offset {lost2}:")
    assert f"messages {lost2}..{hole_end - 1}" in errors[2][0] and f"pull from offset {hole_end}" in errors[2][0]
    # A bit flipped in a closed segment is not seen on start (only the tail is scanned); the
    # damaged record is refused by its checksum on read, naming its offsets and where to continue.
    offset = damaged[3].first_lost_offset
    assert [e.split(":")[0] for e in errors[3]] == [f"offset {offset}"]
    assert f"messages {offset}..{offset}" in errors[3][0] and f"pull from offset {offset + 1}" in errors[3][0]
    assert not any(errors[q] for q in (0, 1, 4))


def test_an_offset_committed_past_a_lost_tail_moves_back_so_the_group_gets_what_is_stored_there(broker_proc):
    """A power cut with flush = "async" may take a log's tail that a group already consumed and
    committed. What is stored at those offsets after the restart is new: the broker moves the
    group's offset back to the log's end on start (naming it in its log), and a consumer of the
    group receives every new message, in order, instead of skipping those stored below the old
    offset."""
    from connector.client import OrderlyConsumer
    from connector.client.listener import ConsumeOrderlyStatus
    from tests.client.helpers import FAST
    from tests.support import wait_until

    proc = broker_proc(flush="async")
    with BrokerConnection(proc.address, retry_timeout=5) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=TOPIC, queue_count=1))
        for seq in range(10):
            send_rows(conn, TOPIC, 0, [{"key": "a", "body": body("a", seq)}])
        conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=TOPIC, queue_id=0, offset=10))
    proc.kill9()
    [segment] = segments(proc.data_dir / "topics" / TOPIC / "0")
    truncate(records(segment)[7], keep=1)  # offsets 7..9 are gone, as in a power cut
    proc.start()
    assert "its committed offset 10 of ledger/0 is past the end of the queue's log (7)" in proc.log_text()
    delivered: list[tuple[str, int]] = []

    def listener(messages, context):
        delivered.extend(parse_body(m.body) for m in messages)
        return ConsumeOrderlyStatus.SUCCESS

    with BrokerConnection(proc.address, retry_timeout=5) as conn:
        assert conn.call("GetOffset", pb.GetOffsetRequest(group="g", topic=TOPIC, queue_id=0)).offset == 7
        for seq in range(5):
            send_rows(conn, TOPIC, 0, [{"key": "b", "body": body("b", seq)}])  # stored at offsets 7..11
        consumer = OrderlyConsumer(proc.address, "g", listener, **FAST)
        consumer.subscribe(TOPIC)
        consumer.start()
        try:
            assert wait_until(lambda: len(delivered) >= 5, 20), delivered
        finally:
            consumer.shutdown()
        assert delivered == [("b", seq) for seq in range(5)]
        assert conn.call("GetOffset", pb.GetOffsetRequest(group="g", topic=TOPIC, queue_id=0)).offset == 12
