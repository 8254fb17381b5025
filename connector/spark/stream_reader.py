"""The streaming reader: micro-batches of per-queue offset ranges under the group's queue locks.

Spark keeps one instance of this reader in a driver-side Python process for the life of the
query (``initialOffset`` / ``latestOffset`` / ``partitions`` / ``commit`` / ``stop`` run there),
and pickles it to the tasks, which only call ``read``. So ``__init__`` holds only picklable,
checked options; the broker connection and the lock keeper are created on first use on the
driver and never pickled.

Client id. The query's consumer identity is minted once, in ``initialOffset``, and stored in
every offset this reader returns (``{"clientId": ..., "queues": ...}``). Spark checkpoints those
offsets and hands them back after a restart, so a restarted query uses the same client id and
re-acquires its own locks at once, while a different query of the same group is refused until
those locks are released or expire.

Restart. The first call of a reader process that receives an offset it did not mint itself is
a restart from the checkpoint: the checkpoint's positions are compared with the group's
committed offsets before anything is read (``DriverState.check_checkpoint``, option
``groupOffsetConflict``). A query that died in its first batch is replayed from the start that
batch's end recorded, under the identity of the run that died (``connector.spark.offsets``).

Stop. Spark stops this process with SIGTERM; the first one unwinds through the runner's
``finally`` into ``stop()``, which releases the locks (later ones are ignored so that the release
completes). A warden process (``connector.spark.lock_warden``) releases them if this process dies
without doing so.
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

from broker.wire.errors import GroupOffsetConflictError
from connector.spark import metadata
from connector.spark.driver_state import DriverState
from connector.spark.offsets import (
    Positions,
    QueueRef,
    admit,
    carried_read_at,
    client_id_of,
    fresh_start,
    initial_of,
    is_fresh_start,
    positions_of,
    read_at_of,
    to_json,
)
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
        self._driver: DriverState | None = None
        self._target: Positions | None = None  # Trigger.AvailableNow: never read past these positions
        self._initial: dict | None = None  # the identity Spark asked for first
        self._first: dict | None = None  # the start of the first batch, once resolved

    def __getstate__(self) -> dict:
        return {"options": self.options, "schema": self.schema, "_driver": None, "_target": None, "_initial": None,
                "_first": None}

    # -- driver side ---------------------------------------------------------------------------

    def _state(self, client_id: str, checkpoint: Positions | None = None) -> DriverState:
        """The driver state; ``checkpoint`` is the start Spark hands over (checked on a restart)."""
        if self._driver is None:
            _release_on_sigterm()
            self._driver = DriverState(self.options, client_id)
        elif self._driver.client_id != client_id:
            raise ValueError(
                f"offsets of two consumer identities in one query ({self._driver.client_id!r}, {client_id!r}): "
                "the checkpoint was written by another query; use a new checkpointLocation"
            )
        state = self._driver
        if not state.checked and checkpoint is not None:
            state.check_checkpoint(checkpoint, state.queues())
        return state

    def initialOffset(self) -> dict:
        # The identity only. Spark does not checkpoint this offset and asks again, in a new process,
        # when it replays the first batch after a restart; so the start positions are resolved as
        # that batch is planned and recorded in its end (connector.spark.offsets).
        if self._initial is None:  # Spark may ask more than once
            self._initial = fresh_start(f"spark-{uuid.uuid4().hex}", group=self.options.consumer_group,
                                        brokers=self.options.brokers)
        return self._initial

    def _first_start(self, fresh: dict) -> dict:
        """The start of a new query's first batch (resolved once), the group's queues held first."""
        if self._first is None:
            state = self._state(client_id_of(fresh))
            queues = state.queues()
            state.hold_and_accept(queues)
            start = metadata.resolve_positions(
                state.conn,
                self.options.starting,
                queues,
                option=self.options.starting.option_name,
                group=self.options.consumer_group,
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
            self._first = self._offset(state.client_id, start)
        return self._first

    def _replayed_start(self, end: dict) -> dict:
        """The start of the first batch, ending at ``end``: where the query started, as recorded in
        ``end``, under the identity of the run that planned it (this one, or one that died)."""
        client_id = client_id_of(end)
        initial = initial_of(end)
        if initial is None:
            initial = self._start_from_group(client_id, sorted(positions_of(end)))
        return self._offset(client_id, initial)

    def _start_from_group(self, client_id: str, queues: list[QueueRef]) -> Positions:
        """The start of a first batch planned by an earlier connector, which did not record it: the
        group's offsets, which that planning committed as ``client_id``."""
        found = self._state(client_id).hold_and_accept(queues)
        unknown = {ref: found[ref] for ref in queues if found[ref].offset < 0 or found[ref].committed_by != client_id}
        if unknown:
            listed = "; ".join(f"{topic}/{queue_id}: {offset.describe()}" for (topic, queue_id), offset in unknown.items())
            raise GroupOffsetConflictError(
                f"consumer group {self.options.consumer_group!r}: the first micro-batch of this query was planned by "
                "an earlier orderlymq connector, which did not record where the query started, and the group's "
                f"offsets no longer show it ({listed}); use a new checkpointLocation"
            )
        return {ref: found[ref].offset for ref in queues}

    def _offset(self, client_id: str, positions: Positions, read_at: Positions | None = None,
                initial: Positions | None = None) -> dict:
        return to_json(client_id, positions, group=self.options.consumer_group, brokers=self.options.brokers,
                       read_at=read_at, initial=initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        first_batch = is_fresh_start(start)
        if first_batch:
            start = self._first_start(start)
        spark_begin, begun_at = positions_of(start), read_at_of(start)
        state = self._state(client_id_of(start), spark_begin)
        queues = state.queues()
        # The ends first: their answers tell whether the broker started again since (its log may
        # have lost the tail below ``start``), before anything is committed or planned from there.
        latest = state.latest(queues)
        state.check_tails(queues, start)
        begin = state.effective(spark_begin, begun_at)
        state.commit(begin)  # every batch up to ``start`` has completed (see DriverState.commit)
        if self._target is not None:
            latest = {ref: min(pos, self._target.get(ref, 0)) for ref, pos in latest.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = admit(begin, latest, max_rows)
        # The first batch's end records where the query started; an idle query's next end, the same
        # positions, keeps it (Spark runs a batch whenever the JSON changes).
        initial = spark_begin if first_batch else initial_of(start) if end == spark_begin else None
        return self._offset(state.client_id, end, carried_read_at(begin, begun_at, end, state.last_read_at),
                            initial=initial)

    def prepareForTriggerAvailableNow(self) -> None:
        # Called before the first offset is known, so the identity is not needed: a throwaway
        # connection records the end of every queue now; latestOffset never goes past it.
        with self.options.connect() as conn:
            queues = metadata.all_queues(metadata.describe_topics(conn, self.options.topics))
            self._target = metadata.queue_ends(conn, queues)

    def reportLatestOffset(self) -> dict | None:
        if self._driver is None or self._driver.last_latest is None:
            return None
        return self._offset(self._driver.client_id, self._driver.last_latest)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        if is_fresh_start(start):  # the first batch, planned by this process or replayed after a restart
            start = self._replayed_start(end)
        client_id = client_id_of(end)
        spark_begin = positions_of(start)
        state = self._state(client_id, spark_begin)
        state.check_tails(state.queues(), start, end)  # a batch replayed after a restart
        begin = state.effective(spark_begin, read_at_of(start))
        finish = state.tails.effective(positions_of(end), read_at_of(end))
        ranges = [(ref, begin.get(ref, 0), stop) for ref, stop in sorted(finish.items()) if stop > begin.get(ref, 0)]
        state.commit(begin)
        epochs = state.locks.epochs(ref for ref, _, _ in ranges)
        planned, end_read_at = [], read_at_of(end)
        for (t, q), lo, hi in ranges:
            broker, addresses = state.placement((t, q))
            planned.append(QueuePartition(topic=t, broker=broker, queue_id=q, start=lo, end=hi, client_id=client_id,
                                          epoch=epochs[(t, q)], addresses=addresses,
                                          end_read_at=end_read_at.get((t, q))))
        return planned

    def commit(self, end: dict) -> None:
        spark_end = positions_of(end)
        state = self._state(client_id_of(end), spark_end)
        state.commit(state.effective(spark_end, read_at_of(end)))

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
    """Turn the first SIGTERM into ``SystemExit`` in the driver-side reader process.

    When a query stops, Spark terminates this process (and may signal it again) instead of
    letting ``stop()`` return normally; unwinding through the runner's ``finally`` still calls
    ``stop()``, which releases the queue locks at once. Later SIGTERMs are ignored: raised inside
    the release, they would cut it short and leave the locks to expire with their lease.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
