"""Cluster scenario (a): with ``replication = "sync"``, every acknowledged send is on the slave.

A group of a master and a slave; keyed producers send through the group's addresses (the client
finds the master); the master is then killed, the slave takes over, and its store is read back
and judged against every send by the strict checker: nothing acknowledged missing, nothing
twice, every key in order. A queue lock granted by the new master carries a greater fencing epoch
than the old master's, whose holder is refused.
"""

from __future__ import annotations

import time

import pytest

from broker.wire.errors import FencedError
from connector.client import Admin
from connector.client.connection import BrokerConnection, pb
from connector.history import History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import keyed_producers, stored_deliveries

TOPIC, GROUP, QUEUES = "orders", "order-service", 4


def _lock(conn: BrokerConnection, client_id: str) -> int:
    """Lock queue 0 for ``client_id``; its fencing epoch."""
    answer = conn.call("LockBatch", pb.LockBatchRequest(group=GROUP, client_id=client_id, topic=TOPIC, queue_ids=[0]))
    return answer.locked[0].epoch


def test_sync_replication_puts_every_acknowledged_send_on_the_slave(broker_group, fault_report):
    group = broker_group(2)
    master = group.wait_for_master()
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    per_producer = 10 * PROFILE.send_rate
    producers = keyed_producers(group.addresses, TOPIC, history, rate=10 * PROFILE.send_rate, limit=per_producer)
    started = time.monotonic()
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join()
    elapsed = time.monotonic() - started
    with BrokerConnection(group.addresses) as conn:
        old_epoch = _lock(conn, "consumer-before")

    master.kill9()
    killed = time.monotonic()
    promoted = group.wait_for_master(exclude=master)
    failover_s = time.monotonic() - killed
    with BrokerConnection(promoted.address) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
        new_epoch = _lock(conn, "consumer-after")
        with pytest.raises(FencedError):  # the holder of the old master's lock is fenced
            conn.call("CommitOffset", pb.CommitOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0, offset=1,
                                                             client_id="consumer-before", epoch=old_epoch))
    acked = sum(1 for s in history.sends if s.acked)
    fault_report("cluster: sync replication, read back from the promoted slave", {"log": log},
                 sent=len(history.sends), acked=acked, sync_sends_per_s=round(acked / elapsed),
                 failover_s=round(failover_s, 2), lock_epochs=f"{old_epoch}->{new_epoch}")
    assert acked == len(history.sends), [f for p in producers for f in p.failures]
    assert log.ok and log.lost == 0, str(log)
    assert new_epoch > old_epoch, (old_epoch, new_epoch)
