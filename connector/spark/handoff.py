"""The sink's half of a clean hand-over: advance the source group's offsets right after a batch
became visible.

Spark tells a source that a micro-batch is done only lazily (``commit(end)`` and the next
``latestOffset`` come when the *next* batch is planned), so a query stopped between two batches
leaves its group's offsets one batch behind what its sink already made visible, and the next
query of the group would read that batch again. The ``orderlymq`` sink closes this window: right
after its ``commit(messages, batchId)`` made the batch visible, and before Spark records the batch
in its commit log, it reads the batch's source offsets from the query's checkpoint
(``<checkpointLocation>/offsets/<batchId>``) and commits, for every ``orderlymq`` source there,
the group's offsets to the batch's end, as the source's own client id and with the epoch of the
lock that client holds now (a queue the client no longer holds is left alone: fencing still
applies); in a cluster each on the master of the broker group holding the queue. What remains is
the time between the sink's last ``CommitTxn`` and these commits. Where a log lost its tail after
the batch's end was read (a power cut with ``flush = "async"``), the group's offset moves no
further than the first offset written again: the query reads those messages next.

Best effort by design: any failure is logged and the source's own lazy commit still follows.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

from broker.wire.errors import OrderlyMQError
from connector.client.connection import BrokerConnection, pb
from connector.client.locking import queues_by_topic
from connector.client.routed import RoutedConnection
from connector.spark.connections import shared_connection
from connector.spark.lost_tails import written_again
from connector.spark.metadata import by_group, each_concurrently, group_connection
from connector.spark.offsets import positions_of, read_at_of
from connector.spark.security import ConnectionSecurity

__all__ = ["advance_group_offsets", "source_offsets"]

log = logging.getLogger(__name__)

_KEYS = frozenset({"clientId", "group", "brokers", "queues"})
_CALL_TIMEOUT_S = 10.0  # a broker that does not answer within it leaves the offsets to the source's commit


def source_offsets(checkpoint: str, batch_id: int) -> list[dict]:
    """The ``orderlymq`` source offsets Spark planned for ``batch_id`` (none if unreadable)."""
    path = Path(checkpoint.removeprefix("file:")) / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []  # not a local checkpoint, or no such batch: the source's lazy commit does it
    found = []
    for line in lines[2:]:  # "v1", the batch metadata, then one offset per source
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and _KEYS <= parsed.keys():
            found.append(parsed)
    return found


def advance_group_offsets(checkpoint: str | None, batch_id: int, security: ConnectionSecurity | None = None) -> int:
    """Commit the groups' offsets of ``batch_id``'s ``orderlymq`` sources; the number committed.
    ``security``: the sink's TLS and credentials (the checkpoint holds no secrets), which need
    subscribe rights on the source's topics and group for this to succeed."""
    if not checkpoint:
        return 0
    done = 0
    for offset in source_offsets(checkpoint, batch_id):
        try:
            conn = shared_connection(offset["brokers"], security or ConnectionSecurity(), timeout=_CALL_TIMEOUT_S)
            done += _advance(conn, offset["group"], offset["clientId"], positions_of(offset), read_at_of(offset))
        except OrderlyMQError as exc:
            log.warning("batch %d: advancing the offsets of group %r failed (the source commits them when it plans "
                        "the next batch): %s", batch_id, offset["group"], exc)
    return done


def _advance(conn: RoutedConnection, group: str, client_id: str, positions: dict, read_at: dict) -> int:
    """Per broker group (a single broker is one): a group failing over leaves the others' commits."""
    done = 0
    for broker_group, refs in by_group(conn, positions).items():
        try:
            done += _advance_group(group_connection(conn, broker_group), group, client_id,
                                   {ref: positions[ref] for ref in refs}, read_at)
        except OrderlyMQError as exc:
            log.warning("advancing the offsets of group %r on broker group %r failed (the source commits them when "
                        "it plans the next batch): %s", group, broker_group, exc)
    return done


def _advance_group(conn: BrokerConnection, group: str, client_id: str, positions: dict, read_at: dict) -> int:
    """Per topic, its locks, the group's offsets and where each log was written again since its
    position was read, at once; then the queues the client holds and the group has not reached
    yet move (never back), each with the epoch of its lock."""
    done = 0
    for topic, ids in queues_by_topic(positions).items():
        looked = [queue_id for queue_id in ids if (topic, queue_id) in read_at]
        calls = [functools.partial(conn.call, "QueryLocks", pb.QueryLocksRequest(group=group, topic=topic))]
        calls += [functools.partial(conn.call, "GetOffset", pb.GetOffsetRequest(group=group, topic=topic,
                                                                                queue_id=queue_id))
                  for queue_id in ids]
        calls += [functools.partial(written_again, conn, (topic, queue_id), positions[(topic, queue_id)],
                                    read_at[(topic, queue_id)])
                  for queue_id in looked]
        locks, *answers = each_concurrently(lambda call: call(), calls)
        offsets = {queue_id: answer.offset for queue_id, answer in zip(ids, answers[:len(ids)], strict=True)}
        ends = {queue_id: positions[(topic, queue_id)] for queue_id in ids}
        for queue_id, end in zip(looked, answers[len(ids):], strict=True):
            if end < ends[queue_id]:
                log.warning("queue %s/%d lost its tail after the query read up to offset %d: the group's offset "
                            "moves to %d at most, where the log was written again", topic, queue_id,
                            ends[queue_id], end)
                ends[queue_id] = end
        epochs = {lock.queue_id: lock.epoch for lock in locks.locks if lock.client_id == client_id}
        requests = [pb.CommitOffsetRequest(group=group, topic=topic, queue_id=queue_id, client_id=client_id,
                                           offset=ends[queue_id], epoch=epochs[queue_id])
                    for queue_id in ids  # a queue lost: fencing decides
                    if queue_id in epochs and offsets[queue_id] < ends[queue_id]]
        each_concurrently(lambda request: conn.call("CommitOffset", request), requests)
        done += len(requests)
    return done
