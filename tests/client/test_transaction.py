"""Producer transactions: all or nothing, per-key order kept, finished ids refused."""

from __future__ import annotations

import pytest

from broker.wire.routing import queue_for_key
from connector.client import PullConsumer
from connector.errors import QueueOutOfRangeError, TopicNotFoundError, TransactionError

from .test_producer import assert_per_key_order, read_topic


def test_commit_makes_every_message_visible_in_send_order(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 3)
    keys = [f"acct-{i}" for i in range(6)]
    with producer.transaction() as tx:
        for seq in range(10):
            for key in keys:
                result = tx.send(topic_name, str(seq), key=key)
                assert (result.queue_id, result.queue_offset) == (queue_for_key(key, 3), -1)
        tx.send_batch(topic_name, [{"key": key, "body": "10"} for key in keys])
        assert read_topic(broker.address, topic_name) == {0: [], 1: [], 2: []}  # staged, not visible
    assert tx.state == "COMMITTED"
    assert_per_key_order(read_topic(broker.address, topic_name), {key: 11 for key in keys}, 3)


def test_an_exception_aborts_and_nothing_becomes_visible(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)
    with pytest.raises(ZeroDivisionError):
        with producer.transaction() as tx:
            tx.send(topic_name, b"debit", key="a")
            tx.send(topic_name, b"credit", key="b")
            1 / 0  # noqa: B018
    assert tx.state == "ABORTED"
    producer.send(topic_name, b"after", key="a")
    stored = read_topic(broker.address, topic_name)
    assert [m.body for ms in stored.values() for m in ms] == [b"after"]


def test_a_failed_staged_send_aborts_the_transaction(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)
    tx = producer.transaction().begin()
    tx.send(topic_name, b"one", key="a")
    with pytest.raises(QueueOutOfRangeError):
        tx.send(topic_name, b"two", queue_id=9)  # refused before anything is staged
    assert tx.state == "OPEN"
    admin.delete_topic(topic_name)  # the producer's cached route still names it: the broker refuses
    with pytest.raises(TopicNotFoundError):
        tx.send(topic_name, b"three", key="a")
    assert tx.state == "ABORTED"
    with pytest.raises(TransactionError, match="ABORTED"):
        tx.send(topic_name, b"four", key="a")
    admin.create_topic(topic_name, 2)
    with pytest.raises(TransactionError):
        tx.commit()
    with PullConsumer(broker.address) as consumer:
        assert all(consumer.query_offsets(topic_name, q)[1] == 0 for q in range(2))


def test_a_finished_transaction_id_cannot_be_reused(admin, producer, topic_name):
    admin.create_topic(topic_name, 1)
    with producer.transaction("batch-7") as tx:
        tx.send(topic_name, b"x", key="k")
    with pytest.raises(TransactionError, match="already COMMITTED"):
        producer.transaction("batch-7").begin()


def test_a_broker_older_than_numbering_gets_no_staged_send_twice(tmp_path, topic_name):
    """A broker from before numbered staging ignores the numbers, so a resent staged send would be
    staged twice: it says so when the transaction begins, and a send it does not answer (killed -9,
    back a second later) fails the transaction instead of being sent again."""
    import threading

    from connector.client import Admin, Producer
    from connector.errors import BrokerUnavailableError
    from tests.support import BROKER_BEFORE_NUMBERED_STAGING, older_broker

    proc = older_broker(tmp_path, BROKER_BEFORE_NUMBERED_STAGING).start()
    try:
        with Admin(proc.address) as admin, Producer(proc.address, retry_timeout=30.0) as producer:
            admin.create_topic(topic_name, 2)
            tx = producer.transaction().begin()
            tx.send(topic_name, "0", key="acct-0")
            proc.kill9()
            restart = threading.Timer(1.0, proc.start)
            restart.start()
            with pytest.raises(BrokerUnavailableError):
                tx.send(topic_name, "1", key="acct-0")
            assert tx.state == "ABORTED"
            restart.join()
        assert read_topic(proc.address, topic_name) == {0: [], 1: []}
    finally:
        proc.kill9()


def test_a_transaction_rides_out_a_broker_restart(tmp_path, topic_name):
    """The broker is killed -9 between staged sends and comes back on its port a second later: the
    next send waits for it (numbered, it may be resent without being staged twice), and the
    commit makes every message visible once, each key in order."""
    import threading

    from connector.client import Admin, Producer
    from tests.faults.brokers import broker_process

    proc = broker_process(tmp_path / "broker").start()
    keys = [f"acct-{i}" for i in range(4)]
    try:
        with Admin(proc.address) as admin, Producer(proc.address, retry_timeout=30.0) as producer:
            admin.create_topic(topic_name, 2)
            tx = producer.transaction().begin()
            for seq in range(12):
                if seq == 6:
                    proc.kill9()
                    threading.Timer(1.0, proc.start).start()
                for key in keys:
                    tx.send(topic_name, str(seq), key=key)
            assert tx.commit() == 12 * len(keys)
        assert_per_key_order(read_topic(proc.address, topic_name), {key: 12 for key in keys}, 2)
    finally:
        proc.kill9()
