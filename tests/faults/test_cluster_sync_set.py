"""Cluster scenario: a slave that lags leaves the sync-state set, sends go on without it, and it
rejoins once caught up.

A group of three (sync replication, ``min_sync_replicas = 2``) under a keyed producer. One slave
is paused (SIGSTOP) for longer than ``replica_lag_timeout_ms`` but shorter than its ZooKeeper
session: it stays a member, yet the master drops it from the sync-state set, so acknowledgements
resume after the lag timeout instead of waiting for it. Resumed, it catches up and is added back.
The set is read from ZooKeeper; the log is judged by the strict checker; the stall is reported.
"""

from __future__ import annotations

import json
import os
import signal
import time

from kazoo.client import KazooClient

from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import KeyedProducer, stored_deliveries
from tests.support import wait_until

TOPIC, QUEUES = "orders", 4
LAG_MS, SESSION_MS = 1_000, 8_000


def test_a_lagging_slave_leaves_the_sync_state_set_and_rejoins_when_caught_up(broker_group, zookeeper,
                                                                               fault_report):
    group = broker_group(3, replica_lag_timeout_ms=LAG_MS, zk_session_timeout_ms=SESSION_MS)
    zk = KazooClient(hosts=zookeeper.connect_string)
    zk.start(timeout=30)

    def sync_set() -> set[int]:
        raw, _ = zk.get("/orderlymq/orderlymq/groups/group-a/state")
        return set(json.loads(raw)["sync_set"])

    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    producer = KeyedProducer(group.addresses, TOPIC, [f"k{k}" for k in range(PROFILE.keys_per_producer)], history,
                             rate=PROFILE.send_rate)
    laggard = group.brokers[2]
    try:
        producer.start()
        assert wait_until(lambda: sync_set() == {0, 1, 2}, timeout=30), sync_set()
        assert wait_until(lambda: len(producer.ack_times) >= PROFILE.send_rate, timeout=60)  # traffic flows
        os.kill(laggard.pid, signal.SIGSTOP)
        paused_wall, paused = time.time(), time.monotonic()
        assert wait_until(lambda: sync_set() == {0, 1}, timeout=30), sync_set()
        left_s = time.monotonic() - paused
        resumed_acks = wait_until(lambda: [t for t in list(producer.ack_times) if t > paused_wall + left_s],
                                  timeout=30)
        time.sleep(1.0)
        os.kill(laggard.pid, signal.SIGCONT)
        resumed = time.monotonic()
        assert wait_until(lambda: sync_set() == {0, 1, 2}, timeout=30), sync_set()
        rejoined_s = time.monotonic() - resumed
    finally:
        os.kill(laggard.pid, signal.SIGCONT)
        producer.stop.set()
        producer.join()
        zk.stop()
    acks = sorted(producer.ack_times)
    around = [t for t in acks if paused_wall - 1 <= t <= paused_wall + left_s + 1]
    stall_s = max((b - a for a, b in zip(around, around[1:], strict=False)), default=None)  # acks stopped this long
    with BrokerConnection(group.addresses) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    fault_report("cluster: lagging slave leaves the sync-state set and rejoins", {"log": log},
                 left_after_s=round(left_s, 2), longest_ack_stall_s=round(stall_s or 0, 2),
                 rejoined_after_resume_s=round(rejoined_s, 2), send_failures=len(producer.failures))
    assert resumed_acks, "no send was acknowledged once the laggard left the sync-state set"
    assert log.ok, str(log)
    assert not producer.failures, producer.failures
