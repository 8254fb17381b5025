"""All topics of a broker: metadata, their queue logs, the flusher and retention threads.

Layout under ``data_dir``::

    topics.json                  topic -> queue count (written atomically)
    topics/<topic>/<queue_id>/   the queue's segments (*.log, *.index)
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from broker.persist import read_json, write_json_atomic
from broker.storage.queue_log import QueueLog
from broker.storage.segment import CutReport
from broker.wire import codec
from broker.wire.errors import InvalidRequestError, QueueOutOfRangeError, TopicExistsError, TopicNotFoundError

__all__ = ["MAX_QUEUES", "TOPIC_NAME", "Store"]

log = logging.getLogger(__name__)

TOPIC_NAME = re.compile(r"^[A-Za-z0-9_%|.-]{1,127}$")
MAX_QUEUES = 1024


def validate_topic_name(name: str) -> None:
    if not isinstance(name, str) or not TOPIC_NAME.match(name) or name in (".", ".."):
        raise InvalidRequestError(
            f"invalid topic name {name!r}: use 1-127 characters from letters, digits, '_', '-', '.', '%', '|'"
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
    ) -> None:
        self.data_dir = Path(data_dir)
        self.segment_bytes = segment_bytes
        self.index_interval_bytes = index_interval_bytes
        self.sync = sync
        self.clock = clock
        self._meta_path = self.data_dir / "topics.json"
        self._lock = threading.RLock()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._topics: dict[str, int] = {name: int(n) for name, n in read_json(self._meta_path, {}).items()}
        self._queues: dict[tuple[str, int], QueueLog] = {}
        for name, count in self._topics.items():
            for qid in range(count):
                self._open_queue(name, qid)

    # -- topics --------------------------------------------------------------------------------

    def _topic_dir(self, topic: str) -> Path:
        return self.data_dir / "topics" / topic

    def _open_queue(self, topic: str, queue_id: int) -> QueueLog:
        q = QueueLog(
            self._topic_dir(topic) / str(queue_id),
            segment_bytes=self.segment_bytes,
            index_interval_bytes=self.index_interval_bytes,
            sync=self.sync,
            clock=self.clock,
        )
        self._queues[(topic, queue_id)] = q
        return q

    def _save_topics(self) -> None:
        write_json_atomic(self._meta_path, self._topics)

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
            for qid in range(queue_count):
                self._open_queue(topic, qid)
            self._topics[topic] = queue_count
            self._save_topics()
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
            for qid in range(current, queue_count):
                self._open_queue(topic, qid)
            self._topics[topic] = queue_count
            self._save_topics()
            return queue_count

    def delete_topic(self, topic: str) -> None:
        with self._lock:
            count = self.queue_count(topic)
            del self._topics[topic]
            self._save_topics()
            for qid in range(count):
                q = self._queues.pop((topic, qid))
                q.wake_waiters()
                q.close()
            trash = self.data_dir / f".deleted-{uuid.uuid4().hex}"
            self._topic_dir(topic).rename(trash)
            shutil.rmtree(trash, ignore_errors=True)
            log.info("deleted topic %s", topic)

    def topics(self) -> dict[str, int]:
        with self._lock:
            return dict(self._topics)

    def queue_count(self, topic: str) -> int:
        count = self._topics.get(topic)
        if count is None:
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
        for q in list(self._queues.values()):
            q.flush()

    def apply_retention(self, retention_ms: int, retention_bytes: int) -> int:
        return sum(q.apply_retention(retention_ms, retention_bytes) for q in list(self._queues.values()))

    def cut_reports(self) -> list[CutReport]:
        return [r for q in self._queues.values() for r in q.cut_reports]

    def close(self) -> None:
        with self._lock:
            for q in self._queues.values():
                q.wake_waiters()
                q.close()
