"""A consumer's local state of one assigned MessageQueue (RocketMQ's ProcessQueue).

Orderly consumption moves messages ``buffer -> consuming -> committed``: ``take`` hands the next
messages of the buffer to a listener and keeps them in ``consuming`` until ``commit`` (the offset
then moves past them), ``consume_again`` (those messages go back to the head of the buffer) or
``rollback`` (everything since the last commit goes back). Concurrent consumption keeps every pulled
message ``outstanding`` until ``remove``; the committable offset is the lowest one still outstanding.

Two locks serialize the work on a queue: ``local_lock`` lets one thread at a time consume it, and
``consume_lock`` is held while a listener runs, so a rebalance can wait for in-flight messages to
finish before it commits and unlocks the queue.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque

from connector.client.messages import Message, MessageQueue

__all__ = ["ProcessQueue"]


class ProcessQueue:
    """Buffered and in-flight messages of one queue, its pull position and its broker lock state."""

    def __init__(self, mq: MessageQueue, next_offset: int, epoch: int = 0) -> None:
        self.mq = mq
        self.next_offset = next_offset
        self.epoch = epoch
        self.locked = epoch > 0
        self.last_lock_time = time.monotonic() if self.locked else 0.0
        self.dropped = False
        self.lost = None  # a MessagesLostError not accepted: the queue is not pulled any more
        self.scheduled = False  # a consume request is queued or running
        self.suspended_until = 0.0
        self.local_lock = threading.Lock()
        self.consume_lock = threading.Lock()
        self.commit_lock = threading.Lock()  # one offset commit RPC at a time, always the newest offset
        self._lock = threading.Lock()
        self._buffer: deque[Message] = deque()
        self._consuming: dict[int, Message] = {}
        self._outstanding: dict[int, Message] = {}
        self._max_offset = next_offset - 1
        self.committed_offset = -1
        self.pending_commit: int | None = None
        self.last_pulled: Message | None = None  # what a re-lock checks the broker still holds
        self.boot_id = 0  # the broker start that answered the last pull (0: none yet)
        self.found_empty_at = 0.0  # when a pull last found the queue at its end (time.monotonic)

    def __repr__(self) -> str:
        return (
            f"ProcessQueue({self.mq}, next={self.next_offset}, epoch={self.epoch}, locked={self.locked}, "
            f"dropped={self.dropped}, buffered={len(self._buffer)}, consuming={len(self._consuming)}, "
            f"scheduled={self.scheduled}, committed={self.committed_offset}, lost={self.lost is not None})"
        )

    # -- lock state ----------------------------------------------------------------------------

    def mark_locked(self, epoch: int) -> None:
        self.epoch = epoch
        self.locked = True
        self.last_lock_time = time.monotonic()

    def lock_expired(self, max_live: float) -> bool:
        """True when the last successful lock is older than ``max_live`` seconds."""
        return time.monotonic() - self.last_lock_time > max_live

    # -- scheduling ----------------------------------------------------------------------------

    def try_schedule(self) -> bool:
        """Claim the right to queue a consume request: False when one is queued or the queue is suspended."""
        with self._lock:
            if self.scheduled or time.monotonic() < self.suspended_until:
                return False
            self.scheduled = True
            return True

    def unschedule(self) -> None:
        with self._lock:
            self.scheduled = False

    # -- offsets -------------------------------------------------------------------------------

    def stage_commit(self, offset: int) -> bool:
        """Remember ``offset`` as the one to commit; False when a commit at or past it happened."""
        with self._lock:
            if offset <= self.committed_offset or (self.pending_commit is not None and offset < self.pending_commit):
                return False
            self.pending_commit = offset
            return True

    def consumed_offset(self) -> int:
        """The offset after what was consumed and committed or staged to be (-1: none yet)."""
        with self._lock:
            return max(self.committed_offset, -1 if self.pending_commit is None else self.pending_commit)

    def commit_done(self, offset: int) -> None:
        with self._lock:
            if self.pending_commit == offset:
                self.pending_commit = None
            self.committed_offset = max(self.committed_offset, offset)

    # -- orderly -------------------------------------------------------------------------------

    def put(self, messages: list[Message]) -> None:
        with self._lock:
            self._buffer.extend(messages)
            if messages:
                self._max_offset = max(self._max_offset, messages[-1].queue_offset)

    def take(self, n: int) -> list[Message]:
        """The next ``n`` buffered messages, moved to ``consuming``."""
        with self._lock:
            out = []
            while self._buffer and len(out) < n:
                m = self._buffer.popleft()
                self._consuming[m.queue_offset] = m
                out.append(m)
            return out

    def commit(self) -> int | None:
        """Forget the consuming messages; the offset after them (None when there were none)."""
        with self._lock:
            if not self._consuming:
                return None
            offset = max(self._consuming) + 1
            self._consuming.clear()
            return offset

    def consume_again(self, messages: list[Message]) -> list[Message]:
        """Put ``messages`` back at the head of the buffer, counting one more attempt each."""
        with self._lock:
            again = []
            for m in messages:
                self._consuming.pop(m.queue_offset, None)
                again.append(dataclasses.replace(m, reconsume_times=m.reconsume_times + 1))
            self._buffer.extendleft(reversed(again))
            return again

    def rollback(self) -> None:
        """Everything consumed since the last commit goes back to the head of the buffer."""
        with self._lock:
            back = [self._consuming[k] for k in sorted(self._consuming)]
            self._consuming.clear()
            self._buffer.extendleft(reversed(back))

    def has_temp_message(self) -> bool:
        with self._lock:
            return bool(self._buffer)

    def idle(self) -> bool:
        """Nothing buffered, in flight or uncommitted."""
        with self._lock:
            return not self._buffer and not self._consuming and not self._outstanding

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._buffer) + len(self._consuming) + len(self._outstanding)

    # -- concurrent ----------------------------------------------------------------------------

    def put_outstanding(self, messages: list[Message]) -> None:
        with self._lock:
            for m in messages:
                self._outstanding[m.queue_offset] = m
            if messages:
                self._max_offset = max(self._max_offset, messages[-1].queue_offset)

    def remove(self, messages: list[Message]) -> int:
        """Mark messages done; the offset all messages below are done up to."""
        with self._lock:
            for m in messages:
                self._outstanding.pop(m.queue_offset, None)
            if self._outstanding:
                return next(iter(self._outstanding))
            return self._max_offset + 1
