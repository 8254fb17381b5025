"""Cluster scenario (b): the master of a group of three is killed with SIGKILL, again and again,
under sync-replicated keyed producers and an orderly consumer group.

A slave of the sync-state set takes over within seconds with a new group epoch; the killed broker
is restarted and rejoins as a slave. Two histories are judged by the strict checker: the *log*
(everything stored at the end, read from the last master, against every send: nothing
acknowledged missing, nothing twice, every key in order) and the *consumption* (what the group's
listeners were handed: nothing acknowledged missed, every key in order; redeliveries of what was
not committed yet are allowed and counted). Failover times are measured and reported: from the
kill to a master answering, and to the producers' first acknowledgement after it.
"""

from __future__ import annotations

import statistics
import time

from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import KeyedProducer, drain, shutdown_all, start_orderly_group, stored_deliveries
from tests.support import wait_until

TOPIC, GROUP, QUEUES = "orders", "order-service", 4
KILLS = 3 if PROFILE.name == "short" else 10


def _first_ack_after(producers: list[KeyedProducer], moment: float) -> float | None:
    later = [t for p in producers for t in list(p.ack_times) if t > moment]
    return min(later) - moment if later else None


def test_master_kill9_fails_over_within_seconds_losing_nothing(broker_group, fault_report):
    group = broker_group(3)
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    consumers = start_orderly_group(group.addresses, TOPIC, GROUP, PROFILE.consumers, history)
    producers = [KeyedProducer(group.addresses, TOPIC, [f"p{p}-k{k}" for k in range(PROFILE.keys_per_producer)],
                               history, rate=PROFILE.send_rate)
                 for p in range(PROFILE.producers)]
    elections, first_acks, epochs = [], [], []
    try:
        for producer in producers:
            producer.start()
        for _ in range(KILLS):
            time.sleep(PROFILE.cycle_seconds)
            master = group.wait_for_master()
            master.kill9()
            killed_wall, killed = time.time(), time.monotonic()
            promoted = group.wait_for_master(exclude=master)
            elections.append(time.monotonic() - killed)
            epochs.append(group.health(promoted).group_epoch)
            master.start()  # back as a slave: it cuts what the group never had and catches up
            first_acks.append(wait_until(lambda at=killed_wall: _first_ack_after(producers, at), timeout=60))
        time.sleep(PROFILE.cycle_seconds)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        shutdown_all(consumers)
    with BrokerConnection(group.addresses) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    consumed = history.check()
    fault_report(
        "cluster: master kill -9 loop, 3 brokers, sync replication", {"log": log, "consumed": consumed},
        kills=KILLS, election_s_max=round(max(elections), 2), election_s_median=round(statistics.median(elections), 2),
        first_ack_after_kill_s_max=round(max(a or 0 for a in first_acks), 2),
        epochs=epochs, send_failures=sum(len(p.failures) for p in producers),
    )
    assert epochs == sorted(set(epochs)), f"every failover must bring a greater group epoch: {epochs}"
    assert log.ok, str(log)
    assert caught_up and consumed.lost == 0, str(consumed)
    assert consumed.out_of_order == 0 and consumed.unexpected == 0, str(consumed)
