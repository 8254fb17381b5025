"""Where a consumer's offsets live, and where a queue without one starts.

Clustering consumers keep offsets on the broker (``RemoteOffsetStore``: one commit per call,
fenced by the queue lock's epoch when one is given); broadcasting consumers keep them in a local
JSON file (``LocalOffsetStore``), since every instance reads every queue. An offset is always the
next offset to consume.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

from broker.wire.errors import InvalidOptionError
from connector.client.connection import BrokerConnection, pb
from connector.client.messages import MessageQueue

__all__ = ["CONSUME_FROM", "LocalOffsetStore", "RemoteOffsetStore", "check_consume_from", "start_offset"]

log = logging.getLogger(__name__)

CONSUME_FROM = ("committed", "earliest", "latest", "timestamp")


def check_consume_from(consume_from: str, timestamp_ms: int | None) -> None:
    if consume_from not in CONSUME_FROM:
        raise InvalidOptionError(f"consume_from must be one of {', '.join(CONSUME_FROM)}, got {consume_from!r}")
    if consume_from == "timestamp" and timestamp_ms is None:
        raise InvalidOptionError("consume_from='timestamp' needs consume_timestamp=<ms since the epoch>")


def start_offset(
    connection: BrokerConnection, mq: MessageQueue, committed: int, consume_from: str, timestamp_ms: int | None
) -> int:
    """Where consumption of ``mq`` starts: the committed offset when there is one (clamped to what
    retention kept), else by ``consume_from``: ``committed``/``earliest`` the first stored message,
    ``latest`` the next one to be stored, ``timestamp`` the first stored at or after ``timestamp_ms``."""
    request = pb.QueryOffsetsRequest(topic=mq.topic, queue_id=mq.queue_id)
    if consume_from == "timestamp" and committed < 0:
        request.timestamp, request.has_timestamp = int(timestamp_ms or 0), True
    r = connection.call("QueryOffsets", request)
    if committed >= 0:
        return min(max(committed, r.min_offset), r.max_offset)
    if consume_from == "latest":
        return r.max_offset
    if consume_from == "timestamp":
        return r.offset_for_timestamp
    return r.min_offset


class RemoteOffsetStore:
    """Committed offsets of a group on the broker."""

    def __init__(self, connection: BrokerConnection, group: str, client_id: str) -> None:
        self._conn = connection
        self.group = group
        self.client_id = client_id

    def read(self, mq: MessageQueue) -> int:
        request = pb.GetOffsetRequest(group=self.group, topic=mq.topic, queue_id=mq.queue_id)
        return self._conn.call("GetOffset", request).offset

    def commit(self, mq: MessageQueue, offset: int, epoch: int | None = None) -> None:
        """Commit ``offset`` (fenced by ``epoch`` when given); raises ``FencedError`` when stale."""
        request = pb.CommitOffsetRequest(group=self.group, topic=mq.topic, queue_id=mq.queue_id, offset=offset)
        if epoch:
            request.client_id, request.epoch = self.client_id, epoch
        self._conn.call("CommitOffset", request)

    def flush(self) -> None:
        """Nothing buffered: every commit went to the broker."""


class LocalOffsetStore:
    """Offsets in ``<directory>/<group>.json`` (written atomically on ``flush``)."""

    def __init__(self, directory: str | os.PathLike, group: str) -> None:
        self.path = Path(directory) / f"{group}.json"
        self._lock = threading.Lock()
        self._dirty = False
        self._offsets: dict[str, int] = {}
        if self.path.exists():
            try:
                self._offsets = {k: int(v) for k, v in json.loads(self.path.read_text()).items()}
            except (ValueError, OSError) as exc:
                raise InvalidOptionError(f"offset file {self.path} is unreadable ({exc}); move it away") from None

    @staticmethod
    def _name(mq: MessageQueue) -> str:
        return f"{mq.topic}/{mq.queue_id}"

    def read(self, mq: MessageQueue) -> int:
        with self._lock:
            return self._offsets.get(self._name(mq), -1)

    def commit(self, mq: MessageQueue, offset: int, epoch: int | None = None) -> None:
        with self._lock:
            self._offsets[self._name(mq)] = offset
            self._dirty = True

    def flush(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            data = json.dumps(self._offsets, sort_keys=True)
            self._dirty = False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
