"""Cluster scenario (a): with ``replication = "sync"``, every acknowledged send is on the slave.

A group of a master and a slave; keyed producers send through the group's addresses (the client
finds the master); the master is then killed, the slave takes over, and its store is read back
and judged against every send by the strict checker: nothing acknowledged missing, nothing
twice, every key in order.
"""

from __future__ import annotations

import time

from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import KeyedProducer, stored_deliveries

TOPIC, QUEUES = "orders", 4


def test_sync_replication_puts_every_acknowledged_send_on_the_slave(broker_group, fault_report):
    group = broker_group(2)
    master = group.wait_for_master()
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    per_producer = 10 * PROFILE.send_rate
    producers = [KeyedProducer(group.addresses, TOPIC, [f"p{p}-k{k}" for k in range(PROFILE.keys_per_producer)],
                               history, rate=10 * PROFILE.send_rate, limit=per_producer)
                 for p in range(PROFILE.producers)]
    started = time.monotonic()
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join()
    elapsed = time.monotonic() - started

    master.kill9()
    killed = time.monotonic()
    promoted = group.wait_for_master(exclude=master)
    failover_s = time.monotonic() - killed
    with BrokerConnection(promoted.address) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    acked = sum(1 for s in history.sends if s.acked)
    fault_report("cluster: sync replication, read back from the promoted slave", {"log": log},
                 sent=len(history.sends), acked=acked, sync_sends_per_s=round(acked / elapsed),
                 failover_s=round(failover_s, 2))
    assert acked == len(history.sends), [f for p in producers for f in p.failures]
    assert log.ok and log.lost == 0, str(log)
