"""The pull consumer: the caller decides which queue, from which offset (RocketMQ's
``DefaultLitePullConsumer`` with ``assign``/``seek``/``commitSync``).

With ``group`` set, positions can be committed to the broker and queues locked: a locked queue's
pulls and commits carry the lock's fencing epoch, and the broker refuses them with ``FencedError``
once another client has taken the lock.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from broker.wire import codec
from broker.wire.errors import (
    DamagedRecordError,
    InvalidOptionError,
    NotMasterError,
    OffsetOutOfRangeError,
    OrderlyMQError,
    QueueOutOfRangeError,
)
from connector.client.arrivals import ArrivalWait, by_broker, common_start
from connector.client.connection import BrokerConnection, Credentials, TlsOptions, pb
from connector.client.locking import lock_queues
from connector.client.messages import Message, MessageQueue, PullResult, same_stored
from connector.client.pull_port import PullLinkPool, PullPortFailure
from connector.client.routed import RoutedConnection

__all__ = ["EARLIEST", "EMPTY_RECHECK_S", "LATEST", "PullConsumer", "default_client_id", "found_empty_last",
           "message_at", "still_stored"]

log = logging.getLogger(__name__)
_POLL_PAUSE_S = 0.05  # between rounds of pulls, where the brokers cannot wait for messages themselves
# A queue found at its end is pulled again only this much later while other queues have messages
# (here and in the push consumers): catching up on one queue of 8 took 8 pulls per poll, 7 of them
# empty (14,300 msg/s).
EMPTY_RECHECK_S = 0.05

EARLIEST = "earliest"
LATEST = "latest"

_T = TypeVar("_T")


def found_empty_last(queues: list[_T], found_empty_at: Callable[[_T], float]) -> tuple[list[_T], list[_T]]:
    """``queues`` in two parts, each in order: those not found at their end (``found_empty_at``,
    ``time.monotonic``) in the last ``EMPTY_RECHECK_S``, and those, pulled only when the first
    part has nothing."""
    since = time.monotonic() - EMPTY_RECHECK_S
    fresh: list[_T] = []
    recent: list[_T] = []
    for queue in queues:
        (recent if found_empty_at(queue) > since else fresh).append(queue)
    return fresh, recent


def message_at(conn: BrokerConnection, topic: str, queue_id: int, offset: int) -> Message | None:
    """The message stored at ``offset`` (an unlocked pull of one); None when none can be read
    there (past the end, removed by retention, damaged)."""
    try:
        found = conn.call("Pull", pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, max_messages=1))
    except (OffsetOutOfRangeError, DamagedRecordError):
        return None
    messages = Message.from_table(codec.decode_many(found.batches), topic, queue_id)
    return messages[0] if messages and messages[0].queue_offset == offset else None


def still_stored(conn: BrokerConnection, pulled: Message) -> bool:
    """Whether the queue still holds ``pulled`` at its offset: not after a broker start whose log
    lost its tail and stored other messages there (``same_stored``)."""
    found = message_at(conn, pulled.topic, pulled.queue_id, pulled.queue_offset)
    return found is not None and same_stored(found, pulled)


def default_client_id() -> str:
    """``host@pid@random``: unique per consumer instance."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


class PullConsumer:
    """Pull messages from chosen queues at chosen offsets; thread-safe per queue.

    Parameters
    ----------
    brokers : str
        ``"host:port[,host:port]"``.
    group : str, optional
        Consumer group, needed to commit offsets and to lock queues.
    client_id : str, optional
        This instance's id in the group (default: host, pid and a random suffix).
    timeout, retry_timeout : float
        Seconds per RPC attempt, and how long an unreachable broker is retried.
    tls, credentials : TlsOptions, Credentials, optional
        TLS to the broker, and the access key / secret of a broker with access control
        (docs/security.md); credentials default to ORDERLYMQ_ACCESS_KEY / ORDERLYMQ_SECRET_KEY.
    """

    def __init__(
        self,
        brokers: str,
        *,
        group: str | None = None,
        client_id: str | None = None,
        timeout: float = 10.0,
        retry_timeout: float = 30.0,
        tls: TlsOptions | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.connection = RoutedConnection(brokers, timeout=timeout, retry_timeout=retry_timeout, tls=tls,
                                           credentials=credentials)
        self.group = group
        self.client_id = client_id or default_client_id()
        self.routes = self.connection.routes
        self._lock = threading.Lock()
        self._positions: dict[MessageQueue, int] = {}
        self._followed: dict[MessageQueue, tuple[int, Message]] = {}  # poll's last message and the broker start
        self._epochs: dict[MessageQueue, int] = {}
        self._next_queue = 0
        self._found_empty: dict[MessageQueue, float] = {}  # when a poll last found the queue at its end
        self._links = PullLinkPool()
        self._arrivals = ArrivalWait()

    # -- single pulls --------------------------------------------------------------------------

    def pull(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_messages: int = 32,
        *,
        wait_ms: int = 0,
        max_bytes: int = 0,
        tag_expression: str | None = None,
    ) -> PullResult:
        """Messages of one queue from ``offset`` on (at most ``max_messages``), in queue order.

        ``wait_ms`` long-polls when nothing is stored at ``offset`` yet. When this consumer holds
        the queue's lock (``lock``), the pull is fenced by its epoch. Raises ``TopicNotFoundError``,
        ``QueueOutOfRangeError``, ``OffsetOutOfRangeError``, ``FencedError``.
        """
        mq = MessageQueue(topic, queue_id)
        epoch = self._epochs.get(mq)
        request = pb.PullRequest(
            topic=topic,
            queue_id=queue_id,
            offset=offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            wait_ms=wait_ms,
            tag_expression=tag_expression or "",
        )
        if epoch is not None:
            request.group, request.client_id, request.epoch = self.group or "", self.client_id, epoch
        response = self._pull_on_link(request)
        if response is None:
            timeout = self.connection.timeout + wait_ms / 1000
            response = self.connection.call("Pull", request, timeout=timeout)
        table = codec.decode_many(response.batches)
        return PullResult(
            topic=topic,
            queue_id=queue_id,
            messages=Message.from_table(table, topic, queue_id),
            next_offset=response.next_offset,
            min_offset=response.min_offset,
            max_offset=response.max_offset,
            boot_id=response.boot_id,
        )

    def _pull_on_link(self, request: pb.PullRequest):
        """The answer to ``request`` over the lean port of the broker holding its queue (a group's
        master); None where that broker serves none, or the link failed or reached a group's slave:
        gRPC then carries the pull, and its connection follows the master."""
        try:
            broker = self.connection.for_queue(request.topic, request.queue_id)
        except OrderlyMQError:
            return None  # gRPC's call says why
        link = self._links.lease(broker)
        if link is None:
            return None
        try:
            link.issue(request)
            response = link.receive(request.wait_ms / 1000)
        except (PullPortFailure, NotMasterError) as exc:
            log.info("pulling over the lean port of %s failed (%s); pulling over gRPC", broker.address, exc)
            self._links.discard(broker, link)
            return None
        except OrderlyMQError:  # the broker's answer, read: the link goes on
            self._links.give_back(broker, link)
            raise
        self._links.give_back(broker, link)
        return response

    def query_offsets(self, topic: str, queue_id: int, timestamp_ms: int | None = None) -> tuple[int, int, int]:
        """``(min_offset, max_offset, offset_for_timestamp)``; the last is max_offset without a timestamp."""
        request = pb.QueryOffsetsRequest(topic=topic, queue_id=queue_id)
        if timestamp_ms is not None:
            request.timestamp, request.has_timestamp = int(timestamp_ms), True
        r = self.connection.call("QueryOffsets", request)
        return r.min_offset, r.max_offset, r.offset_for_timestamp

    # -- assignment and positions --------------------------------------------------------------

    def queues(self, topic: str) -> list[MessageQueue]:
        """The topic's queues; ``TopicNotFoundError`` when it does not exist."""
        return self.routes.queues(topic, refresh=True)

    def assign(self, topic: str, queue_ids: list[int] | None = None, *, start: str = "committed") -> None:
        """Consume ``queue_ids`` of ``topic`` (all queues when None) with ``poll``.

        Each queue starts at the group's committed offset (``start="committed"``, falling back to
        the earliest), or at ``"earliest"`` / ``"latest"``.
        """
        all_queues = self.queues(topic)
        chosen = all_queues if queue_ids is None else [MessageQueue(topic, q) for q in queue_ids]
        for mq in chosen:
            if mq not in all_queues:
                raise QueueOutOfRangeError(f"topic {topic!r} has queues 0..{len(all_queues) - 1}, not {mq.queue_id}")
        for mq in chosen:
            self._move(mq, self._start_offset(mq, start))

    def assignment(self) -> list[MessageQueue]:
        return sorted(self._positions)

    def unassign(self, topic: str | None = None) -> None:
        for mq in [m for m in self._positions if topic is None or m.topic == topic]:
            del self._positions[mq]
            self._followed.pop(mq, None)
            self._found_empty.pop(mq, None)

    def _start_offset(self, mq: MessageQueue, start: str) -> int:
        lo, hi, _ = self.query_offsets(mq.topic, mq.queue_id)
        if start == "committed":
            committed = self.committed(mq.topic, mq.queue_id) if self.group else -1
            return max(committed, lo) if committed >= 0 else lo
        if start == EARLIEST:
            return lo
        if start == LATEST:
            return hi
        raise InvalidOptionError(f"start must be 'committed', 'earliest' or 'latest', got {start!r}")

    def position(self, topic: str, queue_id: int) -> int:
        """The offset the next ``poll`` of this queue starts at."""
        return self._positions[self._assigned(topic, queue_id)]

    def _assigned(self, topic: str, queue_id: int) -> MessageQueue:
        mq = MessageQueue(topic, queue_id)
        if mq not in self._positions:
            raise InvalidOptionError(f"queue {mq} is not assigned; call assign({topic!r}, [{queue_id}]) first")
        return mq

    def seek(self, topic: str, queue_id: int, offset: int | str) -> int:
        """Move an assigned queue to ``offset``, ``"earliest"`` or ``"latest"``; returns the offset."""
        mq = self._assigned(topic, queue_id)
        return self._move(mq, self._start_offset(mq, offset) if isinstance(offset, str) else int(offset))

    def seek_to_timestamp(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Move an assigned queue to its first message stored at or after ``timestamp_ms``."""
        mq = self._assigned(topic, queue_id)
        return self._move(mq, self.query_offsets(topic, queue_id, timestamp_ms)[2])

    def _move(self, mq: MessageQueue, offset: int) -> int:
        """Set a queue's position where its caller (not its last poll) says."""
        self._positions[mq] = offset
        self._followed.pop(mq, None)
        self._found_empty.pop(mq, None)
        return offset

    def poll(self, max_messages: int = 32, *, wait_ms: int = 0, tag_expression: str | None = None) -> list[Message]:
        """The next messages of one assigned queue that has some (queues taken in turn; one found at
        its end waits ``EMPTY_RECHECK_S`` for its next turn while others have messages).

        Advances that queue's position; commit it with ``commit``. With ``wait_ms``, waits up to
        that long in total when no queue has anything: on the brokers, which answer as soon as a
        message arrives in one of the queues (``AwaitMessages``).

        A queue answered by another start of the broker than its last poll is checked first: if its
        log lost its tail (a power cut with flush = "async") and other messages were stored at those
        offsets, or it now ends below the position, the position moves back to the first message
        stored since the last one polled, so that none of them is skipped.
        """
        with self._lock:
            queues = sorted(self._positions)
        if not queues:
            raise InvalidOptionError("no queue assigned; call assign(topic) first")
        deadline = time.monotonic() + wait_ms / 1000
        in_vain = False  # a queue was ready, and the pass after found nothing: pause before waiting again
        while True:
            for index in self._poll_order(queues):
                mq = queues[index]
                with self._lock:
                    self._next_queue = index + 1
                position = self._positions[mq]
                messages = self._poll_queue(mq, max_messages, tag_expression)
                if messages:
                    self._found_empty.pop(mq, None)
                    return messages
                if self._positions.get(mq) == position:  # at its end (not past messages its tags filtered)
                    self._found_empty[mq] = time.monotonic()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            ready = None if in_vain else self._await_messages(queues, remaining)
            in_vain = bool(ready)
            if ready is None:
                time.sleep(min(_POLL_PAUSE_S, max(0.0, deadline - time.monotonic())))

    def _poll_order(self, queues: list[MessageQueue]) -> list[int]:
        """One pass over ``queues`` (their indexes) in turn from the last one pulled: first those not
        found at their end in the last ``EMPTY_RECHECK_S``, then those."""
        with self._lock:
            start = self._next_queue
        turn = [(start + i) % len(queues) for i in range(len(queues))]
        fresh, recent = found_empty_last(turn, lambda i: self._found_empty.get(queues[i], 0.0))
        return fresh + recent

    def _await_messages(self, queues: list[MessageQueue], timeout_s: float) -> bool | None:
        """Wait on the brokers until one of ``queues`` holds a message past its position (True), at
        most ``timeout_s`` (False); None when they cannot wait (``ArrivalWait``)."""
        with self._lock:
            at = {mq: self._positions[mq] for mq in queues if mq in self._positions}
            starts = {mq: self._followed[mq][0] for mq in at if mq in self._followed}  # of the last message polled
        grouped = [(broker, common_start(starts[mq] for mq in its if mq in starts),
                    [(mq.topic, mq.queue_id, at[mq]) for mq in its])
                   for broker, its in by_broker(self.connection, at, lambda mq: (mq.topic, mq.queue_id))]
        return self._arrivals.wait(grouped, timeout_s) if grouped else None

    def _poll_queue(self, mq: MessageQueue, max_messages: int, tag_expression: str | None) -> list[Message]:
        """The next messages of ``mq`` from its position, which moves past them; pulled once more
        from where its log was cut when it lost its tail."""
        for _ in range(2):
            try:
                result = self.pull(mq.topic, mq.queue_id, self._positions[mq], max_messages,
                                   tag_expression=tag_expression)
            except OffsetOutOfRangeError:
                if not self._ended_below(mq):
                    raise
                continue
            if not self._reads_on(mq, result.boot_id):
                continue
            self._positions[mq] = result.next_offset
            if result.messages:
                self._followed[mq] = (result.boot_id, result.messages[-1])
            return result.messages
        return []

    def _reads_on(self, mq: MessageQueue, boot_id: int) -> bool:
        """Whether a poll of ``mq`` answered by broker start ``boot_id`` goes on from its position:
        yes unless another start answers and the last message polled is not there any more (then
        the position moves to the cut)."""
        followed = self._followed.get(mq)
        if followed is None or followed[0] == boot_id:
            return True
        last = followed[1]
        if still_stored(self.connection, last):
            self._followed[mq] = (boot_id, last)
            return True
        self._start_at_cut(mq, last)
        return False

    def _ended_below(self, mq: MessageQueue) -> bool:
        """Whether a queue polled before now ends below its position (its log lost its tail, or the
        topic was recreated); its position then moves to the cut."""
        followed = self._followed.get(mq)
        if followed is None or self._positions[mq] <= self.query_offsets(mq.topic, mq.queue_id)[1]:
            return False  # below the first message (retention): the caller decides
        self._start_at_cut(mq, followed[1])
        return True

    def _start_at_cut(self, mq: MessageQueue, last: Message) -> None:
        """Move ``mq`` to the first message stored after ``last``, the last one polled."""
        cut = self.query_offsets(mq.topic, mq.queue_id, last.store_timestamp + 1)[2]
        log.warning("pull consumer %s: %s no longer holds the message polled at offset %d (a power cut cut its "
                    "log's tail): polling on from offset %d, the first stored since", self.client_id, mq,
                    last.queue_offset, cut)
        self._move(mq, cut)

    # -- offsets -------------------------------------------------------------------------------

    def _require_group(self, what: str) -> str:
        if not self.group:
            raise InvalidOptionError(f"{what} needs a consumer group: PullConsumer(brokers, group='...')")
        return self.group

    def committed(self, topic: str, queue_id: int) -> int:
        """The group's committed offset (the next to consume), -1 when none."""
        request = pb.GetOffsetRequest(group=self._require_group("committed"), topic=topic, queue_id=queue_id)
        return self.connection.call("GetOffset", request).offset

    def commit(self, topic: str | None = None, queue_id: int | None = None, offset: int | None = None) -> None:
        """Commit positions to the broker: one queue (``offset`` or its position) or every assigned
        queue. Fenced by the lock epoch when this consumer locked the queue."""
        group = self._require_group("commit")
        if topic is not None and queue_id is not None:
            mq = MessageQueue(topic, queue_id)
            targets = {mq: offset if offset is not None else self.position(topic, queue_id)}
        else:
            targets = {mq: pos for mq, pos in self._positions.items() if topic is None or mq.topic == topic}
        for mq, pos in targets.items():
            request = pb.CommitOffsetRequest(group=group, topic=mq.topic, queue_id=mq.queue_id, offset=pos)
            epoch = self._epochs.get(mq)
            if epoch is not None:
                request.client_id, request.epoch = self.client_id, epoch
            self.connection.call("CommitOffset", request)

    # -- locks ---------------------------------------------------------------------------------

    def lock(self, topic: str, queue_id: int, *, wait: float = 0.0) -> int:
        """Take (or renew) the group's lock of a queue; returns the fencing epoch.

        While another live client holds it, retries for up to ``wait`` seconds, then raises
        ``LockUnavailableError`` naming the holder.
        """
        group = self._require_group("lock")
        queue = (topic, queue_id)
        epoch = lock_queues(self.connection, group, self.client_id, [queue], wait,
                            advice="It is released when that client unlocks it or its lease expires; pass wait= "
                                   "to wait for it.")[queue]
        self._epochs[MessageQueue(topic, queue_id)] = epoch
        return epoch

    def unlock(self, topic: str, queue_id: int) -> None:
        """Release the lock of a queue (pulls are no longer fenced)."""
        group = self._require_group("unlock")
        request = pb.UnlockBatchRequest(group=group, client_id=self.client_id, topic=topic, queue_ids=[queue_id])
        self.connection.call("UnlockBatch", request)
        self._epochs.pop(MessageQueue(topic, queue_id), None)

    def epoch(self, topic: str, queue_id: int) -> int | None:
        """The fencing epoch of a queue this consumer locked, else None."""
        return self._epochs.get(MessageQueue(topic, queue_id))

    def close(self) -> None:
        """Release the locks this consumer holds (best effort: leases expire anyway) and disconnect."""
        self._arrivals.close()
        for mq in list(self._epochs):
            try:
                request = pb.UnlockBatchRequest(
                    group=self.group or "", client_id=self.client_id, topic=mq.topic, queue_ids=[mq.queue_id]
                )
                self.connection.call("UnlockBatch", request, retry=False)
            except OrderlyMQError:
                pass
            self._epochs.pop(mq, None)
        self._links.close()
        self.connection.close()

    def __enter__(self) -> PullConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
