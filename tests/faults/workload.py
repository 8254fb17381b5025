"""Traffic of the fault scenarios: keyed producers that record every send, and consumers that
record every delivery, both into a ``History``.

A message's body is ``"<key>:<seq>"``, so a delivery is judged from what was stored, not from
what the consumer expected to get.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

from broker.wire.errors import OrderlyMQError
from connector.client import ConsumeOrderlyStatus, Message, OrderlyConsumer, Producer
from connector.client.connection import BrokerConnection, pb
from connector.history import Delivery, History
from tests.client.helpers import FAST
from tests.faults.fault_profile import PROFILE
from tests.support import pull_all, wait_until

__all__ = [
    "FAST_CONSUMER",
    "KeyedProducer",
    "ack_stall",
    "body",
    "first_ack_after",
    "keyed_producers",
    "parse_body",
    "recording_listener",
    "shutdown_all",
    "start_orderly_group",
    "stored_deliveries",
]

# The client tests' fast orderly consumers, retrying long enough to outlive a broker restart.
FAST_CONSUMER = FAST | dict(retry_timeout=60.0)


def body(key: str, seq: int) -> bytes:
    return f"{key}:{seq}".encode()


def parse_body(raw: bytes) -> tuple[str, int]:
    key, _, seq = raw.decode().rpartition(":")
    return key, int(seq)


class KeyedProducer(threading.Thread):
    """Sends ``key:seq`` messages for its keys in turn, at most ``rate`` a second, until stopped
    (or until ``limit`` messages were sent).

    Sends are asynchronous with at most ``window`` unacknowledged; each send's outcome goes to the
    history when known (a send that fails, e.g. after the broker stayed down past the producer's
    retry timeout, is recorded as not acknowledged and the next sequence number is used).
    """

    def __init__(self, address: str, topic: str, keys: list[str], history: History, *, rate: float,
                 window: int = 32, retry_timeout: float = 60.0, limit: int | None = None, **client) -> None:
        super().__init__(name=f"producer-{keys[0]}", daemon=True)
        self.address, self.topic, self.keys = address, topic, keys
        self.client = client  # tls=, credentials= of the Producer
        self.history = history
        self.rate, self.window, self.retry_timeout, self.limit = rate, window, retry_timeout, limit
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.ack_times: list[float] = []  # wall clock of each acknowledgement

    def run(self) -> None:
        pending: deque[tuple[str, int, Future]] = deque()
        seqs = dict.fromkeys(self.keys, 0)
        started, sent = time.monotonic(), 0
        with Producer(self.address, retry_timeout=self.retry_timeout, **self.client) as producer:
            while not self.stop.is_set() and (self.limit is None or sent < self.limit):
                key = self.keys[sent % len(self.keys)]
                seq = seqs[key]
                seqs[key] = seq + 1
                future = producer.send_async(self.topic, body(key, seq), key=key)
                future.add_done_callback(self._note_ack)
                pending.append((key, seq, future))
                sent += 1
                while len(pending) >= self.window:
                    self._settle(*pending.popleft())
                ahead = sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self.stop.wait(ahead)
            while pending:
                self._settle(*pending.popleft())

    def _note_ack(self, future: Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self.ack_times.append(time.time())

    def _settle(self, key: str, seq: int, future: Future) -> None:
        try:
            future.result(timeout=self.retry_timeout * 3)
            self.history.sent(key, seq, acked=True)
        except (OrderlyMQError, TimeoutError) as exc:
            self.history.sent(key, seq, acked=False)
            if len(self.failures) < 5:
                self.failures.append(f"{key}:{seq}: {exc}")


def keyed_producers(address: str, topic: str, history: History, **options) -> list[KeyedProducer]:
    """The fault profile's producers on ``topic``, not started: each with keys of its own, at the
    profile's send rate unless ``rate`` is given (``options``: the rest of ``KeyedProducer``'s)."""
    return [KeyedProducer(address, topic, [f"p{p}-k{k}" for k in range(PROFILE.keys_per_producer)], history,
                          **(dict(rate=PROFILE.send_rate) | options))
            for p in range(PROFILE.producers)]


def send_all(address: str, topic: str, keys: list[str], history: History, count: int) -> list[str]:
    """``count`` messages over ``keys`` in turn, from one producer at ten times the profile's send
    rate; returns once every one is answered, with the failures."""
    producer = KeyedProducer(address, topic, keys, history, rate=10 * PROFILE.send_rate, limit=count)
    producer.start()
    producer.join()
    return producer.failures


def first_ack_after(producers: list[KeyedProducer], moment: float) -> float | None:
    """Seconds from ``moment`` (wall clock) to the first acknowledgement after it, None before one."""
    later = [t for p in producers for t in list(p.ack_times) if t > moment]
    return min(later) - moment if later else None


def ack_stall(producers: list[KeyedProducer], start: float, end: float) -> float:
    """The longest time without any acknowledgement to ``producers`` between ``start`` and
    ``end`` (wall clock): the outage their clients saw."""
    acks = sorted([start, end] + [t for p in producers for t in list(p.ack_times) if start <= t <= end])
    return max(b - a for a, b in zip(acks, acks[1:], strict=False))


def recording_listener(history: History, name: str):
    """An orderly listener that records each message it is handed, in order."""

    def listen(messages: list[Message], context) -> ConsumeOrderlyStatus:
        for m in messages:
            key, seq = parse_body(m.body)
            history.delivered(key, seq, consumer=name, queue_id=m.queue_id, offset=m.queue_offset)
        return ConsumeOrderlyStatus.SUCCESS

    return listen


def start_orderly_group(address: str, topic: str, group: str, members: int, history: History,
                        **settings) -> list[OrderlyConsumer]:
    """``members`` orderly consumers of ``group`` on ``topic``, started, recording into ``history``."""
    consumers = []
    for i in range(members):
        name = f"{group}-c{i}"
        consumer = OrderlyConsumer(address, group, recording_listener(history, name), client_id=name,
                                   **(FAST_CONSUMER | settings))
        consumer.subscribe(topic)
        consumer.start()
        consumers.append(consumer)
    return consumers



def stop_all(producers: list[threading.Thread]) -> None:
    """Stop the producer threads (each has a ``stop`` event) and wait for them."""
    for producer in producers:
        producer.stop.set()
    for producer in producers:
        producer.join()


def drain(producers: list[threading.Thread], history: History, timeout: float = 120.0) -> bool:
    """Stop the producer threads, then wait until every acknowledged send was delivered (False
    when that did not happen within ``timeout``)."""
    stop_all(producers)
    return bool(wait_until(history.delivered_all_acked, timeout=timeout))


def shutdown_all(consumers: list[OrderlyConsumer]) -> None:
    for consumer in consumers:
        consumer.shutdown()


def consumer_states(consumers: list[OrderlyConsumer]) -> list[str]:
    """Each consumer's queues as they stand (position, lock, buffered): why a queue stopped."""
    # list() copies the table in one step, while the consumer's threads may change it
    return [f"{consumer.client_id}: {sorted(map(repr, list(consumer.table.values())))}" for consumer in consumers]


def undelivered_where(stored: list[Delivery], lost: list[tuple[str, int]]) -> dict[int, tuple[int, int, int]]:
    """Where in the log the messages never delivered sit: per queue, (count, first, last offset)."""
    missing = set(lost)
    where: dict[int, tuple[int, int, int]] = {}
    for d in stored:
        if (d.key, d.seq) in missing:
            count, first, last = where.get(d.queue_id, (0, d.offset, d.offset))
            where[d.queue_id] = (count + 1, min(first, d.offset), max(last, d.offset))
    return where


def stored_deliveries(conn: BrokerConnection, topic: str) -> list[Delivery]:
    """Every message stored in ``topic`` (from the first offset retention left), queue by queue
    in offset order, as deliveries."""
    count = conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic)).queue_count
    out = []
    for queue_id in range(count):
        first = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic, queue_id=queue_id)).min_offset
        table = pull_all(conn, topic, queue_id, first)
        for raw, offset in zip(table.column("body").to_pylist(), table.column("queue_offset").to_pylist(),
                               strict=True):
            key, seq = parse_body(raw)
            out.append(Delivery(key, seq, consumer="log", queue_id=queue_id, offset=offset))
    return out
