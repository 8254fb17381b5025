"""Queue locks of a streaming read: taking them (waiting for another holder), renewing, releasing.

A streaming query is one consumer: its client id holds the locks of every queue it reads. The
driver-side reader takes them when it plans a micro-batch, renews them from a background thread
while the query runs, and releases them in ``stop()``. Each planned partition carries the epoch
the driver held when it planned it; the task pulls with that epoch and never takes a lock itself
(a task that did could take a lock again after the stopping driver released it).

A lock found lost or granted again at another epoch (a broker restart fences every holder; a lapsed
lease lets any client in) is never adopted silently: the group's committed offsets decide
(``connector.spark.group_offsets``). Nobody else consumed the queue: the new epoch is adopted
with a warning. Someone did, or another client holds the lock now: the queue is fenced and the
next driver call fails the query with an error naming that client.

In a cluster (docs/cluster.md) each broker group's master grants the locks of its queues, with
fencing epochs of its own (a new master's are above ``group epoch << 32``, so a failover frees
the group's locks as a restart does, and the same rule takes them back). Renewal runs per group,
so a group failing over delays only its own; unlocking too, so one group down leaves the others'
locks released at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from broker.wire.errors import FencedError, OrderlyMQError
from connector.client import locking
from connector.client.connection import BrokerConnection, pb
from connector.spark.group_offsets import check_not_consumed
from connector.spark.metadata import Connection, by_group, group_connection, group_of
from connector.spark.offsets import QueueRef

__all__ = ["LockKeeper", "describe_holder", "holder_connection", "lock_queues", "unlock"]

log = logging.getLogger(__name__)

# A third of the lease, but at least every few seconds: a lock lost to a broker restart is then
# taken again (or found taken by another client) before a task waiting for it gives up.
MAX_RENEW_S = 5.0
_MIN_RENEW_S = 0.05
_RENEW_CALL_S = 4.0  # one renewal call's deadline: a group failing over is tried again next round

_ADVICE = ("Another live consumer of the group reads them: stop it, use another consumerGroup, or raise the "
           "option lockTimeoutMs to wait for its lease to expire.")


def lock_queues(
    conn: Connection, group: str, client_id: str, queues: Iterable[QueueRef], timeout_ms: int
) -> dict[QueueRef, int]:
    """Lock (or renew) ``queues`` for ``client_id``; ``{queue: epoch}``.

    Waits up to ``timeout_ms`` (option lockTimeoutMs) for queues held by another client, then
    raises ``LockUnavailableError`` naming the holder.
    """
    return locking.lock_queues(conn, group, client_id, queues, timeout_ms / 1000, advice=_ADVICE)


def describe_holder(conn: Connection, group: str, ref: QueueRef) -> pb.QueueLock | None:
    """The live lock of queue ``ref`` in ``group`` (holder, epoch, lease end), or None when free."""
    topic, queue_id = ref
    request = pb.QueryLocksRequest(group=group, topic=topic)
    locks = holder_connection(conn, ref).call("QueryLocks", request).locks
    return next((lock for lock in locks if lock.queue_id == queue_id and lock.client_id), None)


def holder_connection(conn: Connection, ref: QueueRef) -> BrokerConnection:
    """The connection to the broker that grants the lock of ``ref``: in a cluster its group's master."""
    return group_connection(conn, group_of(conn, ref))


class LockKeeper:
    """The driver's queue locks for one (group, client id), renewed by a daemon thread.

    Parameters
    ----------
    conn : BrokerConnection or RoutedConnection
        A single broker's, or a cluster's (locks are then taken and renewed per broker group).
    group, client_id : str
    timeout_ms : int
        How long to wait for a queue held by another client (option lockTimeoutMs).
    left_at : callable
        ``left_at(queue)``: the group offset this client last committed or accepted for the
        queue (None if unknown); the position the rule of ``group_offsets`` compares with.

    Not picklable on purpose: it lives in the driver-side reader process only.
    """

    def __init__(self, conn: Connection, group: str, client_id: str, timeout_ms: int,
                 left_at: Callable[[QueueRef], int | None] = lambda ref: None) -> None:
        self.conn = conn
        self.group = group
        self.client_id = client_id
        self.timeout_ms = timeout_ms
        self.left_at = left_at
        self._epochs: dict[QueueRef, int] = {}
        self._fenced: dict[QueueRef, FencedError] = {}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}  # renewal, per broker group
        self.on_change: Callable[[dict[QueueRef, int]], None] = lambda epochs: None

    def epochs(self, queues: Iterable[QueueRef]) -> dict[QueueRef, int]:
        """Hold ``queues`` (taking the ones never held, waiting for other holders); their epochs.

        Raises the ``FencedError`` of a queue found lost to another consumer.
        """
        queues = sorted(set(queues))
        self.raise_if_fenced(queues)
        with self._mutex:
            missing = [ref for ref in queues if ref not in self._epochs]
        if missing:
            granted = lock_queues(self.conn, self.group, self.client_id, missing, self.timeout_ms)
            with self._mutex:
                self._epochs.update(granted)
            self._unless_released(granted)
            self._changed()
            self._start_renewal()
        with self._mutex:
            return {ref: self._epochs[ref] for ref in queues}

    def raise_if_fenced(self, queues: Iterable[QueueRef] | None = None) -> None:
        with self._mutex:
            fenced = [self._fenced[ref] for ref in sorted(self._fenced) if queues is None or ref in set(queues)]
        if fenced:
            raise fenced[0]

    def recover(self, ref: QueueRef) -> int:
        """Take ``ref`` again after the broker refused its epoch; the new epoch.

        Allowed only when the group's offsets show that nobody else consumed the queue (see the
        module docstring); else the queue is fenced and ``FencedError`` names the other client.
        """
        with self._mutex:
            old = self._epochs.get(ref)
        topic, queue_id = ref
        granted = locking.try_lock(self.conn, self.group, self.client_id, topic, [queue_id])
        self._settle(ref, old, granted.get(queue_id))
        if queue_id in granted:
            self._unless_released([ref])
        self.raise_if_fenced([ref])
        with self._mutex:
            return self._epochs[ref]

    def _unless_released(self, taken: Iterable[QueueRef]) -> None:
        """After recording locks just ``taken``: when ``release`` has begun meanwhile, unlock them
        again and stop. Spark stops a reader with a SIGTERM that unwinds its main thread while a
        planning call's threads (offset commits that take a lost lock back) may still run: a lock
        they take after the release must not outlive the reader and block the next query. Checked
        after recording, so ``release`` either unlocks the lock itself or this does."""
        if not self._stop.is_set():
            return
        taken = sorted(taken)
        with self._mutex:
            for ref in taken:
                self._epochs.pop(ref, None)
        unlock(self.conn, self.group, self.client_id, taken)
        raise OrderlyMQError(f"client {self.client_id!r} of group {self.group!r} stopped and released its queue "
                             "locks; the lock just taken was given back")

    def _settle(self, ref: QueueRef, old: int | None, new: int | None) -> None:
        """Record the answer of a renewal of ``ref``: same epoch, regained, or lost."""
        if new is not None and new == old:
            return
        topic, queue_id = ref
        try:
            if new is None:
                holder = describe_holder(self.conn, self.group, ref)
                who = f"client {holder.client_id!r} (epoch {holder.epoch})" if holder else "another client"
                raise FencedError(
                    f"client {self.client_id!r} lost the lock of queue {topic}/{queue_id} (group {self.group!r}, "
                    f"epoch {old}) to {who}: its lease lapsed or the broker restarted, and that client took it. "
                    "This query stops so that the two do not both consume the queue; restart it to go on from "
                    "the group's offsets"
                )
            check_not_consumed(
                self.conn, self.group, self.client_id, ref, self.left_at(ref),
                context=f"the lock of queue {topic}/{queue_id} held by client {self.client_id!r} at epoch {old} "
                        f"was lost (broker restart or lapsed lease) and granted again at epoch {new}",
            )
        except FencedError as exc:
            with self._mutex:
                self._fenced[ref] = exc
                self._epochs.pop(ref, None)
            log.error("%s", exc)
            return
        log.warning("queue %s/%d: lock of client %s lost and taken again (epoch %s -> %d); the group's offsets show "
                    "no other consumer, reading goes on", topic, queue_id, self.client_id, old, new)
        with self._mutex:
            self._epochs[ref] = new
        self._changed()

    def _changed(self) -> None:
        with self._mutex:
            epochs = dict(self._epochs)
        self.on_change(epochs)

    def _start_renewal(self) -> None:
        """One renewal thread per broker group: a group failing over (its master gone until a
        slave takes over) delays the renewal of its own locks only."""
        with self._mutex:
            held = list(self._epochs)
        for group in by_group(self.conn, held):
            if group not in self._threads:
                name = f"orderlymq-lock-renewal-{group}" if group else "orderlymq-lock-renewal"
                thread = threading.Thread(target=self._renew_loop, args=(group,), name=name, daemon=True)
                self._threads[group] = thread
                thread.start()

    def _renew_loop(self, group: str) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            try:
                lease_s = self.renew(group)
            except OrderlyMQError as exc:  # the route could not be read: try again next round
                log.warning("renewing queue locks of %s failed: %s", self.client_id, exc)
                lease_s = None
            except Exception:  # noqa: BLE001 - were this thread to end, every lock it renews would lapse
                log.exception("renewing queue locks of %s failed unexpectedly; trying again", self.client_id)
                lease_s = None
            wait = MAX_RENEW_S if lease_s is None else min(MAX_RENEW_S, max(_MIN_RENEW_S, lease_s / 3))

    def renew(self, group: str | None = None) -> float | None:
        """Renew every held lock (of broker group ``group`` only, when given) once; the shortest
        lease granted, in seconds (None if unknown).

        An epoch that changed, or a lock not granted, is settled by the rule of the module
        docstring: adopted with a warning, or the queue is fenced.
        """
        with self._mutex:
            held = dict(self._epochs)
        lease_s: float | None = None
        for in_group, refs in by_group(self.conn, held).items():
            if group is None or in_group == group:
                shortest = self._renew_group(in_group, {ref: held[ref] for ref in refs})
                if shortest is not None:
                    lease_s = shortest if lease_s is None else min(lease_s, shortest)
        return lease_s

    def _renew_group(self, group: str, held: dict[QueueRef, int]) -> float | None:
        conn = group_connection(self.conn, group)
        lease_s: float | None = None
        for topic, ids in locking.queues_by_topic(held).items():
            try:
                response = conn.call(
                    "LockBatch",
                    pb.LockBatchRequest(group=self.group, client_id=self.client_id, topic=topic, queue_ids=ids),
                    deadline=time.monotonic() + _RENEW_CALL_S,
                )
            except OrderlyMQError as exc:
                where = f"{topic} on broker group {group}" if group else topic
                log.warning("renewing queue locks of %s for %s failed: %s", where, self.client_id, exc)
                continue
            granted = {lock.queue_id: lock for lock in response.locked}
            for lock in granted.values():
                left = locking.lease_left_ms(lock) / 1000
                lease_s = left if lease_s is None else min(lease_s, left)
            for queue_id in ids:
                lock = granted.get(queue_id)
                try:
                    self._settle((topic, queue_id), held[(topic, queue_id)], None if lock is None else lock.epoch)
                except OrderlyMQError as exc:
                    log.warning("checking queue %s/%d for %s failed: %s", topic, queue_id, self.client_id, exc)
        return lease_s

    def held(self) -> list[QueueRef]:
        with self._mutex:
            return sorted(set(self._epochs) | set(self._fenced))

    def release(self) -> bool:
        """Stop renewing and unlock every queue taken; whether the broker confirmed every unlock."""
        self._stop.set()
        for thread in list(self._threads.values()):
            thread.join(timeout=_RENEW_CALL_S + 1)  # so that no renewal takes a lock again after the unlock
        with self._mutex:
            held = sorted(set(self._epochs) | set(self._fenced))
            self._epochs, self._fenced = {}, {}
        return unlock(self.conn, self.group, self.client_id, held)


def unlock(conn: Connection, group: str, client_id: str, queues: Iterable[QueueRef]) -> bool:
    """``UnlockBatch`` of ``queues`` for ``client_id`` (queues it does not hold are left alone).

    Returns whether every call succeeded (a failure is logged: the lease expires anyway).
    """
    done = True
    for broker_group, refs in by_group(conn, queues).items():  # one group down leaves the others' unlocks
        for topic, ids in locking.queues_by_topic(refs).items():
            try:
                group_connection(conn, broker_group).call(
                    "UnlockBatch",
                    pb.UnlockBatchRequest(group=group, client_id=client_id, topic=topic, queue_ids=ids),
                    retry=False,
                )
            except OrderlyMQError as exc:
                done = False
                log.warning("unlocking queues of %s for %s failed (the lease will expire): %s", topic, client_id, exc)
    return done
