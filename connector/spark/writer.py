"""The sink: one mixin shared by the batch writer (``df.write``) and the stream writer
(``df.writeStream``).

A task routes its input Arrow batches, a few at a time (``_gathered``), with the routing function
(``connector.spark.sharding``), groups their rows by target queue with a stable sort (so every
queue receives the task's rows in the order the task saw them) and sends each group as one or
more Arrow batches. With ``exactlyOnce`` (the default) the sends are staged in the task's own
broker transaction and made visible by the driver's commit in partition order
(``connector.spark.transactions``): a failed attempt leaves nothing visible, a replayed batch is
committed once. Without it the task sends directly (at-least-once, still ordered within the task)
with idempotent-producer sequence numbers, so a retried send is stored once.

Every send is idempotent: an at-least-once send carries its producer sequence, a staged send its
number in the transaction, so a send whose answer was lost (a broker restart, a closed
connection) is sent again and stored or staged once. In a cluster each queue's rows go to the
master of the broker group holding it, and a task's transaction has one part per group
(``_StagingSender``); a part that a group's failover lost is staged again in a new transaction.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from broker.wire import codec
from broker.wire.errors import (
    BadBatchError,
    BrokerUnavailableError,
    TopicGrewError,
    TransactionError,
    WrongGroupError,
    from_answer,
)
from broker.wire.send_request import EncodedSend, send_request_parts
from connector.client.connection import BrokerConnection, pb
from connector.client.routed import RoutedConnection
from connector.client.send_port import SendPortFailure
from connector.spark import metadata
from connector.spark.connections import shared_send_port
from connector.spark.handoff import advance_group_offsets
from connector.spark.options import SinkOptions
from connector.spark.sharding import queue_ids
from connector.spark.sink_columns import SinkColumns, message_columns, message_table
from connector.spark.transactions import abort_all, abort_batch, commit_batch, task_txn_id
from connector.spark.txn_keepalive import KeepAlive
from connector.spark.worker_gc import freeze_worker_objects

__all__ = ["OrderlyMQStreamWriter", "OrderlyMQWriter", "SinkCommitMessage"]

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
RUN_ID_PROPERTY = "spark.jobGroup.id"  # a streaming query sets its job group to its run id


@dataclass(frozen=True)
class SinkCommitMessage(WriterCommitMessage):
    """What a task reports: its transaction, as ``(broker group, transaction id)`` per group it
    staged rows on (one ``("", id)`` on a single broker; none without exactlyOnce or rows), its
    row count, the run of the streaming query it belongs to (empty when unknown), the queue
    count of each topic it routed rows over, and the queues each part staged rows into (as
    ``(broker group, transaction id, ((topic, queue id), ...))``: the commit runs parts with none
    in common side by side)."""

    query_id: str
    batch_id: int
    partition_id: int
    parts: tuple[tuple[str, str], ...]
    rows: int
    run_id: str = ""
    queue_counts: tuple[tuple[str, int], ...] = ()
    staged_queues: tuple[tuple[str, str, tuple[tuple[str, int], ...]], ...] = ()


class _OrderlyMQWriterMixin:
    """Task-side ``write`` and driver-side commit/abort, shared by the batch and stream writers.

    Holds only picklable data: the checked options, the resolved columns, the queue count of
    the ``topic`` option when the write was planned, and an id for writes outside a stream.
    """

    streaming = False

    def __init__(self, options: SinkOptions, columns: SinkColumns, queue_counts: dict[str, int]) -> None:
        self.options = options
        self.columns = columns
        self.queue_counts = dict(queue_counts)
        self.write_id = f"write-{uuid.uuid4().hex}"

    # -- task side -----------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        freeze_worker_objects()
        ctx = TaskContext.get()
        query_id = (ctx.getLocalProperty(QUERY_ID_PROPERTY) if ctx else None) or self.write_id
        batch_id = int((ctx.getLocalProperty(BATCH_ID_PROPERTY) if ctx else None) or 0)
        partition = ctx.partitionId() if ctx else 0
        task_attempt, attempt = (ctx.taskAttemptId(), ctx.attemptNumber()) if ctx else (0, 0)
        run_id = (ctx.getLocalProperty(RUN_ID_PROPERTY) if ctx else None) or ""
        txn_id = task_txn_id(query_id, batch_id, partition, task_attempt, attempt)
        conn = self.options.connect()
        if self.options.exactly_once:
            sender: _Sender = _StagingSender(conn, self.options, txn_id)
        else:
            sender = _Sender(conn, self.options, producer_id=txn_id)
        try:
            router = _Router(conn, self.options, self.columns, self.queue_counts)
            with ThreadPoolExecutor(1, thread_name_prefix="orderlymq-sink-prepare") as pool:
                # The first input batch comes only once Spark has started the work upstream: meanwhile
                # the topic's route is read and the transaction begun, round trips a micro-batch would
                # otherwise wait for after it.
                prepared = pool.submit(self._prepare, router, sender)
                # Gathered past a small maxBatchBytes too: the sender cuts each queue's rows to it.
                for rows in _gathered(iterator, max(self.options.max_batch_bytes, _ROUTE_BYTES)):
                    prepared.result()
                    for topic, queue_id, table, size in router.route(rows):
                        sender.add(topic, queue_id, table, size)
                prepared.result()
            sender.flush_all()
            sender.drop_abandoned()
            sender.hold_for_commit()
            return SinkCommitMessage(query_id, batch_id, partition, sender.parts(), sender.rows, run_id,
                                     tuple(sorted(router.counts.items())), sender.staged_queues())
        except BaseException as exc:
            sender.drop_all()
            if isinstance(exc, BrokerUnavailableError):
                raise type(exc)(
                    f"{exc}. The sink waits up to requestTimeoutMs={self.options.request_timeout_ms} ms for a "
                    "broker's answer, retrying while it is unreachable: raise the option to ride out longer outages"
                ) from None
            raise
        finally:
            sender.close()

    def _prepare(self, router: _Router, sender: _Sender) -> None:
        """What the task's first send needs and can be done before its first row: the topic's
        queue count (checked against the planned one) and, staged, its transaction."""
        if self.options.topic is not None:
            sender.prepare(self.options.topic, router.queue_count(self.options.topic))

    # -- driver side ---------------------------------------------------------------------------

    def _commit(self, messages: list[SinkCommitMessage | None], batch_id: int,
                then: Callable[[], object] | None = None) -> None:
        """Make the batch visible, then call ``then`` (at once when there is nothing to commit)."""
        done = [m for m in messages if m is not None]
        txns = [(m.partition_id, group, txn_id) for m in done for group, txn_id in m.parts]
        if not txns:
            if then is not None:
                then()
            return
        conn = self.options.connect()
        runs = {m.run_id for m in done}
        rows = commit_batch(conn, done[0].query_id, batch_id, txns, replayable=self.streaming, then=then,
                            run_id=runs.pop() if len(runs) == 1 else "", queues=queues_of_parts(done))
        log.info("committed batch %d: %d row(s) from %d task(s)", batch_id, rows, len({p for p, _, _ in txns}))

    def _abort(self, messages: list[SinkCommitMessage | None], batch_id: int) -> None:
        done = [m for m in messages if m is not None]
        parts = [part for m in done for part in m.parts]
        dropped = abort_batch(self.options.connect(), done[0].query_id, batch_id, parts,
                              replayable=self.streaming) if parts else 0
        kept = f" ({len(parts) - dropped} kept: the batch's plan names them, and its replay commits them)" \
            if dropped < len(parts) else ""
        log.warning("aborted batch %d: %d staged transaction(s) dropped%s", batch_id, dropped, kept)


class OrderlyMQWriter(_OrderlyMQWriterMixin, DataSourceArrowWriter):
    """``df.write.format("orderlymq")``: all tasks' rows become visible together at the end."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._commit(messages, 0)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self._abort(messages, 0)


class OrderlyMQStreamWriter(_OrderlyMQWriterMixin, DataSourceStreamArrowWriter):
    """``df.writeStream.format("orderlymq")``: each micro-batch becomes visible once, in partition order.

    With ``checkpoint`` (the query's checkpointLocation), the groups of the ``orderlymq`` sources
    of the batch move to its end right after it became visible (``connector.spark.handoff``).
    """

    streaming = True

    def __init__(self, options: SinkOptions, columns: SinkColumns, queue_counts: dict[str, int],
                 checkpoint: str | None = None, run: str = "") -> None:
        super().__init__(options, columns, queue_counts)
        self.checkpoint = checkpoint
        self.run = run or self.write_id  # the instance of the data source it was made from

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        try:
            self._check_routing([m for m in messages if m is not None])
        except TopicGrewError:
            self._abort(messages, batchId)
            raise
        self._commit(messages, batchId, then=lambda: advance_group_offsets(self.checkpoint, batchId,
                                                                           self.options.security))

    def _check_routing(self, messages: list[SinkCommitMessage]) -> None:
        """Every task of the run routed each topic over the count its first batch did: a topic grown
        while the query runs fails the batch (each micro-batch's tasks route over the count read when
        it was planned, so without this keys would move to other queues from that batch on)."""
        run_counts = _routed_counts(self.run)
        for message in messages:
            for topic, count in message.queue_counts:
                routed = run_counts.setdefault(topic, count)
                if count != routed:
                    raise TopicGrewError(_grown(topic, count, routed, message.batch_id, self.options.exactly_once))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._abort(messages, batchId)


def queues_of_parts(messages: list[SinkCommitMessage]) -> dict[tuple[str, str], frozenset[tuple[str, int]]]:
    """``{(broker group, transaction id): its (topic, queue id)}`` of the tasks' parts: a task's parts
    on several groups share its transaction id."""
    return {(group, txn_id): frozenset(queues) for m in messages for group, txn_id, queues in m.staged_queues}


@functools.lru_cache(maxsize=64)
def _routed_counts(run: str) -> dict[str, int]:
    """``{topic: queue count}`` the tasks of a streaming query's run routed over, as its commits
    learn them; one dict per instance of the data source.

    Spark makes the writer of every commit of a run from the one instance of the data source it
    made when the query started, in a driver worker it keeps for the run, while each micro-batch's
    tasks get a writer planned afresh from a new instance: this is what outlives a micro-batch, so
    a topic grown between two of them is caught. A restarted query is a new instance: it routes
    over the count of then."""
    return {}


_KEYS_WOULD_MOVE = "keys would move to other queues and lose their order."
_RESTART_TO_REROUTE = "Stop the query and restart it to route over the new count (see 'Growing a topic' in docs/spark.md)"


def _grown(topic: str, count: int, routed: int, batch_id: int, exactly_once: bool) -> str:
    written = (f"Nothing of batch {batch_id} was made visible. " if exactly_once else
               f"With exactlyOnce=false the rows of batch {batch_id} are already written, routed over the new count. ")
    return (f"topic {topic!r} now has {count} queues, but this query routed keys over the {routed} it had when its "
            f"first batch was written: {_KEYS_WOULD_MOVE} {written}{_RESTART_TO_REROUTE}")


class _Router:
    """Splits input batches into ``(topic, queue, message table)`` groups, checking the rows."""

    def __init__(
        self, conn: BrokerConnection, options: SinkOptions, columns: SinkColumns, planned: dict[str, int]
    ) -> None:
        self.conn = conn
        self.options = options
        self.columns = columns
        self.planned = planned
        self.counts: dict[str, int] = {}

    def queue_count(self, topic: str) -> int:
        count = self.counts.get(topic)
        if count is None:
            route = metadata.describe_topics(
                self.conn, [topic], option="topic" if self.options.topic else "topic column"
            )
            count = route[topic].queue_count
            planned = self.planned.get(topic)
            if planned is not None and count != planned:
                raise TopicGrewError(
                    f"topic {topic!r} now has {count} queues, but this query routes keys over the {planned} it had "
                    f"when this batch's write was planned: {_KEYS_WOULD_MOVE} {_RESTART_TO_REROUTE}"
                )
            self.counts[topic] = count
        return count

    def route(self, batch: pa.RecordBatch | pa.Table) -> Iterator[tuple[str, int, pa.Table, int]]:
        """The batch's messages as ``(topic, queue id, message table, its size in bytes)`` per
        queue, each queue's in input order."""
        n = batch.num_rows
        cols = self.columns
        body = batch.column(cols.body)
        if body.null_count:
            raise BadBatchError(
                f"{body.null_count} of {n} row(s) have a null body in column {cols.body!r} (option 'bodyColumn'): "
                f"every message needs a body; filter them out, e.g. df.where(col({cols.body!r}).isNotNull())"
            )
        if cols.topic is not None:
            topic_col = batch.column(cols.topic)
            if topic_col.null_count:
                raise BadBatchError(
                    f"{topic_col.null_count} of {n} row(s) have a null 'topic' column: name a topic on every row, "
                    "or set option 'topic'"
                )
            topics = topic_col.unique().to_pylist()
        else:
            topic_col, topics = None, [self.options.topic]
        queues = np.empty(n, dtype=np.int64)
        topic_index = np.zeros(n, dtype=np.int64)
        for i, topic in enumerate(topics):
            count = self.queue_count(topic)
            if topic_col is None:
                rows = None
            else:
                rows = np.flatnonzero(pc.equal(topic_col, pa.scalar(topic, pa.string())).to_numpy(zero_copy_only=False))
                topic_index[rows] = i
            queues[slice(None) if rows is None else rows] = self._queues(batch, rows, count, topic)
        group = topic_index * (max(self.counts.values()) + 1) + queues
        messages = batch.select(message_columns(cols))
        if n and group.min() == group.max():
            # One queue, as in a pipeline that keeps its keys' queues: the rows as they came, ungathered.
            table = message_table(messages, cols, codec.now_ms())
            yield topics[topic_index[0]], int(queues[0]), table, table.nbytes
            return
        if group.max(initial=0) < 2**15:  # a stable sort of 16-bit values is a radix sort: 4x faster
            group = group.astype(np.int16)
        order = np.argsort(group, kind="stable")
        # Only the columns a message is made of are gathered; the rest of it is made at its size.
        ordered = message_table(messages.take(pa.array(order)), cols, codec.now_ms())
        sorted_groups = group[order]
        cuts = np.flatnonzero(np.diff(sorted_groups)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [n]))
        sizes = _range_sizes(ordered, starts, ends)
        for lo, hi, size in zip(starts.tolist(), ends.tolist(), sizes.tolist(), strict=True):
            first = order[lo]
            yield topics[topic_index[first]], int(queues[first]), ordered.slice(lo, hi - lo), size

    def _queues(self, batch: pa.RecordBatch, rows: np.ndarray | None, count: int, topic: str) -> np.ndarray:
        cols = self.columns
        name = cols.sharding_key or cols.queue_id
        values = batch.column(name)
        if rows is not None:
            values = values.take(pa.array(rows))
        if values.null_count:
            what = "sharding key" if cols.sharding_key else "queue id"
            fix = (
                f"give every row a key, or filter them out: df.where(col({name!r}).isNotNull())"
                if cols.sharding_key
                else "give every row a queue id, or set option 'shardingKey'"
            )
            raise BadBatchError(
                f"{values.null_count} of {batch.num_rows} row(s) have a null {what} in column {name!r} "
                f"(option '{'shardingKey' if cols.sharding_key else 'queue_id column'}'): a null key cannot be "
                f"routed; {fix}"
            )
        if cols.sharding_key:
            return queue_ids(values, count)
        ids = values.cast(pa.int64()).to_numpy(zero_copy_only=False)
        bad = int(np.count_nonzero((ids < 0) | (ids >= count)))
        if bad:
            raise BadBatchError(
                f"{bad} of {batch.num_rows} row(s) have a queue id outside 0..{count - 1} in column 'queue_id' "
                f"(topic {topic!r} has {count} queues): fix the ids, or route by key with option 'shardingKey'"
            )
        return ids


_ROUTE_ROWS = 40_000  # input rows routed at once, at most
_ROUTE_BYTES = 4 * 1024 * 1024  # input bytes routed at once, at most (or maxBatchBytes, where larger)


def _gathered(batches: Iterator[pa.RecordBatch], max_bytes: int) -> Iterator[pa.Table]:
    """The input batches, in order, gathered into tables of ``_ROUTE_ROWS`` rows or ``max_bytes``,
    the last one maybe less; none empty.

    Routing costs a little per call besides its cost per row (each distinct key hashed, the sort,
    the message table's columns made): Spark hands a writer batches of 10,000 rows, and routing
    40,000 at once takes two thirds of the time (100-byte bodies, 1,000 keys). The bytes bound
    what a task holds gathered, and its copy sorted by queue, when rows are large."""
    gathered: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in batches:
        if not batch.num_rows:
            continue
        gathered.append(batch)
        rows += batch.num_rows
        size += batch.get_total_buffer_size()
        if rows >= _ROUTE_ROWS or size >= max_bytes:
            yield pa.Table.from_batches(gathered)
            gathered, rows, size = [], 0, 0
    if gathered:
        yield pa.Table.from_batches(gathered)


_Payload = Sequence[bytes | pa.Buffer]  # an Arrow IPC stream as the parts that concatenate to it

_MAX_BUFFERED_BYTES = 32 * 1024 * 1024  # a task's rows held back across all its queues
_MAX_RESTAGE_BYTES = 256 * 1024 * 1024  # a task's staged payloads kept to stage again after a failover


class _Sender:
    """Sends message tables of one task, in order, each queue's to the master of its broker group,
    with idempotent-producer sequence numbers: a send resent through a failover is stored once."""

    def __init__(self, conn: RoutedConnection, options: SinkOptions, *, producer_id: str) -> None:
        self.conn = conn
        self.options = options
        self.producer_id = producer_id
        self.rows = 0
        self._sequence: dict[tuple[str, int], int] = {}
        self._buffers: dict[tuple[str, int], list[pa.Table]] = {}
        self._buffered: dict[tuple[str, int], int] = {}
        self._total = 0

    def add(self, topic: str, queue_id: int, table: pa.Table, size: int) -> None:
        """Buffer a queue's rows (in order; ``size`` bytes) and send them once ``maxBatchBytes``
        have gathered: one large send instead of one per incoming Arrow batch and queue."""
        key = (topic, queue_id)
        self._buffers.setdefault(key, []).append(table)
        self._buffered[key] = self._buffered.get(key, 0) + size
        self._total += size
        if self._buffered[key] >= self.options.max_batch_bytes:
            self._flush(key)
        elif self._total >= _MAX_BUFFERED_BYTES:
            self._flush(max(self._buffered, key=self._buffered.__getitem__))

    def flush_all(self) -> None:
        for key in list(self._buffers):
            self._flush(key)

    def _flush(self, key: tuple[str, int]) -> None:
        tables = self._buffers.pop(key)
        size = self._buffered.pop(key)
        self._total -= size
        self.send(key[0], key[1], pa.concat_tables(tables) if len(tables) > 1 else tables[0], size)

    def send(self, topic: str, queue_id: int, table: pa.Table, size: int) -> None:
        for chunk in _chunks(table, size, self.options.max_batch_bytes):
            self._send_chunk(topic, queue_id, codec.encode_parts(chunk))
            self.rows += chunk.num_rows

    def _send_chunk(self, topic: str, queue_id: int, payload: _Payload) -> None:
        sequence = self._sequence.get((topic, queue_id), 0)
        parts = send_request_parts(topic, queue_id, payload, producer_id=self.producer_id, sequence=sequence)
        _send_idempotent(self.conn.for_queue(topic, queue_id), self.conn, topic, queue_id, parts)
        self._sequence[(topic, queue_id)] = sequence + 1

    def prepare(self, topic: str, queue_count: int) -> None:
        pass  # idempotent sends need nothing before the first one

    def parts(self) -> tuple[tuple[str, str], ...]:
        return ()  # nothing to commit: every send is visible already

    def staged_queues(self) -> tuple[tuple[str, str, tuple[tuple[str, int], ...]], ...]:
        return ()

    def drop_abandoned(self) -> None:
        pass

    def drop_all(self) -> None:
        pass

    def hold_for_commit(self) -> None:
        pass  # nothing waits for a commit

    def close(self) -> None:
        pass


class _StagingSender(_Sender):
    """Stages the task's rows in its transaction: one part per broker group it writes to (each
    group's master holds its own transactions), begun on first use, or ahead of the first row on
    a single broker (one that stays empty is aborted, not committed).

    A staged send whose answer was lost is sent again under its number in the part, and staged
    once (``_Part.stage``): the part survives a restart of its broker. A group's failover may
    lose a part, or its last sends, when the new master had not copied them yet: the part is then
    abandoned (aborted, never committed) and replaced by a new transaction on the group's new
    master, into which everything the task staged on that group is staged again, in order. That
    needs a cluster's staged payloads kept until the task ends (up to ``_MAX_RESTAGE_BYTES`` per
    task; past it such a failover fails the task, and Spark's retry stages it anew). A single
    broker's are not kept: nothing else could take its part over. A broker older than numbering
    (``_Part.numbered``) would stage a resent send twice: a part there keeps its payloads too,
    and a send whose answer is lost is staged again, with them, in a new transaction.
    """

    def __init__(self, conn: RoutedConnection, options: SinkOptions, txn_id: str) -> None:
        super().__init__(conn, options, producer_id=txn_id)
        self.txn_id = txn_id
        self._parts: dict[str, _Part] = {}
        self._abandoned: list[tuple[str, str]] = []
        self._kept_bytes = 0
        self._keepalive = KeepAlive(self._refresh, lambda: min((p.timeout_ms for p in self._begun()), default=0))

    def prepare(self, topic: str, queue_count: int) -> None:
        """Begin the part of the group holding every queue of ``topic`` (a single broker); in a
        cluster, parts are begun when the task first writes to their group."""
        groups = {metadata.group_of(self.conn, (topic, queue_id)) for queue_id in range(queue_count)}
        if len(groups) == 1:
            self._part(groups.pop())

    def _part(self, group: str) -> _Part:
        part = self._parts.get(group)
        if part is None:
            part = self._parts[group] = _Part(self.conn.for_group(group), self.txn_id, keep=bool(group))
            part.begin()
            self._keepalive.start()
        return part

    def _begun(self) -> list[_Part]:
        return list(self._parts.values())  # a copy: the task's thread may add a part meanwhile

    def _refresh(self) -> None:
        for part in self._begun():
            part.refresh()

    def hold_for_commit(self) -> None:
        """The task staged everything: its parts wait for the driver's commit for up to
        ``transactionTimeoutMs`` from now, however long the other tasks of the batch take."""
        self._keepalive.stop()
        metadata.each_concurrently(lambda part: part.hold(self.options.transaction_timeout_ms),
                                   [part for part in self._begun() if part.staged])

    def close(self) -> None:
        self._keepalive.stop()

    def parts(self) -> tuple[tuple[str, str], ...]:
        return tuple((group, part.txn_id) for group, part in sorted(self._parts.items()) if part.staged)

    def staged_queues(self) -> tuple[tuple[str, str, tuple[tuple[str, int], ...]], ...]:
        return tuple((group, part.txn_id, tuple(sorted(part.queues))) for group, part in sorted(self._parts.items())
                     if part.staged)

    def _send_chunk(self, topic: str, queue_id: int, payload: bytes) -> None:
        group = metadata.group_of(self.conn, (topic, queue_id))
        part = self._part(group)
        give_up = time.monotonic() + self.conn.retry_timeout
        todo = [(topic, queue_id, payload)]
        while todo:
            try:
                part.stage(*todo[0])
            except (BrokerUnavailableError, TransactionError) as exc:
                if part.kept is None or time.monotonic() > give_up:
                    raise type(exc)(
                        f"transaction {part.txn_id}: broker {part.conn.address} could not stage a send ({exc}); "
                        "the task fails, and nothing it staged becomes visible"
                    ) from None
                log.warning("transaction %s: broker group %r lost or did not answer a staged send (%s); staging its "
                            "%d earlier send(s) again in a new transaction on the group's master", part.txn_id,
                            group, exc, len(part.kept))
                todo = part.kept + todo
                self._kept_bytes -= sum(_size(kept) for _, _, kept in part.kept)  # kept again once restaged
                self._abandoned.append((group, part.txn_id))
                part.renew(f"{self.txn_id}.r{len(self._abandoned)}")
                continue
            self._keep(part, todo.pop(0))

    def _keep(self, part: _Part, item: tuple[str, int, _Payload]) -> None:
        if part.kept is None:
            return
        self._kept_bytes += _size(item[2])
        if self._kept_bytes > _MAX_RESTAGE_BYTES:
            for each in self._parts.values():
                each.kept = None  # too large to stage again: a failover fails the task instead
        else:
            part.kept.append(item)

    def drop_abandoned(self) -> None:
        """Abort the parts abandoned in a failover, and those begun ahead that staged nothing."""
        unused = [(group, part.txn_id) for group, part in sorted(self._parts.items()) if not part.staged]
        abort_all(self.conn, self._abandoned + unused)

    def drop_all(self) -> None:
        abort_all(self.conn, self._abandoned + [(group, part.txn_id) for group, part in sorted(self._parts.items())])


class _Part:
    """One broker group's part of a task's transaction: its id and what was staged in it."""

    def __init__(self, conn: BrokerConnection, txn_id: str, *, keep: bool) -> None:
        self.conn = conn
        self.txn_id = txn_id
        self.kept: list[tuple[str, int, _Payload]] | None = [] if keep else None  # staged; None: not kept
        self.sent = 0  # sends staged in it: the number of the next one
        self.queues: set[tuple[str, int]] = set()  # (topic, queue id) of every send staged in it
        self.numbered = True  # whether its broker stages a numbered send once (one older than that does not)
        self.timeout_ms = 0  # its idle timeout, as its broker tells (0: a broker that does not)

    def begin(self) -> None:
        """Open the part with the broker's timeout: one the task stops refreshing ends with it."""
        response = self._begin(0)
        if response.state != "OPEN":
            raise TransactionError(f"transaction {self.txn_id} is {response.state}, expected a new OPEN transaction")
        self.numbered = response.numbers_sends
        if not self.numbered and self.kept is None:
            # A send whose answer is lost cannot be sent again into this part: it is staged again,
            # with everything before it, in a new one.
            self.kept = []

    def refresh(self) -> None:
        """Reset the part's idle time (``txn_keepalive``)."""
        self._begin(0)

    def hold(self, timeout_ms: int) -> None:
        """Give the staged part ``timeout_ms`` to wait for its commit (brokers older than this keep
        their timeout)."""
        response = self._begin(timeout_ms)
        if response.state != "OPEN":
            raise TransactionError(f"transaction {self.txn_id} is {response.state} before its commit; the task "
                                   "fails, and Spark's retry stages its rows again")
        if not response.timeout_ms:
            log.warning("broker %s is older than held transactions: transaction %s keeps its first timeout, and "
                        "the batch must be committed within it", self.conn.address, self.txn_id)

    def _begin(self, timeout_ms: int) -> pb.BeginTxnResponse:
        response = self.conn.call("BeginTxn", pb.BeginTxnRequest(txn_id=self.txn_id, timeout_ms=timeout_ms))
        self.timeout_ms = response.timeout_ms
        return response

    def renew(self, txn_id: str) -> None:
        """Go on in a new transaction ``txn_id`` (begun once the group answers again), empty: only
        a part that keeps its payloads is renewed, to stage them again."""
        self.txn_id, self.kept, self.sent, self.queues = txn_id, [], 0, set()
        self.begin()

    @property
    def staged(self) -> bool:
        """Whether a send was staged in it (a part begun ahead may stay empty)."""
        return self.sent > 0

    def stage(self, topic: str, queue_id: int, payload: _Payload) -> None:
        """Stage one send, numbered in the part: sent again until an answer comes, it is staged once
        (sent once to a broker older than numbering).

        Raises
        ------
        BrokerUnavailableError
            No answer (until the connection's retry timeout where it is sent again): it may or may
            not have been staged.
        TransactionError
            The broker no longer has the part, or not all of it (lost in a failover).
        """
        parts = send_request_parts(topic, queue_id, payload, txn_id=self.txn_id, producer_id=self.txn_id,
                                   sequence=self.sent)
        if self.numbered:
            _send_idempotent(self.conn, self.conn, topic, queue_id, parts)
        else:
            _send_once(self.conn, topic, queue_id, parts)
        self.sent += 1
        self.queues.add((topic, queue_id))


def _send_idempotent(port_conn: BrokerConnection, conn: BrokerConnection | RoutedConnection, topic: str,
                     queue_id: int, parts: _Payload) -> None:
    """Send the idempotent send request whose bytes are ``parts``: over the lean port of
    ``port_conn``'s broker where it serves one, else, or when the port fails or the broker is
    unavailable, over ``conn``'s gRPC, whose call retries until the broker answers. The broker
    stores or stages one producer sequence once, so a request the port may have delivered is
    safe to send again."""
    try:
        answer = _send_by_port(port_conn, parts)
    except SendPortFailure as exc:
        log.info("the broker's lean port failed a send (%s); sending it over gRPC", exc)
        answer = None
    if answer is not None and answer.error_code:
        error = from_answer(answer.error_code, answer.error_message, answer.error_kind)
        if not isinstance(error, BrokerUnavailableError | WrongGroupError):
            raise error
        answer = None  # gRPC's call retries a broker that is down or not the master, or reads a stale route again
    if answer is None:
        conn.call("Send", EncodedSend(topic, queue_id, b"".join(parts)))


def _send_once(conn: BrokerConnection, topic: str, queue_id: int, parts: _Payload) -> None:
    """Send the request whose bytes are ``parts`` once: over the lean port of ``conn``'s broker
    where it serves one, else over gRPC.

    Raises
    ------
    BrokerUnavailableError
        No answer: the request may or may not have been stored or staged.
    """
    try:
        answer = _send_by_port(conn, parts)
    except SendPortFailure as exc:
        raise BrokerUnavailableError(f"the lean port of broker {conn.address} failed a send ({exc})") from None
    if answer is None:
        conn.call("Send", EncodedSend(topic, queue_id, b"".join(parts)), retry=False)
    elif answer.error_code:
        raise from_answer(answer.error_code, answer.error_message, answer.error_kind)


def _send_by_port(conn: BrokerConnection, parts: _Payload) -> pb.SendResponse | None:
    """The broker's answer to the send request whose bytes are ``parts``, over the lean port of
    ``conn``'s broker, where it serves one (None where not: gRPC carries the send).

    Raises
    ------
    SendPortFailure
        No answer; ``written`` says whether the request may have reached the broker.
    """
    port = shared_send_port(conn)
    if not port.ready():
        return None
    return port.round_trip(parts, time.monotonic() + conn.timeout)


def _size(payload: _Payload) -> int:
    return sum(len(part) for part in payload)


def _range_sizes(table: pa.Table, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The bytes of each row range ``starts[i]:ends[i]`` of a message table: its keys' and
    bodies' bytes exactly (from their offsets), the other columns' by their share of rows
    (counting a slice's bytes, ``nbytes``, walks its buffers: slow at thousands a second)."""
    variable, variable_bytes = np.zeros(table.num_rows + 1, dtype=np.int64), 0
    for name in ("key", "body"):
        chunks = table.column(name)
        column = chunks.chunk(0) if chunks.num_chunks == 1 else chunks.combine_chunks()
        offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset:column.offset + len(column) + 1]
        variable += offsets - offsets[0]
        variable_bytes += int(offsets[-1] - offsets[0])
    # nbytes, not get_total_buffer_size: that counts a buffer shared by columns (pa.nulls's) once.
    per_row = (table.nbytes - variable_bytes) / max(table.num_rows, 1)
    return variable[ends] - variable[starts] + np.ceil((ends - starts) * per_row).astype(np.int64)


def _chunks(table: pa.Table, size: int, max_bytes: int) -> Iterator[pa.Table]:
    """Consecutive slices of about ``max_bytes`` each (at least one row) of ``table`` (``size`` bytes)."""
    n = table.num_rows
    per_row = max(1, size // max(n, 1))
    step = max(1, max_bytes // per_row)
    for lo in range(0, n, step):
        yield table.slice(lo, step)
