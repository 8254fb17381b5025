"""Pipelined sending over one ``SendStream``, keeping every queue's order through retries.

Messages submitted for a queue wait at most ``linger_ms`` to be coalesced into one batch
(``max_batch_messages`` / ``max_batch_bytes``); up to ``max_in_flight_per_queue`` batches of a queue
are on the stream at once. Each batch carries the producer id and the queue's next sequence number,
so the broker stores it at most once.

Ordering argument: the broker handles a stream's requests one after another and answers in request
order. Batches of one queue are written to the stream in sequence order. When the stream breaks,
every unacknowledged batch is written again, in the same order, with the same producer id and
sequence: those the broker had stored come back as ``duplicate`` with their original offsets, the
others are stored after them. A batch the broker rejects (a per-request error) is never resent, so no
batch is ever stored after a later batch of its queue. When the broker stays unreachable for
``retry_timeout`` seconds, every waiting send fails with ``BrokerUnavailableError``; nothing is dropped
silently.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import grpc
import pyarrow as pa

from broker.wire import codec
from broker.wire.errors import BadBatchError, BrokerUnavailableError, OrderlyMQError, from_status
from connector.client.connection import BrokerConnection, pb
from connector.client.messages import SendResult

__all__ = ["PipelinedSender"]

log = logging.getLogger(__name__)

_STATUS_BY_VALUE = {status.value[0]: status for status in grpc.StatusCode}


@dataclass(eq=False)
class _Chunk:
    """Rows submitted together (one send, or one queue's share of a batch send): a normalized
    table, or validated message dicts turned into Arrow only when their batch is built."""

    table: pa.Table | None
    rows: list[dict] | None
    future: Future
    single: bool
    nbytes: int
    num_rows: int


def _row_bytes(row: dict) -> int:
    return len(row["body"]) + 64


@dataclass(eq=False)
class _Batch:
    topic: str
    queue_id: int
    sequence: int
    chunks: list[_Chunk]
    request: pb.SendRequest | None = None
    error: OrderlyMQError | None = None


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
        retry_timeout: float = 30.0,
    ) -> None:
        self._conn = connection
        self.producer_id = producer_id
        self.linger = linger_ms / 1000
        self.max_batch_messages = max_batch_messages
        self.max_batch_bytes = max_batch_bytes
        self.window = max_in_flight_per_queue
        self.max_buffered = max_buffered_messages
        self.retry_timeout = retry_timeout
        self._cond = threading.Condition()
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._in_flight: deque[_Batch] = deque()
        self._requests: queue_mod.SimpleQueue | None = None
        self._outstanding = 0  # chunks submitted and not yet resolved
        self._buffered = 0  # rows submitted and not yet on the stream
        self._flushing = 0
        self._closed = False
        self._dispatcher = threading.Thread(target=self._dispatch_loop, name="orderlymq-send-dispatch", daemon=True)
        self._streamer = threading.Thread(target=self._stream_loop, name="orderlymq-send-stream", daemon=True)
        self._dispatcher.start()
        self._streamer.start()

    # -- submitting ----------------------------------------------------------------------------

    def submit(
        self, topic: str, queue_id: int, data: pa.Table | list[dict], *, single: bool, urgent: bool
    ) -> list[Future]:
        """Queue rows for ``(topic, queue_id)``: a normalized table, or validated message dicts (see
        ``codec.messages_to_batch``). Returns one future per chunk of at most one batch; a future
        resolves to a ``SendResult`` (``single``) or a list of them, one per row.
        """
        chunks = []
        if isinstance(data, list):
            chunks.append(_Chunk(None, data, Future(), single, sum(map(_row_bytes, data)), len(data)))
        else:
            step = self.max_batch_messages
            if data.num_rows > 1 and data.nbytes > self.max_batch_bytes:
                step = max(1, min(step, int(data.num_rows * self.max_batch_bytes / data.nbytes)))
            for start in range(0, data.num_rows, step):
                part = data.slice(start, step)
                chunks.append(_Chunk(part, None, Future(), single, part.nbytes, part.num_rows))
        with self._cond:
            if self._closed:
                raise OrderlyMQError("the producer is closed; create a new one to send")
            while self._buffered >= self.max_buffered and not self._closed:
                self._cond.wait(0.1)
            partition = self._partitions.setdefault((topic, queue_id), _Partition())
            if not partition.pending:
                partition.oldest = time.monotonic()
            for chunk in chunks:
                partition.pending.append(chunk)
                partition.pending_rows += chunk.num_rows
                partition.pending_bytes += chunk.nbytes
                self._buffered += chunk.num_rows
            partition.urgent = partition.urgent or urgent
            self._outstanding += len(chunks)
            self._cond.notify_all()
        return [c.future for c in chunks]

    def flush(self, timeout: float | None = None) -> bool:
        """Send everything buffered now and wait until every send so far is acknowledged or failed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
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
        """Flush, then stop the stream and the threads."""
        self.flush(timeout)
        with self._cond:
            self._closed = True
            if self._requests is not None:
                self._requests.put(None)
            self._cond.notify_all()
        self._dispatcher.join(timeout=5)
        self._streamer.join(timeout=5)

    # -- dispatching ---------------------------------------------------------------------------

    def _due(self, partition: _Partition, now: float) -> bool:
        return (
            partition.urgent
            or self._flushing > 0
            or self._closed
            or partition.pending_rows >= self.max_batch_messages
            or partition.pending_bytes >= self.max_batch_bytes
            or now >= partition.oldest + self.linger
        )

    def _take_batches(self) -> tuple[list[_Batch], float | None]:
        """Under the lock: pop due batches, assigning sequences; and when to look again."""
        now = time.monotonic()
        batches, wake = [], None
        for (topic, queue_id), partition in self._partitions.items():
            while partition.pending and partition.in_flight < self.window:
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
                batches, wake = self._take_batches()
                if not batches:
                    if self._closed and not self._outstanding:
                        return
                    timeout = 0.5 if wake is None else max(0.0005, wake - time.monotonic())
                    self._cond.wait(timeout)
                    continue
            for batch in batches:
                try:
                    table = _batch_table(batch.chunks)
                except Exception as exc:  # noqa: BLE001 - the dispatcher must survive any bad message
                    batch.error = exc if isinstance(exc, OrderlyMQError) else BadBatchError(f"cannot encode: {exc}")
                    continue
                batch.request = pb.SendRequest(
                    topic=batch.topic,
                    queue_id=batch.queue_id,
                    batch=codec.encode(table),
                    producer_id=self.producer_id,
                    sequence=batch.sequence,
                )
            failed = [b for b in batches if b.error is not None]
            for batch in failed:
                for chunk in batch.chunks:
                    chunk.future.set_exception(batch.error)
            with self._cond:
                for batch in failed:
                    self._partitions[(batch.topic, batch.queue_id)].in_flight -= 1
                    self._buffered -= sum(c.num_rows for c in batch.chunks)
                    self._outstanding -= len(batch.chunks)
                for batch in batches:
                    if batch.error is not None:
                        continue
                    self._in_flight.append(batch)
                    self._buffered -= sum(c.num_rows for c in batch.chunks)
                    if self._requests is not None:
                        self._requests.put(batch.request)
                self._cond.notify_all()

    # -- the stream ----------------------------------------------------------------------------

    @staticmethod
    def _iterate(requests: queue_mod.SimpleQueue) -> Iterator[pb.SendRequest]:
        while True:
            item = requests.get()
            if item is None:
                return
            yield item

    def _stream_loop(self) -> None:
        failing_since: float | None = None
        delay = 0.05
        while True:
            with self._cond:
                while not self._in_flight and not (self._closed and not self._outstanding):
                    self._cond.wait(0.5)
                if not self._in_flight:
                    return
                requests: queue_mod.SimpleQueue = queue_mod.SimpleQueue()
                for batch in self._in_flight:
                    requests.put(batch.request)
                self._requests = requests
            error: OrderlyMQError | None = None
            try:
                for response in self._conn.stream("SendStream", self._iterate(requests)):
                    failing_since, delay = None, 0.05
                    self._acknowledge(response)
            except OrderlyMQError as exc:
                error = exc
            with self._cond:
                self._requests = None
                requests.put(None)
                broken = bool(self._in_flight)
            if not broken:
                continue
            now = time.monotonic()
            failing_since = failing_since or now
            log.warning(
                "send stream to %s broke (%s); resending %d unacknowledged batch(es)",
                self._conn.address,
                error or "stream ended",
                len(self._in_flight),
            )
            if now - failing_since + delay > self.retry_timeout or not isinstance(error, BrokerUnavailableError | None):
                self._fail_all(error)
                failing_since, delay = None, 0.05
                continue
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            try:
                self._conn.call("Health", pb.HealthRequest(), retry=True)
            except OrderlyMQError as exc:
                self._fail_all(exc)
                failing_since, delay = None, 0.05

    def _acknowledge(self, response: pb.SendResponse) -> None:
        with self._cond:
            batch = self._in_flight.popleft()
            self._partitions[(batch.topic, batch.queue_id)].in_flight -= 1
        if response.error_code:
            status = _STATUS_BY_VALUE.get(response.error_code, grpc.StatusCode.UNKNOWN)
            error = from_status(status, response.error_message, response.error_kind)
            for chunk in batch.chunks:
                chunk.future.set_exception(error)
        else:
            offset = response.base_offset
            for chunk in batch.chunks:
                results = [
                    SendResult(batch.topic, batch.queue_id, offset + i, response.store_timestamp, response.duplicate)
                    for i in range(chunk.num_rows)
                ]
                offset += chunk.num_rows
                chunk.future.set_result(results[0] if chunk.single else results)
        with self._cond:
            self._outstanding -= len(batch.chunks)
            self._cond.notify_all()

    def _fail_all(self, cause: OrderlyMQError | None) -> None:
        """Fail every unacknowledged and buffered send: the broker stayed out of reach."""
        message = (
            f"broker {self._conn.address} unreachable for {self.retry_timeout:.0f}s; "
            f"sends not acknowledged (last error: {cause or 'stream ended'})"
        )
        error = cause if cause is not None and not isinstance(cause, BrokerUnavailableError) else None
        error = error or BrokerUnavailableError(message)
        with self._cond:
            failed = list(self._in_flight)
            self._in_flight.clear()
            chunks = [c for b in failed for c in b.chunks]
            for b in failed:
                self._partitions[(b.topic, b.queue_id)].in_flight -= 1
            for partition in self._partitions.values():
                chunks.extend(partition.pending)
                self._buffered -= partition.pending_rows
                partition.pending.clear()
                partition.pending_rows = partition.pending_bytes = 0
                partition.urgent = False
        for chunk in chunks:
            if not chunk.future.done():
                chunk.future.set_exception(error)
        with self._cond:
            self._outstanding -= len(chunks)
            self._cond.notify_all()
