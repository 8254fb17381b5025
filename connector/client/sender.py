"""Pipelined sending over one ``SendStream``, keeping every queue's order through retries.

The stream is a gRPC call, or the same requests and answers over the broker's send port
(``PortStream``) when it serves one: everything below holds for either.

Messages submitted for a queue wait at most ``linger_ms`` to be coalesced into one batch
(``max_batch_messages`` / ``max_batch_bytes``); up to ``max_in_flight_per_queue`` batches of a queue
are on the stream at once. Each batch carries the producer id and the queue's next sequence number,
so the broker stores it at most once.

Ordering argument: the broker handles a stream's requests one after another and answers in request
order. Batches of one queue are written to the stream in sequence order. When the stream breaks,
every unacknowledged batch is written again, in the same order, with the same producer id and
sequence: those the broker had stored come back as ``duplicate`` with their original offsets, the
others are stored after them. A batch the broker rejects (a per-request error) is never resent, so no
batch is ever stored after a later batch of its queue.

Delivery timeout: every send is answered within ``delivery_timeout`` seconds of its submission (a
watchdog enforces it, whatever the stream is doing). When that time passes without an answer, the
stream is cancelled and every waiting send fails, in one of two ways:

- a send that was never written to the stream fails with ``BrokerUnavailableError``: the broker never
  received it, it is dropped and never sent later;
- a send that was written fails with ``SendOutcomeUnknownError``: it may already be stored. Its batch
  stays at the head of its queue and is resent, with the same producer id and sequence, on every later
  stream until the broker answers (it stores it at most once); only then do later batches of the
  queue follow, so the queue's order holds. The answer settles the outcome (``settlement``).
"""

from __future__ import annotations

import logging
import queue as queue_mod
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property

import grpc
import pyarrow as pa

from broker.wire import codec
from broker.wire.errors import (
    BadBatchError,
    BrokerUnavailableError,
    OrderlyMQError,
    SendOutcomeUnknownError,
    from_answer,
    from_rpc_error,
)
from broker.wire.message_rows import encode_rows
from broker.wire.one_message import encode_one
from broker.wire.send_request import EncodedSend, encode_send_request
from connector.client.busy_poll import SENDING
from connector.client.connection import BrokerConnection, pb
from connector.client.messages import SendResult
from connector.client.send_future import SendFuture
from connector.client.send_port import PortStream, SendPortClient, SendPortFailure
from connector.client.send_results import SendResults

__all__ = ["PipelinedSender"]

log = logging.getLogger(__name__)

_MAX_SETTLEMENTS = 10_000  # settled outcomes kept for ``settlement`` (oldest dropped)
_WATCH_INTERVAL_S = 0.5  # the watchdog looks at the deadlines at least this often
_PORT_CONNECT_TIMEOUT_S = 2.0  # past it, batches go over gRPC while the send port is looked up again
# Answers of a broker group that leave a send to be resent, same producer id and sequence, on a
# new stream to the master: a slave refused it, or the master lost its role or its slaves before
# the send was replicated (stored at most once when resent).
_RESEND_KINDS = frozenset({"NotMasterError", "ReplicationTimeoutError"})


def _stored_at(topic: str, queue_id: int, store_timestamp: int, duplicate: bool) -> Callable[[int], SendResult]:
    """The ``SendResult`` of a message of one answer, given its offset."""
    return lambda offset: SendResult(topic, queue_id, offset, store_timestamp, duplicate)


def _response_error(response: pb.SendResponse) -> OrderlyMQError:
    return from_answer(response.error_code, response.error_message, response.error_kind)


class _Submitted(SendFuture):
    """The future of one ``submit_one``, carrying its message to the dispatcher until it joins its
    queue. The inbox holds these rather than a tuple per message, which was one more object per
    message in flight for Python's cyclic collector (what that costs: docs/client.md). Its own
    fields are slots, held in the object rather than beside it: with 500,000 futures kept, the
    collector's full passes took 380-570 ms instead of 720-850, and the sends went 6% faster (the
    median of 8 alternated runs).

    A callback given with the message is its first callback from the start: no other thread can
    see the future yet, so it needs none of the lock ``add_done_callback`` takes, which every
    answer's thread holds while it finishes a batch's futures."""

    __slots__ = ("_topic", "_queue_id", "_row", "_deadline", "_at")

    def __init__(self, topic: str, queue_id: int, row: dict, deadline: float, at: float,
                 callback: Callable[[Future], object] | None) -> None:
        SendFuture.__init__(self)  # not super(): a super object is one more for the cyclic collector
        self._topic, self._queue_id, self._row, self._deadline, self._at = topic, queue_id, row, deadline, at
        self._early_callbacks = callback


@dataclass(eq=False, slots=True)
class _Chunk:
    """Rows submitted together: a normalized table, or validated message dicts turned into Arrow
    only when their batch is built. Either one send of many rows (one queue's share of a batch
    send): one future for them all; or ``single`` sends of one row each, a future per row (the
    consecutive asynchronous sends of a queue share one chunk: no object per message)."""

    table: pa.Table | None
    rows: list[dict] | None
    futures: list[Future]
    single: bool
    nbytes: int
    num_rows: int
    deadline: float  # the earliest of its sends'


def _futures(chunks) -> int:
    return sum(len(chunk.futures) for chunk in chunks)


def _row_bytes(row: dict) -> int:
    return len(row["body"]) + 64


@dataclass(eq=False)
class _Batch:
    topic: str
    queue_id: int
    sequence: int
    chunks: list[_Chunk]
    request: pb.SendRequest | EncodedSend | None = None
    error: OrderlyMQError | None = None
    written: bool = False  # handed to a stream: the broker may have it
    dropped: bool = False  # failed before it was written: never to be sent
    settled: Future | None = None  # set once reported as of unknown outcome

    @cached_property
    def deadline(self) -> float:  # the watchdog asks often, the chunks never change
        return min(chunk.deadline for chunk in self.chunks)


def _batch_payload(chunks: list[_Chunk]) -> bytes | list[bytes | pa.Buffer]:
    """The Arrow IPC stream of the chunks' rows in order (or its parts): message dicts alone (what
    ``send_async`` queues) are laid out directly, tables among them joined by Arrow."""
    if all(chunk.rows is not None for chunk in chunks):
        return encode_rows([row for chunk in chunks for row in chunk.rows])
    return codec.encode_parts(_batch_table(chunks))


def _batch_table(chunks: list[_Chunk]) -> pa.Table:
    """One table of the chunks' rows in order; consecutive dict chunks become one Arrow conversion."""
    tables: list[pa.Table] = []
    rows: list[dict] = []
    for chunk in chunks:
        if chunk.rows is not None:
            rows.extend(chunk.rows)
            continue
        if rows:
            tables.append(codec.messages_to_batch(rows))
            rows = []
        tables.append(chunk.table)
    if rows:
        tables.append(codec.messages_to_batch(rows))
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


@dataclass(eq=False)
class _Partition:
    pending: deque = field(default_factory=deque)
    pending_rows: int = 0
    pending_bytes: int = 0
    oldest: float = 0.0
    next_sequence: int = 0
    in_flight: int = 0
    urgent: bool = False
    direct: bool = False  # a send on the send port is out: nothing else of the queue leaves meanwhile
    turn: threading.Condition | None = None  # where other threads' sends wait for the direct one to end
    waiting: int = 0  # how many do


class PipelinedSender:
    """Sends batches of many queues on one stream; see the module docstring for the guarantees."""

    def __init__(
        self,
        connection: BrokerConnection,
        producer_id: str,
        *,
        linger_ms: float = 5.0,
        max_batch_messages: int = 1000,
        max_batch_bytes: int = 1 << 20,
        max_in_flight_per_queue: int = 4,
        max_buffered_messages: int = 100_000,
        delivery_timeout: float = 30.0,
        busy_poll_us: float = 0,
        on_rejected: Callable[[str, OrderlyMQError], None] = lambda topic, error: None,
    ) -> None:
        self._conn = connection
        self._on_rejected = on_rejected  # told of every batch the broker refused, before its sends fail
        self.producer_id = producer_id
        self.linger = linger_ms / 1000
        self.max_batch_messages = max_batch_messages
        self.max_batch_bytes = max_batch_bytes
        self.window = max_in_flight_per_queue
        self.max_buffered = max_buffered_messages
        self.delivery_timeout = delivery_timeout
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        # The watchdog waits apart: a wake-up at every notify (each batch acknowledged, each queue
        # that starts lingering) would cost a pass over every deadline for nothing.
        self._watch = threading.Condition(self._lock)
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._in_flight: deque[_Batch] = deque()
        self._requests: queue_mod.SimpleQueue | None = None
        self._call: grpc.Future | PortStream | None = None
        self._settlements: dict[tuple[str, int, int], Future] = {}
        self._outstanding = 0  # futures handed out and not yet resolved
        self._buffered = 0  # rows submitted and not yet on the stream
        self._flushing = 0
        self._closed = False
        self._inbox: deque[_Submitted] = deque()
        self._idle = False  # the dispatcher waits with nothing buffered: an inbox message must wake it
        self._send_port = SendPortClient(connection, busy_poll_us)  # send_direct's round trips poll
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="orderlymq-send-dispatch", daemon=True)
        self._streamer = threading.Thread(target=self._stream_loop, name="orderlymq-send-stream", daemon=True)
        self._watchdog = threading.Thread(target=self._watch_loop, name="orderlymq-send-watchdog", daemon=True)
        self._dispatcher.start()
        self._streamer.start()
        self._watchdog.start()

    # -- submitting ----------------------------------------------------------------------------

    def submit(
        self,
        topic: str,
        queue_id: int,
        data: pa.Table | list[dict],
        *,
        single: bool,
        urgent: bool,
        deadline: float | None = None,
    ) -> list[Future]:
        """Queue rows for ``(topic, queue_id)``: a normalized table, or validated message dicts (see
        ``codec.messages_to_batch``). Returns one future per chunk of at most one batch; a future
        resolves to a ``SendResult`` (``single``) or ``SendResults``, one per row, or fails by
        ``deadline`` (``time.monotonic()``; default: now + ``delivery_timeout``).
        """
        return self.submit_tables(topic, [(queue_id, data)], single=single, urgent=urgent, deadline=deadline)[0]

    def submit_tables(
        self,
        topic: str,
        shares: list[tuple[int, pa.Table | list[dict]]],
        *,
        single: bool,
        urgent: bool,
        deadline: float | None = None,
    ) -> list[list[Future]]:
        """``submit`` of several queues' rows at once, ``(queue_id, data)`` each: one pass under the
        lock and one wake-up of the dispatcher for all of them. A table routed over a thousand
        queues, submitted a queue at a time, woke the dispatcher a thousand times, and the caller
        spent most of its time waiting for the GIL it handed over. Futures per share, in order."""
        default_deadline = time.monotonic() + self.delivery_timeout
        # A deadline well before the usual one must be seen by the watchdog now (it looks every 0.5 s).
        shortened = deadline is not None and deadline < default_deadline - _WATCH_INTERVAL_S
        if deadline is None:
            deadline = default_deadline
        split = [(queue_id, self._chunks(data, single, deadline)) for queue_id, data in shares]
        wake = urgent or shortened
        with self._cond:
            self._take_inbox()
            for queue_id, chunks in split:
                if self._buffered >= self.max_buffered:
                    self._cond.notify_all()  # what is queued must leave to make room
                partition = self._partition_with_room(topic, queue_id)
                was_empty = not partition.pending
                if was_empty:
                    partition.oldest = time.monotonic()
                for chunk in chunks:
                    partition.pending.append(chunk)
                    partition.pending_rows += chunk.num_rows
                    partition.pending_bytes += chunk.nbytes
                    self._buffered += chunk.num_rows
                partition.urgent = partition.urgent or urgent
                self._outstanding += _futures(chunks)
                wake = wake or was_empty or self._full(partition)
            # Wake the threads only when this changes what they wait for: a queue to linger on, a
            # batch due now, or an earlier deadline. A wake-up per message would make the caller and
            # the dispatcher trade the GIL for every send.
            if wake:
                self._cond.notify_all()
            if shortened:
                self._watch.notify()
        return [[future for c in chunks for future in c.futures] for _, chunks in split]

    def _chunks(self, data: pa.Table | list[dict], single: bool, deadline: float) -> list[_Chunk]:
        """One queue's rows cut into chunks of at most one batch each."""
        if isinstance(data, list):
            futures = [SendFuture() for _ in data] if single else [SendFuture()]
            return [_Chunk(None, data, futures, single, sum(map(_row_bytes, data)), len(data), deadline)]
        step = self.max_batch_messages
        if data.num_rows > 1 and data.nbytes > self.max_batch_bytes:
            step = max(1, min(step, int(data.num_rows * self.max_batch_bytes / data.nbytes)))
        chunks = []
        for start in range(0, data.num_rows, step):
            part = data.slice(start, step)
            chunks.append(_Chunk(part, None, [SendFuture()], single, part.nbytes, part.num_rows, deadline))
        return chunks

    def submit_one(self, topic: str, queue_id: int, row: dict, deadline: float,
                   callback: Callable[[Future], object] | None = None) -> Future:
        """``submit`` of one validated message dict, not urgent (an asynchronous send): added to
        the queue's last waiting chunk of such sends while it fits in a batch. Its future resolves
        to the message's ``SendResult`` or fails by ``deadline``; ``callback(future)`` runs then.

        The message goes into the inbox without the lock, which the dispatcher (or the next call
        that takes the lock) empties into the queues in arrival order: threads calling this side by
        side would otherwise hand the lock to each other on most calls, each hand-over a thread
        woken that must then wait for the GIL (four threads sent a third of what one did)."""
        now = time.monotonic()
        future = _Submitted(topic, queue_id, row, deadline, now, callback)
        if (self._closed or self._buffered + len(self._inbox) >= self.max_buffered
                or deadline < now + self.delivery_timeout - _WATCH_INTERVAL_S):
            with self._lock:  # the condition's lock, without the condition's own Python-level __enter__
                self._take_inbox()
                self._add_one(self._partition_with_room(topic, queue_id), future)
                self._cond.notify_all()
                self._watch.notify()  # perhaps well before the usual deadline: the watchdog must see it now
            return future
        self._inbox.append(future)
        # After the append, as the dispatcher marks itself idle before looking at the inbox: one of
        # the two sees the other, so a message never waits in the inbox for a sleeping dispatcher.
        if self._idle or self._closed:
            with self._lock:
                self._take_inbox()
                self._cond.notify_all()
        return future

    def _take_inbox(self) -> None:
        """Under the lock: the messages ``submit_one`` left in the inbox join their queues, in the
        order they came (before anything later of the same thread, which takes the lock first)."""
        inbox, partitions, add, taken = self._inbox, self._partitions, self._add_row, 0
        try:
            while inbox:
                future = inbox.popleft()
                if self._closed:
                    future._row = None
                    future.set_exception(OrderlyMQError("the producer is closed; create a new one to send"))
                    continue
                queue = (future._topic, future._queue_id)
                partition = partitions.get(queue)
                if partition is None:
                    partition = partitions[queue] = _Partition()
                add(partition, future)
                taken += 1
        finally:  # counted once for the lot: this loop runs once per message sent
            self._buffered += taken
            self._outstanding += taken

    def _add_one(self, partition: _Partition, future: _Submitted) -> None:
        """Under the lock: one message into its queue's last chunk of single sends while it fits."""
        self._add_row(partition, future)
        self._buffered += 1
        self._outstanding += 1

    def _add_row(self, partition: _Partition, future: _Submitted) -> None:
        """``_add_one`` but for the buffer's counts, which the caller updates."""
        row, future._row = future._row, None  # a future the caller keeps does not keep the message
        nbytes = _row_bytes(row)
        pending = partition.pending
        last = pending[-1] if pending else None
        if (last is not None and last.single and last.rows is not None and last.num_rows < self.max_batch_messages
                and last.nbytes + nbytes <= self.max_batch_bytes):
            last.rows.append(row)
            last.futures.append(future)
            last.num_rows += 1
            last.nbytes += nbytes
        else:
            if last is None:
                partition.oldest = future._at
            pending.append(_Chunk(None, [row], [future], True, nbytes, 1, future._deadline))
        partition.pending_rows += 1
        partition.pending_bytes += nbytes

    def _partition_with_room(self, topic: str, queue_id: int) -> _Partition:
        """Under the lock: the queue's partition, once the buffer has room for more rows."""
        if self._closed:
            raise OrderlyMQError("the producer is closed; create a new one to send")
        while self._buffered >= self.max_buffered and not self._closed:
            self._cond.wait(0.1)
        key = (topic, queue_id)
        partition = self._partitions.get(key)
        if partition is None:
            partition = self._partitions[key] = _Partition()
        return partition

    def send_direct(self, topic: str, queue_id: int, row: dict, deadline: float) -> SendResult | Future | None:
        """Send one message over the broker's send port and wait for it, when its queue has
        nothing buffered or in flight (so it cannot pass an earlier message): its ``SendResult``.
        When the port does not answer, the message is resent on the stream under the same
        sequence, and the future of that send is returned. None: not taken, ``submit`` it.
        """
        if not self._send_port.ready():
            return None
        with SENDING:
            return self._send_direct(topic, queue_id, row, deadline)

    def _send_direct(self, topic: str, queue_id: int, row: dict, deadline: float) -> SendResult | Future | None:
        key = (topic, queue_id)
        with self._cond:
            if self._closed:
                raise OrderlyMQError("the producer is closed; create a new one to send")
            self._take_inbox()
            partition = self._partitions.get(key)
            if partition is None:
                partition = self._partitions[key] = _Partition()
            if partition.direct and not partition.pending:
                self._await_turn(partition, deadline)
            if partition.pending or partition.in_flight:
                return None
            sequence = partition.next_sequence
            partition.next_sequence += 1
            partition.in_flight += 1
            partition.direct = True
            self._outstanding += 1
        try:
            request = pb.SendRequest(topic=topic, queue_id=queue_id, batch=encode_one(row),
                                     producer_id=self.producer_id, sequence=sequence)
            response = self._send_port.round_trip(request, deadline)
        except SendPortFailure as failure:
            return self._hand_over(topic, queue_id, sequence, row, request, deadline, failure.written)
        except BaseException:
            self._direct_done(partition)  # not encodable: never sent (the sequence stays unused)
            raise
        if response.error_kind in _RESEND_KINDS:
            return self._hand_over(topic, queue_id, sequence, row, request, deadline, True)
        self._direct_done(partition)
        if response.error_code:
            error = _response_error(response)
            self._on_rejected(topic, error)
            raise error
        return SendResult(topic, queue_id, response.base_offset, response.store_timestamp, response.duplicate)

    def _await_turn(self, partition: _Partition, deadline: float) -> None:
        """Under the lock: wait while another thread's send of the queue is out on the send port (one
        at a time, so that the broker gets a queue's sequence numbers in order). Taking the port
        after it costs this send one wake-up; the stream would cost it four threads' hand-overs."""
        if partition.turn is None:
            partition.turn = threading.Condition(self._lock)
        partition.waiting += 1
        try:
            while partition.direct and not partition.pending and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return  # the stream's path fails it by its deadline
                partition.turn.wait(left)
        finally:
            partition.waiting -= 1
        if self._closed:
            raise OrderlyMQError("the producer is closed; create a new one to send")

    @staticmethod
    def _end_turn(partition: _Partition) -> None:
        """Under the lock, the queue's direct send ended: the sends waiting for it look again."""
        partition.direct = False
        if partition.waiting:
            partition.turn.notify_all()

    def _direct_done(self, partition: _Partition) -> None:
        with self._cond:
            partition.in_flight -= 1
            self._end_turn(partition)
            self._outstanding -= 1
            # Wake the threads only when one waits for this (sends held back behind it, a flush):
            # a wake-up per message would make them trade the GIL with the caller for nothing.
            if partition.pending or self._flushing:
                self._cond.notify_all()

    def _hand_over(self, topic: str, queue_id: int, sequence: int, row: dict, request: pb.SendRequest,
                   deadline: float, written: bool) -> Future:
        """Put a send the send port did not answer on the stream, first of its queue, as if it had
        been sent there: resent under its sequence (stored at most once), or failed by its deadline."""
        chunk = _Chunk(None, [row], [SendFuture()], True, _row_bytes(row), 1, deadline)
        batch = _Batch(topic, queue_id, sequence, [chunk], request=request, written=written)
        with self._cond:
            self._end_turn(self._partitions[(topic, queue_id)])
            self._in_flight.append(batch)
            if self._requests is not None:
                self._requests.put(batch)
            self._cond.notify_all()
        return chunk.futures[0]

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything buffered now and wait until every send so far is acknowledged or failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._take_inbox()
            self._flushing += 1
            self._cond.notify_all()
            try:
                while self._outstanding:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining if remaining is not None else 0.5)
                return True
            finally:
                self._flushing -= 1

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the stream and the threads.

        Batches of unknown outcome not settled by then stay unknown: their settlements fail.
        """
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._take_inbox()  # what came after the flush fails: see submit_one
            for partition in self._partitions.values():
                if partition.waiting:
                    partition.turn.notify_all()
            if self._requests is not None:
                self._requests.put(None)
            call = self._call if all(b.settled is not None for b in self._in_flight) else None
            self._cond.notify_all()
            self._watch.notify()
        if call is not None:
            call.cancel()  # only unsettled batches are left: do not wait for a broker that may not answer
        for thread in (self._dispatcher, self._streamer, self._watchdog):
            thread.join(timeout=5)
        self._send_port.close()

    def settlement(self, topic: str, queue_id: int, sequence: int) -> Future | None:
        """The future settling batch ``sequence`` of a queue once reported as of unknown outcome: it
        resolves to ``(base_offset, store_timestamp, duplicate)`` when the broker answers its resend
        (``duplicate``: it had been stored before), or fails when it cannot be settled. None for a
        batch never reported as unknown (or settled long ago)."""
        with self._cond:
            return self._settlements.get((topic, queue_id, sequence))

    # -- dispatching ---------------------------------------------------------------------------

    def _full(self, partition: _Partition) -> bool:
        return partition.pending_rows >= self.max_batch_messages or partition.pending_bytes >= self.max_batch_bytes

    def _due(self, partition: _Partition, now: float) -> bool:
        return (
            partition.urgent
            or self._flushing > 0
            or self._closed
            or self._full(partition)
            or now >= partition.oldest + self.linger
        )

    def _take_batches(self) -> tuple[list[_Batch], float | None]:
        """Under the lock: pop due batches, assigning sequences; and when to look again."""
        now = time.monotonic()
        batches, wake = [], None
        for (topic, queue_id), partition in self._partitions.items():
            while partition.pending and partition.in_flight < self.window and not partition.direct:
                if not self._due(partition, now):
                    wake = partition.oldest + self.linger if wake is None else min(wake, partition.oldest + self.linger)
                    break
                chunks, rows, nbytes = [], 0, 0
                while partition.pending:
                    nxt = partition.pending[0]
                    if chunks and (
                        rows + nxt.num_rows > self.max_batch_messages or nbytes + nxt.nbytes > self.max_batch_bytes
                    ):
                        break
                    partition.pending.popleft()
                    chunks.append(nxt)
                    rows += nxt.num_rows
                    nbytes += nxt.nbytes
                partition.pending_rows -= rows
                partition.pending_bytes -= nbytes
                partition.oldest = now
                if not partition.pending:
                    partition.urgent = False
                partition.in_flight += 1
                batches.append(_Batch(topic, queue_id, partition.next_sequence, chunks))
                partition.next_sequence += 1
        return batches, wake

    def _dispatch_loop(self) -> None:
        while True:
            with self._cond:
                self._take_inbox()
                batches, wake = self._take_batches()
                if not batches:
                    if self._closed and not self._outstanding:
                        return
                    self._idle = not any(partition.pending for partition in self._partitions.values())
                    if self._idle and self._inbox:  # came after the last look (see submit_one)
                        self._idle = False
                        continue
                    if wake is None:  # idle, or every waiting queue at its window: an answer wakes this
                        # (and an inbox message either wakes an idle one or waits here at most a linger)
                        timeout = 0.5 if self._idle else max(self.linger, 0.0005)
                    else:
                        timeout = max(0.0005, wake - time.monotonic())
                    self._cond.wait(timeout)
                    self._idle = False
                    continue
            for batch in batches:
                try:
                    payload = _batch_payload(batch.chunks)
                except Exception as exc:  # noqa: BLE001 - the dispatcher must survive any bad message
                    batch.error = exc if isinstance(exc, OrderlyMQError) else BadBatchError(f"cannot encode: {exc}")
                    continue
                batch.request = encode_send_request(batch.topic, batch.queue_id, payload,
                                                    producer_id=self.producer_id, sequence=batch.sequence)
            failed = [b for b in batches if b.error is not None]
            for batch in failed:
                for chunk in batch.chunks:
                    for future in chunk.futures:
                        future.set_exception(batch.error)
            with self._cond:
                for batch in failed:
                    self._partitions[(batch.topic, batch.queue_id)].in_flight -= 1
                    self._buffered -= sum(c.num_rows for c in batch.chunks)
                    self._outstanding -= _futures(batch.chunks)
                for batch in batches:
                    if batch.error is not None:
                        continue
                    self._in_flight.append(batch)
                    self._buffered -= sum(c.num_rows for c in batch.chunks)
                    if self._requests is not None:
                        self._requests.put(batch)
                self._cond.notify_all()


    # -- the stream ----------------------------------------------------------------------------

    def _iterate(self, requests: queue_mod.SimpleQueue) -> Iterator[pb.SendRequest]:
        """The stream's requests; a batch counts as written (possibly received) from here on."""
        while True:
            batch = requests.get()
            if batch is None:
                return
            with self._cond:
                if batch.dropped:
                    continue
                batch.written = True
            yield batch.request

    def _open_stream(self) -> tuple[grpc.Future | PortStream, queue_mod.SimpleQueue] | None:
        """Wait for batches to send and open a stream carrying them in order; None once closed and done."""
        with self._cond:
            while not self._in_flight and not (self._closed and not self._outstanding):
                self._cond.wait(0.5)
            done = not self._in_flight or (self._closed and all(b.settled is not None for b in self._in_flight))
        if done:
            self._abandon("the producer was closed before the broker answered")
            return None
        port_stream = self._connect_port()  # may ask the broker and connect: not under the lock
        with self._cond:
            requests: queue_mod.SimpleQueue = queue_mod.SimpleQueue()
            for batch in self._in_flight:
                requests.put(batch)
            if self._closed:  # close() ended the last stream: this one carries what is left, then ends
                requests.put(None)
            self._requests = requests
            if port_stream is not None:
                self._call = port_stream.start(self._iterate(requests))
            else:
                self._call = self._open_grpc_stream(requests)
            return self._call, requests

    def _connect_port(self) -> PortStream | None:
        """A stream over the broker's send port; None (gRPC for a while) when it has none or
        cannot be reached."""
        port = self._send_port.address()
        if port is None:
            return None
        try:
            return PortStream(self._send_port, *port, connect_timeout=_PORT_CONNECT_TIMEOUT_S)
        except OSError as exc:
            log.info("send port %s:%s unreachable (%s): batches go over gRPC for a while", *port, exc)
            self._send_port.failed()
            return None

    def _open_grpc_stream(self, requests: queue_mod.SimpleQueue) -> grpc.Future:
        return self._conn.on_current_stub(lambda stub: stub.SendStream(self._iterate(requests),
                                                                      metadata=self._conn.metadata))

    def _stream_loop(self) -> None:
        delay = 0.05
        while True:
            opened = self._open_stream()
            if opened is None:
                return
            call, requests = opened
            error: OrderlyMQError | None = None
            try:
                for response in call:
                    delay = 0.05
                    if response.error_kind in _RESEND_KINDS:  # nothing stored for good: resend to the master
                        error = _response_error(response)
                        call.cancel()
                        break
                    self._acknowledge(response)
            except grpc.RpcError as err:
                error = from_rpc_error(err)
            except BrokerUnavailableError as err:  # how a stream over the send port breaks
                error = err
            with self._cond:
                self._requests = self._call = None
                requests.put(None)
                broken = bool(self._in_flight)
            if not broken:
                continue
            log.warning(
                "send stream to %s broke (%s); resending %d unacknowledged batch(es)",
                self._conn.address,
                error or "stream ended",
                len(self._in_flight),
            )
            if error is not None and not isinstance(error, BrokerUnavailableError):
                self._expire(error)  # the broker refused the stream itself: resending would not help
                self._abandon(f"the broker refused the send stream: {error}")
                continue
            self._conn._fail_over(error)  # noqa: SLF001 - the next stream goes to the master, or the next address
            with self._cond:
                self._cond.wait(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)

    def _acknowledge(self, response: pb.SendResponse) -> None:
        with self._cond:
            batch = self._in_flight.popleft()
            self._partitions[(batch.topic, batch.queue_id)].in_flight -= 1
            self._cond.notify_all()
        error = _response_error(response) if response.error_code else None
        if batch.settled is not None:  # its sends already failed as of unknown outcome: settle it
            if error is not None:
                batch.settled.set_exception(error)
            else:
                batch.settled.set_result((response.base_offset, response.store_timestamp, response.duplicate))
            return
        if error is not None:
            self._on_rejected(batch.topic, error)
            for chunk in batch.chunks:
                for future in chunk.futures:
                    future.set_exception(error)
        else:
            offset = response.base_offset
            topic, queue_id, stamp, duplicate = batch.topic, batch.queue_id, response.store_timestamp, response.duplicate
            for chunk in batch.chunks:
                if chunk.single:
                    SendFuture.set_results(chunk.futures, range(offset, offset + chunk.num_rows),
                                           _stored_at(topic, queue_id, stamp, duplicate))
                else:
                    chunk.futures[0].set_result(
                        SendResults.stored_run(topic, queue_id, offset, chunk.num_rows, stamp, duplicate))
                offset += chunk.num_rows
        with self._cond:
            self._outstanding -= _futures(batch.chunks)
            self._cond.notify_all()

    # -- the delivery timeout ------------------------------------------------------------------

    def _next_deadline(self) -> float | None:
        """Under the lock: the earliest deadline of a send not yet answered nor reported."""
        deadlines = [b.deadline for b in self._in_flight if b.settled is None]
        deadlines += [p.pending[0].deadline for p in self._partitions.values() if p.pending]
        return min(deadlines) if deadlines else None

    def _watch_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed and not self._outstanding and not self._streamer.is_alive():
                    return
                deadline = self._next_deadline()
                now = time.monotonic()
                if deadline is None or now < deadline:
                    self._watch.wait(_WATCH_INTERVAL_S if deadline is None else min(deadline - now, _WATCH_INTERVAL_S))
                    continue
                call = self._call
            log.warning("no answer from broker %s within %gs: failing the waiting sends",
                        self._conn.address, self.delivery_timeout)
            self._expire(None)
            if call is not None:
                call.cancel()  # the stream may hang on a frozen broker; the stream loop reopens it

    def _expire(self, cause: OrderlyMQError | None) -> None:
        """Fail every send not answered yet: those written as of unknown outcome (their batches stay
        first in their queue, to be settled), the others plainly (dropped, never sent)."""
        why = f"no answer from broker {self._conn.address} within {self.delivery_timeout:g}s"
        if cause is not None:
            why = f"the send stream to broker {self._conn.address} failed ({cause})"
        plain = BrokerUnavailableError(
            f"{why}; the message was not sent and is not stored: send it again when the broker is back"
        )
        failures: list[tuple[Future, OrderlyMQError]] = []
        with self._cond:
            kept: deque[_Batch] = deque()
            for batch in self._in_flight:
                if batch.settled is not None:
                    kept.append(batch)
                elif batch.written:
                    failures += self._report_unknown(batch, why)
                    kept.append(batch)
                else:
                    batch.dropped = True
                    self._partitions[(batch.topic, batch.queue_id)].in_flight -= 1
                    self._outstanding -= _futures(batch.chunks)
                    failures += [(future, plain) for chunk in batch.chunks for future in chunk.futures]
            self._in_flight = kept
            for partition in self._partitions.values():
                failures += [(future, plain) for chunk in partition.pending for future in chunk.futures]
                self._outstanding -= _futures(partition.pending)
                self._buffered -= partition.pending_rows
                partition.pending.clear()
                partition.pending_rows = partition.pending_bytes = 0
                partition.urgent = False
            self._cond.notify_all()
        for future, error in failures:
            if not future.done():
                future.set_exception(error)

    def _report_unknown(self, batch: _Batch, why: str) -> list[tuple[Future, OrderlyMQError]]:
        """Under the lock: turn ``batch`` into one awaiting settlement; the errors for its sends."""
        batch.settled = Future()
        self._settlements[(batch.topic, batch.queue_id, batch.sequence)] = batch.settled
        while len(self._settlements) > _MAX_SETTLEMENTS:
            oldest = next(iter(self._settlements))
            self._settlements.pop(oldest)
        self._outstanding -= _futures(batch.chunks)
        failures, index = [], 0
        for chunk in batch.chunks:
            if chunk.single:  # a future per row: each error names its own row
                for future in chunk.futures:
                    failures.append((future, self._unknown(batch, why, index, 1)))
                    index += 1
            else:
                failures.append((chunk.futures[0], self._unknown(batch, why, index, chunk.num_rows)))
                index += chunk.num_rows
        return failures

    def _unknown(self, batch: _Batch, why: str, index: int, count: int) -> SendOutcomeUnknownError:
        """The error of ``count`` rows from ``index`` of a batch of unknown outcome."""
        return SendOutcomeUnknownError(
            f"{why}; the message was sent but the broker did not confirm it, so it may be stored "
            f"(topic {batch.topic!r}, queue {batch.queue_id}, producer {self.producer_id}, sequence "
            f"{batch.sequence}). Do not send it again: the producer settles it when the broker is back; "
            "producer.resolve(error) tells where it is stored",
            topic=batch.topic,
            queue_id=batch.queue_id,
            producer_id=self.producer_id,
            sequence=batch.sequence,
            batch_index=index,
            count=count,
        )

    def _abandon(self, why: str) -> None:
        """Under or outside the lock: give up settling the batches of unknown outcome."""
        with self._cond:
            left = [b for b in self._in_flight if b.settled is not None]
            self._in_flight = deque(b for b in self._in_flight if b.settled is None)
            for batch in left:
                self._partitions[(batch.topic, batch.queue_id)].in_flight -= 1
            self._cond.notify_all()
        for batch in left:
            if not batch.settled.done():
                batch.settled.set_exception(
                    SendOutcomeUnknownError(
                        f"the outcome of batch {batch.sequence} of {batch.topic}/{batch.queue_id} stays unknown: "
                        f"{why}",
                        topic=batch.topic,
                        queue_id=batch.queue_id,
                        producer_id=self.producer_id,
                        sequence=batch.sequence,
                        count=sum(c.num_rows for c in batch.chunks),
                    )
                )
