"""What a send reports when the broker freezes (SIGSTOP), and that the report is true.

A send written to the stream and not answered within the delivery timeout fails with
``SendOutcomeUnknownError`` (it may be stored); the producer settles it once the broker is back,
exactly once and before later messages of its queue. A send never written fails with a plain
``BrokerUnavailableError`` and is never stored. Every verdict comes from ``connector.history``
on what the broker stored, in queue order.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from broker.launcher import BrokerProcess
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.errors import BrokerUnavailableError, InvalidRequestError, SendOutcomeUnknownError
from connector.history import History
from tests.faults.workload import body, stored_deliveries

DELIVERY_TIMEOUT = 2.0  # seconds: short, so the test waits little for each expiry


@pytest.fixture
def frozen_broker(tmp_path):
    """A broker subprocess and ``freeze()`` / ``thaw()``; always thawed and stopped at the end."""
    proc = BrokerProcess(tmp_path / "data", "--flush", "sync").start()
    state = {"frozen": False}

    def freeze() -> None:
        os.kill(proc.pid, signal.SIGSTOP)
        state["frozen"] = True

    def thaw() -> None:
        os.kill(proc.pid, signal.SIGCONT)
        state["frozen"] = False

    proc.freeze, proc.thaw = freeze, thaw
    yield proc
    if state["frozen"]:
        thaw()
    proc.kill9()


def test_a_send_cut_off_by_a_freeze_is_unknown_then_settled_once_and_a_never_sent_one_never_appears(
    frozen_broker, topic_name, record_property
):
    with Admin(frozen_broker.address) as admin:
        admin.create_topic(topic_name, 1)
    history = History()
    # One message per batch and one batch of the queue on the wire: the second send waits, never written.
    with Producer(frozen_broker.address, retry_timeout=DELIVERY_TIMEOUT, max_in_flight_per_queue=1,
                  max_batch_messages=1) as producer:
        producer.send(topic_name, body("k", 0), key="k")
        history.sent("k", 0, acked=True)
        frozen_broker.freeze()
        started = time.monotonic()
        written = producer.send_async(topic_name, body("k", 1), key="k")  # on the stream, never answered
        held = producer.send_async(topic_name, body("k", 2), key="k", properties={"attempt": "first"})
        with pytest.raises(SendOutcomeUnknownError) as unknown:
            written.result()
        record_property("seconds_to_fail", round(time.monotonic() - started, 2))
        with pytest.raises(BrokerUnavailableError) as plain:
            held.result()
        assert not isinstance(plain.value, SendOutcomeUnknownError), "a send never written must be a plain failure"
        assert "not sent" in str(plain.value)
        error = unknown.value
        assert (error.topic, error.queue_id, error.producer_id, error.sequence) == (
            topic_name, 0, producer.producer_id, 1)
        with pytest.raises(BrokerUnavailableError, match="still unknown"):
            producer.resolve(error, timeout=0.2)  # still frozen: the outcome is not known yet
        frozen_broker.thaw()
        (settled,) = producer.resolve(error, timeout=60)
        history.sent("k", 1, acked=True)
        again = producer.send(topic_name, body("k", 2), key="k", properties={"attempt": "second"})
        history.sent("k", 2, acked=True)
        assert settled.queue_offset == 1 and again.queue_offset == 2
    with BrokerConnection(frozen_broker.address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic_name))
    verdict = history.check()
    assert verdict.ok, verdict
    assert verdict.deliveries == 3, verdict  # once each, and the first attempt of seq 2 is not there
    with Producer(frozen_broker.address) as other:
        with pytest.raises(InvalidRequestError, match="this producer"):
            other.resolve(error)


def test_a_key_stays_in_order_when_the_application_resends_its_plain_failures(frozen_broker, topic_name):
    """The application pattern the docs give: resend plain failures, resolve unknown ones."""
    with Admin(frozen_broker.address) as admin:
        admin.create_topic(topic_name, 2)
    history = History()
    with Producer(frozen_broker.address, retry_timeout=DELIVERY_TIMEOUT) as producer:
        pending = [producer.send_async(topic_name, body("a", s), key="a") for s in range(3)]
        assert all(f.result().queue_offset >= 0 for f in pending)
        for s in range(3):
            history.sent("a", s, acked=True)
        frozen_broker.freeze()
        futures = {s: producer.send_async(topic_name, body("a", s), key="a") for s in range(3, 8)}
        unknown, failed = [], []
        for s, future in futures.items():
            try:
                future.result()
                history.sent("a", s, acked=True)
            except SendOutcomeUnknownError as exc:
                unknown.append((s, exc))
            except BrokerUnavailableError:
                failed.append(s)
        assert unknown, "the first send was written to the stream before the freeze took effect"
        frozen_broker.thaw()
        for s, exc in unknown:
            producer.resolve(exc, timeout=60)
            history.sent("a", s, acked=True)
        for s in failed:
            producer.send(topic_name, body("a", s), key="a")
            history.sent("a", s, acked=True)
    with BrokerConnection(frozen_broker.address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic_name))
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == 8, verdict
