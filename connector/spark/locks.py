"""Queue locks of a streaming read: taking them (waiting for another holder), renewing, releasing.

A streaming query is one consumer: its client id holds the locks of every queue it reads. The
driver-side reader takes them when it plans a micro-batch (so it can commit offsets with the
fencing epoch), renews them from a background thread while the query runs, and releases them in
``stop()``; each task re-locks its queue (a renewal by the same client: same epoch) and pulls
with that epoch, so a task of a query that lost its lock is refused by the broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from broker.wire.errors import OrderlyMQError
from connector.client import locking
from connector.client.connection import BrokerConnection, pb
from connector.spark.offsets import QueueRef

__all__ = ["LockKeeper", "lock_queues"]

log = logging.getLogger(__name__)

DEFAULT_RENEW_S = 20.0


_ADVICE = ("Another live consumer of the group reads them: stop it, use another consumerGroup, or raise the "
           "option lockTimeoutMs to wait for its lease to expire.")


def lock_queues(
    conn: BrokerConnection, group: str, client_id: str, queues: Iterable[QueueRef], timeout_ms: int
) -> dict[QueueRef, int]:
    """Lock (or renew) ``queues`` for ``client_id``; ``{queue: epoch}``.

    Waits up to ``timeout_ms`` (option lockTimeoutMs) for queues held by another client, then
    raises ``LockUnavailableError`` naming the holder.
    """
    return locking.lock_queues(conn, group, client_id, queues, timeout_ms / 1000, advice=_ADVICE)


class LockKeeper:
    """The driver's queue locks for one (group, client id), renewed by a daemon thread.

    Not picklable on purpose: it lives in the driver-side reader process only.
    """

    def __init__(self, conn: BrokerConnection, group: str, client_id: str, timeout_ms: int) -> None:
        self.conn = conn
        self.group = group
        self.client_id = client_id
        self.timeout_ms = timeout_ms
        self._epochs: dict[QueueRef, int] = {}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._renew_s = DEFAULT_RENEW_S

    def epochs(self, queues: Iterable[QueueRef]) -> dict[QueueRef, int]:
        """Hold ``queues`` (taking the ones not yet held, waiting for other holders); their epochs."""
        queues = sorted(set(queues))
        with self._mutex:
            missing = [ref for ref in queues if ref not in self._epochs]
        if missing:
            granted = lock_queues(self.conn, self.group, self.client_id, missing, self.timeout_ms)
            with self._mutex:
                self._epochs.update(granted)
            self._start_renewal(missing[0][0])
        with self._mutex:
            return {ref: self._epochs[ref] for ref in queues}

    def forget(self, ref: QueueRef) -> None:
        """Drop a lock found lost (fenced), so the next ``epochs`` call takes it again."""
        with self._mutex:
            self._epochs.pop(ref, None)

    def _start_renewal(self, topic: str) -> None:
        if self._thread is not None:
            return
        self._renew_s = self._renew_interval(topic)
        self._thread = threading.Thread(target=self._renew_loop, name="orderlymq-lock-renewal", daemon=True)
        self._thread.start()

    def _renew_interval(self, topic: str) -> float:
        """A third of the lease the broker grants (read from the lock's expiry), at most 20 s."""
        try:
            locks = self.conn.call("QueryLocks", pb.QueryLocksRequest(group=self.group, topic=topic)).locks
        except OrderlyMQError:
            return DEFAULT_RENEW_S
        now_ms = time.time() * 1000
        leases = [lock.expires_at_ms - now_ms for lock in locks if lock.client_id == self.client_id]
        if not leases or max(leases) <= 0:
            return DEFAULT_RENEW_S
        return min(DEFAULT_RENEW_S, max(0.05, max(leases) / 3000))

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._renew_s):
            self.renew()

    def renew(self) -> None:
        """Renew every held lock once; a lock found lost is dropped (and re-taken when next needed)."""
        with self._mutex:
            held = list(self._epochs)
        for topic, ids in locking.queues_by_topic(held).items():
            try:
                granted = locking.try_lock(self.conn, self.group, self.client_id, topic, ids)
            except OrderlyMQError as exc:
                log.warning("renewing queue locks of %s for %s failed: %s", topic, self.client_id, exc)
                continue
            with self._mutex:
                for queue_id in ids:
                    epoch = granted.get(queue_id)
                    if epoch is None:
                        log.warning("lost the lock of queue %s/%d (client %s)", topic, queue_id, self.client_id)
                        self._epochs.pop((topic, queue_id), None)
                    else:
                        self._epochs[(topic, queue_id)] = epoch

    def release(self) -> None:
        """Stop renewing and unlock every held queue (best effort: the lease expires anyway)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._mutex:
            held, self._epochs = list(self._epochs), {}
        for topic, ids in locking.queues_by_topic(held).items():
            try:
                self.conn.call(
                    "UnlockBatch",
                    pb.UnlockBatchRequest(group=self.group, client_id=self.client_id, topic=topic, queue_ids=ids),
                    retry=False,
                )
            except OrderlyMQError as exc:
                log.warning(
                    "unlocking queues of %s for %s failed (the lease will expire): %s", topic, self.client_id, exc
                )
