"""Committed consumer-group offsets: ``(group, topic, queue_id) -> offset``, durable on return.

The offset is the next one the group will read (RocketMQ's consumer offset). Any offset >= 0 may be
committed, backwards too: that is how a group is reset (RocketMQ's ``resetOffset``). Forward-only
progress among concurrent consumers is enforced by the lock epoch, checked before ``commit``.

Each offset remembers the client id that committed it (empty for an unfenced commit), so a consumer
can tell whether another client of its group moved the group's position.

The whole table is one JSON file replaced atomically on every change: the table is small (groups x
queues) and a single file can never be half old, half new after a crash.
"""

from __future__ import annotations

import threading
from pathlib import Path

from broker.persist import load_state, write_json_atomic
from broker.wire.errors import InvalidRequestError

__all__ = ["OffsetStore"]

_STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # version 1 stored bare offsets, without the committer


class OffsetStore:
    """Durable committed offsets, loaded from ``path`` at construction.

    Parameters
    ----------
    path : Path
        The JSON file (created on the first commit, its directory too).

    Notes
    -----
    Thread-safe; commits are serialised so the file always holds the last one returned.
    """

    def __init__(self, path: Path):
        self._path = Path(path)
        self._mutex = threading.Lock()
        # group -> topic -> queue_id -> (offset, client id that committed it)
        self._offsets: dict[str, dict[str, dict[int, tuple[int, str]]]] = {}
        self._load()

    def commit(self, group: str, topic: str, queue_id: int, offset: int, client_id: str = "") -> None:
        """Record ``offset`` as the group's position in the queue, committed by ``client_id``;
        durable before returning.

        Raises
        ------
        InvalidRequestError
            Empty group or topic, a negative queue id or a negative offset.
        """
        _check(group, topic, queue_id)
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise InvalidRequestError(
                f"offset to commit for group {group!r} on {topic}/{queue_id} must be an integer >= 0, got {offset!r}"
            )
        with self._mutex:
            per_queue = self._offsets.get(group, {}).get(topic, {})
            if per_queue.get(queue_id) == (offset, client_id):
                return  # already durable
            updated = {g: {t: dict(q) for t, q in topics.items()} for g, topics in self._offsets.items()}
            updated.setdefault(group, {}).setdefault(topic, {})[queue_id] = (offset, client_id)
            self._save(updated)
            self._offsets = updated

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

    def groups(self) -> list[str]:
        """Every group with at least one committed offset, sorted."""
        with self._mutex:
            return sorted(g for g, topics in self._offsets.items() if any(topics.values()))

    def drop_topic(self, topic: str) -> None:
        """Forget every group's offsets on ``topic`` (the topic was deleted)."""
        with self._mutex:
            if not any(topic in topics for topics in self._offsets.values()):
                return
            updated = {g: {t: dict(q) for t, q in topics.items() if t != topic} for g, topics in self._offsets.items()}
            updated = {g: topics for g, topics in updated.items() if topics}
            self._save(updated)
            self._offsets = updated

    def _load(self) -> None:
        load_state(self._path, _READABLE_VERSIONS, "offset file", self._parse_state)

    def _parse_state(self, state: dict) -> None:
        for group, topics in state["offsets"].items():
            for topic, queues in topics.items():
                for qid, entry in queues.items():
                    offset, client_id = (entry, "") if state["version"] == 1 else entry
                    self._offsets.setdefault(group, {}).setdefault(topic, {})[int(qid)] = (int(offset), str(client_id))

    def _save(self, offsets: dict[str, dict[str, dict[int, tuple[int, str]]]]) -> None:
        # JSON object keys are strings: queue ids are written as "0", "1", ... and parsed back on load.
        doc = {
            g: {t: {str(q): list(entry) for q, entry in queues.items()} for t, queues in topics.items()}
            for g, topics in offsets.items()
        }
        write_json_atomic(self._path, {"version": _STATE_VERSION, "offsets": doc})


def _check(group: str, topic: str, queue_id: int) -> None:
    if not isinstance(group, str) or not group:
        raise InvalidRequestError(f"consumer group must be a non-empty string, got {group!r}")
    if not isinstance(topic, str) or not topic:
        raise InvalidRequestError(f"topic must be a non-empty string, got {topic!r}")
    if not isinstance(queue_id, int) or isinstance(queue_id, bool) or queue_id < 0:
        raise InvalidRequestError(f"queue id must be an integer >= 0, got {queue_id!r}")
