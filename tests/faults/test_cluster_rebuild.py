"""Cluster scenario 3: slaves rebuilt from the master, and every broker restarted in turn, under
sync-replicated keyed producers (and an orderly consumer group).

- A slave's data dir is deleted: restarted empty, it leaves the sync-state set at its first fetch
  (it reports less than it had), copies everything from the master, and rejoins. It may not
  campaign before it caught up; once it did, it alone holds the group: the two other brokers are
  killed, it is elected, and its log is judged against every send.
- A slave that retention left behind the master's first offset (down while the master's segments
  aged out) restarts those queues at the master's first offset and catches up on its own; promoted,
  its log is judged against what the master kept.
- A rolling restart: each broker in turn is stopped (SIGTERM) and started, and the next waits until
  it is back in the sync-state set. The master's turn is a failover.

Reported: how long each rebuild or restart took until the broker was back in the sync-state set,
the longest stop of acknowledgements, the epochs.
"""

from __future__ import annotations

import json
import shutil
import time

from connector.client import Admin
from connector.client.connection import BrokerConnection, pb
from connector.history import History, Send, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import (
    KeyedProducer,
    ack_stall,
    consumer_states,
    keyed_producers,
    shutdown_all,
    start_orderly_group,
    stored_deliveries,
    undelivered_where,
)
from tests.support import wait_until

TOPIC, GROUP, QUEUES = "orders", "order-service", 4


def _rebuilt(group, broker, since: float, timeout: float = 120.0) -> tuple[float | None, float]:
    """Seconds from ``since`` (``time.monotonic()``) until the restarted ``broker`` was seen out of
    the master's sync-state set (None if that moment was too short to see), and until its new copy
    had caught up (its ``cluster-epochs.json`` says so) and it was in the set again."""
    broker_id = group.brokers.index(broker)
    epochs = broker.data_dir / "cluster-epochs.json"
    deadline = time.monotonic() + timeout
    left = None
    while time.monotonic() < deadline:
        inside = broker_id in group.sync_set()
        if left is None and not inside:
            left = time.monotonic() - since
        if inside and epochs.exists() and json.loads(epochs.read_text()).get("caught_up"):
            return left, time.monotonic() - since
        time.sleep(0.01)
    raise AssertionError(f"broker {broker_id} did not catch up and rejoin the sync-state set within {timeout:.0f}s")


def _stop(producers: list[KeyedProducer]) -> None:
    for producer in producers:
        producer.stop.set()
    for producer in producers:
        producer.join()


def _promote_alone(group, survivor) -> None:
    """Kill every other broker: ``survivor`` must be elected with what it holds."""
    for broker in group.brokers:
        if broker is not survivor:
            broker.kill9()
    assert group.wait_for_master() is survivor


def test_a_wiped_slave_is_rebuilt_from_the_master_under_load(broker_group, fault_report):
    group = broker_group(3)
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    consumers = start_orderly_group(group.addresses, TOPIC, GROUP, PROFILE.consumers, history)
    producers = keyed_producers(group.addresses, TOPIC, history)
    wiped = group.brokers[2]
    try:
        for producer in producers:
            producer.start()
        group.wait_in_sync_set(group.brokers[2])
        time.sleep(2 * PROFILE.cycle_seconds)
        wiped.kill9()
        shutil.rmtree(wiped.data_dir)
        killed, since = time.time(), time.monotonic()
        wiped.start()
        started_s = time.monotonic() - since
        left_s, rebuilt_s = _rebuilt(group, wiped, since)
        stall = ack_stall(producers, killed - 1, time.time())
        time.sleep(PROFILE.cycle_seconds)
        _stop(producers)
        caught_up = wait_until(history.delivered_all_acked, timeout=120)
    finally:
        _stop(producers)
        shutdown_all(consumers)
    assert wait_until(lambda: group.sync_set() == {0, 1, 2}, timeout=60)
    _promote_alone(group, wiped)
    with BrokerConnection(wiped.address) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    consumed = history.check()
    fault_report("cluster: a wiped slave rebuilt from the master under load", {"rebuilt log": log, "consumed": consumed},
                 restarted_empty_s=round(started_s, 2), out_of_sync_set_s=left_s and round(left_s, 2),
                 back_in_sync_set_s=round(rebuilt_s, 2), longest_ack_stall_s=round(stall, 2),
                 send_failures=sum(len(p.failures) for p in producers))
    assert log.ok, str(log)
    assert caught_up and consumed.lost == 0 and consumed.out_of_order == 0, str(consumed)


def test_a_slave_behind_the_masters_retention_catches_up_on_its_own(broker_group, fault_report):
    # Small segments, a few kept per queue: the master's first offsets move on within seconds.
    group = broker_group(3, segment_bytes=8_192, retention_bytes=32_768, retention_check_interval_ms=200)
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    producers = keyed_producers(group.addresses, TOPIC, history)
    behind = group.brokers[2]
    try:
        for producer in producers:
            producer.start()
        group.wait_in_sync_set(group.brokers[2])
        behind.kill9()
        ends = _queue_ends(behind)
        assert wait_until(lambda: all(_offsets(group.addresses, q)[0] > end for q, end in ends.items()), timeout=120), \
            "retention did not move past the stopped slave's copy"
        behind.start()
        caught_up_s = group.wait_in_sync_set(group.brokers[2])
        _stop(producers)
    finally:
        _stop(producers)
    assert wait_until(lambda: group.sync_set() == {0, 1, 2}, timeout=60)
    with BrokerConnection(group.addresses) as conn:
        kept = stored_deliveries(conn, TOPIC)  # what the master's retention left
    master_ends = {q: _offsets(group.addresses, q)[1] for q in range(QUEUES)}
    _promote_alone(group, behind)
    # Its own retention runs too (on segments cut elsewhere): judged from its first offsets on.
    firsts = {q: _offsets(behind.address, q)[0] for q in range(QUEUES)}
    with BrokerConnection(behind.address) as conn:
        log = check([Send(d.key, d.seq, True) for d in kept if d.offset >= firsts[d.queue_id]],
                    stored_deliveries(conn, TOPIC))
    ends = {q: _offsets(behind.address, q)[1] for q in range(QUEUES)}
    restarted = behind.log_text().count("restarts at offset")
    fault_report("cluster: a slave behind the master's retention catches up", {"its log against the master's": log},
                 queues_restarted=restarted, caught_up_into_sync_set_s=round(caught_up_s, 2),
                 master_kept=len(kept), sent=len(history.sends))
    assert restarted > 0, "no queue restarted at the master's first offset"
    assert ends == master_ends, f"its queues end at {ends}, the master's at {master_ends}"
    assert log.ok, str(log)


def _queue_ends(broker) -> dict[int, int]:
    """Where each queue of a stopped broker's copy ends, from its segment files (name: base offset)."""
    ends = {}
    for queue_id in range(QUEUES):
        segments = sorted((broker.data_dir / "topics" / TOPIC / str(queue_id)).glob("*.log"))
        ends[queue_id] = int(segments[-1].stem) if segments else 0  # at least the last segment's base
    return ends


def _offsets(addresses: str, queue_id: int) -> tuple[int, int]:
    """The first and the end offset of a queue (at the master among ``addresses``)."""
    with BrokerConnection(addresses) as conn:
        answer = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=queue_id))
    return answer.min_offset, answer.max_offset


def test_rolling_restart_of_every_broker_under_load(broker_group, fault_report):
    group = broker_group(3)
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    consumers = start_orderly_group(group.addresses, TOPIC, GROUP, PROFILE.consumers, history)
    producers = keyed_producers(group.addresses, TOPIC, history)
    back_s, stalls, epochs = [], [], []
    try:
        for producer in producers:
            producer.start()
        assert wait_until(lambda: group.sync_set() == {0, 1, 2}, timeout=60)
        for broker_id, broker in enumerate(group.brokers):
            time.sleep(PROFILE.cycle_seconds)
            stopped = time.time()
            broker.stop()
            broker.start()
            back_s.append(round(group.wait_in_sync_set(group.brokers[broker_id]), 2))
            stalls.append(round(ack_stall(producers, stopped - 1, time.time()), 2))
            epochs.append(group.health(group.wait_for_master()).group_epoch)
        time.sleep(PROFILE.cycle_seconds)
        _stop(producers)
        caught_up = wait_until(history.delivered_all_acked, timeout=120)
        states = [] if caught_up else consumer_states(consumers)
    finally:
        _stop(producers)
        shutdown_all(consumers)
    with BrokerConnection(group.addresses) as conn:
        stored = stored_deliveries(conn, TOPIC)
    log = check(history.sends, stored)
    consumed = history.check()
    fault_report("cluster: rolling restart of every broker under load", {"log": log, "consumed": consumed},
                 back_in_sync_set_s=back_s, longest_ack_stall_s=stalls, epochs_after_each=epochs,
                 send_failures=sum(len(p.failures) for p in producers))
    assert log.ok, str(log)
    assert caught_up and consumed.lost == 0, (
        f"{consumed}\nnever delivered, per queue (count, first, last offset): "
        f"{undelivered_where(stored, consumed.lost_messages)}\nconsumers when the wait ended: {states}")
    assert consumed.out_of_order == 0 and consumed.unexpected == 0, str(consumed)

