"""Exactly-once commits of the sink: transaction ids, and the driver's commit of a micro-batch.

Every write task stages its rows in its own broker transaction::

    spark-sink/<query id>/<batch id>/<partition>/<task attempt id>.<attempt number>/<nonce>

The nonce makes the id unique even when a restarted query re-runs the batch with attempt numbers
that start again at 0, so a task never appends to a transaction left open by an earlier run.

The driver's ``commit(messages, batchId)`` must make the batch visible once, even when it is
replayed: Spark re-runs a batch whose commit did not reach its commit log (the driver died after
committing on the broker but before recording it), with new tasks and therefore new transaction
ids. Committing "the transactions of the last attempt" would then write the batch twice, and a
batch-level marker committed after the data still leaves a window (data committed, marker not)
in which a replay duplicates the batch. So the driver first records a *commit plan* — the list
of ``(partition, transaction id)`` it is about to commit — as one message appended (atomically)
to the internal topic ``__orderlymq_spark_sink`` with the query id as its tag, and only then
commits the transactions: every queue gets its parts in partition order, and parts with no queue
in common are committed side by side (``_waves``). A replay of the batch finds the plan and commits
exactly the planned transactions (``CommitTxn`` of a committed id is an idempotent no-op) and
aborts its own. A planned transaction the broker aborted meanwhile (its timeout passed during a
long outage) was never visible, so the replay's transaction of that partition, which holds the
same rows, takes its place, recorded first as a revision of the plan (a later replay applies the
revisions in order, so it commits that substitute again, never a third copy). A failed batch's
``abort`` leaves alone what its plan names: its replay commits those. After a commit the group
``spark-sink/<query id>`` stores the log position of that batch's plan (the last batch that can
still be replayed), so a lookup reads only the plans written since. That position is recorded
once the batch is visible, at the same time as the caller's own follow-up (the sink's hand-over of
the source offsets): neither waits for the other, and a lookup that starts earlier than it could
only reads more plans. A process that
committed an earlier batch of the query starts the next lookup at that batch's plan without
asking: any plan of a later batch was recorded after it (Spark commits a batch only once the one
before it has completed), so nothing is skipped. When that earlier batch was of the same run of
the query (Spark's ``runId``, which the tasks read from their job group), there is no lookup at
all: within a run Spark calls a batch's commit once (a failed commit ends the run), and no earlier
run can have planned a batch after one this run committed (an earlier run plans batch N only
once N - 1 is in the commit log, and a run that follows starts at N or later).

Plans are removed by the broker's retention; the position of the query's last plan, stored in
the group ``spark-sink/<query id>/planned`` before any commit, tells a replay whose plan is gone
that the batch's commit began (it fails, rather than writing the batch again).

In a cluster (docs/cluster.md) a task's rows go to queues of several broker groups, and each
group's master holds its own transactions: a task's transaction has one part per group it wrote
to, and the plan lists ``(partition, broker group, transaction id)`` for every part. Committed,
replayed and substituted part by part, the plan is made visible exactly on every group (a
``CommitTxn`` of a committed id is a no-op on its group; a part aborted by timeout is replaced
by the replay's part of the same partition and group). Each group's parts are committed as on
a single broker and the groups side by side, so a reader may see some groups' parts of a batch
before the others', as within one broker it may see some partitions' before the others'.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from broker.wire import codec
from broker.wire.errors import (
    OffsetOutOfRangeError,
    OrderlyMQError,
    PermissionDeniedError,
    TopicNotFoundError,
    TransactionError,
    TransactionNotFoundError,
)
from connector.client.connection import pb
from connector.client.routed import RoutedConnection
from connector.spark.metadata import Connection, at_once, each_concurrently, group_connection

__all__ = ["SINK_LOG_TOPIC", "abort_all", "abort_batch", "commit_batch", "task_txn_id"]

log = logging.getLogger(__name__)

_P = TypeVar("_P")
_R = TypeVar("_R")

SINK_LOG_TOPIC = "__orderlymq_spark_sink"
_PLAN_TAG = "plan"

# (bootstrap broker, query id) -> (batch id, log position of its plan, run id), for the batches this
# process committed: where the lookup of a later batch of the query starts, and whether one is
# needed (see the module docstring).
_committed_here: dict[tuple[str, str], tuple[int, int, str]] = {}


def task_txn_id(query_id: str, batch_id: int, partition: int, task_attempt: int, attempt: int) -> str:
    return f"spark-sink/{query_id}/{batch_id}/{partition}/{task_attempt}.{attempt}/{uuid.uuid4().hex[:12]}"


def _ensure_sink_log(conn: Connection) -> None:
    """Create the sink log if missing; a user without admin rights (access control) may still use
    one an administrator created."""
    try:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=SINK_LOG_TOPIC, queue_count=1, if_not_exists=True))
    except PermissionDeniedError as denied:
        try:
            conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=SINK_LOG_TOPIC))
        except OrderlyMQError:
            raise denied from None


def _log_group(query_id: str) -> str:
    """Stores the log position of the plan of the query's last visible batch."""
    return f"spark-sink/{query_id}"


def _planned_group(query_id: str) -> str:
    """Stores the log position of the query's last plan, recorded before any of its commits: it
    outlives the plan itself (offsets are not subject to retention)."""
    return f"spark-sink/{query_id}/planned"


def _store_position(conn: Connection, group: str, position: int) -> None:
    """Store a log position of the sink log as ``group``'s offset (``_log_group``, ``_planned_group``)."""
    conn.call("CommitOffset", pb.CommitOffsetRequest(group=group, topic=SINK_LOG_TOPIC, queue_id=0, offset=position))


def _stored_position(conn: Connection, group: str) -> int:
    """The position ``_store_position`` stored for ``group``; -1 when none was."""
    return conn.call("GetOffset", pb.GetOffsetRequest(group=group, topic=SINK_LOG_TOPIC, queue_id=0)).offset


def abort_batch(conn: Connection, query_id: str, batch_id: int, parts: list[tuple[str, str]], *,
                replayable: bool) -> int:
    """Abort a failed batch's ``(broker group, transaction id)`` parts, but those a recorded plan
    of the batch names (its commit was cut short): the batch's replay commits them. How many it
    aborted."""
    if replayable and parts:
        try:
            found = _find_plan(conn, query_id, batch_id)
        except TopicNotFoundError:
            found = None
        except OrderlyMQError as exc:
            log.warning("batch %d of query %s: its plan cannot be looked up (%s); its transactions are left to the "
                        "broker's timeout", batch_id, query_id, exc)
            return 0
        if found is not None:
            planned = {(group, txn_id) for _, group, txn_id in found[0]}
            parts = [part for part in parts if part not in planned]
    abort_all(conn, parts)
    return len(parts)


def abort_all(conn: Connection, parts: list[tuple[str, str]]) -> None:
    """Abort ``(broker group, transaction id)`` parts, best effort (an abandoned one is aborted by
    the broker's timeout)."""
    for group, txn_id in parts:
        try:
            group_connection(conn, group).call("AbortTxn", pb.AbortTxnRequest(txn_id=txn_id))
        except OrderlyMQError as exc:
            log.warning("aborting transaction %s failed (the broker's timeout will abort it): %s", txn_id, exc)


def commit_batch(
    conn: Connection,
    query_id: str,
    batch_id: int,
    txns: list[tuple[int, str, str]],
    *,
    replayable: bool,
    then: Callable[[], object] | None = None,
    run_id: str = "",
    queues: Mapping[tuple[str, str], frozenset[tuple[str, int]]] | None = None,
) -> int:
    """Commit the batch ``batch_id`` of ``query_id`` once; the number of rows made visible now.

    ``txns`` are this attempt's ``(partition, broker group, transaction id)``. With ``replayable``
    (a streaming query) a plan recorded by an earlier attempt of the batch wins, as explained above,
    and ``then`` is called once the batch is visible, while its plan's position is recorded.
    ``run_id``: the query's run the batch belongs to, empty when unknown (then a lookup is always made).
    ``queues``: the ``(topic, queue id)`` each ``(broker group, transaction id)`` staged rows into,
    where known (``_waves``).
    """
    txns = sorted(txns)
    queues = queues or {}
    if isinstance(conn, RoutedConnection) and any(group for _, group, _ in txns):
        conn.groups()  # learn every group: a plan may name groups no route read by this process holds
    if not replayable:
        return sum(_commit_in_waves(lambda part: _commit(conn, part[1], part[2]), txns,
                                    lambda part: queues.get((part[1], part[2]))))
    try:
        found = None if _later_in_run(conn, query_id, batch_id, run_id) else _find_plan(conn, query_id, batch_id)
    except TopicNotFoundError:  # the first batch ever committed through this broker: no plan anywhere
        _ensure_sink_log(conn)
        found = None
    if found is None:
        plan, position = txns, _record_plan(conn, query_id, batch_id, txns)
    else:
        plan, position = found
        log.info("batch %d of query %s was planned before (replay): committing that plan", batch_id, query_id)
    # Before any commit (again on a replay: the attempt that recorded the plan may have died first).
    _store_position(conn, _planned_group(query_id), position)
    mine = {(partition, group): txn_id for partition, group, txn_id in txns}
    per_group: dict[str, list[tuple[int, str]]] = {}
    for partition, group, txn_id in plan:
        per_group.setdefault(group, []).append((partition, txn_id))

    def commit_group(group: str) -> list[tuple[str, int, str]]:  # (group, rows, transaction committed) per part
        def commit_part(part: tuple[int, str]) -> tuple[str, int, str]:
            partition, txn_id = part
            return group, *_commit_part(conn, query_id, batch_id, group, partition, txn_id, mine.get((partition, group)))

        return _commit_in_waves(commit_part, per_group[group], lambda part: queues.get((group, part[1])))

    done = [part for parts in each_concurrently(commit_group, list(per_group)) for part in parts]
    committed = sum(rows for _, rows, _ in done)
    used = {(group, txn_id) for group, _, txn_id in done}
    abort_all(conn, [(group, txn_id) for _, group, txn_id in txns if (group, txn_id) not in used])
    # Batches before this one can no longer be replayed (Spark recorded them as done before it
    # started this one); this one can, until Spark records it: later lookups start at its plan.
    _committed_here[_position_key(conn, query_id)] = (batch_id, position, run_id)

    def record_position() -> None:
        _store_position(conn, _log_group(query_id), position)

    at_once(*([record_position] if then is None else [record_position, then]))
    return committed


def _commit_part(conn: Connection, query_id: str, batch_id: int, group: str, partition: int, txn_id: str,
                 substitute: str | None) -> tuple[int, str]:
    """Commit one planned part; if the broker aborted it, this run's part of the same partition
    and group (the same rows) instead, recorded as a revision of the plan first: a later replay
    commits that one too, never a third. The rows made visible, and the transaction committed."""
    batch = (f"batch {batch_id} of query {query_id}: planned transaction {txn_id} of partition {partition} "
             f"{_on_group(group)}")
    try:
        return _commit(conn, group, txn_id), txn_id
    except TransactionNotFoundError:
        raise TransactionError(
            f"{batch}is unknown to the broker (it forgets finished transactions after 24 h), so whether its rows "
            "are visible cannot be told. Check the target topic for this batch's rows, then restart with a new "
            "checkpointLocation"
        ) from None
    except TransactionError:
        if substitute is None:
            raise TransactionError(
                f"{batch}was aborted by the broker before it could be committed, and this run has no rows for "
                "that partition there to replace it; the input is not replayable. Rerun with a new checkpointLocation"
            ) from None
        if substitute == txn_id:
            raise TransactionError(
                f"{batch}was aborted by the broker (its transactionTimeoutMs passed) before the commit; the batch "
                "fails, and its replay (restart the query) stages those rows again"
            ) from None
    log.warning("planned transaction %s %swas aborted by the broker; committing %s (same partition, same rows)",
                txn_id, _on_group(group), substitute)
    _record_plan(conn, query_id, batch_id, [(partition, group, substitute)], revision=True)
    return _commit(conn, group, substitute), substitute


def _waves(parts: Sequence[_P], queues_of: Callable[[_P], frozenset[tuple[str, int]] | None]) -> list[list[_P]]:
    """``parts`` (in partition order) as waves to commit one after the other, the parts of a wave
    side by side: each part comes in a wave after every earlier part it shares a queue with, so
    that every queue still gets the parts in partition order. A part whose queues are unknown
    (``queues_of`` gives None: one planned by an earlier attempt) is taken to share every queue.

    In a pipeline that keeps its keys' queues (each task reads one queue and writes to the queue
    of the same number), no two parts share a queue: the whole batch is one wave."""
    waves: list[list[_P]] = []
    last_wave: dict[tuple[str, int], int] = {}  # queue -> the last wave holding a part that touched it
    floor = 0  # the first wave after the last part of unknown queues
    for part in parts:
        touched = queues_of(part)
        if touched is None:
            wave = len(waves)
            floor = wave + 1
        else:
            wave = max([floor, *(last_wave[queue] + 1 for queue in touched if queue in last_wave)])
            last_wave.update(dict.fromkeys(touched, wave))
        if wave == len(waves):
            waves.append([])
        waves[wave].append(part)
    return waves


def _commit_in_waves(commit: Callable[[_P], _R], parts: Sequence[_P],
                     queues_of: Callable[[_P], frozenset[tuple[str, int]] | None]) -> list[_R]:
    """``commit(part)`` of every part, wave by wave (``_waves``), the parts of a wave side by side;
    their results in that order. A failure ends the commit after its wave, so no queue gets a
    part before an earlier one of it."""
    return [result for wave in _waves(parts, queues_of) for result in each_concurrently(commit, wave)]


def _position_key(conn: Connection, query_id: str) -> tuple[str, str]:
    return conn.addresses[0], query_id


def _lookup_start(conn: Connection, query_id: str, batch_id: int) -> int:
    """Where the plan of ``batch_id`` can be first: at the plan of the last batch committed, as this
    process committed an earlier batch of the query, else as the log's group stores it."""
    known = _committed_here.get(_position_key(conn, query_id))
    if known is not None and known[0] < batch_id:
        return known[1]
    return _stored_position(conn, _log_group(query_id))


def _later_in_run(conn: Connection, query_id: str, batch_id: int, run_id: str) -> bool:
    """Did this process commit an earlier batch of the query in the run ``run_id``? Then no attempt
    of ``batch_id`` planned it before (see the module docstring)."""
    known = _committed_here.get(_position_key(conn, query_id))
    return bool(run_id) and known is not None and known[0] < batch_id and known[2] == run_id


def _on_group(group: str) -> str:
    return f"on broker group {group} " if group else ""


def _commit(conn: Connection, group: str, txn_id: str) -> int:
    response = group_connection(conn, group).call("CommitTxn", pb.CommitTxnRequest(txn_id=txn_id))
    return 0 if response.already_committed else response.count


def _record_plan(conn: Connection, query_id: str, batch_id: int, txns: list[tuple[int, str, str]], *,
                 revision: bool = False) -> int:
    """Append the plan of ``batch_id`` (or, as a ``revision``, the parts that replace some of its
    own); its log offset."""
    entry = {"query": query_id, "batch": batch_id, "txns": txns}
    body = json.dumps({**entry, "revision": True} if revision else entry).encode()
    table = pa.table(
        {
            "key": pa.array([query_id], pa.string()),
            "tag": pa.array([_PLAN_TAG], pa.string()),
            "body": pa.array([body], pa.binary()),
        }
    )
    request = pb.SendRequest(
        topic=SINK_LOG_TOPIC,
        queue_id=0,
        batch=codec.encode(codec.normalize(table)),
        producer_id=f"spark-sink-plan/{uuid.uuid4().hex}",  # dedupes retries of this send only
        sequence=0,
    )
    return conn.call("Send", request).base_offset


def _find_plan(conn: Connection, query_id: str, batch_id: int) -> tuple[list[tuple[int, str, str]], int] | None:
    """The plan of ``batch_id`` and its log offset, if an attempt recorded one: the first plan of
    the batch in the log, with the revisions recorded after it applied in order."""
    start = _lookup_start(conn, query_id, batch_id)  # -1: no batch of the query committed yet
    offset = max(start, 0)
    plan: list[tuple[int, str, str]] | None = None
    position = -1
    while True:
        request = pb.PullRequest(topic=SINK_LOG_TOPIC, queue_id=0, offset=offset, tag_expression=_PLAN_TAG)
        try:
            response = conn.call("Pull", request)
        except OffsetOutOfRangeError:
            first = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=SINK_LOG_TOPIC, queue_id=0)).min_offset
            if offset == max(start, 0) and first > offset:
                _check_plans_removed(conn, query_id, batch_id, start, first)
            offset = first
            continue
        table = codec.decode_many(response.batches)
        mine = table.filter(pc.equal(table.column("key"), pa.scalar(query_id, pa.string())))
        for body, at in zip(mine.column("body").to_pylist(), mine.column("queue_offset").to_pylist(), strict=True):
            entry = json.loads(body)
            if entry.get("batch") != batch_id:
                continue
            parts = [_planned_part(part) for part in entry["txns"]]
            if plan is None and not entry.get("revision"):
                plan, position = parts, at
            elif plan is not None and entry.get("revision"):
                plan = _revised(plan, parts)
        if response.next_offset <= offset or response.next_offset >= response.max_offset:
            return None if plan is None else (plan, position)
        offset = response.next_offset


def _check_plans_removed(conn: Connection, query_id: str, batch_id: int, start: int, first: int) -> None:
    """Retention removed the plans from ``start`` (the plan of the query's last visible batch) up to
    ``first``. Raises if one of them was the query's last plan: the commit of the batch replayed now
    began and was cut short (a later batch is planned only once this one is visible), so some of its
    rows may be visible, and which cannot be told."""
    planned = _stored_position(conn, _planned_group(query_id))
    if start < planned < first:
        raise TransactionError(
            f"batch {batch_id} of query {query_id}: its commit began (its plan is at offset {planned} of "
            f"{SINK_LOG_TOPIC}) and was cut short, and the broker's retention (retention_ms) has since removed that "
            "plan, so which of its rows are visible cannot be told. Check the target topic for this batch's rows, "
            "then restart with a new checkpointLocation")
    if planned < 0 <= start:  # the query's earlier batches were committed by a version that kept no such position
        log.warning(
            "batch %d of query %s: the broker's retention removed commit plans %d..%d of %s, written since this "
            "query's last committed batch; if this batch's plan was among them (its commit was cut short longer "
            "ago than the broker's retention_ms), its rows are written again", batch_id, query_id, start, first - 1,
            SINK_LOG_TOPIC)


def _revised(plan: list[tuple[int, str, str]], revision: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """``plan`` with each part named in ``revision`` (same partition and group) replaced."""
    replaced = {(partition, group): txn_id for partition, group, txn_id in revision}
    return [(partition, group, replaced.get((partition, group), txn_id)) for partition, group, txn_id in plan]


def _planned_part(entry: list) -> tuple[int, str, str]:
    """``(partition, broker group, transaction id)`` of a plan entry; plans written before
    clusters hold ``(partition, transaction id)``, of the single broker."""
    if len(entry) == 2:
        return int(entry[0]), "", str(entry[1])
    return int(entry[0]), str(entry[1]), str(entry[2])
