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
commits the transactions in partition order. A replay of the batch finds the plan and commits
exactly the planned transactions (``CommitTxn`` of a committed id is an idempotent no-op) and
aborts its own. A planned transaction the broker aborted meanwhile (its timeout passed during a
long outage) was never visible, so the replay's transaction of that partition, which holds the
same rows, takes its place. After a commit the group ``spark-sink/<query id>`` stores the log
position of that batch's plan (the last batch that can still be replayed), so a lookup reads only
the plans written since.
"""

from __future__ import annotations

import json
import logging
import uuid

import pyarrow as pa
import pyarrow.compute as pc

from broker.wire import codec
from broker.wire.errors import OffsetOutOfRangeError, OrderlyMQError, PermissionDeniedError, TransactionError
from connector.client.connection import BrokerConnection, pb

__all__ = ["SINK_LOG_TOPIC", "abort_all", "commit_batch", "task_txn_id"]

log = logging.getLogger(__name__)

SINK_LOG_TOPIC = "__orderlymq_spark_sink"
_PLAN_TAG = "plan"


def task_txn_id(query_id: str, batch_id: int, partition: int, task_attempt: int, attempt: int) -> str:
    return f"spark-sink/{query_id}/{batch_id}/{partition}/{task_attempt}.{attempt}/{uuid.uuid4().hex[:12]}"


def _ensure_sink_log(conn: BrokerConnection) -> None:
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
    return f"spark-sink/{query_id}"


def abort_all(conn: BrokerConnection, txn_ids: list[str]) -> None:
    """Abort transactions, best effort (an abandoned one is aborted by the broker's timeout)."""
    for txn_id in txn_ids:
        try:
            conn.call("AbortTxn", pb.AbortTxnRequest(txn_id=txn_id))
        except OrderlyMQError as exc:
            log.warning("aborting transaction %s failed (the broker's timeout will abort it): %s", txn_id, exc)


def commit_batch(
    conn: BrokerConnection, query_id: str, batch_id: int, txns: list[tuple[int, str]], *, replayable: bool
) -> int:
    """Commit the batch ``batch_id`` of ``query_id`` once; the number of rows made visible now.

    ``txns`` are this attempt's ``(partition, transaction id)``. With ``replayable`` (a streaming
    query) a plan recorded by an earlier attempt of the batch wins, as explained above.
    """
    txns = sorted(txns)
    if not replayable:
        return sum(_commit(conn, txn_id) for _, txn_id in txns)
    _ensure_sink_log(conn)
    found = _find_plan(conn, query_id, batch_id)
    if found is None:
        plan, position = txns, _record_plan(conn, query_id, batch_id, txns)
    else:
        plan, position = found
        log.info("batch %d of query %s was planned before (replay): committing that plan", batch_id, query_id)
    mine = dict(txns)
    committed, used = 0, set()
    for partition, txn_id in plan:
        try:
            committed += _commit(conn, txn_id)
            used.add(txn_id)
        except TransactionError:
            substitute = mine.get(partition)
            if substitute is None:
                raise TransactionError(
                    f"batch {batch_id} of query {query_id}: planned transaction {txn_id} of partition {partition} "
                    "was aborted by the broker before it could be committed, and this run has no rows for that "
                    "partition to replace it; the input is not replayable. Rerun with a new checkpointLocation"
                ) from None
            log.warning(
                "planned transaction %s was aborted by the broker; committing %s (same partition, same rows)",
                txn_id,
                substitute,
            )
            committed += _commit(conn, substitute)
            used.add(substitute)
    abort_all(conn, [txn_id for _, txn_id in txns if txn_id not in used])
    # Batches before this one can no longer be replayed (Spark recorded them as done before it
    # started this one); this one can, until Spark records it: later lookups start at its plan.
    conn.call(
        "CommitOffset",
        pb.CommitOffsetRequest(group=_log_group(query_id), topic=SINK_LOG_TOPIC, queue_id=0, offset=position),
    )
    return committed


def _commit(conn: BrokerConnection, txn_id: str) -> int:
    response = conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=txn_id))
    return 0 if response.already_committed else response.count


def _record_plan(conn: BrokerConnection, query_id: str, batch_id: int, txns: list[tuple[int, str]]) -> int:
    body = json.dumps({"query": query_id, "batch": batch_id, "txns": txns}).encode()
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


def _find_plan(conn: BrokerConnection, query_id: str, batch_id: int) -> tuple[list[tuple[int, str]], int] | None:
    """The plan of ``batch_id`` and its log offset, if an earlier attempt recorded one."""
    start = conn.call(
        "GetOffset", pb.GetOffsetRequest(group=_log_group(query_id), topic=SINK_LOG_TOPIC, queue_id=0)
    ).offset
    offset = max(start, 0)
    while True:
        request = pb.PullRequest(topic=SINK_LOG_TOPIC, queue_id=0, offset=offset, tag_expression=_PLAN_TAG)
        try:
            response = conn.call("Pull", request)
        except OffsetOutOfRangeError:
            offset = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=SINK_LOG_TOPIC, queue_id=0)).min_offset
            continue
        table = codec.decode_many(response.batches)
        mine = table.filter(pc.equal(table.column("key"), pa.scalar(query_id, pa.string())))
        for body, position in zip(
            mine.column("body").to_pylist(), mine.column("queue_offset").to_pylist(), strict=True
        ):
            plan = json.loads(body)
            if plan.get("batch") == batch_id:
                return [(int(p), str(t)) for p, t in plan["txns"]], position
        if response.next_offset <= offset or response.next_offset >= response.max_offset:
            return None
        offset = response.next_offset
