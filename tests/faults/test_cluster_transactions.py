"""Cluster scenario: transactions survive a failover.

In a group of two (sync replication, ``min_sync_replicas = 2``) a producer commits one
transaction of over a megabyte (its queues are appended side by side, each append waiting for the
slave) and leaves a second one open with sends staged; the master is then killed. On the new
master the first is known as committed (a replayed commit stores nothing again) and the second
is still open with everything it staged: committed there, its messages become visible once. The
log, read back, is judged by the strict checker against every send.

And a commit cut short on the master (its disk filled midway: some queues appended, some not)
is finished by the slave promoted after it, by itself: the slave knew the transaction was
committing, and from where, before the first record was appended.
"""

from __future__ import annotations

import pytest

from broker.wire.errors import DiskFullError
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection, pb
from connector.history import History, check
from tests.faults.workload import body, stored_deliveries
from tests.support import send_rows, wait_until
from tests.tmpfs import Ballast, mounted_tmpfs

TOPIC, QUEUES = "orders", 2
KEYS, PER_TXN = ["a", "b", "c"], 30
BIG = {"pad": "x" * 20_000, "more": "y" * 20_000}  # 30 sends of it: 1.2 MB


def _stage(tx, history: History, seqs: dict[str, int], properties: dict[str, str] | None = None) -> None:
    for i in range(PER_TXN):
        key = KEYS[i % len(KEYS)]
        tx.send(TOPIC, body(key, seqs[key]), key=key, properties=properties)
        seqs[key] += 1


def test_committed_and_open_transactions_survive_a_failover(broker_group, fault_report):
    group = broker_group(2)
    old = group.wait_for_master()
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history, seqs = History(), dict.fromkeys(KEYS, 0)
    with Producer(group.addresses) as producer:
        first = producer.transaction("txn-committed").begin()
        _stage(first, history, seqs, BIG)
        first.commit()
        second = producer.transaction("txn-open").begin()
        _stage(second, history, seqs)

        old.kill9()
        new = group.wait_for_master(exclude=old)
        old.start()  # back as a slave: with min_sync_replicas = 2 the new master acknowledges once it caught up
        with BrokerConnection(new.address) as conn:
            replay = conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="txn-committed"))
            open_state = conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="txn-open")).state
        applied = producer.transaction("txn-open").begin().commit()
    for key in KEYS:
        for seq in range(seqs[key]):
            history.sent(key, seq, acked=True)
    with BrokerConnection(group.addresses) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    fault_report("cluster: transactions across a failover", {"log": log}, replayed_commit_already=
                 replay.already_committed, open_after_failover=open_state, applied_after_failover=applied)
    assert replay.already_committed, "the new master did not know the committed transaction"
    assert open_state == "OPEN" and applied == PER_TXN
    assert log.ok, str(log)


def test_a_commit_cut_short_on_the_master_is_finished_by_the_promoted_slave(tmp_path, broker_group, fault_report):
    history, queues = History(), 4
    # The master's data dir on a disk of 6 MiB; its slave's on the ordinary one. The slave alone
    # will serve: it must not wait for the old master to acknowledge.
    with mounted_tmpfs(tmp_path / "group-0" / "broker-0", 6144) as disk:
        group = broker_group(2, min_sync_replicas=1)
        old, slave = group.brokers
        assert group.wait_for_master() is old
        with Admin(group.addresses) as admin:
            admin.create_topic(TOPIC, queues)
        with BrokerConnection(old.address, retry_timeout=10) as conn:
            conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="big"))
            for seq in range(40):  # 1.6 MB over four queues, appended side by side at commit
                key = f"k{seq % queues}"
                send_rows(conn, TOPIC, seq % queues, [{"key": key, "body": body(key, seq), "properties": BIG}],
                          txn_id="big")
                history.sent(key, seq, acked=True)
            Ballast(disk).fill(leave_bytes=900_000)
            with pytest.raises(DiskFullError):
                conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="big"))
            # what the master serves: what its slave holds (sync replication)
            before = sum(conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=q)).max_offset
                         for q in range(queues))
        # Only a member of the sync-state set may be elected: under load the slave may have fallen
        # behind for a moment (min_sync_replicas = 1 lets the master write on without it).
        group.wait_in_sync_set(slave)
        old.kill9()
        assert group.wait_for_master(exclude=old) is slave
        with BrokerConnection(slave.address) as conn:
            finished = wait_until(lambda: conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="big")).state
                                  == "COMMITTED", timeout=30)
            log = check(history.sends, stored_deliveries(conn, TOPIC))
            replay = conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="big"))
    fault_report("cluster: a commit cut short, finished by the promoted slave", {"log": log},
                 on_slave_before_failover=before, finished_by_new_master=finished)
    assert 0 < before < 40, f"the commit was not cut short midway: {before} of 40 on the slave"
    assert finished, "the new master left the interrupted commit unfinished"
    assert replay.already_committed
    assert log.ok and log.lost == 0, str(log)
