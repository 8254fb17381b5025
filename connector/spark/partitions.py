"""One Spark input partition per MessageQueue, and the task-side read of ``[start, end)``.

A queue is never split across partitions: its messages leave in queue order as Arrow record
batches, converted with Arrow compute (``connector.spark.schema``). A streaming partition carries
the query's consumer identity and the fencing epoch the driver held when it planned the batch;
the task pulls with that epoch and takes no lock itself. When the broker refuses the epoch (the
lock was lost), the task goes on only if the driver holds the queue again and the group's
offsets show that nobody else consumed it (``connector.spark.group_offsets``); otherwise the
batch fails with a ``FencedError`` naming the other client. In a cluster a partition names the
broker group holding its queue and the group's brokers, which the task asks directly: a failover
of that group is the same case (the new master refuses the old epoch until the driver locks again).
On a single broker that serves its lean port, a task pulls over it (``connector.client.pull_port``):
the same requests and answers, without gRPC's per-megabyte copies and wake-ups.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from broker.wire import codec
from broker.wire.errors import (
    BrokerUnavailableError,
    DamagedRecordError,
    FencedError,
    NotMasterError,
    OffsetOutOfRangeError,
)
from broker.wire.pull_response import PullReply
from connector.client.connection import BrokerConnection, pb
from connector.client.pull_port import PullLink, PullPortFailure
from connector.spark.connections import give_back_pull_link, lease_pull_link
from connector.spark.group_offsets import check_not_consumed
from connector.spark.locks import describe_holder
from connector.spark.lost_tails import stored_at
from connector.spark.options import SourceOptions
from connector.spark.schema import to_spark_batch
from connector.spark.worker_gc import freeze_worker_objects

__all__ = ["DataLossError", "QueuePartition", "read_partition"]

log = logging.getLogger(__name__)

PULL_MAX_MESSAGES = 100_000  # whole stored batches: a pull that ends mid-record makes the broker re-encode it
_STALL_SLEEP_S = 0.05
_RELOCK_POLL_S = 0.2


class DataLossError(OffsetOutOfRangeError):
    """Messages a micro-batch must read are gone (retention removed them, or they are damaged on disk)."""


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """Read ``[start, end)`` of queue ``topic/queue_id``.

    ``broker`` is the broker's name, in a cluster the name of the group holding the queue, and
    ``addresses`` that group's brokers (master first; empty on a single broker): the task asks
    them directly and follows the group's master through a failover. A locked (streaming) read
    sets ``client_id`` and the lock ``epoch`` planned by the driver (an epoch of that group), and
    ``end_read_at`` the broker's clock by which the message at ``end - 1`` had been stored
    (``connector.spark.lost_tails``; None when unknown).
    """

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int
    client_id: str | None = None
    epoch: int = 0
    addresses: tuple[str, ...] = ()
    end_read_at: int | None = None


def read_partition(options: SourceOptions, partition: QueuePartition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The messages of ``partition`` in queue order as record batches of ``target``."""
    freeze_worker_objects()
    conn = options.connect_direct(partition.addresses)
    link = lease_pull_link(conn)
    with ThreadPoolExecutor(1, thread_name_prefix="orderlymq-prefetch") as prefetch:
        puller = _Puller(conn, link, prefetch)
        try:
            yield from _pull_range(conn, options, partition, target, puller)
        finally:
            puller.release()


class _Puller:
    """The pulls of one partition, over the broker's lean port when it serves one (``link``), else
    over gRPC; at most one issued ahead, so that while Spark takes a batch the next one crosses
    the network. A failing link is dropped and the pull made over gRPC (pulls are safe to repeat),
    within what is left of the poll timeout: a frozen broker fails the read after it, as on gRPC.
    So is a link to a group's broker that is not its master (a failover, or a first address that
    is a slave): the gRPC connection finds the master, and the next read's link goes there."""

    def __init__(self, conn: BrokerConnection, link: PullLink | None, pool: ThreadPoolExecutor) -> None:
        self._conn, self._link, self._pool = conn, link, pool
        self._ahead: tuple[pb.PullRequest, Future | None] | None = None  # no future: issued on the link

    def issue(self, request: pb.PullRequest) -> None:
        if self._link is not None:
            try:
                self._link.issue(request)
                self._ahead = (request, None)
                return
            except PullPortFailure as exc:
                self._drop_link(exc)
        self._ahead = (request, self._pool.submit(self._conn.call, "Pull", request))

    def pull(self, request: pb.PullRequest) -> PullReply:
        """The answer to ``request``: the one issued ahead when it asked the same, else a new pull."""
        ahead, self._ahead = self._ahead, None
        started = time.monotonic()
        try:
            if ahead is not None and ahead[1] is not None and ahead[0] == request:
                return ahead[1].result()
            if self._link is not None:
                if ahead is not None and ahead[1] is None:
                    if ahead[0] == request:
                        return self._link.receive()
                    self._link.skip()
                self._link.issue(request)
                return self._link.receive()
        except (PullPortFailure, NotMasterError) as exc:  # a group's slave, or a master that stepped down
            self._drop_link(exc)
            return self._conn.call("Pull", request, deadline=started + self._conn.retry_timeout)
        return self._conn.call("Pull", request)

    def release(self) -> None:
        """Hand the link back for the process's next read, unless an answer is left unread on it."""
        if self._link is None:
            return
        if self._ahead is None:
            give_back_pull_link(self._conn, self._link)
        else:
            self._link.close()
        self._link = None

    def _drop_link(self, failure: PullPortFailure | NotMasterError) -> None:
        # A group's slave is where a read of a group may start: no warning for that.
        level = logging.INFO if isinstance(failure, NotMasterError) else logging.WARNING
        log.log(level, "pulling over the broker's lean port failed (%s); pulling over gRPC", failure)
        self._link.close()
        self._link = None


def _pull_range(
    conn: BrokerConnection, options: SourceOptions, part: QueuePartition, target: pa.Schema, puller: _Puller
) -> Iterator[pa.RecordBatch]:
    group, client_id, epoch = "", "", 0
    if part.client_id is not None:
        group, client_id, epoch = options.consumer_group or "", part.client_id, part.epoch
    tags = "" if options.tags == "*" else options.tags

    def request_at(position: int) -> pb.PullRequest:
        return pb.PullRequest(topic=part.topic, queue_id=part.queue_id, offset=position,
                              max_messages=min(part.end - position, PULL_MAX_MESSAGES), tag_expression=tags,
                              group=group, client_id=client_id, epoch=epoch)

    offset = part.start
    stalled_since: float | None = None
    while offset < part.end:
        try:
            response = puller.pull(request_at(offset))
        except OffsetOutOfRangeError:
            offset = _skip_lost(conn, options, part, offset)
            continue
        except DamagedRecordError as exc:
            offset = _skip_damaged(options, part, offset, exc)
            continue
        except FencedError as exc:
            epoch = _regained_epoch(conn, options, part, epoch, exc)
            continue
        except BrokerUnavailableError as exc:
            raise BrokerUnavailableError(
                f"queue {part.topic}/{part.queue_id}: reading offset {offset} of [{part.start}, {part.end}) failed: "
                f"{exc}. The broker did not answer within pollTimeoutMs={options.poll_timeout_ms} ms (it is down, "
                "frozen or overloaded): the batch fails; restart the query once the broker serves again, or raise "
                "option pollTimeoutMs to ride out longer stalls"
            ) from None
        if offset < response.next_offset < part.end:
            puller.issue(request_at(response.next_offset))
        table = codec.decode_many(response.batches)
        if table.num_rows:
            offsets = table.column("queue_offset")
            if offsets[-1].as_py() >= part.end:
                table = table.filter(pc.less(offsets, pa.scalar(part.end, pa.int64())))
            if table.num_rows:
                yield to_spark_batch(table, target, topic=part.topic, broker=part.broker, queue_id=part.queue_id)
        if response.next_offset > offset:
            offset, stalled_since = response.next_offset, None
            continue
        if response.max_offset <= offset:
            offset = _missing_tail(options, part, offset, response.max_offset)
            continue
        stalled_since = stalled_since or time.monotonic()
        if time.monotonic() - stalled_since > options.poll_timeout_ms / 1000:
            raise TimeoutError(
                f"queue {part.topic}/{part.queue_id}: no progress reading offset {offset} for "
                f"{options.poll_timeout_ms} ms (option pollTimeoutMs)"
            )
        time.sleep(_STALL_SLEEP_S)


def _regained_epoch(conn: BrokerConnection, options: SourceOptions, part: QueuePartition, epoch: int,
                    refused: FencedError) -> int:
    """The epoch to read on with after the broker refused ``epoch``; ``FencedError`` when none.

    Waits up to lockTimeoutMs for the query's driver to hold the queue again (after a broker
    restart its lock renewal takes it again), then applies the rule of ``group_offsets``.
    """
    group, client_id, ref = options.consumer_group or "", part.client_id or "", (part.topic, part.queue_id)
    where = f"queue {part.topic}/{part.queue_id} (group {group!r}, reading [{part.start}, {part.end}))"
    deadline = time.monotonic() + options.lock_timeout_ms / 1000
    while True:
        lock = describe_holder(conn, group, ref)
        if lock is not None and lock.client_id != client_id:
            raise FencedError(
                f"{where}: client {client_id!r} lost its lock (epoch {epoch}) to client {lock.client_id!r} "
                f"(epoch {lock.epoch}); the batch fails so that the two do not both consume the queue ({refused})"
            )
        if lock is not None and lock.epoch != epoch:
            check_not_consumed(conn, group, client_id, ref, part.start,
                               context=f"{where}: the lock planned at epoch {epoch} was lost and taken again by "
                                       f"this query at epoch {lock.epoch}")
            _check_planned_tail(conn, part, where)
            log.warning("%s: lock regained at epoch %d (planned %d); nobody else consumed the queue", where,
                        lock.epoch, epoch)
            return lock.epoch
        if time.monotonic() > deadline:
            raise FencedError(
                f"{where}: client {client_id!r} lost its lock (epoch {epoch}) and its query did not take it again "
                f"within {options.lock_timeout_ms} ms (option lockTimeoutMs): the query is stopping, or its driver "
                f"cannot reach the broker ({refused})"
            )
        time.sleep(_RELOCK_POLL_S)


def _check_planned_tail(conn: BrokerConnection, part: QueuePartition, where: str) -> None:
    """After the broker restarted: the batch's last planned message is still the one planned,
    or the log lost its tail and other messages were stored there (which the batch would read as
    if planned, and the next batch read again): the batch fails, and the query reads on from
    where the log was cut when it plans again. A log shorter than planned: ``_missing_tail``."""
    if part.end_read_at is None:
        return
    stored = stored_at(conn, (part.topic, part.queue_id), part.end - 1)
    if stored is not None and stored > part.end_read_at:
        raise DataLossError(
            f"{where}: the broker lost the tail of the queue's log after this batch was planned (a power cut with "
            "flush = \"async\") and other messages were stored at its offsets since; the batch fails, and the "
            "query, started again from its checkpoint, reads on from where the log was cut"
        )


def _skip_damaged(options: SourceOptions, part: QueuePartition, offset: int, exc: DamagedRecordError) -> int:
    """Where to go on after messages the broker reports damaged on disk (``failOnDataLoss``)."""
    if options.fail_on_data_loss or exc.next_offset <= offset:
        raise DataLossError(
            f"queue {part.topic}/{part.queue_id}: {exc}. Set failOnDataLoss=false to skip damaged messages "
            "with a warning"
        ) from None
    log.warning("queue %s/%d: skipping damaged offsets %d..%d (failOnDataLoss=false): %s", part.topic,
                part.queue_id, offset, exc.next_offset - 1, exc)
    return min(exc.next_offset, part.end)


def _skip_lost(conn: BrokerConnection, options: SourceOptions, part: QueuePartition, offset: int) -> int:
    response = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=part.topic, queue_id=part.queue_id))
    low = response.min_offset
    if offset >= low:
        return _missing_tail(options, part, offset, response.max_offset)
    if options.fail_on_data_loss:
        raise DataLossError(
            f"queue {part.topic}/{part.queue_id}: offsets {offset}..{low - 1} were removed by retention before "
            f"this query read them (earliest retained offset is {low}). Set failOnDataLoss=false to skip lost "
            "messages with a warning, or keep data longer (broker retention)"
        )
    log.warning(
        "queue %s/%d: skipping offsets %d..%d removed by retention (failOnDataLoss=false)",
        part.topic,
        part.queue_id,
        offset,
        low - 1,
    )
    return min(low, part.end)


def _missing_tail(options: SourceOptions, part: QueuePartition, offset: int, high: int) -> int:
    """The queue ends at ``high`` < ``part.end``: messages the batch planned to read are gone."""
    if options.fail_on_data_loss:
        raise DataLossError(
            f"queue {part.topic}/{part.queue_id} now ends at offset {high}, but this batch was planned up to "
            f"{part.end} (the topic was deleted and recreated, or the broker lost data). Set failOnDataLoss=false "
            "to skip the missing offsets with a warning"
        )
    log.warning(
        "queue %s/%d: offsets %d..%d are missing (failOnDataLoss=false)",
        part.topic,
        part.queue_id,
        offset,
        part.end - 1,
    )
    return part.end
