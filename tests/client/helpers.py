"""Helpers of the client tests: fast consumer settings, keyed traffic and a per-key order checker."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from connector.client import ConsumeOrderlyStatus, Message, Producer

# Consumer settings that make rebalance, renewal and suspension happen within a fraction of a second.
FAST = dict(
    rebalance_interval=0.3,
    heartbeat_interval=0.1,
    lock_interval=0.15,
    lock_max_live=0.7,
    unlock_delay=0.1,
    suspend_ms=50,
    idle_pull_ms=20,
    consume_threads=2,
    retry_timeout=5.0,
)
# Broker settings to match: a lock lease of 1.5 s and members expiring 1 s after their last heartbeat.
FAST_BROKER = dict(lock_lease_ms=1500, consumer_timeout_ms=1000)


def send_keyed(producer: Producer, topic: str, keys: list, per_key: int, start: dict | None = None, **kw) -> dict:
    """Send ``per_key`` messages for every key, interleaved; body ``"<seq>"``. Returns key -> next seq."""
    seqs = dict(start or {})
    futures = []
    for _ in range(per_key):
        for key in keys:
            seq = seqs.get(key, 0)
            futures.append(producer.send_async(topic, str(seq).encode(), key=key, **kw))
            seqs[key] = seq + 1
    for f in futures:
        f.result(timeout=30)
    return seqs


class OrderLog:
    """What listeners consumed, in consumption order, across consumers of one test."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[tuple[str, str, int, int, int]] = []  # consumer, key, seq, queue id, offset

    def record(self, consumer: str, messages: list[Message]) -> None:
        with self._lock:
            for m in messages:
                self.entries.append((consumer, m.key, int(m.body), m.queue_id, m.queue_offset))

    def listener(self, name: str, status=ConsumeOrderlyStatus.SUCCESS, delay: float = 0.0):
        def listen(messages, context):
            self.record(name, messages)
            if delay:
                time.sleep(delay)
            return status

        return listen

    def distinct(self) -> set[tuple[str, int]]:
        with self._lock:
            return {(key, seq) for _, key, seq, _, _ in self.entries}

    def count(self) -> int:
        with self._lock:
            return len(self.entries)

    def has_all(self, expected: dict) -> bool:
        return len(self.distinct()) >= sum(expected.values())

    def check(self, expected: dict) -> int:
        """Assert completeness and per-key order; return the number of duplicates.

        Per key, consumption must be runs of consecutive sequence numbers: a run continues at
        ``last + 1`` and may only restart at or below the highest number seen (a replay from the
        committed offset, which at-least-once delivery allows). A jump past ``highest + 1`` would be
        a message consumed before an earlier one of its key.
        """
        with self._lock:
            entries = list(self.entries)
        last: dict[str, int] = {}
        highest: dict[str, int] = defaultdict(lambda: -1)
        for consumer, key, seq, qid, offset in entries:
            prev = last.get(key)
            if prev is None or seq != prev + 1:
                assert seq <= highest[key] or (prev is None and seq == 0), (
                    f"key {key!r}: seq {seq} consumed by {consumer} at {qid}@{offset} after {prev} "
                    f"(highest {highest[key]}): out of order"
                )
            last[key] = seq
            highest[key] = max(highest[key], seq)
        missing = {(str(k), s) for k, n in expected.items() for s in range(n)} - {(k, s) for _, k, s, _, _ in entries}
        assert not missing, f"{len(missing)} message(s) never consumed, e.g. {sorted(missing)[:5]}"
        return len(entries) - len({(k, s) for _, k, s, _, _ in entries})
