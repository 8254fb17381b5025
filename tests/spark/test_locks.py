"""The driver's LockKeeper against a real broker whose locks lapse or that restarts (a restart
keeps each lock for its holder for one lease, at a new epoch): an epoch that changed is adopted
only when the group's offsets show nobody else consumed."""

from __future__ import annotations

import pytest

from broker.wire.errors import FencedError, OrderlyMQError
from connector.client import locking
from connector.client.connection import BrokerConnection, pb
from connector.spark.locks import LockKeeper
from tests.spark.helpers import create_topic, keyed_events, produce
from tests.support import wait_until


def commit(conn, client_id, epoch, offset, topic, group="g"):
    conn.call("CommitOffset", pb.CommitOffsetRequest(group=group, topic=topic, queue_id=0, offset=offset,
                                                     client_id=client_id, epoch=epoch))


def test_renewal_fences_a_queue_another_client_consumed_while_the_lock_was_free(restartable, topic_name):
    proc, conn = restartable
    create_topic(conn, topic_name, 1)
    produce(conn, topic_name, 1, keyed_events(1, 10))
    ref = (topic_name, 0)
    keeper = LockKeeper(conn, "g", "me", 1000)
    commit(conn, "me", keeper.epochs([ref])[ref], 5, topic_name)
    proc.kill9()
    proc.start()  # the lock is kept for "me"; freed here as a lease that lapsed would be
    conn.call("UnlockBatch", pb.UnlockBatchRequest(group="g", client_id="me", topic=topic_name, queue_ids=[0]))
    rival = locking.try_lock(conn, "g", "rival", topic_name, [0])[0]
    commit(conn, "rival", rival, 9, topic_name)
    conn.call("UnlockBatch", pb.UnlockBatchRequest(group="g", client_id="rival", topic=topic_name, queue_ids=[0]))
    keeper.renew()
    with pytest.raises(FencedError, match="'rival'"):
        keeper.epochs([ref])
    keeper.release()


def test_a_lock_taken_back_after_release_is_given_back(broker, topic_name):
    """A stopping reader's planning thread may still take a lost lock back (``recover``) after
    ``release``: the lock must not outlive the reader, or the next query of the group waits."""
    conn = BrokerConnection(broker.address)
    create_topic(conn, topic_name, 2)
    keeper = LockKeeper(conn, "g", "me", 1000)
    keeper.epochs([(topic_name, 0)])
    keeper.release()
    with pytest.raises(OrderlyMQError, match="released its queue locks"):
        keeper.recover((topic_name, 0))
    with pytest.raises(OrderlyMQError, match="released its queue locks"):
        keeper.epochs([(topic_name, 1)])
    locks = conn.call("QueryLocks", pb.QueryLocksRequest(group="g", topic=topic_name)).locks
    assert [lock.queue_id for lock in locks if lock.client_id] == []
    assert locking.try_lock(conn, "g", "next-query", topic_name, [0, 1]).keys() == {0, 1}


def test_renewal_takes_back_a_lock_kept_over_a_restart_when_nobody_else_consumed(restartable, topic_name):
    proc, conn = restartable
    create_topic(conn, topic_name, 1)
    produce(conn, topic_name, 1, keyed_events(1, 10))
    ref = (topic_name, 0)
    left = {}
    keeper = LockKeeper(conn, "g", "me", 1000, left_at=left.get)
    before = keeper.epochs([ref])[ref]
    commit(conn, "me", before, 5, topic_name)
    left[ref] = 5
    proc.kill9()
    proc.start()
    assert locking.try_lock(conn, "g", "rival", topic_name, [0]) == {}  # kept for "me" over the restart
    keeper.renew()
    after = keeper.epochs([ref])[ref]
    assert after > before
    commit(conn, "me", after, 6, topic_name)  # the adopted epoch is the broker's
    keeper.release()


def test_the_warden_releases_the_locks_of_a_reader_process_that_died(broker, topic_name):
    import subprocess
    import sys

    from tests.support import wait_until

    def holders():
        locks = conn.call("QueryLocks", pb.QueryLocksRequest(group="w", topic=topic_name)).locks
        return sorted(lock.queue_id for lock in locks if lock.client_id == "reader")

    with BrokerConnection(broker.address, retry_timeout=5) as conn:
        create_topic(conn, topic_name, 2)
        # A stand-in for the driver-side reader: it takes the locks, tells its warden, and dies
        # without releasing them (as when Spark or the OS kills it) once the test has seen them.
        code = (
            "import os, sys; from connector.client.connection import BrokerConnection; "
            "from connector.spark.locks import LockKeeper; from connector.spark.lock_warden import Warden; "
            f"conn = BrokerConnection({broker.address!r}); keeper = LockKeeper(conn, 'w', 'reader', 1000); "
            f"warden = Warden({broker.address!r}, 'w', 'reader'); "
            f"warden.holds(keeper.epochs([({topic_name!r}, 0), ({topic_name!r}, 1)])); "
            "print('held', flush=True); sys.stdin.readline(); os._exit(9)"
        )
        reader = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        assert reader.stdout.readline().strip() == "held"
        assert holders() == [0, 1]
        reader.stdin.write("die\n")
        reader.stdin.flush()
        assert reader.wait(timeout=60) == 9
        # Released by the warden, not expired: the broker's lease is 60 s.
        assert wait_until(lambda: not holders(), 20), holders()


def test_renewal_goes_on_after_an_unexpected_failure(broker, topic_name, monkeypatch, caplog):
    """The renewal thread ended on any error but the broker's own, and every lock it renewed
    then lapsed under a running query: it now tries again at its next round."""
    conn = BrokerConnection(broker.address)
    create_topic(conn, topic_name, 1)
    keeper = LockKeeper(conn, "g", "me", 1000)
    renew, raised, renewed = keeper.renew, [], []

    def failing_once(group=None):
        if not raised:
            raised.append(RuntimeError("an unexpected failure of a renewal"))
            raise raised[0]
        renewed.append(renew(group))
        return renewed[-1]

    monkeypatch.setattr(keeper, "renew", failing_once)
    epoch = keeper.epochs([(topic_name, 0)])[(topic_name, 0)]
    try:
        assert wait_until(lambda: renewed, timeout=30)
        assert "failed unexpectedly; trying again" in caplog.text
        locks = conn.call("QueryLocks", pb.QueryLocksRequest(group="g", topic=topic_name)).locks
        assert [(lock.client_id, lock.epoch) for lock in locks if lock.queue_id == 0] == [("me", epoch)]
    finally:
        keeper.release()
        conn.close()
