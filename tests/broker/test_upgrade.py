"""A broker upgraded in place keeps everything an older one stored.

The broker of the first release (``tests.support.FIRST_RELEASE``, run from this
repository's history) writes a data dir: keyed messages, a committed offset, a producer's
numbered send, a committed transaction and an open one. It is stopped, cleanly or by kill -9,
and this broker opens the same dir. Every message must be there once and in per-key order, the
offset committed, the numbered send recognised when resent (a producer that was mid-flight during
the upgrade resends it), and the open transaction still committable.
"""

from __future__ import annotations

import pytest

from broker.launcher import BrokerProcess
from broker.wire import codec
from connector.client import Admin, Producer, PullConsumer
from connector.client.connection import BrokerConnection, pb
from connector.history import check_keyed
from tests.support import FIRST_RELEASE, older_broker, stored_keyed

TOPIC, QUEUES, KEYS = "upgraded", 4, 10


def _numbered_send(address: str) -> pb.SendResponse:
    batch = codec.encode(codec.messages_to_batch([{"key": "numbered", "body": b"numbered:0"}]))
    with BrokerConnection(address) as conn:
        return conn.call("Send", pb.SendRequest(topic=TOPIC, queue_id=1, batch=batch, producer_id="mid-flight",
                                                sequence=5))


def _write_everything(address: str) -> dict[str, int]:
    """What the older broker stores; the messages each key should have."""
    with Admin(address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    expected = {}
    with Producer(address) as producer:
        for i in range(40 * KEYS):
            key = f"k{i % KEYS}"
            producer.send_async(TOPIC, f"{key}:{i // KEYS}", key=key)
            expected[key] = i // KEYS + 1
        producer.flush()
        with producer.transaction("committed-before") as tx:
            for i in range(5):
                tx.send(TOPIC, f"committed:{i}", key="committed")
        left_open = producer.transaction("open-across", timeout_ms=600_000).begin()
        for i in range(5):
            left_open.send(TOPIC, f"open:{i}", key="open")
    with PullConsumer(address, group="readers") as consumer:
        consumer.commit(TOPIC, 0, 7)
    assert not _numbered_send(address).duplicate
    return expected | {"committed": 5, "open": 5, "numbered": 1}


@pytest.mark.parametrize("stop", ["stop", "kill9"])
def test_a_data_dir_of_the_first_release_opens_with_everything_it_stored(tmp_path, stop):
    old = older_broker(tmp_path, FIRST_RELEASE).start()
    expected = _write_everything(old.address)
    getattr(old, stop)()

    new = BrokerProcess(old.data_dir, port=old.port, log_path=tmp_path / "upgraded.log").start()
    try:
        assert _numbered_send(new.address).duplicate, "a resend of a send the older broker stored was stored again"
        with Producer(new.address) as producer:
            producer.send(TOPIC, f"k0:{expected['k0']}", key="k0")  # after the older broker's, in the same queue
        expected["k0"] += 1
        with BrokerConnection(new.address) as conn:
            committed = conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="open-across")).count
            offset = conn.call("GetOffset", pb.GetOffsetRequest(group="readers", topic=TOPIC, queue_id=0)).offset
            stored = stored_keyed(conn, TOPIC, QUEUES)
    finally:
        new.stop()
    assert committed == 5 and offset == 7
    verdict = check_keyed(expected, stored)
    assert verdict.ok and verdict.lost == 0, str(verdict)
