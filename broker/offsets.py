"""Committed consumer-group offsets: ``(group, topic, queue_id) -> offset``, durable on return.

The offset is the next one the group will read (RocketMQ's consumer offset). Any offset >= 0 may be
committed, backwards too: that is how a group is reset (RocketMQ's ``resetOffset``). Forward-only
progress among concurrent consumers is enforced by the lock epoch, checked before ``commit``.

Each offset remembers the client id that committed it (empty for an unfenced commit), so a consumer
can tell whether another client of its group moved the group's position.

The table lives in an SQLite database (``broker.statedb``): a commit is one row upserted and one
fsync, whatever the number of groups, and durable before ``commit`` returns. A data directory from
before keeps its ``offsets.json``: it is imported once, in one transaction, and renamed to
``offsets.json.migrated``. An in-memory copy serves reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

from broker.persist import load_state
from broker.statedb import StateDB
from broker.wire.errors import InvalidRequestError
from broker.wire.limits import MAX_CLIENT_ID_BYTES, MAX_GROUP_BYTES, MAX_TOPIC_BYTES, check_name, shown

__all__ = ["OffsetStore"]

log = logging.getLogger(__name__)

_READABLE_VERSIONS = (1, 2)  # of offsets.json; version 1 stored bare offsets, without the committer
_SCHEMA = """
CREATE TABLE IF NOT EXISTS offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, queue_id INTEGER NOT NULL,
    offset INTEGER NOT NULL, client_id TEXT NOT NULL,
    PRIMARY KEY (grp, topic, queue_id)
) WITHOUT ROWID;
"""
_UPSERT = "INSERT OR REPLACE INTO offsets (grp, topic, queue_id, offset, client_id) VALUES (?, ?, ?, ?, ?)"
_MIGRATED = "migrated offsets.json"


class OffsetStore:
    """Durable committed offsets, loaded at construction.

    Parameters
    ----------
    path : Path
        Where the offsets live: the database is ``path`` with the suffix ``.db`` (``offsets.json``
        and ``offsets.db`` name the same store), and a ``.json`` file of that name from an older
        broker is imported. Its directory is created if missing.
    sync : bool, default True
        False trades durability against power loss for speed (see ``StateDB``).

    Notes
    -----
    Thread-safe; commits are serialised so the database always holds the last one returned.
    """

    def __init__(self, path: Path, *, sync: bool = True):
        path = Path(path)
        self._legacy_path = path.with_suffix(".json")
        self._mutex = threading.Lock()
        # group -> topic -> queue_id -> (offset, client id that committed it)
        self._offsets: dict[str, dict[str, dict[int, tuple[int, str]]]] = {}
        self._db = StateDB(path.with_suffix(".db"), _SCHEMA, "committed offsets", sync=sync)
        try:
            self._migrate()
            for group, topic, qid, offset, client_id in self._db.rows("SELECT * FROM offsets"):
                self._offsets.setdefault(group, {}).setdefault(topic, {})[qid] = (offset, client_id)
        except BaseException:
            self._db.close()
            raise

    def commit(self, group: str, topic: str, queue_id: int, offset: int, client_id: str = "") -> None:
        """Record ``offset`` as the group's position in the queue, committed by ``client_id``;
        durable before returning.

        Raises
        ------
        InvalidRequestError
            Empty or over-long group, topic or client id, a negative queue id or a negative offset.
        DiskFullError
            No space to record it; the committed offset did not change.
        """
        _check(group, topic, queue_id)
        if client_id:
            check_name("client id", client_id, MAX_CLIENT_ID_BYTES)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidRequestError(
                f"offset to commit for group {shown(group)} on {topic}/{queue_id} must be an integer >= 0, "
                f"got {offset!r}"
            )
        with self._mutex:
            if self._offsets.get(group, {}).get(topic, {}).get(queue_id) == (offset, client_id):
                return  # already durable
            with self._db.transaction(f"commit offset {offset} of group {shown(group)} on {topic}/{queue_id}") as db:
                db.execute(_UPSERT, (group, topic, queue_id, offset, client_id))
            self._offsets.setdefault(group, {}).setdefault(topic, {})[queue_id] = (offset, client_id)

    def get(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 when the group never committed for this queue."""
        return self.committed(group, topic, queue_id)[0]

    def committed(self, group: str, topic: str, queue_id: int) -> tuple[int, str]:
        """``(offset, committing client id)``; ``(-1, "")`` when the group never committed here."""
        _check(group, topic, queue_id)
        with self._mutex:
            return self._offsets.get(group, {}).get(topic, {}).get(queue_id, (-1, ""))

    def group_offsets(self, group: str, topic: str) -> dict[int, int]:
        """``queue_id -> offset`` for every queue of ``topic`` the group committed."""
        with self._mutex:
            return {q: o for q, (o, _) in sorted(self._offsets.get(group, {}).get(topic, {}).items())}

    def group_positions(self, group: str) -> list[tuple[str, int, int, str]]:
        """``(topic, queue id, offset, committing client id)`` of every commit of ``group``, sorted."""
        with self._mutex:
            topics = self._offsets.get(group, {})
            return sorted((t, q, o, c) for t, queues in topics.items() for q, (o, c) in queues.items())

    def groups(self) -> list[str]:
        """Every group with at least one committed offset, sorted."""
        with self._mutex:
            return sorted(g for g, topics in self._offsets.items() if any(topics.values()))

    def drop_topic(self, topic: str) -> None:
        """Forget every group's offsets on ``topic`` (the topic was deleted)."""
        with self._mutex:
            groups = [g for g, topics in self._offsets.items() if topic in topics]
            if not groups:
                return
            with self._db.transaction(f"drop the offsets of topic {shown(topic)}") as db:
                db.execute("DELETE FROM offsets WHERE topic = ?", (topic,))
            for group in groups:
                del self._offsets[group][topic]
                if not self._offsets[group]:
                    del self._offsets[group]

    def snapshot(self) -> list[tuple[str, str, int, int, str]]:
        """Every committed offset as ``(group, topic, queue id, offset, client id)``, sorted."""
        with self._mutex:
            return sorted((g, t, q, o, c) for g, topics in self._offsets.items()
                          for t, queues in topics.items() for q, (o, c) in queues.items())

    def replace(self, rows: list[tuple[str, str, int, int, str]]) -> None:
        """Make ``rows`` (a ``snapshot`` of the group's master) the committed offsets, durably;
        only the rows that differ are written."""
        wanted = {(g, t, q): (o, c) for g, t, q, o, c in rows}
        with self._mutex:
            held = {(g, t, q): entry for g, topics in self._offsets.items() for t, queues in topics.items()
                    for q, entry in queues.items()}
            changed = [(*key, *entry) for key, entry in wanted.items() if held.get(key) != entry]
            gone = [key for key in held if key not in wanted]
            if not changed and not gone:
                return
            with self._db.transaction("copy the committed offsets of the group's master") as db:
                db.executemany("DELETE FROM offsets WHERE grp = ? AND topic = ? AND queue_id = ?", gone)
                db.executemany(_UPSERT, changed)
            self._offsets = {}
            for (group, topic, qid), entry in wanted.items():
                self._offsets.setdefault(group, {}).setdefault(topic, {})[qid] = entry

    def close(self) -> None:
        """Close the database (every commit already returned is durable)."""
        with self._mutex:
            self._db.close()

    def _migrate(self) -> None:
        """Import an older broker's ``offsets.json`` once (the marker commits with the rows)."""
        if not self._legacy_path.exists() or self._db.meta(_MIGRATED) is not None:
            return
        imported: list[tuple[str, str, int, int, str]] = []

        def parse(state: dict) -> None:
            for group, topics in state["offsets"].items():
                for topic, queues in topics.items():
                    for qid, entry in queues.items():
                        offset, client_id = (entry, "") if state["version"] == 1 else entry
                        imported.append((str(group), str(topic), int(qid), int(offset), str(client_id)))

        load_state(self._legacy_path, _READABLE_VERSIONS, "offset file", parse)
        with self._db.transaction(f"import {self._legacy_path}") as db:
            db.executemany(_UPSERT, imported)
            db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (_MIGRATED, str(len(imported))))
        with contextlib.suppress(OSError):  # the marker already keeps it from being imported twice
            os.replace(self._legacy_path, self._legacy_path.with_name(self._legacy_path.name + ".migrated"))
        log.info("imported %d committed offsets from %s into %s", len(imported), self._legacy_path, self._db.path)


def _check(group: str, topic: str, queue_id: int) -> None:
    check_name("consumer group", group, MAX_GROUP_BYTES)
    check_name("topic", topic, MAX_TOPIC_BYTES)
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
        raise InvalidRequestError(f"queue id must be an integer >= 0, got {queue_id!r}")
