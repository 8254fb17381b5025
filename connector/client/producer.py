"""The producer: routes messages to queues with a selector and sends them in per-queue order.

Every send, synchronous or not, goes through one pipelined ``SendStream``
(``connector.client.sender``): a later message of a queue is never stored before an earlier one,
even when the stream breaks and batches are resent.

Delivery timeout: ``send`` and ``send_batch`` return or raise within ``retry_timeout`` seconds of
the call (route lookup included), and the future of ``send_async`` resolves within that time. A send
that fails with plain ``BrokerUnavailableError`` was never stored and never will be: send it again.
A send that fails with ``SendOutcomeUnknownError`` (a subclass) had reached the broker: it may be
stored. Do not send it again; ``resolve(error)`` returns where it is stored once the broker answers
(the producer resends it under the same producer id and sequence, stored at most once, ahead of any
later message of its queue).

Routing: a message with a key goes to ``queue_for_key(key, N)``; a message without a key needs a
selector (``"round_robin"``, ``"random"``, a callable) or an explicit ``queue_id``. In a cluster
(docs/cluster.md) each queue's messages go to the master of the broker group holding it, on one
send stream per group; a group's failover is followed by its stream (same producer id and
sequence on resend), and a route a group calls stale (``WrongGroupError``) is read again and the
send sent once more.

Example
-------
>>> with Producer("127.0.0.1:9876") as producer:                        # doctest: +SKIP
...     result = producer.send("orders", b"created", key="order-42", tag="TagA")
...     print(result.queue_id, result.queue_offset)
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FuturesTimeout
from operator import itemgetter
from typing import Any

import numpy as np
import pyarrow as pa

from broker.wire import codec
from broker.wire.errors import (
    BadBatchError,
    BrokerUnavailableError,
    InvalidRequestError,
    OrderlyMQError,
    QueueOutOfRangeError,
    SendOutcomeUnknownError,
    TopicNotFoundError,
    WrongGroupError,
)
from broker.wire.routing import queue_for_key, queue_ids, routable_key_type
from connector.client.connection import BrokerConnection, Credentials, TlsOptions
from connector.client.messages import Message, MessageQueue, SendResult
from connector.client.routed import RoutedConnection
from connector.client.selectors import SELECTORS, QueueSelector, SelectByHash, resolve_selector, select_queue
from connector.client.send_results import SendResults
from connector.client.sender import PipelinedSender

__all__ = ["Producer", "RoutedChunk"]

Messages = pa.Table | pa.RecordBatch | Sequence[Mapping[str, Any]]


class RoutedChunk:
    """The rows of a send that go to one queue, and their positions in the caller's input."""

    __slots__ = ("queue_id", "table", "positions")

    def __init__(self, queue_id: int, table: pa.Table, positions: list[int]) -> None:
        self.queue_id = queue_id
        self.table = table
        self.positions = positions


_BINARY = (bytes, bytearray, memoryview)
_BODY_TYPES = (*_BINARY, str)
_KEY_TYPES = (str, int, *_BINARY)
_TEXT_KEY_TYPES = {str, bytes}  # keys the key column holds as their own bytes
_KEY = itemgetter("key")


def _check_key(key: Any) -> None:
    if key is not None and (isinstance(key, bool) or not isinstance(key, _KEY_TYPES)):
        raise InvalidRequestError(f"sharding key must be str, int or bytes, got {type(key).__name__} {key!r}")


def _hash_routed_column(messages: pa.Table, selector: QueueSelector | None, by_hash: QueueSelector) -> bool:
    """Whether every row of ``messages`` goes by the hash of its key, which a whole column can
    compute at once: no selector (or the hash one), and a key column of a routable type without nulls
    (the row by row path gives the errors)."""
    if selector not in (None, by_hash) or "key" not in messages.column_names:
        return False
    keys = messages.column("key")
    return keys.null_count == 0 and routable_key_type(keys.type)


def _hash_routed_dicts(messages: Sequence[Mapping], selector: QueueSelector | None, by_hash: QueueSelector) -> bool:
    """Whether every dict goes by the hash of a text key, which the normalized key column holds byte
    for byte (a ``bytes`` key as its UTF-8 text): routed as a column, in 40% less time than row by row. An
    integer key is routed by its value, a missing one needs a selector: those go row by row."""
    if selector not in (None, by_hash):
        return False
    try:
        return set(map(type, map(_KEY, messages))) <= _TEXT_KEY_TYPES
    except KeyError:
        return False


def _split_by_queue(table: pa.Table, queue_of_row: np.ndarray) -> list[RoutedChunk]:
    """One chunk per queue, by ascending queue id, each with its rows in input order."""
    if not len(queue_of_row):
        return []
    first = int(queue_of_row[0])
    if (queue_of_row == first).all():
        return [RoutedChunk(first, table, list(range(table.num_rows)))]
    order = np.argsort(queue_of_row, kind="stable")
    ids, starts = np.unique(queue_of_row[order], return_index=True)
    # One gather of all rows in queue order, then a slice per queue: a take per queue cost 46 µs
    # each, most of a send_batch spread over a thousand queues.
    grouped = table.take(codec.int64_array(np.ascontiguousarray(order, np.int64), pa.int64()))
    ends = [*starts[1:].tolist(), len(order)]
    return [RoutedChunk(int(qid), grouped.slice(start, end - start), order[start:end].tolist())
            for qid, start, end in zip(ids.tolist(), starts.tolist(), ends, strict=True)]


def _message_row(body: Any, key: Any, tag: Any, properties: Any) -> dict:
    """A checked message dict (``encode_one``, ``encode_rows``), stamped with its born time now."""
    if type(body) is not bytes and not isinstance(body, _BODY_TYPES):  # type(): the usual case, quickest
        raise BadBatchError(f"body must be bytes or str, got {type(body).__name__}")
    if type(key) is not str:
        _check_key(key)
        if isinstance(key, _BINARY):
            try:
                bytes(key).decode("utf-8")
            except UnicodeDecodeError:
                raise BadBatchError("binary key is not valid UTF-8 (the key column is a string)") from None
    if tag is not None and not isinstance(tag, str):
        raise BadBatchError(f"tag must be a string, got {type(tag).__name__}")
    if properties is not None and not isinstance(properties, Mapping):
        raise BadBatchError(f"properties must be a mapping of strings, got {type(properties).__name__}")
    return {"body": body, "key": key, "tag": tag, "properties": properties, "born_timestamp": codec.now_ms()}


class Producer:
    """Sends messages to topics, routing each to a queue; thread-safe.

    Parameters
    ----------
    brokers : str
        ``"host:port[,host:port]"``: a single broker, or any brokers of a cluster (bootstrap).
    producer_group : str
        A name for this kind of producer (logged; part of the idempotent producer id).
    timeout : float
        Seconds one RPC attempt may take (route lookups, transactions).
    retry_timeout : float
        The delivery timeout: every send is answered within this many seconds of the call, route
        lookup included: stored, refused, or failed with ``BrokerUnavailableError`` (not stored) or
        ``SendOutcomeUnknownError`` (may be stored; see ``resolve``).
    tls, credentials : TlsOptions, Credentials, optional
        TLS to the broker, and the access key / secret of a broker with access control
        (docs/security.md); credentials default to ORDERLYMQ_ACCESS_KEY / ORDERLYMQ_SECRET_KEY.
    linger_ms : float
        How long an asynchronous send may wait to be coalesced with others of its queue.
    max_batch_messages, max_batch_bytes : int
        The largest batch sent in one request.
    max_in_flight_per_queue : int
        Batches of one queue sent before the first is acknowledged.
    max_buffered_messages : int
        Messages waiting to be sent before ``send_async`` blocks.
    route_ttl : float
        Seconds a topic's queue count is cached.
    busy_poll_us : float
        How long ``send`` polls for the broker's answer on its send port before it sleeps until
        the answer comes (0: never). Polling spares a wake-up that costs a nearby broker's answer
        more than the broker's work, for a CPU while the caller waits; it is done only by a send
        alone in its process, while the machine has a CPU to spare (docs/client.md).
    """

    def __init__(
        self,
        brokers: str,
        *,
        producer_group: str = "DEFAULT_PRODUCER",
        timeout: float = 10.0,
        retry_timeout: float = 30.0,
        linger_ms: float = 5.0,
        max_batch_messages: int = 1000,
        max_batch_bytes: int = 1 << 20,
        max_in_flight_per_queue: int = 4,
        max_buffered_messages: int = 100_000,
        route_ttl: float = 30.0,
        tls: TlsOptions | None = None,
        credentials: Credentials | None = None,
        busy_poll_us: float = 500,
    ) -> None:
        self.connection = RoutedConnection(brokers, timeout=timeout, retry_timeout=retry_timeout, tls=tls,
                                           credentials=credentials, route_ttl=route_ttl)
        self.producer_group = producer_group
        # Unique per instance: sequences restart at 0, so a reused id would look like a resend.
        self.producer_id = f"{producer_group}-{uuid.uuid4().hex}"
        self.timeout = timeout
        self.retry_timeout = retry_timeout
        self.routes = self.connection.routes
        # Named selectors live as long as the producer: "round_robin" keeps its position per topic.
        self._selectors: dict[str, QueueSelector] = {name: cls() for name, cls in SELECTORS.items()}
        self._sender_settings = dict(
            linger_ms=linger_ms,
            max_batch_messages=max_batch_messages,
            max_batch_bytes=max_batch_bytes,
            max_in_flight_per_queue=max_in_flight_per_queue,
            max_buffered_messages=max_buffered_messages,
            delivery_timeout=retry_timeout,
            busy_poll_us=busy_poll_us,
            on_rejected=self._forget_stale_route,
        )
        # One send stream per broker group ("": a single broker), each to its group's master.
        self._senders: dict[str, PipelinedSender] = {"": self._new_sender(self.connection.bootstrap)}
        self._senders_lock = threading.Lock()

    def _new_sender(self, connection: BrokerConnection) -> PipelinedSender:
        return PipelinedSender(connection, self.producer_id, **self._sender_settings)

    def _sender_for(self, topic: str, queue_id: int, deadline: float | None = None) -> PipelinedSender:
        """The send stream of the group holding the queue."""
        if self.routes.clustered is False:
            return self._senders[""]
        group = self.routes.route(topic, deadline=deadline).group_of(queue_id)
        sender = self._senders.get(group)
        if sender is None:
            with self._senders_lock:
                sender = self._senders.get(group)
                if sender is None:
                    sender = self._senders[group] = self._new_sender(self.connection.for_group(group))
        return sender

    # -- routing -------------------------------------------------------------------------------

    def queues(self, topic: str, *, deadline: float | None = None) -> list[MessageQueue]:
        """The topic's queues (cached route); ``TopicNotFoundError`` when it does not exist."""
        return self.routes.queues(topic, deadline=deadline)

    def _resolve(self, selector: str | QueueSelector | None) -> QueueSelector | None:
        if isinstance(selector, str) and selector in self._selectors:
            return self._selectors[selector]
        return resolve_selector(selector)

    def _selector_for(self, selector: QueueSelector | None, key: Any, topic: str) -> QueueSelector:
        if selector is not None:
            return selector
        if key is None:
            raise InvalidRequestError(
                f"a message to topic {topic!r} has no sharding key, so no queue is implied: pass key=... "
                "(messages of one key stay in order), or choose the queue with selector='round_robin' / "
                "'random' / a callable, or queue_id=..."
            )
        return self._selectors["hash"]

    def select_queue(
        self,
        topic: str,
        key: str | int | bytes | None = None,
        *,
        selector: str | QueueSelector | None = None,
        arg: Any = None,
        message: Message | None = None,
    ) -> int:
        """The queue id a message with ``key`` goes to, as ``send`` would pick it."""
        _check_key(key)
        queues = self.queues(topic)
        msg = message or Message(topic=topic, body=b"", key=key)
        return select_queue(self._selector_for(self._resolve(selector), key, topic), queues, msg, arg)

    def _route_one(
        self,
        topic: str,
        row: dict,
        selector: str | QueueSelector | None,
        arg: Any,
        queue_id: int | None,
        deadline: float | None = None,
    ) -> int:
        key = row["key"]
        if selector is None and queue_id is None:  # the usual send, first: by its key's hash
            if key is None:
                self._selector_for(None, key, topic)  # fails before any lookup
            return queue_for_key(key, len(self.routes.route(topic, deadline=deadline).queues))
        chosen = self._resolve(selector)
        queues = self.queues(topic, deadline=deadline)
        if queue_id is not None:
            return _check_queue_id(topic, queue_id, len(queues))
        sel = self._selector_for(chosen, key, topic)
        if isinstance(sel, SelectByHash) and key is not None:
            return queue_for_key(key, len(queues))
        return select_queue(sel, queues, _dict_message(topic, row), arg)

    def route(
        self,
        topic: str,
        messages: Messages,
        *,
        selector: str | QueueSelector | None = None,
        arg: Any = None,
        queue_id: int | None = None,
        deadline: float | None = None,
    ) -> list[RoutedChunk]:
        """Split messages into one normalized table per queue, each in input order."""
        queues = self.queues(topic, deadline=deadline)
        if isinstance(messages, pa.RecordBatch):
            messages = pa.Table.from_batches([messages])
        if isinstance(messages, pa.Table):
            table = codec.normalize(messages)
        else:
            if not isinstance(messages, Sequence) or isinstance(messages, str | bytes):
                raise InvalidRequestError("messages must be an Arrow table or a list of dicts with a 'body'")
            if not set(map(type, messages)) <= {dict}:  # plain dicts without a check each: 3x quicker
                for m in messages:
                    if not isinstance(m, Mapping):
                        raise InvalidRequestError(f"each message must be a dict with a 'body', got {type(m).__name__}")
            table = codec.messages_to_batch(messages)
        if queue_id is not None:
            return [RoutedChunk(_check_queue_id(topic, queue_id, len(queues)), table, list(range(table.num_rows)))]
        chosen = self._resolve(selector)
        by_hash = self._selectors["hash"]
        if isinstance(messages, pa.Table) and _hash_routed_column(messages, chosen, by_hash):
            return _split_by_queue(table, queue_ids(messages.column("key"), len(queues)))
        if not isinstance(messages, pa.Table) and _hash_routed_dicts(messages, chosen, by_hash):
            return _split_by_queue(table, queue_ids(table.column("key"), len(queues)))
        return _split_by_queue(table, self._queue_of_each_row(topic, messages, queues, chosen, arg))

    def _queue_of_each_row(self, topic: str, messages: pa.Table | Sequence[Mapping], queues: list[MessageQueue],
                           selector: QueueSelector | None, arg: Any) -> np.ndarray:
        """Row by row: the queue of each message, by its key's hash or by ``selector``."""
        if isinstance(messages, pa.Table):
            raw = messages.column("key").to_pylist() if "key" in messages.column_names else [None] * messages.num_rows
            rows: Callable[[int], Message] = lambda i: _row_message(topic, messages, i, raw[i])  # noqa: E731
        else:
            raw = [m.get("key") for m in messages]
            rows = lambda i: _dict_message(topic, messages[i])  # noqa: E731
        queue_of_row = np.empty(len(raw), np.int64)
        for i, key in enumerate(raw):
            _check_key(key)
            sel = self._selector_for(selector, key, topic)
            if isinstance(sel, SelectByHash) and key is not None:
                queue_of_row[i] = queue_for_key(key, len(queues))
            else:
                queue_of_row[i] = select_queue(sel, queues, rows(i), arg)
        return queue_of_row

    # -- sending -------------------------------------------------------------------------------

    def send_async(
        self,
        topic: str,
        body: bytes | str,
        key: str | int | bytes | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        selector: str | QueueSelector | None = None,
        arg: Any = None,
        *,
        queue_id: int | None = None,
        callback: Callable[[Future], None] | None = None,
    ) -> Future:
        """Queue one message; the returned future resolves to its ``SendResult``.

        Messages of one queue are stored in the order ``send_async`` was called (per thread).
        ``callback(future)`` runs on the producer's I/O thread when the send completes: keep it short
        and do not wait on other sends from it.
        """
        deadline = time.monotonic() + self.retry_timeout
        row = _message_row(body, key, tag, properties)
        target = self._route_one(topic, row, selector, arg, queue_id, deadline)
        sender = self._sender_for(topic, target, deadline)
        return sender.submit_one(topic, target, row, deadline, callback)

    def send(
        self,
        topic: str,
        body: bytes | str,
        key: str | int | bytes | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        selector: str | QueueSelector | None = None,
        arg: Any = None,
        *,
        queue_id: int | None = None,
    ) -> SendResult:
        """Send one message and wait until the broker stored it; returns where.

        Raises ``TopicNotFoundError``, ``InvalidRequestError`` (no key and no selector or queue, bad
        key type), ``QueueOutOfRangeError`` (a selector's bad answer), ``BrokerUnavailableError`` (not
        stored: send again) or its subclass ``SendOutcomeUnknownError`` (may be stored: see
        ``resolve``), within ``retry_timeout`` seconds.
        """
        deadline = time.monotonic() + self.retry_timeout
        row = _message_row(body, key, tag, properties)
        target = self._route_one(topic, row, selector, arg, queue_id, deadline)
        try:
            sent = self._sender_for(topic, target, deadline).send_direct(topic, target, row, deadline)
        except WrongGroupError:
            sent = None  # nothing stored, the route read again (on_rejected): sent to the group holding the queue
        if isinstance(sent, SendResult):  # over the broker's send port
            return sent
        return self._send_chunk(topic, target, [row], True, deadline, None if sent is None else [sent])

    def _send_chunk(self, topic: str, queue_id: int, data, single: bool, deadline: float,
                    parts: list[Future] | None = None):
        """Wait for a submitted chunk (submit it first when ``parts`` is None); sent once more to
        the right group when the route turns out stale. One result (``single``) or a list."""
        for attempt in (0, 1):
            if parts is None:
                sender = self._sender_for(topic, queue_id, deadline)
                parts = sender.submit(topic, queue_id, data, single=single, urgent=True, deadline=deadline)
            try:
                if single:
                    return self._wait(parts[0], topic)
                return SendResults.concat(topic, [self._wait(f, topic) for f in parts])
            except WrongGroupError:
                if attempt or not all(isinstance(f.exception(), WrongGroupError) for f in parts):
                    raise
                parts = None  # nothing of it was stored: the route was read again (on_rejected)

    def send_batch(
        self,
        topic: str,
        messages: Messages,
        *,
        selector: str | QueueSelector | None = None,
        arg: Any = None,
        queue_id: int | None = None,
    ) -> SendResults:
        """Send many messages (an Arrow table, or dicts with ``body`` and optional ``key``, ``tag``,
        ``properties``); each row is routed like ``send``. Returns one ``SendResult`` per message, in
        input order, as a ``SendResults`` sequence (its fields also numpy columns). Rows of one queue
        are stored in input order, in as few requests as the limits allow."""
        deadline = time.monotonic() + self.retry_timeout
        by_sender: dict[PipelinedSender, list[RoutedChunk]] = {}
        for chunk in self.route(topic, messages, selector=selector, arg=arg, queue_id=queue_id, deadline=deadline):
            by_sender.setdefault(self._sender_for(topic, chunk.queue_id, deadline), []).append(chunk)
        futures = []
        for sender, chunks in by_sender.items():
            submitted = sender.submit_tables(topic, [(chunk.queue_id, chunk.table) for chunk in chunks],
                                             single=False, urgent=True, deadline=deadline)
            futures.extend(zip(chunks, submitted, strict=True))
        total = sum(len(chunk.positions) for chunk, _ in futures)
        return SendResults.gather(topic, total, [
            (chunk.positions, self._send_chunk(topic, chunk.queue_id, chunk.table, False, deadline, parts))
            for chunk, parts in futures])

    def _forget_stale_route(self, topic: str, error: OrderlyMQError) -> None:
        """Forget the cached route when the broker refused a batch because the route is stale."""
        if isinstance(error, TopicNotFoundError | QueueOutOfRangeError | WrongGroupError):
            self.routes.invalidate(topic)

    def _wait(self, future: Future, topic: str):
        # No timeout of its own: the sender answers every send by its deadline (its watchdog), and a
        # wait that gave up earlier would report a failure for a message that may still be stored.
        try:
            return future.result()
        except (TopicNotFoundError, QueueOutOfRangeError):
            self.routes.invalidate(topic)
            raise

    def resolve(self, error: SendOutcomeUnknownError, timeout: float | None = None) -> list[SendResult]:
        """Where the messages of a send that failed with ``SendOutcomeUnknownError`` are stored.

        The producer resends such a batch itself (same producer id and sequence, so the broker stores
        it at most once, before any later message of its queue) until the broker answers. This waits
        for that answer up to ``timeout`` seconds (None: as long as it takes) and returns one result
        per message; ``duplicate`` is True when the broker had stored the batch before the error.

        Raises ``BrokerUnavailableError`` when the broker has not answered within ``timeout`` (call
        again later), ``SendOutcomeUnknownError`` when the outcome can no longer be settled (the
        producer was closed first), ``InvalidRequestError`` for an error of another producer.
        """
        if not isinstance(error, SendOutcomeUnknownError) or error.producer_id != self.producer_id:
            raise InvalidRequestError("resolve() takes a SendOutcomeUnknownError raised by this producer's sends")
        future = self._sender_for(error.topic, error.queue_id).settlement(error.topic, error.queue_id, error.sequence)
        if future is None:
            raise InvalidRequestError(
                f"batch {error.sequence} of {error.topic}/{error.queue_id} is no longer tracked by this producer"
            )
        try:
            base, store_timestamp, duplicate = future.result(timeout)
        except FuturesTimeout:
            raise BrokerUnavailableError(
                f"broker {self.connection.address} has not answered within {timeout:g}s; the outcome of batch "
                f"{error.sequence} of {error.topic}/{error.queue_id} is still unknown: call resolve() again"
            ) from None
        first = base + error.batch_index
        return [
            SendResult(error.topic, error.queue_id, first + i, store_timestamp, duplicate) for i in range(error.count)
        ]

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message sent so far is acknowledged or failed; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return all([sender.flush(None if deadline is None else max(deadline - time.monotonic(), 0))
                    for sender in list(self._senders.values())])

    def transaction(self, txn_id: str | None = None, *, timeout_ms: int = 0):
        """A broker transaction: ``with producer.transaction() as tx: tx.send(...)`` makes every
        message of the block visible at once when it exits normally, none when it raises."""
        from connector.client.transaction import Transaction

        return Transaction(self, txn_id, timeout_ms=timeout_ms)

    def close(self, timeout: float | None = None) -> None:
        """Send what is buffered, then close the stream and the connection."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for sender in list(self._senders.values()):
            sender.close(None if deadline is None else max(deadline - time.monotonic(), 0))
        self.connection.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_queue_id(topic: str, queue_id: Any, count: int) -> int:
    if isinstance(queue_id, bool) or not isinstance(queue_id, int) or not 0 <= queue_id < count:
        raise QueueOutOfRangeError(f"queue_id {queue_id!r} out of range: topic {topic!r} has queues 0..{count - 1}")
    return queue_id


def _row_message(topic: str, table: pa.Table, i: int, key: Any) -> Message:
    row = table.slice(i, 1).to_pylist()[0]
    body = row.get("body")
    props = row.get("properties")
    return Message(
        topic=topic,
        body=body.encode() if isinstance(body, str) else body,
        key=key,
        tag=row.get("tag"),
        properties=dict(props) if props else {},
    )


def _dict_message(topic: str, m: Mapping[str, Any]) -> Message:
    body = m.get("body")
    return Message(
        topic=topic,
        body=body.encode() if isinstance(body, str) else bytes(body or b""),
        key=m.get("key"),
        tag=m.get("tag"),
        properties=dict(m.get("properties") or {}),
    )
