"""Scenarios 1 and 2: the broker is killed with SIGKILL and restarted, again and again, while
keyed producers send and an orderly consumer group consumes.

Two histories are checked. The *log*: everything stored in the topic at the end, against every
send — nothing acknowledged may be missing, nothing stored twice, every key in order. The
*consumption*: what the group's listeners were handed — nothing acknowledged missed, every key in
order, and nothing twice: the group is at-least-once, but a restart keeps each queue for its
consumer, which goes on where it was once it finds that nobody else consumed the queue and the
queue still holds what it pulled, so what it consumed but had not yet committed when the broker
died (or while it was down) is not consumed again. Committed offsets must never move back across a
restart.

With ``flush = "sync"`` nothing acknowledged may be lost. With ``flush = "async"`` an
acknowledged message may be lost if it was not yet fsynced when the machine lost power; a killed
process loses nothing the kernel already has, so the loss is reported and checked against its
bound (the messages acknowledged within one flush interval before each kill).
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right

from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.client.helpers import FAST_BROKER
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import drain, keyed_producers, shutdown_all, start_orderly_group, stored_deliveries
from tests.spark.helpers import committed

TOPIC, GROUP, QUEUES = "orders", "order-service", 4
FLUSH_INTERVAL_MS = 500


def crash_loop(proc, history: History) -> dict:
    """Producers and the group run while the broker is killed and restarted; returns figures."""
    with Admin(proc.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    consumers = start_orderly_group(proc.address, TOPIC, GROUP, PROFILE.consumers, history)
    producers = keyed_producers(proc.address, TOPIC, history)
    kills: list[float] = []
    regressions: list[str] = []
    try:
        for producer in producers:
            producer.start()
        with BrokerConnection(proc.address, retry_timeout=60) as conn:
            for _ in range(PROFILE.broker_cycles):
                time.sleep(PROFILE.cycle_seconds)
                before = committed(conn, GROUP, TOPIC)
                kills.append(time.time())
                proc.kill9()
                proc.start()
                after = committed(conn, GROUP, TOPIC)
                regressions += [f"queue {q}: {before[q]} -> {after[q]}" for q in range(QUEUES) if after[q] < before[q]]
            time.sleep(PROFILE.cycle_seconds)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        shutdown_all(consumers)
    with BrokerConnection(proc.address, retry_timeout=30) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    acks = sorted(t for p in producers for t in p.ack_times)
    window = FLUSH_INTERVAL_MS / 1000
    return {
        "log": log,
        "kills": len(kills),
        "caught_up": caught_up,
        "offset_regressions": regressions,
        "send_failures": [f for p in producers for f in p.failures],
        "acks_within_flush_interval_before_a_kill": sum(
            bisect_right(acks, t) - bisect_left(acks, t - window) for t in kills
        ),
    }


def test_kill9_loop_with_sync_flush_loses_nothing_and_keeps_order(broker_proc, fault_report):
    proc = broker_proc(flush="sync", **FAST_BROKER)
    history = History()
    run = crash_loop(proc, history)
    consumed, log = history.check(), run["log"]
    fault_report("1 broker kill -9 loop, sync flush", {"log": log, "consumed": consumed}, kills=run["kills"],
                 offset_regressions=len(run["offset_regressions"]), send_failures=len(run["send_failures"]))
    assert run["kills"] >= 5
    assert log.ok, str(log)
    assert run["caught_up"] and consumed.lost == 0, str(consumed)
    assert (consumed.duplicated, consumed.out_of_order, consumed.unexpected) == (0, 0, 0), str(consumed)
    assert run["offset_regressions"] == []


def test_kill9_loop_with_async_flush_keeps_order_and_reports_its_loss(broker_proc, fault_report):
    proc = broker_proc(flush="async", flush_interval_ms=FLUSH_INTERVAL_MS, **FAST_BROKER)
    history = History()
    run = crash_loop(proc, history)
    consumed, log = history.check(), run["log"]
    bound = run["acks_within_flush_interval_before_a_kill"]
    fault_report("2 broker kill -9 loop, async flush", {"log": log, "consumed": consumed}, kills=run["kills"],
                 loss_bound=bound, offset_regressions=len(run["offset_regressions"]),
                 send_failures=len(run["send_failures"]))
    assert run["kills"] >= 5
    assert log.lost <= bound, f"lost {log.lost} acknowledged messages, more than the {bound} of the flush windows"
    assert (log.duplicated, log.out_of_order, log.unexpected) == (0, 0, 0), str(log)
    assert consumed.lost_messages == log.lost_messages, "the group consumed everything the log kept"
    assert (consumed.duplicated, consumed.out_of_order, consumed.unexpected) == (0, 0, 0), str(consumed)
    assert run["offset_regressions"] == []
