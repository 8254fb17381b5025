"""Break 7: a send that raised must not be stored later, unless its error said the outcome is unknown.

Keyed producer threads send ``key:seq`` messages synchronously, each attempt tagged with an
``attempt`` property. The broker subprocess is frozen (SIGSTOP) once every producer has been
acknowledged since the last thaw, and thawed once every producer has seen a send fail, for
``PROFILE.broker_cycles`` cycles. Half the producers look their topic's route up before every send
(``route_ttl=0``), so during a freeze their sends fail before reaching the stream (plainly); the
others' sends reach the stream and come back as of unknown outcome. A producer does what the documentation asks of an application:
it sends a plain ``BrokerUnavailableError`` again (a new attempt of the same ``key:seq``) and
resolves a ``SendOutcomeUnknownError`` with ``Producer.resolve``, never resending it.

Checked on what the broker stored, queue by queue in offset order, with ``connector.history``:
every acknowledged message stored exactly once and in per-key order, and no attempt that failed
plainly stored at all.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.errors import BrokerUnavailableError, SendOutcomeUnknownError
from connector.history import Delivery, History
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import body, parse_body
from tests.support import pull_all, wait_until

DELIVERY_TIMEOUT = 2.0  # seconds; the producers' retry_timeout
ACKS_BETWEEN_FREEZES = 20  # acknowledgements each producer gets between two freezes


class FreezingProducer(threading.Thread):
    """Sends its keys in turn, one message at a time, handling failures as the docs say."""

    def __init__(self, address: str, topic: str, keys: list[str], history: History, *, route_ttl: float) -> None:
        super().__init__(name=f"producer-{keys[0]}", daemon=True)
        self.address, self.topic, self.keys, self.history = address, topic, keys, history
        self.route_ttl = route_ttl
        self.stop = threading.Event()
        self.failed = threading.Event()  # a send failed since the event was last cleared
        self.acks = 0
        self.unknown = self.plain = self.duplicates_settled = 0
        self.failed_attempts: set[str] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self.address, retry_timeout=DELIVERY_TIMEOUT, route_ttl=self.route_ttl) as producer:
                sent = 0
                while not self.stop.is_set():
                    key = self.keys[sent % len(self.keys)]
                    self._deliver(producer, key, sent // len(self.keys))
                    sent += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _deliver(self, producer: Producer, key: str, seq: int) -> None:
        while True:
            attempt = uuid.uuid4().hex
            try:
                producer.send(self.topic, body(key, seq), key=key, properties={"attempt": attempt})
            except SendOutcomeUnknownError as exc:
                self.unknown += 1
                self.failed.set()
                (result,) = producer.resolve(exc)  # waits for the thaw; never resend
                self.duplicates_settled += result.duplicate
            except BrokerUnavailableError:
                self.plain += 1
                self.failed_attempts.add(attempt)
                self.failed.set()
                continue  # never stored: the application sends it again
            self.history.sent(key, seq, acked=True)
            self.acks += 1
            return


def _acked_more(producers: list[FreezingProducer], count: int):
    """A predicate: every producer got ``count`` more acknowledgements than now."""
    marks = [p.acks for p in producers]
    return lambda: all(p.acks >= m + count for p, m in zip(producers, marks, strict=True))


def _stored(address: str, topic: str, queues: int) -> tuple[list[Delivery], set[str]]:
    """Deliveries in queue-then-offset order, and the attempt ids of every stored message."""
    deliveries, attempts = [], set()
    with BrokerConnection(address) as conn:
        for queue_id in range(queues):
            table = pull_all(conn, topic, queue_id)
            rows = zip(table.column("body").to_pylist(), table.column("queue_offset").to_pylist(),
                       table.column("properties").to_pylist(), strict=True)
            for raw, offset, props in rows:
                key, seq = parse_body(raw)
                deliveries.append(Delivery(key, seq, consumer="log", queue_id=queue_id, offset=offset))
                attempts.add(dict(props or {}).get("attempt", ""))
    return deliveries, attempts


def test_freezes_under_keyed_producers_store_every_acknowledged_message_once_and_no_failed_one(
    broker_proc, topic_name, fault_report
):
    broker = broker_proc(flush="sync")
    queues = 4
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, queues)
    history = History()
    producers = [
        FreezingProducer(broker.address, topic_name, [f"p{p}k{k}" for k in range(PROFILE.keys_per_producer)], history,
                         route_ttl=0.0 if p % 2 else 30.0)
        for p in range(PROFILE.producers)
    ]
    for producer in producers:
        producer.start()
    frozen_for, recovery = [], []
    try:
        for _ in range(PROFILE.broker_cycles):
            assert wait_until(_acked_more(producers, ACKS_BETWEEN_FREEZES), 120)
            for producer in producers:
                producer.failed.clear()
            os.kill(broker.pid, signal.SIGSTOP)
            frozen_at = time.monotonic()
            try:
                assert wait_until(lambda: all(p.failed.is_set() for p in producers), 120), "a send never failed"
            finally:
                os.kill(broker.pid, signal.SIGCONT)
            thawed_at = time.monotonic()
            frozen_for.append(thawed_at - frozen_at)
            assert wait_until(_acked_more(producers, 1), 120)
            recovery.append(time.monotonic() - thawed_at)
    finally:
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join(timeout=120)
    assert [p.error for p in producers] == [None] * len(producers)
    deliveries, attempts = _stored(broker.address, topic_name, queues)
    history.extend_deliveries(deliveries)
    verdict = history.check()
    failed_attempts = set().union(*(p.failed_attempts for p in producers))
    stored_failures = failed_attempts & attempts
    fault_report(
        "send outcome under broker freezes",
        {"stored log": verdict},
        freezes=PROFILE.broker_cycles,
        unknown_outcomes=sum(p.unknown for p in producers),
        unknown_already_stored=sum(p.duplicates_settled for p in producers),
        plain_failures=sum(p.plain for p in producers),
        plain_failures_stored=len(stored_failures),
        max_frozen_s=round(max(frozen_for), 2),
        max_recovery_s=round(max(recovery), 2),
    )
    assert verdict.ok and verdict.duplicated == 0 and verdict.deliveries == verdict.acked, verdict
    assert not stored_failures, f"{len(stored_failures)} plainly failed attempt(s) were stored"
