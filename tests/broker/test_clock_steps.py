"""A step of the broker host's clock (an NTP correction at boot, ``date -s``, a virtual machine
resumed from a snapshot) changes nothing that counts time: queue lock leases, idle transaction
timeouts, consumer heartbeats. The broker's wall clock is stepped with ``tests.faults.stepped_clock``.
"""

from __future__ import annotations

import pytest

from broker.launcher import BrokerProcess
from connector.client import Admin, OrderlyConsumer, Producer, locking
from connector.client.connection import BrokerConnection, pb
from connector.client.transaction import Transaction
from connector.history import check_keyed
from tests.client.helpers import FAST, OrderLog, send_keyed
from tests.faults.brokers import broker_process
from tests.faults.stepped_clock import HOUR_S, SteppedClock, lock_queue
from tests.support import send_keyed_rounds, stored_keyed, wait_until

TOPIC, QUEUES, KEYS = "stepped", 4, 8
LEASE_MS = CONSUMER_TIMEOUT_MS = 10_000


def _lock(conn: BrokerConnection, client_id: str) -> list[pb.QueueLock]:
    return lock_queue(conn, TOPIC, client_id)


def _members(conn: BrokerConnection) -> list[str]:
    return list(conn.call("ListConsumers", pb.ListConsumersRequest(group="g")).client_ids)


@pytest.fixture
def stepped(tmp_path):
    """A broker whose wall clock the test steps, with a topic, and a connection to it."""
    clock = SteppedClock(tmp_path / "clock-offset", TOPIC)
    broker: BrokerProcess = broker_process(tmp_path / "data", env=clock.env(), lock_lease_ms=LEASE_MS,
                                           consumer_timeout_ms=CONSUMER_TIMEOUT_MS).start()
    try:
        with Admin(broker.address) as admin:
            admin.create_topic(TOPIC, QUEUES)
        with BrokerConnection(broker.address, retry_timeout=10) as conn:
            yield broker, clock, conn
    finally:
        assert broker.stop() == 0


def test_a_lock_lease_counts_on_the_steady_clock(stepped):
    """Stepped forward, a lease still runs: its holder renews it at the same epoch and nobody
    else gets the queue. Stepped back, it still ends a lease after its holder stops renewing."""
    _, clock, conn = stepped
    (held,) = _lock(conn, "A")
    clock.step(conn, HOUR_S)
    assert [lock.epoch for lock in _lock(conn, "A")] == [held.epoch]  # renewed, never lapsed
    (shown,) = conn.call("QueryLocks", pb.QueryLocksRequest(group="g", topic=TOPIC)).locks
    assert 0 < locking.lease_left_ms(shown) <= LEASE_MS  # though the broker's clock is an hour ahead of ours
    assert _lock(conn, "B") == []
    conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=TOPIC, queue_id=0, offset=0,
                                                     client_id="A", epoch=held.epoch))
    clock.step(conn, -2 * HOUR_S)
    (taken,) = wait_until(lambda: _lock(conn, "B"), 6 * LEASE_MS / 1000)  # not an hour later
    assert taken.epoch > held.epoch


def test_group_members_count_on_the_steady_clock(stepped):
    """Stepped forward, a member stays in its group; stepped back, one that stopped sending
    heartbeats still leaves it on time."""
    _, clock, conn = stepped
    conn.call("Heartbeat", pb.HeartbeatRequest(group="g", client_id="A", topics=[TOPIC]))
    clock.step(conn, HOUR_S)
    assert _members(conn) == ["A"]
    clock.step(conn, -2 * HOUR_S)
    assert wait_until(lambda: _members(conn) == [], 6 * CONSUMER_TIMEOUT_MS / 1000)


def test_an_orderly_group_consumes_across_clock_steps(stepped):
    """Two instances of an orderly consumer group consume a stream while the broker's clock steps
    an hour forward, then two back: every key in order, nothing lost, nothing consumed twice (no
    instance lost its queues to the other)."""
    _, clock, conn = stepped
    log, keys = OrderLog(), [f"account-{i}" for i in range(KEYS)]
    consumers = [OrderlyConsumer(conn.address, "g", log.listener(name), client_id=name, **FAST)
                 for name in ("c1", "c2")]
    with Producer(conn.address) as producer, Admin(conn.address) as admin:
        for consumer in consumers:
            consumer.subscribe(TOPIC)
            consumer.start()
        try:
            assert wait_until(lambda: len({lock.client_id for lock in admin.lock_holders("g", TOPIC)}) == 2)
            expected = send_keyed(producer, TOPIC, keys, 20)
            clock.step(conn, HOUR_S)
            expected = send_keyed(producer, TOPIC, keys, 20, start=expected)
            clock.step(conn, -2 * HOUR_S)
            expected = send_keyed(producer, TOPIC, keys, 20, start=expected)
            assert wait_until(lambda: log.has_all(expected))
        finally:
            for consumer in consumers:
                consumer.shutdown()
    assert log.check(expected) == 0


def test_transactions_count_idle_time_on_the_steady_clock(stepped):
    """An open transaction stages and commits across both steps: every message is stored once,
    in order per key. One left idle across them is still aborted once its timeout passes."""
    _, clock, conn = stepped
    expected: dict[str, int] = {}
    with Producer(conn.address) as producer, Admin(conn.address) as admin:
        txn = Transaction(producer, timeout_ms=4 * LEASE_MS).begin()
        idle = Transaction(producer, timeout_ms=LEASE_MS).begin()
        idle.send(TOPIC, "idle:0", key="idle")
        _stage(txn, expected, 10)
        clock.step(conn, HOUR_S)
        _stage(txn, expected, 10)
        clock.step(conn, -2 * HOUR_S)
        _stage(txn, expected, 10)
        assert txn.commit() == 30 * KEYS
        assert wait_until(lambda: [t.txn_id for t in admin.open_transactions()] == [], 6 * LEASE_MS / 1000)
    verdict = check_keyed(expected, stored_keyed(conn, TOPIC, QUEUES))
    assert verdict.ok and verdict.duplicated == 0, str(verdict)


def _stage(txn: Transaction, expected: dict[str, int], per_key: int) -> None:
    send_keyed_rounds(lambda key, body: txn.send(TOPIC, body, key=key), expected, per_key, KEYS)
