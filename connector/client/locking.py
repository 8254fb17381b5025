"""Taking queue locks with a deadline: retry ``LockBatch`` while another client holds a queue,
then fail with a message that names the holder and when its lease ends."""

from __future__ import annotations

import time
from collections.abc import Iterable

from broker.wire.errors import LockUnavailableError, OrderlyMQError
from connector.client.connection import BrokerConnection, pb

__all__ = ["lease_left_ms", "lock_queues", "queues_by_topic", "try_lock"]

Queue = tuple[str, int]  # (topic, queue id)


def try_lock(conn: BrokerConnection, group: str, client_id: str, topic: str, queue_ids: list[int]) -> dict[int, int]:
    """One ``LockBatch``: ``{queue_id: epoch}`` for exactly the queues ``client_id`` now holds."""
    response = conn.call(
        "LockBatch", pb.LockBatchRequest(group=group, client_id=client_id, topic=topic, queue_ids=queue_ids)
    )
    return {lock.queue_id: lock.epoch for lock in response.locked}


def lock_queues(conn: BrokerConnection, group: str, client_id: str, queues: Iterable[Queue], timeout_s: float,
                *, advice: str) -> dict[Queue, int]:
    """Lock (or renew) ``queues`` for ``client_id``; ``{queue: epoch}``.

    Retries with backoff for up to ``timeout_s`` while other clients hold some of them, then
    raises ``LockUnavailableError`` naming each holder, followed by ``advice`` (what to do).
    Every attempt asks for all of ``queues``, so the ones already granted are renewed while the
    rest are waited for (a wait longer than the lease would otherwise let them lapse), and the
    epochs returned are those of the last grant.
    """
    wanted = sorted(set(queues))
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        held = {}
        for topic, ids in queues_by_topic(wanted).items():
            granted = try_lock(conn, group, client_id, topic, ids)
            held.update({(topic, queue_id): epoch for queue_id, epoch in granted.items()})
        missing = [q for q in wanted if q not in held]
        if not missing:
            return held
        if time.monotonic() + delay > deadline:
            holders = ", ".join(_holders(conn, group, client_id, missing))
            raise LockUnavailableError(f"consumer group {group!r}: could not lock queue(s) {holders} for client "
                                       f"{client_id!r} within {round(timeout_s * 1000)} ms. {advice}")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def queues_by_topic(queues: Iterable[Queue]) -> dict[str, list[int]]:
    """``{topic: sorted queue ids}`` of some queues (duplicates dropped)."""
    grouped: dict[str, list[int]] = {}
    for topic, queue_id in sorted(set(queues)):
        grouped.setdefault(topic, []).append(queue_id)
    return grouped


def lease_left_ms(lock: pb.QueueLock) -> int:
    """How long the lease of ``lock`` had left when the broker answered: on the broker's clock,
    so that a client whose clock differs from the broker's renews in time (a broker older than
    ``expires_in_ms`` leaves it 0: the wall clocks are compared then)."""
    if lock.expires_in_ms:
        return lock.expires_in_ms
    return lock.expires_at_ms - int(time.time() * 1000)


def _holders(conn: BrokerConnection, group: str, client_id: str, missing: list[Queue]) -> list[str]:
    described = []
    for topic, ids in queues_by_topic(missing).items():
        try:
            response = conn.call("QueryLocks", pb.QueryLocksRequest(group=group, topic=topic))
        except OrderlyMQError:
            response = pb.QueryLocksResponse()
        locks = {lock.queue_id: lock for lock in response.locks}
        for queue_id in ids:
            lock = locks.get(queue_id)
            if lock is not None and lock.client_id and lock.client_id != client_id:
                left = max(0, lease_left_ms(lock))
                described.append(f"{topic}/{queue_id} held by client {lock.client_id!r} "
                                 f"(epoch {lock.epoch}, lease ends in {left} ms)")
            else:
                described.append(f"{topic}/{queue_id}")
    return described
