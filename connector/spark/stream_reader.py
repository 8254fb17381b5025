"""The streaming reader: micro-batches of per-queue offset ranges under the group's queue locks.

Spark keeps one instance of this reader in a driver-side Python process for the life of the
query (``initialOffset`` / ``latestOffset`` / ``partitions`` / ``commit`` / ``stop`` run there),
and pickles it to the tasks, which only call ``read``. So ``__init__`` holds only picklable,
checked options; the broker connection and the lock keeper are created on first use on the
driver and never pickled.

Client id. The query's consumer identity is minted once, in ``initialOffset``, and stored in
every offset this reader returns (``{"clientId": ..., "queues": ...}``). Spark checkpoints those
offsets and hands them back after a restart, so a restarted query uses the same client id and
re-acquires its own locks at once (the broker treats it as a renewal), while a different query
of the same group is refused until those locks are released or expire.
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from broker.wire.errors import FencedError
from connector.client.connection import pb
from connector.spark import metadata
from connector.spark.locks import LockKeeper
from connector.spark.offsets import Positions, admit, client_id_of, positions_of, to_json
from connector.spark.options import SourceOptions
from connector.spark.partitions import QueuePartition, read_partition
from connector.spark.schema import arrow_schema

__all__ = ["OrderlyMQStreamReader"]

log = logging.getLogger(__name__)


class OrderlyMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Reads the topics of ``options`` for consumer group ``options.consumer_group``."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._driver: _DriverState | None = None
        self._target: Positions | None = None  # Trigger.AvailableNow: never read past these positions
        self._initial: dict | None = None

    def __getstate__(self) -> dict:
        return {"options": self.options, "schema": self.schema, "_driver": None, "_target": None, "_initial": None}

    # -- driver side ---------------------------------------------------------------------------

    def _state(self, client_id: str) -> _DriverState:
        if self._driver is None:
            _release_on_sigterm()
            self._driver = _DriverState(self.options, client_id)
        elif self._driver.client_id != client_id:
            raise ValueError(
                f"offsets of two consumer identities in one query ({self._driver.client_id!r}, {client_id!r}): "
                "the checkpoint was written by another query; use a new checkpointLocation"
            )
        return self._driver

    def initialOffset(self) -> dict:
        if self._initial is not None:  # Spark may ask more than once
            return self._initial
        state = self._state(f"spark-{uuid.uuid4().hex}")
        queues = state.queues()
        state.locks.epochs(queues)  # hold the queues before reading the group's committed offsets
        start = metadata.resolve_positions(
            state.conn,
            self.options.starting,
            queues,
            option=self.options.starting.option_name,
            group=self.options.consumer_group,
            fail_on_data_loss=self.options.fail_on_data_loss,
        )
        self._initial = to_json(state.client_id, start)
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        state = self._state(client_id_of(start))
        begin = positions_of(start)
        queues = state.queues()
        state.locks.epochs(queues)
        state.commit(begin)  # every batch up to ``start`` has completed (see _DriverState.commit)
        latest = state.latest(queues)
        if self._target is not None:
            latest = {ref: min(pos, self._target.get(ref, 0)) for ref, pos in latest.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return to_json(state.client_id, admit(begin, latest, max_rows))

    def prepareForTriggerAvailableNow(self) -> None:
        # Called before the first offset is known, so the identity is not needed: a throwaway
        # connection records the end of every queue now; latestOffset never goes past it.
        with self.options.connect() as conn:
            queues = metadata.all_queues(metadata.describe_topics(conn, self.options.topics))
            target = {ref: metadata.queue_bounds(conn, ref)[1] for ref in queues}
        self._target = target

    def reportLatestOffset(self) -> dict | None:
        if self._driver is None or self._driver.last_latest is None:
            return None
        return to_json(self._driver.client_id, self._driver.last_latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        client_id = client_id_of(end)
        state = self._state(client_id)
        begin, finish = positions_of(start), positions_of(end)
        ranges = [(ref, begin.get(ref, 0), stop) for ref, stop in sorted(finish.items()) if stop > begin.get(ref, 0)]
        state.locks.epochs(ref for ref, _, _ in ranges)
        state.commit(begin)
        broker = state.broker_name
        return [
            QueuePartition(topic=t, broker=broker, queue_id=q, start=lo, end=hi, client_id=client_id)
            for (t, q), lo, hi in ranges
        ]

    def commit(self, end: dict) -> None:
        state = self._state(client_id_of(end))
        state.commit(positions_of(end))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    # -- task side -----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, QueuePartition):  # Spark's placeholder when there is nothing to read
            return iter(())
        return read_partition(self.options, partition, arrow_schema(self.schema))


def _release_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit`` in the driver-side reader process.

    When a query stops, Spark terminates this process instead of letting ``stop()`` return
    normally; unwinding through the runner's ``finally`` still calls ``stop()``, which releases
    the queue locks at once rather than leaving them to expire with their lease.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)


class _DriverState:
    """Connection, locks and bookkeeping of the driver-side reader process (never pickled)."""

    def __init__(self, options: SourceOptions, client_id: str) -> None:
        self.options = options
        self.client_id = client_id
        self.conn = options.connect()
        self.locks = LockKeeper(self.conn, options.consumer_group or "", client_id, options.lock_timeout_ms)
        self.last_latest: Positions | None = None
        self.broker_name = ""
        self._committed: Positions = {}

    def queues(self) -> list[tuple[str, int]]:
        """Every queue of the topics now (new queues of a growing topic appear here)."""
        routes = metadata.describe_topics(self.conn, self.options.topics)
        self.broker_name = next(iter(routes.values())).broker_name
        return metadata.all_queues(routes)

    def latest(self, queues: list[tuple[str, int]]) -> Positions:
        self.last_latest = {ref: metadata.queue_bounds(self.conn, ref)[1] for ref in queues}
        return dict(self.last_latest)

    def commit(self, end: Positions) -> None:
        """Commit the group's offsets for the queues that moved, fenced by the lock epochs.

        Spark calls ``commit(end)`` lazily, when it plans the batch after the one ending at
        ``end``. ``latestOffset(start)`` and ``partitions(start, end)`` are only called once every
        batch up to ``start`` has completed, so they commit ``start`` too: the group's offsets on
        the broker then trail the query's checkpoint by at most the batch in flight.
        """
        moved = {ref: pos for ref, pos in end.items() if self._committed.get(ref) != pos}
        if not moved:
            return
        epochs = self.locks.epochs(moved)
        group = self.options.consumer_group or ""
        for ref, pos in sorted(moved.items()):
            topic, queue_id = ref
            request = pb.CommitOffsetRequest(
                group=group, topic=topic, queue_id=queue_id, offset=pos, client_id=self.client_id, epoch=epochs[ref]
            )
            try:
                self.conn.call("CommitOffset", request)
            except FencedError as exc:
                self.locks.forget(ref)
                raise FencedError(
                    f"committing offset {pos} of queue {topic}/{queue_id} for group {group!r}: client "
                    f"{self.client_id!r} no longer holds the queue lock ({exc}). Another consumer took the queue; "
                    "this query stops so that the two do not both consume it"
                ) from None
            self._committed[ref] = pos

    def close(self) -> None:
        try:
            self.locks.release()
        finally:
            self.conn.close()
