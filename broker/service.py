"""What each RPC does: validate, delegate to storage/locks/offsets/transactions, build the answer.

``BrokerService`` knows nothing of gRPC: each method takes a parsed request and returns a response
message or raises an ``OrderlyMQError``. The transport (``broker.server``) decides where a method
runs (the event loop or a worker thread) and turns errors into statuses. A long-polling ``Pull``
is split in three (``pull_queue``, the wait, ``pull_read``) so that its wait holds no thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import shutil
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

import broker
from broker.clocks import wall_ms
from broker.config import BrokerConfig
from broker.data_dir_lock import DataDirLock
from broker.locks import LockInfo, LockManager
from broker.membership import Membership
from broker.metrics import BrokerMetrics
from broker.offsets import OffsetStore
from broker.proto import orderlymq_pb2 as pb
from broker.storage import Store
from broker.storage.page_cache import CHUNK_BYTES, window_bytes
from broker.storage.queue_log import QueueLog
from broker.transactions import TransactionManager, prepare_change
from broker.wire import codec
from broker.wire.errors import InvalidRequestError, OffsetOutOfRangeError, OrderlyMQError
from broker.wire.pull_response import encode_pull_response
from broker.wire.tags import parse_tag_expression

__all__ = ["MAX_AWAITED_QUEUES", "BrokerService", "ready_queues"]

log = logging.getLogger(__name__)

# A commit staging less than this appends its queues one after the other: a thread hand-off would
# cost more than the append. Above it, its queues are appended side by side (the copy into the page
# cache is most of a big commit, and an exactly-once Spark batch waits for it with idle cores).
_PARALLEL_COMMIT_BYTES = 1 << 20
MAX_AWAITED_QUEUES = 10_000  # one AwaitMessages call: a waiter on the loop per queue


def _require(value: str, what: str) -> str:
    if not value:
        raise InvalidRequestError(f"{what} is required")
    return value


class BrokerService:
    """The orderlymq.v1 service over one data directory; methods are named after the RPCs."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        data = Path(config.data_dir)
        self._dir_lock = DataDirLock(data)  # before anything in it is read: recovery cuts files
        try:
            self._open(data)
        except BaseException:
            self._dir_lock.release()
            raise

    def _open(self, data: Path) -> None:
        config = self.config
        # Told with every pull: a client pulling from another start than before looks at the tail it read.
        self.boot_id = secrets.randbits(63) or 1
        self.store = Store(
            data,
            segment_bytes=config.segment_bytes,
            index_interval_bytes=config.index_interval_bytes,
            sync=config.flush == "sync",
            page_cache_bytes=window_bytes(config.page_cache_bytes),
        )
        if self.store.page_cache is not None:
            log.info("the last %d MiB of log written stay in the page cache, older log is dropped from it "
                     "(page_cache_bytes)", self.store.page_cache.budget_chunks * CHUNK_BYTES >> 20)
        self.offsets = OffsetStore(data / "offsets.json")
        self.locks = LockManager(data / "lock-epochs.json", lease_ms=config.lock_lease_ms)
        self.members = Membership(timeout_ms=config.consumer_timeout_ms)
        self.txns = self._transactions()
        # Not one per core: an append of a broker group's master also waits for its slaves.
        self._commit_pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="orderlymq-commit")
        self.metrics = BrokerMetrics(self)
        for report in self.store.cut_reports():
            log.warning("recovered %s: cut %d damaged bytes at byte %d (%s); messages from offset %d lost",
                        report.path, report.bytes_cut, report.position, report.reason, report.first_lost_offset)
        # In a broker group, the master's node (``broker.cluster``): None for a single broker.
        # Set by ``start_broker``; a slave finishes interrupted commits only once promoted.
        self.cluster = None
        self.send_port = 0  # the lean send port once served (broker.send_port), told by Health
        if not config.clustered:
            self.offsets_within_logs()
            self.finish_interrupted_commits()

    def offsets_within_logs(self) -> None:
        """Move committed offsets past the end of their queue's log back to that end (in a broker
        group, the slaves copy the moves as any commit).

        A commit past the end is refused, so such an offset means the log lost its tail since (a
        power cut with ``flush = "async"``, or damage cut at recovery): the messages stored at
        those offsets from now on are new ones, and the group would skip them. A single broker does
        this on start; in a broker group the master does it when promoted, once its log is the
        group's (a slave's log may lag the offsets it was sent while it follows). There it finds
        such offsets after the whole group lost its tails together, or, with ``replication =
        "async"``, when the new master had not copied what the group consumed.
        """
        for group in self.offsets.groups():
            for topic, queue_id, offset, client_id in self.offsets.group_positions(group):
                try:
                    end = self.store.queue(topic, queue_id).max_offset
                except OrderlyMQError:
                    continue
                if offset > end:
                    log.warning("group %s: its committed offset %d of %s/%d is past the end of the queue's log (%d), "
                                "which lost its tail; moved back to %d, so that the group consumes the messages "
                                "stored there from now on", group, offset, topic, queue_id, end, end)
                    self.offsets.commit(group, topic, queue_id, end, client_id)
                    self._changed(offsets=True)

    def finish_interrupted_commits(self) -> None:
        for txn_id in self.txns.committing():
            log.info("finishing transaction %s interrupted during commit", txn_id)
            self._apply_commit(txn_id)

    @contextlib.contextmanager
    def _txn_changes(self):
        """Around a change of the transaction table: yields ``record(change)``; a broker group's
        master records it for its slaves (and, replicating in sync, waits for them)."""
        if self.cluster is None:
            yield _ignore
        else:
            with self.cluster.txn_changes() as record:
                yield record

    def _expire_transactions(self) -> None:
        for txn_id in self.txns.expire():
            log.info("aborted transaction %s: idle past its timeout", txn_id)
            if self.cluster is not None:
                # Not waited for: lost in a failover, the new master aborts it again when it expires.
                with contextlib.suppress(Exception), self.cluster.txn_changes(wait=False) as record:
                    record(pb.TxnChange(kind=pb.TxnChange.ABORT, txn_id=txn_id))

    def reset_transactions(self) -> None:
        """Empty the transaction table (a slave about to copy its master's)."""
        self.txns.close()
        shutil.rmtree(self.store.data_dir / "txns", ignore_errors=True)
        self.txns = self._transactions()

    def _transactions(self) -> TransactionManager:
        return TransactionManager(self.store.data_dir / "txns", timeout_ms=self.config.txn_timeout_ms,
                                  fsync=self.config.flush == "sync", stage_pool_bytes=self.config.txn_stage_pool_bytes)

    def _changed(self, offsets: bool = False) -> None:
        """Tell the group's slaves (if any) that something they copy changed."""
        if self.cluster is not None:
            self.cluster.changed(offsets)

    def _queue(self, topic: str, queue_id: int) -> QueueLog:
        """The queue a request names; in a cluster, ``WrongGroupError`` when another group holds it."""
        if self.cluster is not None:
            self.cluster.topics.check_holds(topic, queue_id)
        return self.store.queue(topic, queue_id)

    def _still_master(self) -> None:
        """In a broker group, refuse a change unless this broker is its serving master right now: a
        call admitted by the gate may have waited (for a queue, for slaves) while it stepped down.
        Appends check it under their queue's lock too, so none lands after a step-down and the
        follower's cut of the log."""
        if self.cluster is not None:
            self.cluster.require_master()

    # -- topics --------------------------------------------------------------------------------

    def _route(self, topic: str) -> pb.TopicRoute:
        return pb.TopicRoute(topic=topic, broker_name=self.config.broker_name,
                             queue_count=self.store.queue_count(topic))

    # In a cluster the topics live in ZooKeeper, spread over the groups (broker.cluster.topics):
    # any broker of any group answers these, each group's master creates its part.

    def CreateTopic(self, request):
        if self.cluster is not None:
            return self.cluster.create_topic(request.topic, request.queue_count, request.if_not_exists)
        count = self.store.create_topic(request.topic, request.queue_count, request.if_not_exists)
        return pb.TopicRoute(topic=request.topic, broker_name=self.config.broker_name, queue_count=count)

    def UpdateTopic(self, request):
        if self.cluster is not None:
            return self.cluster.grow_topic(request.topic, request.queue_count)
        self.store.grow_topic(request.topic, request.queue_count)
        return self._route(request.topic)

    def DescribeTopic(self, request):
        if self.cluster is not None:
            return self.cluster.describe_topic(request.topic)
        return self._route(request.topic)

    def ListTopics(self, request):
        if self.cluster is not None:
            return pb.ListTopicsResponse(topics=self.cluster.list_topics())
        return pb.ListTopicsResponse(topics=[
            pb.TopicRoute(topic=t, broker_name=self.config.broker_name, queue_count=n)
            for t, n in sorted(self.store.topics().items())
        ])

    def DescribeCluster(self, request):
        if self.cluster is None:
            return pb.DescribeClusterResponse()
        return self.cluster.describe_cluster()

    def DeleteTopic(self, request):
        if self.cluster is not None:
            self.cluster.delete_topic(request.topic)
            return pb.DeleteTopicResponse()
        # Group state goes first: if the topic delete then fails (disk full), consumers re-read from
        # the start (duplicates); the other order could leave old offsets to skip a new topic's messages.
        self.store.queue_count(request.topic)
        self.offsets.drop_topic(request.topic)
        self.locks.drop_topic(request.topic)
        self.store.delete_topic(request.topic)
        return pb.DeleteTopicResponse()

    # -- produce -------------------------------------------------------------------------------

    def Send(self, request) -> pb.SendResponse:
        """Store one batch (or stage it in a transaction); also each request of ``SendStream``."""
        self._still_master()  # a send stream may outlive this broker's term as master
        if request.txn_id:
            return self._stage(request)
        answer = self._append(request)
        if self.cluster is not None:  # a duplicate too: its first copy may not be replicated yet
            self.cluster.stored(request.topic, request.queue_id, answer.base_offset + answer.count)
        return answer

    async def send_replicated(self, request) -> pb.SendResponse:
        """``Send`` of a batch outside a transaction, on the event loop of a broker group's master:
        the wait for its slaves is awaited, with no thread sleeping through it."""
        answer, replicated = self.append_replicated(request)
        if replicated is not None:
            await replicated
        return answer

    def append_replicated(self, request) -> tuple[pb.SendResponse, asyncio.Future | None]:
        """``send_replicated`` in two steps, on the event loop: the batch stored now (its answer),
        and what to await for the slaves to hold it before that answer is given (None: nothing).
        Until then the next batches can be stored: the slaves fetch them together."""
        self._still_master()
        answer = self._append(request)
        return answer, self.cluster.replicated(request.topic, request.queue_id, answer.base_offset + answer.count)

    def _append(self, request) -> pb.SendResponse:
        queue = self._queue(request.topic, request.queue_id)
        body, count = codec.message_batch(request.batch)
        result = queue.append(body, count, request.producer_id, request.sequence if request.producer_id else -1,
                              admit=self._still_master)
        if not result.duplicate:
            self.metrics.stored(request.topic, request.queue_id, result.count, len(body))
        return pb.SendResponse(base_offset=result.base_offset, count=result.count,
                               store_timestamp=result.store_timestamp, duplicate=result.duplicate,
                               queue_id=request.queue_id)

    def _stage(self, request) -> pb.SendResponse:
        self._queue(request.topic, request.queue_id)  # checks the topic and queue id, as an append does
        body, count = codec.message_batch(request.batch)
        # A producer id makes the staged send idempotent: its sequence numbers it in the transaction.
        sequence = request.sequence if request.producer_id else None
        with self._txn_changes() as record:
            staged = self.txns.stage(request.txn_id, request.topic, request.queue_id, body, sequence, count)
            if staged and self.cluster is not None:  # only the group's slaves read the payload from the change
                record(pb.TxnChange(kind=pb.TxnChange.STAGE, txn_id=request.txn_id, topic=request.topic,
                                    queue_id=request.queue_id, payload=bytes(body)))
        return pb.SendResponse(base_offset=-1, count=count, queue_id=request.queue_id, duplicate=not staged)

    # -- consume -------------------------------------------------------------------------------

    def pull_queue(self, request) -> QueueLog:
        """Everything a pull checks before it may wait: the queue, the lock, the tags, the limits
        and the offset. Returns the queue to wait on and read."""
        self._still_master()  # the lean port has no gate (broker.cluster.gate): a slave refuses here
        queue = self._queue(request.topic, request.queue_id)
        if request.group:
            self.locks.check(request.group, request.topic, request.queue_id, request.client_id, request.epoch)
        parse_tag_expression(request.tag_expression)
        if request.max_messages < 0 or request.max_bytes < 0 or request.wait_ms < 0:
            raise InvalidRequestError("max_messages, max_bytes and wait_ms must not be negative")
        queue.check_offset(request.offset)
        return queue

    def pull_wait_s(self, request, queue: QueueLog) -> float:
        """How long the pull may wait for data at its offset (0: answer now)."""
        if not request.wait_ms or request.offset < queue.visible_offset:
            return 0.0
        return self.await_wait_s(request)

    def pull_read(self, request, queue: QueueLog) -> list[bytes | pa.Buffer]:
        """The parts of the serialized ``PullResponse`` (the broker encodes its own: megabytes, copied
        at most once)."""
        result = queue.read(
            request.offset,
            min(request.max_messages or self.config.max_pull_messages, self.config.max_pull_messages),
            min(request.max_bytes or self.config.max_pull_bytes, self.config.max_pull_bytes),
        )
        tags = parse_tag_expression(request.tag_expression)
        table = result.table if tags is None else _with_tags(result.table, tags)
        batches = [codec.encode_parts(table)] if table.num_rows else []
        self.metrics.served(request.topic, request.queue_id, table.num_rows, table.nbytes)
        return encode_pull_response(batches, next_offset=result.next_offset, count=table.num_rows, boot_id=self.boot_id,
                                    min_offset=queue.min_offset, max_offset=queue.visible_offset)

    def awaited_queues(self, request) -> list[tuple[pb.QueuePosition, QueueLog]]:
        """Everything ``AwaitMessages`` checks before it may wait: each position's queue (held by
        this broker group), a wait that is not negative, not too many queues for one call."""
        if not request.positions:
            raise InvalidRequestError("AwaitMessages names no queue: give the position of at least one")
        if len(request.positions) > MAX_AWAITED_QUEUES:
            raise InvalidRequestError(f"AwaitMessages names {len(request.positions)} queues, more than the "
                                      f"{MAX_AWAITED_QUEUES} one call may await: split them over several calls")
        if request.wait_ms < 0:
            raise InvalidRequestError("wait_ms must not be negative")
        return [(position, self._queue(position.topic, position.queue_id)) for position in request.positions]

    def await_wait_s(self, request) -> float:
        """How long a long poll (a ``Pull``, ``AwaitMessages``) may wait: its ``wait_ms``, at most ``max_wait_ms``."""
        return min(request.wait_ms, self.config.max_wait_ms) / 1000

    def QueryOffsets(self, request):
        queue = self._queue(request.topic, request.queue_id)
        end = queue.visible_offset
        at = min(queue.offset_for_timestamp(request.timestamp), end) if request.has_timestamp else end
        return pb.QueryOffsetsResponse(min_offset=queue.min_offset, max_offset=end,
                                       offset_for_timestamp=at, now_ms=queue.clock(), boot_id=self.boot_id)

    # -- group offsets -------------------------------------------------------------------------

    def CommitOffset(self, request):
        _require(request.group, "group")
        self._still_master()
        queue = self._queue(request.topic, request.queue_id)
        if request.epoch or request.client_id:
            self.locks.check(request.group, request.topic, request.queue_id, request.client_id, request.epoch)
        if request.offset > queue.max_offset:
            raise OffsetOutOfRangeError(
                f"cannot commit offset {request.offset} for {request.topic}/{request.queue_id}: "
                f"only {queue.max_offset} messages have been stored"
            )
        self.offsets.commit(request.group, request.topic, request.queue_id, request.offset, request.client_id)
        self._changed(offsets=True)
        return pb.CommitOffsetResponse()

    def GetOffset(self, request):
        _require(request.group, "group")
        self._queue(request.topic, request.queue_id)
        offset, client_id = self.offsets.committed(request.group, request.topic, request.queue_id)
        return pb.GetOffsetResponse(offset=offset, committed_by=client_id)

    # -- locks ---------------------------------------------------------------------------------

    def _check_queues(self, topic: str, queue_ids) -> list[int]:
        for qid in queue_ids:
            self._queue(topic, qid)
        return list(queue_ids)

    def LockBatch(self, request):
        self._still_master()
        queue_ids = self._check_queues(request.topic, request.queue_ids)
        held = self.locks.lock_batch(request.group, request.client_id, request.topic, queue_ids)
        return pb.LockBatchResponse(locked=[
            _queue_lock(LockInfo(request.topic, qid, request.client_id, epoch, self.locks.lease_ms))
            for qid, epoch in sorted(held.items())
        ])

    def UnlockBatch(self, request):
        queue_ids = self._check_queues(request.topic, request.queue_ids)
        released = self.locks.unlock_batch(request.group, request.client_id, request.topic, queue_ids)
        return pb.UnlockBatchResponse(unlocked=sorted(released))

    def QueryLocks(self, request):
        self.store.queue_count(request.topic)
        holders = self.locks.holders(request.group, request.topic)
        return pb.QueryLocksResponse(locks=[_queue_lock(info) for info in holders])

    # -- membership ----------------------------------------------------------------------------

    def Heartbeat(self, request):
        self.members.heartbeat(_require(request.group, "group"), _require(request.client_id, "client_id"),
                               request.topics)
        return pb.HeartbeatResponse()

    def LeaveGroup(self, request):
        self.members.unregister(_require(request.group, "group"), _require(request.client_id, "client_id"))
        return pb.LeaveGroupResponse()

    def ListConsumers(self, request):
        return pb.ListConsumersResponse(client_ids=self.members.consumers(_require(request.group, "group")))

    # -- transactions --------------------------------------------------------------------------

    def BeginTxn(self, request):
        with self._txn_changes() as record:
            state = self.txns.begin(request.txn_id, request.timeout_ms)
            record(pb.TxnChange(kind=pb.TxnChange.BEGIN, txn_id=request.txn_id, timeout_ms=request.timeout_ms))
        return pb.BeginTxnResponse(state=state, numbers_sends=True, timeout_ms=self.txns.timeout_ms(request.txn_id))

    def _apply_commit(self, txn_id: str) -> tuple[bool, int]:
        """Append a transaction's staged batches: one record per queue, in send order. Appends
        carry (txn, sequence 0) as producer identity, so re-applying after a crash stores nothing twice."""
        with self._txn_changes() as record:  # the slaves move it to COMMITTING before any record is appended
            already, staged = self.txns.prepare_commit(txn_id, self._queue_ends)
            starts = self.txns.commit_starts(txn_id)
            if not already:
                record(prepare_change(txn_id, starts))
        if already:
            return True, 0
        appends = [functools.partial(self._append_staged, txn_id, queue, payloads, rows, starts.get(queue))
                   for queue, (payloads, rows) in _by_queue(staged, self.txns.staged_rows(txn_id)).items()]
        if len(appends) > 1 and sum(len(payload) for _, _, payload in staged) >= _PARALLEL_COMMIT_BYTES:
            count = sum(_all_done(self._commit_pool, appends))
        else:
            count = sum(append() for append in appends)
        with self._txn_changes() as record:
            self.txns.mark_committed(txn_id)
            record(pb.TxnChange(kind=pb.TxnChange.COMMIT, txn_id=txn_id))
        return False, count

    def _queue_ends(self, queues: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {(topic, queue_id): self.store.queue(topic, queue_id).max_offset for topic, queue_id in queues}

    def _append_staged(self, txn_id: str, queue: tuple[str, int], payloads: list[memoryview], rows: int | None,
                       start: int | None) -> int:
        """One queue's part of a commit of ``rows`` messages, where known (appended once: looked for
        from ``start`` when the queue no longer remembers the transaction); its message count."""
        topic, queue_id = queue
        parts, rows = codec.join_records(payloads, rows)  # staged sends are message_batch bodies, like records
        result = self.store.queue(topic, queue_id).append(parts, rows, f"txn:{txn_id}", 0, since=start,
                                                          admit=self._still_master, burst=True)
        if self.cluster is not None:
            self.cluster.stored(topic, queue_id, result.base_offset + result.count)
        return rows

    def CommitTxn(self, request):
        already, count = self._apply_commit(_require(request.txn_id, "txn_id"))
        return pb.CommitTxnResponse(already_committed=already, count=count)

    def AbortTxn(self, request):
        with self._txn_changes() as record:
            self.txns.abort(_require(request.txn_id, "txn_id"))
            record(pb.TxnChange(kind=pb.TxnChange.ABORT, txn_id=request.txn_id))
        return pb.AbortTxnResponse()

    def Health(self, request):
        health = pb.HealthResponse(status="SERVING", broker_name=self.config.broker_name, version=broker.__version__,
                                   send_port=self.send_port)
        if self.cluster is not None:
            self.cluster.describe(health)
        return health

    # -- read-only views (consoles) -------------------------------------------------------------

    def ListGroups(self, request):
        holders = defaultdict(list)
        for group, info in self.locks.all_holders():
            holders[group].append(_queue_lock(info))
        names = sorted({*self.offsets.groups(), *self.members.groups(), *holders})
        return pb.ListGroupsResponse(groups=[
            pb.GroupInfo(
                group=group,
                offsets=[pb.GroupOffset(topic=t, queue_id=q, offset=o, committed_by=c)
                         for t, q, o, c in self.offsets.group_positions(group)],
                consumers=self.members.consumers(group),
                locks=holders[group],
            )
            for group in names
        ])

    def ListTransactions(self, request):
        now = wall_ms()
        return pb.ListTransactionsResponse(transactions=[
            pb.OpenTransaction(txn_id=tid, state=state, last_activity_ms=now - idle,
                               expires_at_ms=0 if left is None else now + left, staged_bytes=staged)
            for tid, state, idle, left, staged in self.txns.open_transactions()
        ])

    # -- housekeeping --------------------------------------------------------------------------

    def housekeeping(self, stop: threading.Event) -> None:
        """Flush (async mode), expire transactions and apply retention until ``stop`` is set;
        compaction runs on a thread of its own (a long rewrite must not delay the flushes)."""
        compactor = None
        # Not in a broker group: a slave far behind fetches from record boundaries merging removes.
        if self.config.compact_interval_ms and not self.config.clustered:
            compactor = threading.Thread(target=self._compaction, args=(stop,), name="orderlymq-compaction",
                                         daemon=True)
            compactor.start()
        self._housekeeping(stop)
        if compactor is not None:
            compactor.join()

    def _compaction(self, stop: threading.Event) -> None:
        while not stop.wait(self.config.compact_interval_ms / 1000):
            try:
                self.store.compact(idle_ms=self.config.compact_interval_ms)
            except Exception:  # noqa: BLE001 - compaction must never stop
                log.exception("compaction failed")

    def _housekeeping(self, stop: threading.Event) -> None:
        interval = self.config.flush_interval_ms / 1000
        next_retention = 0.0
        elapsed = 0.0
        while not stop.wait(interval):
            elapsed += interval
            try:
                self.store.flush()
                if self.cluster is None or self.cluster.role == "MASTER":  # a slave replays its master's aborts
                    self._expire_transactions()
                if elapsed >= next_retention:
                    next_retention = elapsed + self.config.retention_check_interval_ms / 1000
                    self.store.apply_retention(self.config.retention_ms, self.config.retention_bytes)
            except Exception:  # noqa: BLE001 - housekeeping must never stop
                log.exception("housekeeping failed")

    def close(self) -> None:
        self._commit_pool.shutdown()  # a commit's appends end before the store closes
        if self.cluster is not None:
            self.cluster.stop()
        self.store.flush()
        self.store.close()
        self.txns.close()
        self.offsets.close()
        self.locks.close()
        self.metrics.close()
        self._dir_lock.release()


def _by_queue(staged: list[tuple[str, int, memoryview]], rows: list[int] | None
              ) -> dict[tuple[str, int], tuple[list[memoryview], int | None]]:
    """A commit's staged sends per queue, in send order, with the messages they hold where ``rows``
    (per send) tells."""
    if rows is not None and len(rows) != len(staged):
        rows = None
    payloads: dict[tuple[str, int], list[memoryview]] = defaultdict(list)
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for i, (topic, queue_id, payload) in enumerate(staged):
        payloads[(topic, queue_id)].append(payload)
        if rows is not None:
            counts[(topic, queue_id)] += rows[i]
    return {queue: (parts, counts[queue] if rows is not None else None) for queue, parts in payloads.items()}


def _all_done(pool: futures.Executor, calls: list[Callable[[], int]]) -> list[int]:
    """Run ``calls`` on ``pool``; their results once every one has ended, or the first error (in
    the order of ``calls``): none is left running behind an error."""
    running = [pool.submit(call) for call in calls]
    futures.wait(running)
    return [future.result() for future in running]


def _queue_lock(info: LockInfo) -> pb.QueueLock:
    """A lock as answers show it: its lease's end on the wall clock, and how long it has left."""
    return pb.QueueLock(topic=info.topic, queue_id=info.queue_id, epoch=info.epoch, client_id=info.client_id,
                        expires_at_ms=wall_ms() + info.expires_in_ms, expires_in_ms=info.expires_in_ms)


def _ignore(change) -> None:
    """``record`` of a broker outside any group: nothing to record."""


def _with_tags(table: pa.Table, tags: frozenset[str]) -> pa.Table:
    # A message without a tag is not in the set: is_in answers false for it, not null.
    return table.filter(pc.is_in(table.column("tag"), value_set=codec.string_array(sorted(tags))))


def ready_queues(awaited: list[tuple[pb.QueuePosition, QueueLog]], every: bool = False) -> list[pb.QueuePosition]:
    """The awaited queues a pull answers at once (``every`` one, for a caller who read its positions
    from another start of the broker): those whose end is not at the position any more (messages
    stored past it, or a position the queue no longer holds), each with its end."""
    ends = [(position, queue.visible_offset) for position, queue in awaited]
    return [pb.QueuePosition(topic=position.topic, queue_id=position.queue_id, offset=end)
            for position, end in ends if every or end != position.offset]
