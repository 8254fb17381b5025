"""One Spark input partition per MessageQueue, and the task-side read of ``[start, end)``.

A queue is never split across partitions: its messages leave in queue order as Arrow record
batches, converted with Arrow compute (``connector.spark.schema``). A streaming partition carries
the query's consumer identity; its task re-locks the queue (same client: same epoch) and pulls
with that fencing epoch, so a query that lost its lock cannot read on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from broker.wire import codec
from broker.wire.errors import DamagedRecordError, FencedError, OffsetOutOfRangeError
from connector.client.connection import BrokerConnection, pb
from connector.spark.locks import lock_queues
from connector.spark.options import SourceOptions
from connector.spark.schema import to_spark_batch

__all__ = ["DataLossError", "QueuePartition", "read_partition"]

log = logging.getLogger(__name__)

PULL_MAX_MESSAGES = 100_000  # whole stored batches: a pull that ends mid-record makes the broker re-encode it
_STALL_SLEEP_S = 0.05


class DataLossError(OffsetOutOfRangeError):
    """Messages a micro-batch must read are gone (retention removed them, or they are damaged on disk)."""


@dataclass(frozen=True)
class QueuePartition(InputPartition):
    """Read ``[start, end)`` of queue ``topic/queue_id``; ``client_id`` set for a locked (streaming) read."""

    topic: str
    broker: str
    queue_id: int
    start: int
    end: int
    client_id: str | None = None


def read_partition(options: SourceOptions, partition: QueuePartition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The messages of ``partition`` in queue order as record batches of ``target``."""
    conn = options.connect()
    try:
        yield from _pull_range(conn, options, partition, target)
    finally:
        conn.close()


def _pull_range(
    conn: BrokerConnection, options: SourceOptions, part: QueuePartition, target: pa.Schema
) -> Iterator[pa.RecordBatch]:
    ref = (part.topic, part.queue_id)
    group, client_id, epoch = "", "", 0
    if part.client_id is not None:
        group, client_id = options.consumer_group or "", part.client_id
        epoch = lock_queues(conn, group, client_id, [ref], options.lock_timeout_ms)[ref]
    tags = "" if options.tags == "*" else options.tags
    offset = part.start
    stalled_since: float | None = None
    while offset < part.end:
        request = pb.PullRequest(
            topic=part.topic,
            queue_id=part.queue_id,
            offset=offset,
            max_messages=min(part.end - offset, PULL_MAX_MESSAGES),
            tag_expression=tags,
            group=group,
            client_id=client_id,
            epoch=epoch,
        )
        try:
            response = conn.call("Pull", request)
        except OffsetOutOfRangeError:
            offset = _skip_lost(conn, options, part, offset)
            continue
        except DamagedRecordError as exc:
            offset = _skip_damaged(options, part, offset, exc)
            continue
        except FencedError as exc:
            raise FencedError(
                f"queue {part.topic}/{part.queue_id}: client {client_id!r} lost its lock while reading "
                f"[{part.start}, {part.end}) ({exc}); the batch fails and the query restarts from its last "
                "committed offsets once it holds the lock again"
            ) from None
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
