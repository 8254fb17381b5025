"""Queue locks with leases, as RocketMQ's RebalanceLockManager, plus fencing epochs.

The lock table maps ``(group, topic, queue_id)`` to ``(client_id, lease expiry)``:

- a queue that is free, or whose lease expired, goes to the client that asks;
- the holder asking again renews its lease;
- any other client is refused until the lease expires (no error: it is simply not in the answer);
- an unlock by a client that does not hold the queue changes nothing.

On top of RocketMQ, every queue carries a fencing epoch that grows each time a lock is granted
other than as a renewal of a live lock by the same client (a new holder, or the same client after
its lease expired or it unlocked). Pulls and offset commits carry the epoch and ``check`` refuses a
stale one, so a consumer that lost its lock (a GC pause, a partition) cannot commit over its successor.

Epochs are persisted on every bump (before the grant is returned), so the first grant after a
restart gets an epoch above any handed out before it, and every old holder is fenced: what a
consumer pulled may be gone after a power cut, so it must look before it goes on. Who holds each
queue is persisted with the bump too (and forgotten at an unlock), and a restart keeps each queue
for its holder for one lease: the holder locks it again (at a new epoch), anyone else is refused
until then, as though the broker had never stopped. Without that, the first member of a group to
come back after a restart (the others not yet heard from) would take every queue, and the others'
consumed but uncommitted messages would be consumed again. Epochs and holders live in an SQLite
database (``broker.statedb``), so a bump costs a row upserted and one fsync whatever the number of
groups; an older broker's ``lock-epochs.json`` is imported once and renamed ``.migrated``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from broker.clocks import steady_ms
from broker.persist import load_state
from broker.statedb import StateDB
from broker.wire.errors import FencedError, InvalidRequestError, OrderlyMQError
from broker.wire.limits import MAX_CLIENT_ID_BYTES, MAX_GROUP_BYTES, MAX_TOPIC_BYTES, check_name, shown

__all__ = ["LockInfo", "LockManager"]

log = logging.getLogger(__name__)

_LEGACY_VERSION = 1  # of lock-epochs.json
_SCHEMA = """
CREATE TABLE IF NOT EXISTS epochs (
    grp TEXT NOT NULL, topic TEXT NOT NULL, queue_id INTEGER NOT NULL, epoch INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, queue_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS holders (
    grp TEXT NOT NULL, topic TEXT NOT NULL, queue_id INTEGER NOT NULL, client_id TEXT NOT NULL,
    PRIMARY KEY (grp, topic, queue_id)
) WITHOUT ROWID;
"""
_UPSERT = "INSERT OR REPLACE INTO epochs (grp, topic, queue_id, epoch) VALUES (?, ?, ?, ?)"
_UPSERT_HOLDER = "INSERT OR REPLACE INTO holders (grp, topic, queue_id, client_id) VALUES (?, ?, ?, ?)"
_FLOOR, _MIGRATED = "floor", "migrated lock-epochs.json"


@dataclass(frozen=True)
class LockInfo:
    """A live queue lock: who holds it, with which epoch, and how long its lease has left (ms)."""

    topic: str
    queue_id: int
    client_id: str
    epoch: int
    expires_in_ms: int


@dataclass
class _Entry:
    client_id: str
    expires_at: int  # steady ms (broker.clocks)
    kept: bool = False  # kept over a restart for its holder, who must lock it again to use it


class LockManager:
    """Leased queue locks per consumer group, with a fencing epoch per (group, topic, queue).

    Parameters
    ----------
    state_path : Path or None
        Where the epochs live: the database is ``state_path`` with the suffix ``.db``, and a
        ``.json`` file of that name from an older broker is imported. None keeps them in memory
        only (epochs then restart at 1 with a new manager, so use it only where no restart has to
        be survived).
    lease_ms : int
        A lock expires this long after its last grant or renewal.
    clock : callable returning int
        Steady milliseconds (``broker.clocks``), which leases count on: a step of the system
        clock neither expires every lease at once nor keeps a dead holder's. Injected by tests.

    Notes
    -----
    Thread-safe: one mutex guards the table; epochs are written under it, but only when an epoch
    changes (holder changes), never on renewals. A lease is live while ``now < expires_at``.
    """

    def __init__(self, state_path: Path | None, lease_ms: int = 60_000, clock: Callable[[], int] = steady_ms):
        if not isinstance(lease_ms, int) or isinstance(lease_ms, bool) or lease_ms <= 0:
            raise InvalidRequestError(f"lock lease_ms must be a positive integer, got {lease_ms!r}")
        self._path = Path(state_path) if state_path is not None else None
        self._lease_ms = lease_ms
        self._clock = clock
        self._mutex = threading.Lock()
        self._locks: dict[tuple[str, str], dict[int, _Entry]] = {}
        self._epochs: dict[tuple[str, str], dict[int, int]] = {}
        # Epochs of dropped topics are forgotten, but a queue without a recorded epoch starts above
        # this floor, so a topic deleted and created again never hands out an epoch seen before.
        self._floor = 0
        self._db: StateDB | None = None
        self._load()

    @property
    def lease_ms(self) -> int:
        return self._lease_ms

    def lock_batch(self, group: str, client_id: str, topic: str, queue_ids: Iterable[int]) -> dict[int, int]:
        """Lock or renew queues for ``client_id``.

        Returns
        -------
        dict[int, int]
            ``queue_id -> epoch`` for exactly those of ``queue_ids`` that ``client_id`` holds after
            the call; queues held by another live client are left out.
        """
        _check_names(group=group, client_id=client_id, topic=topic)
        wanted = _check_queue_ids(queue_ids)
        with self._mutex:
            now = self._clock()
            table = self._locks.setdefault((group, topic), {})
            epochs = self._epochs.get((group, topic), {})
            new_epochs = dict(epochs)
            granted: dict[int, int] = {}
            for qid in wanted:
                entry = table.get(qid)
                live = entry is not None and now < entry.expires_at
                if live and entry.client_id != client_id:
                    continue  # held by someone else: refused until the lease expires
                if not live or entry.kept:
                    # A new holder, the same client after its lease lapsed, or after a restart: fence older epochs.
                    new_epochs[qid] = max(new_epochs.get(qid, 0), self._floor) + 1
                granted[qid] = new_epochs[qid]
            if new_epochs != epochs:
                # Durable before any grant is visible, so a restart can never reissue an epoch.
                bumped = [(group, topic, qid, e) for qid, e in new_epochs.items() if epochs.get(qid) != e]
                self._save(bumped, client_id, f"record new fencing epochs of group {shown(group)} on {topic}")
                self._epochs[(group, topic)] = new_epochs
            for qid in granted:
                table[qid] = _Entry(client_id, now + self._lease_ms)
            return granted

    def unlock_batch(self, group: str, client_id: str, topic: str, queue_ids: Iterable[int]) -> list[int]:
        """Release those of ``queue_ids`` that ``client_id`` holds; others are left untouched.

        Returns
        -------
        list[int]
            The queue ids released, sorted: those whose lock entry belonged to ``client_id``
            (an entry whose lease lapsed but that nobody took over counts, and is removed too).
        """
        _check_names(group=group, client_id=client_id, topic=topic)
        wanted = _check_queue_ids(queue_ids)
        with self._mutex:
            table = self._locks.get((group, topic), {})
            released = [qid for qid in wanted if qid in table and table[qid].client_id == client_id]
            for qid in released:
                del table[qid]
            self._forget_holders(group, topic, released)
            return sorted(released)

    def check(self, group: str, topic: str, queue_id: int, client_id: str, epoch: int) -> None:
        """Pass only if ``client_id`` holds a live lock on the queue at exactly ``epoch``.

        Does not renew the lease (only ``lock_batch`` does, as in RocketMQ).

        Raises
        ------
        FencedError
            Naming the current holder and epoch, and telling the caller to re-lock the queue.
        """
        _check_names(group=group, client_id=client_id, topic=topic)
        _check_queue_ids([queue_id])
        with self._mutex:
            now = self._clock()
            entry = self._locks.get((group, topic), {}).get(queue_id)
            current = self._epochs.get((group, topic), {}).get(queue_id, 0)
            where = f"queue {topic}/{queue_id} of group {group!r}"
            if entry is None or now >= entry.expires_at or entry.kept:
                why = _why_not_locked(entry, client_id, now)
                raise FencedError(
                    f"{where} is not locked ({why}; current epoch {current}), so client {client_id!r} with "
                    f"epoch {epoch} is fenced; re-lock the queue and use the epoch LockBatch returns"
                )
            if entry.client_id != client_id:
                raise FencedError(
                    f"{where} is locked by client {entry.client_id!r} at epoch {current}, not by {client_id!r} "
                    f"(epoch {epoch}); re-lock the queue once that lock is released or expires"
                )
            if epoch != current:
                raise FencedError(
                    f"stale epoch {epoch} for {where}: client {client_id!r} holds it at epoch {current}; "
                    "re-lock the queue and use the epoch LockBatch returns"
                )

    def holders(self, group: str, topic: str) -> list[LockInfo]:
        """The live locks of ``group`` on ``topic``, sorted by queue id."""
        with self._mutex:
            now = self._clock()
            table = self._locks.get((group, topic), {})
            epochs = self._epochs.get((group, topic), {})
            return [
                LockInfo(topic, qid, e.client_id, epochs.get(qid, 0), e.expires_at - now)
                for qid, e in sorted(table.items())
                if now < e.expires_at
            ]

    def all_holders(self) -> list[tuple[str, LockInfo]]:
        """``(group, lock)`` for every live lock of every group and topic (metrics, consoles)."""
        with self._mutex:
            groups_topics = sorted(self._locks)
        return [(group, info) for group, topic in groups_topics for info in self.holders(group, topic)]

    def drop_topic(self, topic: str) -> None:
        """Forget every lock and epoch of ``topic`` (the topic was deleted)."""
        with self._mutex:
            keys = [key for key in self._epochs if key[1] == topic]
            floor = max((e for key in keys for e in self._epochs[key].values()), default=0)
            if keys:
                new_floor = max(self._floor, floor)
                self._drop(topic, new_floor)
                for key in keys:
                    del self._epochs[key]
                self._floor = new_floor
            for key in [key for key in self._locks if key[1] == topic]:
                del self._locks[key]

    def raise_floor(self, floor: int) -> None:
        """Grant every later lock an epoch above ``floor`` (a new master of a broker group: its
        grants must fence every holder of the masters before it), durably."""
        with self._mutex:
            if floor <= self._floor:
                return
            if self._db is not None:
                with self._db.transaction("raise the lock epoch floor") as db:
                    db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (_FLOOR, str(floor)))
            self._floor = floor
            self._locks.clear()  # leases of the previous master's holders are not ours to honour
            self._forget_holders()

    def close(self) -> None:
        """Close the epoch database (every epoch already granted is durable)."""
        with self._mutex:
            if self._db is not None:
                self._db.close()

    def _load(self) -> None:
        if self._path is None:
            return
        self._db = StateDB(self._path.with_suffix(".db"), _SCHEMA, "lock epochs")
        try:
            self._migrate(self._path.with_suffix(".json"))
            self._floor = int(self._db.meta(_FLOOR) or 0)
            for group, topic, qid, epoch in self._db.rows("SELECT * FROM epochs"):
                self._epochs.setdefault((group, topic), {})[qid] = epoch
            kept_until = self._clock() + self._lease_ms
            for group, topic, qid, client_id in self._db.rows("SELECT * FROM holders"):
                self._locks.setdefault((group, topic), {})[qid] = _Entry(client_id, kept_until, kept=True)
        except BaseException:
            self._db.close()
            raise

    def _migrate(self, legacy: Path) -> None:
        """Import an older broker's epoch file once (the marker commits with the rows)."""
        if not legacy.exists() or self._db.meta(_MIGRATED) is not None:
            return
        rows: list[tuple[str, str, int, int]] = []
        floor = [0]

        def parse(state: dict) -> None:
            floor[0] = int(state["floor"])
            rows.extend((str(g), str(t), int(q), int(e)) for g, t, q, e in state["epochs"])

        load_state(legacy, _LEGACY_VERSION, "lock epoch file", parse)
        with self._db.transaction(f"import {legacy}") as db:
            db.executemany(_UPSERT, rows)
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (_FLOOR, str(floor[0])))
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (_MIGRATED, str(len(rows))))
        with contextlib.suppress(OSError):  # the marker already keeps it from being imported twice
            os.replace(legacy, legacy.with_name(legacy.name + ".migrated"))
        log.info("imported %d lock epochs from %s into %s", len(rows), legacy, self._db.path)

    def _save(self, rows: list[tuple[str, str, int, int]], client_id: str, action: str) -> None:
        """Record new epochs, and ``client_id`` as the holder of each of those queues."""
        if self._db is not None:
            with self._db.transaction(action) as db:
                db.executemany(_UPSERT, rows)
                db.executemany(_UPSERT_HOLDER, [(group, topic, qid, client_id) for group, topic, qid, _ in rows])

    def _forget_holders(self, group: str | None = None, topic: str = "", queue_ids: Iterable[int] = ()) -> None:
        """Forget who held the queues (all of them without ``group``). Not worth failing an unlock
        for: a holder left behind only keeps its queue from others for one lease after a restart."""
        if self._db is None:
            return
        if group is not None:
            rows = [(group, topic, qid) for qid in queue_ids]
            if not rows:
                return
        try:
            with self._db.transaction("forget lock holders") as db:
                if group is None:
                    db.execute("DELETE FROM holders")
                else:
                    db.executemany("DELETE FROM holders WHERE grp = ? AND topic = ? AND queue_id = ?", rows)
        except OrderlyMQError as exc:
            log.warning("%s; after a restart those queues stay with their last holder for one lease", exc)

    def _drop(self, topic: str, floor: int) -> None:
        if self._db is not None:
            with self._db.transaction(f"drop the lock epochs of topic {shown(topic)}") as db:
                db.execute("DELETE FROM epochs WHERE topic = ?", (topic,))
                db.execute("DELETE FROM holders WHERE topic = ?", (topic,))
                db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (_FLOOR, str(floor)))


def _why_not_locked(entry: _Entry | None, client_id: str, now: int) -> str:
    if entry is None:
        return "nobody holds it"
    if now < entry.expires_at:  # kept over a restart
        return (f"the broker restarted; it is kept for client {entry.client_id!r} for {entry.expires_at - now} ms "
                "or until that client locks it again")
    if entry.client_id == client_id:
        return f"the lock of {client_id!r} expired {now - entry.expires_at} ms ago"
    return "nobody holds it"


_LIMITS = {"group": MAX_GROUP_BYTES, "client_id": MAX_CLIENT_ID_BYTES, "topic": MAX_TOPIC_BYTES}


def _check_names(**names: object) -> None:
    for what, value in names.items():
        check_name(what, value, _LIMITS[what])


def _check_queue_ids(queue_ids: Iterable[int]) -> list[int]:
    seen: dict[int, None] = {}
    for qid in queue_ids:
        if not isinstance(qid, int) or isinstance(qid, bool) or qid < 0:
            raise InvalidRequestError(f"queue ids must be integers >= 0, got {qid!r}")
        seen[qid] = None
    return list(seen)
