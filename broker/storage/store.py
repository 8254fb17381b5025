"""All topics of a broker: metadata, their queue logs, the flusher and retention threads.

Layout under ``data_dir``::

    topics.json                  topic -> queue count (written atomically)
    topics/<topic>/<queue_id>/   the queue's segments (*.log, *.index)

``topics.json`` is the commit point of every topic change: a create, grow or delete is durable
(the new file is written, fsynced, renamed over the old one and its directory fsynced) before it
takes effect in memory and before it is acknowledged. A change that cannot be written (a full disk:
``DiskFullError``) changes nothing: a failed create leaves no topic, no queue and no open file, a
failed delete leaves the topic whole. Files of a topic are created before it is committed and
removed after it is deleted, so a crash in between leaves only a directory no topic names; it is
cleared when a topic of that name is created again.
"""

from __future__ import annotations

import functools
import logging
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from broker.persist import (
    UnsyncedRenameError,
    fsync_dir,
    make_durable_dir,
    read_json,
    write_failure_as_error,
    write_json_atomic,
)
from broker.storage.end_watch import EndWatch
from broker.storage.lost_writes import LostWrites
from broker.storage.open_files import OpenFiles, budget_for_limit
from broker.storage.page_cache import PageCacheWindow
from broker.storage.queue_log import QueueLog
from broker.storage.segment import CutReport
from broker.wire import codec
from broker.wire.errors import InvalidRequestError, QueueOutOfRangeError, TopicExistsError, TopicNotFoundError
from broker.wire.limits import MAX_TOPIC_BYTES, shown

__all__ = ["MAX_QUEUES", "TOPIC_NAME", "Store"]

log = logging.getLogger(__name__)

TOPIC_NAME = re.compile(rf"^[A-Za-z0-9_%|.-]{{1,{MAX_TOPIC_BYTES}}}$")
MAX_QUEUES = 1024


def validate_topic_name(name: str) -> None:
    if not isinstance(name, str) or not TOPIC_NAME.match(name) or name in (".", ".."):
        raise InvalidRequestError(
            f"invalid topic name {shown(name)}: use 1-{MAX_TOPIC_BYTES} characters from letters, digits, "
            "'_', '-', '.', '%', '|'"
        )


class Store:
    """Topics and their queue logs under one data directory."""

    def __init__(
        self,
        data_dir: Path,
        *,
        segment_bytes: int = 64 << 20,
        index_interval_bytes: int = 4096,
        sync: bool = False,
        clock: Callable[[], int] = codec.now_ms,
        open_files_budget: int | None = None,
        page_cache_bytes: int = 0,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.sync = sync
        self.clock = clock
        self._meta_path = self.data_dir / "topics.json"
        self._lock = threading.RLock()
        make_durable_dir(self.data_dir)
        self._topics: dict[str, int] = {name: int(n) for name, n in read_json(self._meta_path, {}).items()}
        self._queues: dict[tuple[str, int], QueueLog] = {}
        self._watches: list[EndWatch] = []  # see watch_ends
        self._holding_back = False  # see hold_back
        self.lost_writes = LostWrites()  # a failed flush: nothing more is stored
        budget = budget_for_limit() if open_files_budget is None else open_files_budget
        self.open_files = OpenFiles(budget, self.lost_writes)
        self.page_cache = PageCacheWindow(page_cache_bytes) if page_cache_bytes else None
        self._secured = False  # every queue fsynced or cut back after lost writes
        for trash in self.data_dir.glob(".deleted-*"):  # deletes a crash interrupted, already committed
            shutil.rmtree(trash, ignore_errors=True)
        for name, count in self._topics.items():
            for qid in range(count):
                self._queues[(name, qid)] = self._open_queue(name, qid)
        if self.page_cache is not None:
            segments = [segment for queue in self._queues.values() for segment in queue.segments]
            self.page_cache.keep_cached(sorted(segments, key=lambda segment: segment.last_store_ts))

    # -- topics --------------------------------------------------------------------------------

    def _topic_dir(self, topic: str) -> Path:
        return self.data_dir / "topics" / topic

    def _open_queue(self, topic: str, queue_id: int) -> QueueLog:
        queue = QueueLog(
            self._topic_dir(topic) / str(queue_id),
            segment_bytes=self.segment_bytes,
            index_interval_bytes=self.index_interval_bytes,
            sync=self.sync,
            clock=self.clock,
            data_dir=self.data_dir,
            lost_writes=self.lost_writes,
            open_files=self.open_files,
            page_cache=self.page_cache,
        )
        if self._holding_back:
            queue.hold_back()
        queue.on_end_moved = functools.partial(self._end_moved, (topic, queue_id))
        return queue

    def _end_moved(self, ref: tuple[str, int]) -> None:
        for watch in self._watches:
            watch.mark(ref)

    def watch_ends(self) -> EndWatch:
        """A watch marked with each queue whose end moves from now on (``unwatch_ends`` when done)."""
        watch = EndWatch()
        with self._lock:
            self._watches = [*self._watches, watch]  # a new list: appends iterate the old one unlocked
        return watch

    def unwatch_ends(self, watch: EndWatch) -> None:
        with self._lock:
            self._watches = [w for w in self._watches if w is not watch]

    def hold_back(self) -> None:
        """Every queue, and every queue created later, keeps newly stored messages from readers
        until ``QueueLog.make_visible`` passes them (``QueueLog.hold_back``)."""
        with self._lock:
            self._holding_back = True
            for queue in self._queues.values():
                queue.hold_back()

    def _commit_topics(self, topics: dict[str, int], new_queues: dict[tuple[str, int], QueueLog], what: str,
                       undo: Callable[[], None] | None = None) -> None:
        """Make ``topics`` the durable topic table, then the one in memory with ``new_queues``
        opened; on failure close those queues, ``undo``, and raise (``DiskFullError`` for a full disk).

        When only the directory fsync after the table's rename fails, the new table is what a
        restart reads, though a power cut may bring the old one back: it becomes the table in
        memory too, and the broker stops as at a failed flush (``LostWrites``), so that it never
        acknowledges a send into a topic that a restart would not have."""
        unsynced: UnsyncedRenameError | None = None
        try:
            with write_failure_as_error(self.data_dir, what):
                for topic in {topic for topic, _ in new_queues}:  # queue directories exist before the commit
                    fsync_dir(self._topic_dir(topic))
                    fsync_dir(self.data_dir / "topics")
                write_json_atomic(self._meta_path, topics)
        except UnsyncedRenameError as exc:
            unsynced = exc
        except BaseException:
            for q in new_queues.values():
                q.close()
            if undo is not None:
                undo()
            raise
        self._queues.update(new_queues)
        self._topics = topics
        if unsynced is not None:
            self.lost_writes.record(f"the directory of {self._meta_path} (to {what})", unsynced)
            self.lost_writes.check()  # raises: nothing more is stored

    def _new_queues(self, topic: str, queue_ids: range, what: str) -> dict[tuple[str, int], QueueLog]:
        """Open queue logs for ``queue_ids`` (no file is created before the first append)."""
        opened: dict[tuple[str, int], QueueLog] = {}
        try:
            with write_failure_as_error(self.data_dir, what):
                for qid in queue_ids:
                    opened[(topic, qid)] = self._open_queue(topic, qid)
        except BaseException:
            for q in opened.values():
                q.close()
            raise
        return opened

    def _discard(self, path: Path) -> None:
        """Remove a directory no committed topic uses (rename first: a crash mid-way leaves trash)."""
        if path.exists():
            trash = self.data_dir / f".deleted-{uuid.uuid4().hex}"
            try:
                path.rename(trash)
            except OSError:
                trash = path
            shutil.rmtree(trash, ignore_errors=True)

    @staticmethod
    def _check_count(queue_count: int) -> None:
        if not isinstance(queue_count, int) or not 1 <= queue_count <= MAX_QUEUES:
            raise InvalidRequestError(f"queue count must be between 1 and {MAX_QUEUES}, got {queue_count}")

    def create_topic(self, topic: str, queue_count: int, if_not_exists: bool = False) -> int:
        """Create ``topic`` with ``queue_count`` queues; returns the queue count."""
        validate_topic_name(topic)
        self._check_count(queue_count)
        with self._lock:
            existing = self._topics.get(topic)
            if existing is not None:
                if if_not_exists:
                    return existing
                raise TopicExistsError(f"topic {topic!r} already exists with {existing} queues")
            leftover = self._topic_dir(topic)
            if leftover.exists():
                log.warning("clearing %s: files of a topic %s that was never created or was deleted", leftover, topic)
                self._discard(leftover)
            what = f"create topic {topic!r} with {queue_count} queues"
            queues = self._new_queues(topic, range(queue_count), what)
            self._commit_topics({**self._topics, topic: queue_count}, queues, what, lambda: self._discard(leftover))
            log.info("created topic %s with %d queues", topic, queue_count)
            return queue_count

    def grow_topic(self, topic: str, queue_count: int) -> int:
        """Raise the queue count (never lower it: that would re-route keys and strand data)."""
        self._check_count(queue_count)
        with self._lock:
            current = self.queue_count(topic)
            if queue_count < current:
                raise InvalidRequestError(
                    f"topic {topic!r} has {current} queues; the count can only grow (asked {queue_count})"
                )
            if queue_count == current:
                return current
            what = f"grow topic {topic!r} from {current} to {queue_count} queues"
            queues = self._new_queues(topic, range(current, queue_count), what)

            def remove_new_queues() -> None:
                for q in queues.values():
                    shutil.rmtree(q.directory, ignore_errors=True)

            self._commit_topics({**self._topics, topic: queue_count}, queues, what, remove_new_queues)
            return queue_count

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            count = self.queue_count(topic)
            remaining = {name: n for name, n in self._topics.items() if name != topic}
            self._commit_topics(remaining, {}, f"delete topic {topic!r}")
            for qid in range(count):
                q = self._queues.pop((topic, qid))
                q.wake_waiters()
                q.close()
            self._discard(self._topic_dir(topic))
            log.info("deleted topic %s", topic)

    def topics(self) -> dict[str, int]:
        with self._lock:
            return dict(self._topics)

    def topic_table(self) -> Mapping[str, int]:
        """The topic table itself, not a copy: each change replaces it (never changes it in place),
        so a caller that holds it sees one table, and tells a newer one by identity."""
        return self._topics

    def ends(self) -> dict[tuple[str, int], int]:
        """Where every queue ends now (its ``max_offset``)."""
        return {(t, q): self.queue(t, q).max_offset for t, n in self.topic_table().items() for q in range(n)}

    def queue_count(self, topic: str) -> int:
        count = self._topics.get(topic)
        if count is None:
            if len(topic) > MAX_TOPIC_BYTES:  # no topic has such a name: say why, briefly
                validate_topic_name(topic)
            raise TopicNotFoundError(f"topic {topic!r} does not exist; create it first (orderlymq topic create {topic})")
        return count

    def queue(self, topic: str, queue_id: int) -> QueueLog:
        """The log of one queue; precise errors for an unknown topic or queue id."""
        q = self._queues.get((topic, queue_id))
        if q is not None:
            return q
        count = self.queue_count(topic)
        raise QueueOutOfRangeError(f"queue id {queue_id} is out of range for topic {topic!r} (queues 0..{count - 1})")

    # -- background work -----------------------------------------------------------------------

    def flush(self) -> None:
        """fsync what every queue appended since the last flush. Once writes were lost (a flush or
        a segment's close failed), never again: every queue is fsynced one last time or cut back,
        and the failure is not raised again."""
        if self._secured:
            return
        if self.lost_writes.reason is None:
            try:
                for q in list(self._queues.values()):
                    q.flush()
            except OSError:
                pass  # the queue recorded it in lost_writes
            else:
                return
        for q in list(self._queues.values()):
            q.secure()
        self._secured = True

    def apply_retention(self, retention_ms: int, retention_bytes: int) -> int:
        return sum(q.apply_retention(retention_ms, retention_bytes) for q in list(self._queues.values()))

    def compact(self, idle_ms: int = 0) -> int:
        """Merge small records in every queue's closed segments (and in active ones idle for
        ``idle_ms``, see ``QueueLog.compact``); returns segments rewritten."""
        return sum(q.compact(idle_ms) for q in list(self._queues.values()))

    def cut_reports(self) -> list[CutReport]:
        return [r for q in self._queues.values() for r in q.cut_reports]

    def close(self) -> None:
        with self._lock:
            for q in self._queues.values():
                q.wake_waiters()
                q.close()
