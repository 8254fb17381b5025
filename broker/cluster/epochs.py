"""The group's epoch history: where each master's term began in every queue.

A master elected for group epoch ``e`` records, before it accepts a write, the end offset of each
of its queues: epoch ``e`` starts there. Slaves copy the master's history when they start
following it. A broker that rejoins its group as a slave keeps of its log only what the new
master has: in each queue, its records up to where the master's history says its own last
epoch ended (the start of the next epoch the master knows of). Whatever it wrote past that
(an old master's unreplicated tail) is cut before it fetches anything.

The history is a small JSON file, ``cluster-epochs.json``, written atomically: ``{"epoch": the
epoch this broker last followed or led, "caught_up": whether its copy held all its master had at
least once since it began following it, "group_id": the identity of the group it served in (its
``state`` in ZooKeeper names it), "history": [[epoch, {"topic/queue": start}], ...]}``.
Only a broker whose file names the group's current epoch and says ``caught_up`` may campaign: a
broker that starts on an empty (wiped) data dir may still be in the sync-state set, yet holds
nothing until it caught up.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from broker.persist import read_json, write_json_atomic

__all__ = ["EpochHistory", "keyed", "queue_key", "truncation_points"]

_KEPT_EPOCHS = 1000  # the oldest entries are dropped: no replica is that many terms behind


def queue_key(topic: str, queue_id: int) -> str:
    return f"{topic}/{queue_id}"


def keyed(ends: dict[tuple[str, int], int]) -> dict[str, int]:
    """``ends`` (``Store.ends``) by ``queue_key``, as histories and fetches name queues."""
    return {queue_key(topic, queue_id): end for (topic, queue_id), end in ends.items()}


def truncation_points(last_epoch: int, ends: dict[str, int], master_history: list) -> dict[str, int]:
    """Where a slave whose last epoch is ``last_epoch`` and whose queues end at ``ends`` must cut
    each queue to agree with a master of history ``master_history``: the start of the first epoch
    after ``last_epoch`` (0 for a queue that epoch did not have). Queues that need no cut are left out."""
    following = [(epoch, starts) for epoch, starts in master_history if epoch > last_epoch]
    if not following:
        return {}  # the slave's last epoch is the master's current one: its log is a prefix
    _, starts = min(following, key=lambda entry: entry[0])
    return {key: starts.get(key, 0) for key, end in ends.items() if end > starts.get(key, 0)}


class EpochHistory:
    """The persisted epoch history of one broker."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        state = read_json(path, {"epoch": 0, "history": []})
        self.epoch = int(state["epoch"])
        self.caught_up = bool(state.get("caught_up", True))  # files of older versions: as before
        self.group_id = str(state.get("group_id", ""))  # "": none recorded (a new broker, an older version)
        self.history: list = [[int(e), dict(starts)] for e, starts in state["history"]]

    def begin_term(self, epoch: int, starts: dict[str, int]) -> None:
        """This broker is master of ``epoch``, whose queues start at ``starts``."""
        with self._lock:
            self.history = [entry for entry in self.history if entry[0] < epoch] + [[epoch, dict(starts)]]
            self.epoch, self.caught_up = epoch, True
            self._save()

    def follow(self, epoch: int, master_history: list) -> None:
        """This broker now follows the master of ``epoch``, whose history it adopts."""
        with self._lock:
            self.history = [[int(e), dict(s)] for e, s in master_history]
            self.epoch, self.caught_up = epoch, False
            self._save()

    def mark_caught_up(self) -> None:
        """This broker's copy held everything its master had when it sent an answer."""
        with self._lock:
            if not self.caught_up:
                self.caught_up = True
                self._save()

    def join_group(self, group_id: str) -> None:
        """This broker serves in the group of identity ``group_id`` (ZooKeeper's ``state`` names it)."""
        with self._lock:
            if group_id and group_id != self.group_id:
                self.group_id = group_id
                self._save()

    def encoded(self) -> bytes:
        with self._lock:
            return json.dumps(self.history).encode()

    def _save(self) -> None:
        self.history = self.history[-_KEPT_EPOCHS:]
        write_json_atomic(self.path, {"epoch": self.epoch, "caught_up": self.caught_up, "group_id": self.group_id,
                                      "history": self.history})
