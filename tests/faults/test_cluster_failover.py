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
from tests.faults.cluster_group import kill_masters
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import drain, keyed_producers, shutdown_all, start_orderly_group, stored_deliveries

TOPIC, GROUP, QUEUES = "orders", "order-service", 4
KILLS = 3 if PROFILE.name == "short" else 10


def test_master_kill9_fails_over_within_seconds_losing_nothing(broker_group, fault_report):
    group = broker_group(3)
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    consumers = start_orderly_group(group.addresses, TOPIC, GROUP, PROFILE.consumers, history)
    producers = keyed_producers(group.addresses, TOPIC, history)
    try:
        for producer in producers:
            producer.start()
        failovers = kill_masters(group, producers, KILLS)
        time.sleep(PROFILE.cycle_seconds)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        shutdown_all(consumers)
    with BrokerConnection(group.addresses) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    consumed = history.check()
    elections, epochs = [f.election_s for f in failovers], [f.epoch for f in failovers]
    fault_report(
        "cluster: master kill -9 loop, 3 brokers, sync replication", {"log": log, "consumed": consumed},
        kills=KILLS, election_s_max=round(max(elections), 2), election_s_median=round(statistics.median(elections), 2),
        first_ack_after_kill_s_max=round(max(f.first_ack_s or 0 for f in failovers), 2),
        epochs=epochs, send_failures=sum(len(p.failures) for p in producers),
    )
    assert epochs == sorted(set(epochs)), f"every failover must bring a greater group epoch: {epochs}"
    assert log.ok, str(log)
    assert caught_up and consumed.lost == 0, str(consumed)
    assert consumed.out_of_order == 0 and consumed.unexpected == 0, str(consumed)
