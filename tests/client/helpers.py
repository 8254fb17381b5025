"""Helpers of the client tests: quick consumer settings, keyed traffic and a consumption log judged by
``connector.history`` (the one strict checker), in the order messages were consumed."""

from __future__ import annotations

import threading
import time

from connector.client import ConsumeOrderlyStatus, Message, Producer
from connector.history import Verdict, check_keyed

# Consumer settings for quick rebalances and suspensions. Leases stay in seconds, with margins that a
# loaded two-core machine keeps: renewal every 0.5 s, consumption allowed up to 3 s after the last
# renewal, for a broker lease of 5 s.
FAST = dict(
    rebalance_interval=0.3,
    heartbeat_interval=0.3,
    lock_interval=0.5,
    lock_max_live=3.0,
    unlock_delay=0.1,
    suspend_ms=50,
    idle_pull_ms=20,
    consume_threads=2,
    retry_timeout=5.0,
)
# The same for a concurrent consumer, which takes no locks and never suspends a queue.
CONCURRENT = {k: v for k, v in FAST.items() if k not in ("lock_interval", "lock_max_live", "unlock_delay", "suspend_ms")}
# Broker settings to match: a lock lease of 5 s and members expiring 3 s after their last heartbeat.
FAST_BROKER = dict(lock_lease_ms=5000, consumer_timeout_ms=3000)


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

    def verdict(self, expected: dict) -> Verdict:
        """``connector.history``'s judgement of the log against ``expected[key]`` messages per key
        (sequence numbers ``0 .. n - 1``, all acknowledged), in consumption order."""
        with self._lock:
            entries = list(self.entries)
        return check_keyed({str(k): n for k, n in expected.items()}, [(str(key), seq) for _, key, seq, _, _ in entries])

    def check(self, expected: dict) -> int:
        """Assert that nothing was lost or consumed out of order (a replay from the committed offset
        is a duplicate, not a reordering, if it follows the key's order); return the duplicates."""
        verdict = self.verdict(expected)
        assert verdict.lost == verdict.out_of_order == verdict.unexpected == 0, verdict  # duplicates are allowed
        return verdict.duplicated
