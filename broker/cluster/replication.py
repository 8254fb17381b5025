"""The master's side of replication: serving slaves' fetches, and acknowledging sync sends.

Each slave holds one ``Replicate`` stream. Its fetches say where its copy of every queue ends
(after the first, only the ends that moved: ``FetchStream``); the master answers with the records
that follow (framed as stored, at the same offsets), the topic table when it changed since the
stream's previous answer, and, when newer, the committed offsets. A fetch is also the slave's
acknowledgement of everything before its ends, and that is what ``wait_replicated`` waits for: with
``replication = "sync"`` a send is answered once every member of the sync-state set has it and
the set has at least ``min_sync_replicas`` brokers. A send stored on the event loop awaits the
same in ``replicated``, which hands no thread over: a future the acknowledging fetch resolves. A
fetch of a slave that keeps up is answered, and waits for the next send, on the event loop too.

The set changes here, through ``GroupControl`` (a versioned write: only the master of the
current epoch can make it): a slave not caught up with the master for ``replica_lag_timeout_ms``
leaves it, so sends do not wait on a dead or slow slave; a slave joins again once its copy holds
every acknowledged send (the high watermark), so whoever is in the set may become master
without losing one. A slave that reports less than it had before (its data dir was wiped)
leaves the set at once. A slave behind the first offset retention left gets the queue from there.

Each answer a slave acknowledges (by its next fetch on the stream) carries its promise not to
campaign until a while after it received it (``node.py``, "promises"): ``promised_until`` is how
long every slave of the set is bound, which lets a master serve through a ZooKeeper outage.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError

from broker.cluster import lease_clock
from broker.cluster.control import GroupState
from broker.cluster.epochs import EpochHistory, keyed, queue_key
from broker.cluster.txnlog import TxnChangeLog, table_changes
from broker.proto import orderlymq_pb2 as pb
from broker.service import BrokerService
from broker.storage.end_watch import EndWatch, QueueRef
from broker.thread_hops import settle
from broker.wire.errors import (
    InvalidRequestError,
    NotMasterError,
    ReplicationTimeoutError,
    status_metadata,
    to_status,
)

__all__ = ["FETCH_WAIT_S", "MAX_RESPONSE_BYTES", "ReplicaSource"]

log = logging.getLogger(__name__)

FETCH_WAIT_S = 0.5  # an idle fetch is answered (empty) after this long: the slave's heartbeat
MAX_RESPONSE_BYTES = 4 << 20  # an answer cut short holds at least this much
LOOP_ANSWER_MESSAGES = 64  # an answer bringing more is made on a thread, not on the event loop


@dataclass
class _Follower:
    ends: dict[str, int] = field(default_factory=dict)
    offsets_version: int = 0
    last_caught_up: float = 0.0
    # The master's ends of the queues its last answer looked at (the others it knew the slave had);
    # None when that answer was cut short.
    promised: dict[str, int] | None = None
    promised_at: float = 0.0
    txn_seq: int = 0  # the last transaction change the slave applied
    promise_from: float = 0.0  # when the last answer it acknowledged receiving was sent


@dataclass(eq=False)
class _LoopWaiter:
    """A send on the event loop waiting for the sync-state set (``ReplicaSource.replicated``)."""

    has_it: Callable[[_Follower], bool]
    future: asyncio.Future
    what: str
    remedy: str
    thread: int  # its loop's


class ReplicaSource:
    """Serves a master's slaves; inactive (refusing fetches) while this broker is not master."""

    def __init__(self, service: BrokerService, history: EpochHistory, broker_id: int,
                 not_master: Callable[[], NotMasterError]) -> None:
        self.service = service
        self.config = service.config
        self.history = history
        self.broker_id = broker_id
        self.not_master = not_master
        self._cond = threading.Condition()
        self._pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="orderlymq-replication")
        self._active = False
        self.epoch = 0
        self.sync_set: frozenset[int] = frozenset()
        self._followers: dict[int, _Follower] = {}
        # Each slave's fetch streams open now (a new one may start before an old one ends): kept
        # across terms, as a stream opened just before this broker's term began serves in it.
        self._open_streams: Counter[int] = Counter()
        self._high_watermark: dict[str, int] = {}
        self._loop_waiters: list[_LoopWaiter] = []
        self._change_waiters: list[tuple[asyncio.Future, int]] = []  # fetches waiting on a loop, and its thread
        self._changes = 0  # grows with every append, commit or topic change: wakes parked fetches
        self.offsets_version = 0
        self.txn_log = TxnChangeLog()

    # -- the master's term ---------------------------------------------------------------------

    def activate(self, state: GroupState, ends: dict[str, int]) -> None:
        """Serve as master of ``state.epoch``; everything in the log now counts as acknowledged
        (the previous master may have acknowledged it)."""
        with self._cond:
            self._active = True
            self.epoch = state.epoch
            self.sync_set = state.sync_set
            self._followers = {}
            self._high_watermark = dict(ends)
            self.offsets_version = state.epoch << 32
            self.txn_log.begin_term(state.epoch)
            self._notify()
            self._wake_change_waiters()

    def deactivate(self) -> None:
        """Stop serving: fetches are refused and every waiting send fails as not-master."""
        with self._cond:
            self._active = False
            self._notify()
            self._wake_change_waiters()

    def changed(self, offsets: bool = False) -> None:
        """Something slaves copy changed (records, topics; ``offsets``: committed offsets)."""
        with self._cond:
            self._changes += 1
            if offsets:
                self.offsets_version += 1
            self._wake_change_waiters()

    # -- acknowledging sends -------------------------------------------------------------------

    def wait_replicated(self, topic: str, queue_id: int, end: int) -> None:
        """Return once the sync-state set holds ``topic/queue_id`` up to ``end``.

        Raises
        ------
        ReplicationTimeoutError
            Not replicated within twice ``replica_lag_timeout_ms``, or this broker stopped being
            master meanwhile: stored here but not acknowledged; resending is safe.
        """
        self._wait_for_sync_set(*self._holds(topic, queue_id, end))
        self._acknowledged(topic, queue_id, end)

    def replicated(self, topic: str, queue_id: int, end: int) -> asyncio.Future | None:
        """``wait_replicated`` on the event loop: None when acknowledged already, else a future
        done when the fetch that acknowledges it came (acknowledged first), or failed."""
        waiter = self._loop_waiter(*self._holds(topic, queue_id, end))
        if waiter is None:
            self._acknowledged(topic, queue_id, end)
            return None
        waiter.add_done_callback(
            lambda done: done.cancelled() or done.exception() is not None or self._acknowledged(topic, queue_id, end))
        return waiter

    @staticmethod
    def _holds(topic: str, queue_id: int, end: int) -> tuple[Callable[[_Follower], bool], str, str]:
        """What a slave holding ``topic/queue_id`` up to ``end`` has; what to say when it does not."""
        key = queue_key(topic, queue_id)
        return (lambda f: f.ends.get(key, 0) >= end, f"{topic}/{queue_id} up to offset {end}",
                "resend with the same producer id and sequence")

    def _acknowledged(self, topic: str, queue_id: int, end: int) -> None:
        key = queue_key(topic, queue_id)
        with self._cond:
            if end > self._high_watermark.get(key, 0):
                self._high_watermark[key] = end
        self.service.store.queue(topic, queue_id).make_visible(end)  # acknowledged: readers may see it

    def wait_txn_replicated(self, seq: int) -> None:
        """Return once the sync-state set applied the transaction change ``seq`` (same errors as
        ``wait_replicated``; the request may be repeated: begin, stage with a producer's resend
        checks, commit and abort are answered from the transaction's state)."""
        self._wait_for_sync_set(lambda f: f.txn_seq >= seq, f"transaction change {seq & 0xFFFFFFFF}", "retry it")

    def _wait_for_sync_set(self, has_it: Callable[[_Follower], bool], what: str, remedy: str) -> None:
        timeout_s = self._wait_timeout_s()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if not self._active:
                    raise self._stepped_down(what, remedy)
                if self._in_sync_set(has_it):
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timed_out(what, remedy, timeout_s)
                self._cond.wait(remaining)

    def _loop_waiter(self, has_it: Callable[[_Follower], bool], what: str, remedy: str) -> asyncio.Future | None:
        """On the event loop: None when the sync-state set has it already, else a future resolved
        when it does (``_notify``), failed when this broker stops being master or the wait times out."""
        loop = asyncio.get_running_loop()
        with self._cond:
            if not self._active:
                raise self._stepped_down(what, remedy)
            if self._in_sync_set(has_it):
                return None
            waiter = _LoopWaiter(has_it, loop.create_future(), what, remedy, threading.get_ident())
            self._loop_waiters.append(waiter)
        timeout_s = self._wait_timeout_s()
        timer = loop.call_later(timeout_s, lambda: settle(waiter.future, None, self._timed_out(what, remedy, timeout_s)))
        waiter.future.add_done_callback(lambda _: self._forget(waiter, timer))
        return waiter.future

    def _forget(self, waiter: _LoopWaiter, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        with self._cond:
            if waiter in self._loop_waiters:
                self._loop_waiters.remove(waiter)

    def _notify(self) -> None:
        """Under the lock, after a change that may end waits: wake the waiting threads, and settle
        the loop's waiters whose wait it ends."""
        self._cond.notify_all()
        waiting = []
        for waiter in self._loop_waiters:
            if not self._active:
                error = self._stepped_down(waiter.what, waiter.remedy)
            elif self._in_sync_set(waiter.has_it):
                error = None
            else:
                waiting.append(waiter)
                continue
            _settle_from(waiter.future, waiter.thread, error)
        self._loop_waiters = waiting

    def _wait_timeout_s(self) -> float:
        return 2 * self.config.replica_lag_timeout_ms / 1000

    @staticmethod
    def _stepped_down(what: str, remedy: str) -> ReplicationTimeoutError:
        return ReplicationTimeoutError(f"{what} was stored by a broker that stopped being master before its sync-state "
                                       f"set had it; {remedy} (the client sends it to the new master)")

    def _timed_out(self, what: str, remedy: str, timeout_s: float) -> ReplicationTimeoutError:
        return ReplicationTimeoutError(
            f"{what} is stored on the master but not on its sync-state set {sorted(self.sync_set)} after "
            f"{timeout_s:g}s (min_sync_replicas={self.config.min_sync_replicas}); {remedy}")

    def _in_sync_set(self, has_it: Callable[[_Follower], bool]) -> bool:
        if len(self.sync_set) < self.config.min_sync_replicas:
            return False
        for member in self.sync_set - {self.broker_id}:
            follower = self._followers.get(member)
            if follower is None or not has_it(follower):
                return False
        return True

    # -- the sync-state set --------------------------------------------------------------------

    def sync_set_change(self) -> frozenset[int] | None:
        """The sync-state set as it should be now, or None when it is right as it is."""
        now = lease_clock.now()
        lag_s = self.config.replica_lag_timeout_ms / 1000
        with self._cond:
            if not self._active:
                return None
            watermark = self._high_watermark if self.config.replication == "sync" else self._ends()
            lagging = {m for m in self.sync_set - {self.broker_id}
                       if m not in self._followers or now - self._followers[m].last_caught_up > lag_s}
            ready = {m for m, f in self._followers.items()
                     if m not in self.sync_set and self._open_streams[m] and now - f.last_caught_up < lag_s / 2
                     and all(f.ends.get(k, 0) >= end for k, end in watermark.items())}
            if not lagging and not ready:
                return None
            return (self.sync_set - lagging) | ready

    def admit(self, wanted: frozenset[int]) -> frozenset[int]:
        """Before ``wanted`` is written to ZooKeeper: its new members join the set here first, if
        they still hold the high watermark, so a send acknowledged from now on waits for them
        (the set in ZooKeeper, from which a new master is elected, never holds a member this
        master did not wait for). Returns ``wanted`` without the members that fell behind."""
        with self._cond:
            watermark = self._high_watermark if self.config.replication == "sync" else self._ends()
            admitted = {m for m in wanted - self.sync_set
                        if m in self._followers and all(self._followers[m].ends.get(k, 0) >= end
                                                        for k, end in watermark.items())}
            self.sync_set = self.sync_set | admitted
            return (wanted & self.sync_set) | admitted

    def promised_until(self, promise_s: float) -> float:
        """Until when (``lease_clock.now()``) no other member of the sync-state set can campaign:
        each promised so for ``promise_s`` after receiving an answer this master sent. Infinite
        for a set of this broker alone: no one else may campaign at all."""
        with self._cond:
            others = self.sync_set - {self.broker_id}
            if not others:
                return float("inf")
            return min(self._followers[m].promise_from + promise_s if m in self._followers else 0.0
                       for m in others)

    def set_sync_set(self, sync_set: frozenset[int]) -> None:
        with self._cond:
            if sync_set != self.sync_set:
                log.info("sync-state set of group %s: %s -> %s", self.config.broker_name, sorted(self.sync_set),
                         sorted(sync_set))
            self.sync_set = sync_set
            self._notify()

    def replica_status(self) -> list[pb.ReplicaStatus]:
        """Each slave as this master sees it: connected, in the set, how far behind."""
        now = lease_clock.now()
        ends = self._ends()
        with self._cond:
            return [pb.ReplicaStatus(
                broker_id=broker_id, connected=self._open_streams[broker_id] > 0,
                in_sync_set=broker_id in self.sync_set,
                behind_messages=sum(max(0, end - f.ends.get(key, 0)) for key, end in ends.items()),
                caught_up_ms_ago=round((now - f.last_caught_up) * 1000) if f.last_caught_up else -1)
                for broker_id, f in sorted(self._followers.items())]

    # -- serving fetches -----------------------------------------------------------------------

    def rpc_handler(self, guarded: Callable[[str, Callable], Callable] | None = None) -> grpc.GenericRpcHandler:
        """The ``Replication`` service; ``guarded(name, behaviour)``, under access control, wraps
        the stream in its authentication and authorization."""
        behaviour = self._replicate if guarded is None else guarded("Replicate", self._replicate)
        handler = grpc.stream_stream_rpc_method_handler(
            behaviour, request_deserializer=pb.ReplicaFetch.FromString,
            response_serializer=pb.ReplicaData.SerializeToString)
        return grpc.method_handlers_generic_handler("orderlymq.v1.Replication", {"Replicate": handler})

    async def _replicate(self, requests, context: grpc.aio.ServicerContext):
        stream = FetchStream(self)
        try:
            async for fetch in requests:
                try:
                    answer = await stream.answer(fetch)
                except Exception as exc:  # noqa: BLE001 - every failure must become a status
                    code, message, _ = to_status(exc)
                    await context.abort(code, message, trailing_metadata=status_metadata(exc))
                yield answer
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed ReplicaFetch")
        finally:
            stream.close()

    async def serve_fetch(self, fetch: pb.ReplicaFetch, sent_at: float | None,
                          stream: FetchStream) -> tuple[pb.ReplicaData, float]:
        """On the event loop: take what ``fetch`` acknowledges (``sent_at``: when its stream's previous
        answer was sent), then its answer and when that was sent.

        The answer waits on the loop for something to bring. A slave that keeps up asks for the few
        records each send adds: those are read right here, where a thread would cost every
        synchronous send two hand-offs between threads and a wake-up of the loop. An answer that
        may be heavy (a backlog, the committed offsets, the whole transaction table) is collected on
        a thread."""
        self._take_acknowledgement(fetch, sent_at, stream.moved)
        if fetch.handshake:
            return self._greet(fetch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FETCH_WAIT_S
        while True:
            with self._cond:
                self._check_term(fetch)
                seen = self._changes
            topics = self.service.store.topic_table()
            candidates = stream.candidates(topics)
            if self._heavy(fetch, stream, topics, candidates):
                answer, complete = await loop.run_in_executor(self._pool, self._collect, fetch, stream, topics,
                                                              candidates)
            else:
                answer, complete = self._collect(fetch, stream, topics, candidates)
            if _worth_sending(answer, fetch) or loop.time() >= deadline:
                return answer, self._sent(fetch, stream, topics, complete)
            await self._change_after(seen, deadline - loop.time())

    def _heavy(self, fetch: pb.ReplicaFetch, stream: FetchStream, topics: Mapping[str, int],
               candidates: set[QueueRef]) -> bool:
        """Whether answering ``fetch`` from ``candidates`` may take long enough to hold up the loop."""
        if fetch.offsets_version != self.offsets_version or not self.txn_log.holds(fetch.txn_seq):
            return True
        store, have, pending = self.service.store, stream.have, 0
        for topic, queue_id in candidates:
            if queue_id < topics.get(topic, 0):
                queue = store.queue(topic, queue_id)
                pending += queue.max_offset - max(have.get(queue_key(topic, queue_id), 0), queue.min_offset)
                if pending > LOOP_ANSWER_MESSAGES:
                    return True
        return False

    async def _change_after(self, seen: int, timeout_s: float) -> None:
        """Return once something slaves copy changed after change number ``seen``, this broker
        stopped or started being master, or ``timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        waiter = (future, threading.get_ident())
        with self._cond:
            if self._changes != seen:
                return
            self._change_waiters.append(waiter)
        timer = loop.call_later(max(timeout_s, 0), settle, future, None, None)
        try:
            await future
        finally:
            timer.cancel()
            with self._cond:
                if waiter in self._change_waiters:
                    self._change_waiters.remove(waiter)

    def _wake_change_waiters(self) -> None:
        """Under the lock: end every ``_change_after``."""
        for future, thread in self._change_waiters:
            _settle_from(future, thread, None)
        self._change_waiters = []

    def stream_opened(self, broker_id: int) -> None:
        with self._cond:
            self._open_streams[broker_id] += 1

    def stream_closed(self, broker_id: int) -> None:
        with self._cond:
            self._open_streams[broker_id] -= 1
            if not self._open_streams[broker_id]:
                del self._open_streams[broker_id]

    def _greet(self, fetch: pb.ReplicaFetch) -> tuple[pb.ReplicaData, float]:
        """The answer to a handshake, and when it was sent (at the latest: the slave's promise runs
        from its receipt)."""
        with self._cond:
            self._check_term(fetch)
            self._followers.setdefault(fetch.broker_id, _Follower())
            return (pb.ReplicaData(group_epoch=self.epoch, epoch_history=self.history.encoded(), delta_fetches=True),
                    lease_clock.now())

    def _check_term(self, fetch: pb.ReplicaFetch) -> None:
        """Under the lock: refuse a fetch while not master of the term it was made in."""
        if not self._active or fetch.group_epoch != self.epoch:
            raise self.not_master()

    def _sent(self, fetch: pb.ReplicaFetch, stream: FetchStream, topics: Mapping[str, int],
              complete: dict[str, int] | None) -> float:
        """The answer to ``fetch`` is made: what it promises the slave holds once it acknowledges
        it, and when it was sent (at the latest: the slave's promise runs from its receipt)."""
        stream.topics_sent = topics
        with self._cond:
            self._check_term(fetch)  # a step-down while it was made: the follower table may be gone
            follower = self._followers[fetch.broker_id]
            follower.promised, follower.promised_at = complete, (sent := lease_clock.now())
        return sent

    def _take_acknowledgement(self, fetch: pb.ReplicaFetch, received: float | None, moved: dict[str, int]) -> None:
        """On the event loop, as the fetch arrives: the sends it acknowledges are answered without
        waiting for its answer (one that this master's term does not accept is refused by
        ``serve_fetch``); ``received``: when the stream's previous answer, which ``fetch``
        acknowledges, was sent; ``moved``: the ends the fetch lists."""
        with self._cond:
            if self._active and fetch.group_epoch == self.epoch and not fetch.handshake:
                self._acknowledge(fetch, received, moved)

    def _acknowledge(self, fetch: pb.ReplicaFetch, received: float | None, moved: dict[str, int]) -> None:
        """Under the lock: record where the slave stands; wake the sends waiting for it."""
        follower = self._followers.setdefault(fetch.broker_id, _Follower())
        if received is not None:
            follower.promise_from = max(follower.promise_from, received)
        if fetch.delta:
            lost = any(end < follower.ends.get(key, 0) for key, end in moved.items())
            follower.ends.update(moved)
        else:
            lost = any(moved.get(key, 0) < end for key, end in follower.ends.items())
            follower.ends = dict(moved)
        if lost:
            follower.last_caught_up = 0.0  # it lost what it had (a wiped data dir): out of the set now
        follower.offsets_version = fetch.offsets_version
        follower.txn_seq = fetch.txn_seq
        promised = follower.promised
        if promised is not None and all(follower.ends.get(k, 0) >= end for k, end in promised.items()):
            follower.last_caught_up = follower.promised_at
        self._notify()

    def _ends(self) -> dict[str, int]:
        return keyed(self.service.store.ends())

    def _collect(self, fetch: pb.ReplicaFetch, stream: FetchStream, topics: Mapping[str, int],
                 candidates: set[QueueRef]) -> tuple[pb.ReplicaData, dict[str, int] | None]:
        """What follows the slave's copy in ``candidates``, the queues ``stream`` looks at, with the
        topic table ``topics`` unless the stream's previous answer carried it; and the ends of those
        queues when that is all of it (else None: the rest is left for the next answer)."""
        have = stream.have
        store = self.service.store
        answer = pb.ReplicaData(group_epoch=self.epoch)
        self._collect_txn_changes(fetch.txn_seq, answer)  # before the records: a commit's records come with it
        if fetch.topics_on_change and topics is stream.topics_sent:
            answer.topics_unchanged = True
        else:
            answer.topics.update(topics)
        ends, left, budget = {}, set(), MAX_RESPONSE_BYTES
        for topic, queue_id in sorted(candidates):
            if queue_id >= topics.get(topic, 0):
                continue  # its topic was deleted since its end moved
            queue = store.queue(topic, queue_id)
            key = queue_key(topic, queue_id)
            ends[key] = end = queue.max_offset
            # Behind what retention left: from the first offset (the slave starts its copy there).
            start = max(have.get(key, 0), queue.min_offset)
            if start >= end:
                continue
            if budget <= 0:
                left.add((topic, queue_id))
                continue
            frames, reached = queue.read_frames(start, budget)
            budget -= len(frames)
            if reached < end:
                left.add((topic, queue_id))
            answer.records.add(topic=topic, queue_id=queue_id, frames=frames)
        stream.left = left
        with self._cond:
            version = self.offsets_version
        if fetch.offsets_version != version:
            answer.offsets_version = version
            answer.offsets = json.dumps(self.service.offsets.snapshot()).encode()
        return answer, None if left else ends

    def _collect_txn_changes(self, seq: int, answer: pb.ReplicaData) -> None:
        changes = self.txn_log.since(seq)
        if changes is None:  # new to this term, or behind what the log holds: the whole table
            with self.txn_log.copying() as last:
                answer.txn_changes.extend(table_changes(self.service.txns))
            answer.txn_table, answer.txn_seq = True, last
            return
        answer.txn_changes.extend(changes)
        answer.txn_seq = seq + len(changes)

    def close(self) -> None:
        self.deactivate()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _worth_sending(answer: pb.ReplicaData, fetch: pb.ReplicaFetch) -> bool:
    """Whether ``answer`` brings the slave anything, so goes now rather than at the end of the wait."""
    return bool(answer.records or answer.offsets or answer.txn_seq != fetch.txn_seq)


def _settle_from(future: asyncio.Future, thread: int, error: BaseException | None) -> None:
    """Settle a future of the loop running on ``thread``: at once on that thread, else through the loop."""
    try:
        if threading.get_ident() == thread:
            settle(future, None, error)
        else:
            future.get_loop().call_soon_threadsafe(settle, future, None, error)
    except RuntimeError:  # the loop is closed: the broker is stopping, nobody awaits the answer
        pass


class FetchStream:
    """One slave's stream of fetches, over gRPC or the lean port: who it is, what it acknowledged,
    and where its copy of each queue ends.

    A slave's fetch lists the ends of all its queues, or (``delta``, once its master said it takes
    them) of those that moved since its previous fetch on the stream. The stream keeps the whole
    picture, and a watch of the queues whose end moved on this master: an answer looks at every
    queue after a whole fetch, and otherwise only at those that moved here, and those the previous
    answer left behind (cut short at ``MAX_RESPONSE_BYTES``). So a fetch costs what changed, not
    the number of queues the group holds.
    """

    def __init__(self, source: ReplicaSource) -> None:
        self._source = source
        self._follower_id: int | None = None
        # When this stream's last answer was sent: the next fetch on this stream (not on another of
        # the slave's, which may have replaced a half-open one) says it was received.
        self._sent_at: float | None = None
        self.have: dict[str, int] = {}  # where the slave's copy of each queue ends, as its fetches said
        self.moved: dict[str, int] = {}  # the ends the last fetch listed
        self.left: set[QueueRef] = set()  # queues the last answer did not bring up to the master's end
        self._watch: EndWatch | None = None
        self._rescan = False
        self.topics_sent: Mapping[str, int] | None = None  # the topic table of the last answer (Store.topic_table)

    async def answer(self, fetch: pb.ReplicaFetch) -> pb.ReplicaData:
        if self._follower_id is None:
            self._follower_id = fetch.broker_id
            self._source.stream_opened(self._follower_id)
        if not fetch.handshake:
            self._take_ends(fetch)
        answer, self._sent_at = await self._source.serve_fetch(fetch, self._sent_at, self)
        return answer

    def _take_ends(self, fetch: pb.ReplicaFetch) -> None:
        self.moved = {queue_key(p.topic, p.queue_id): p.offset for p in fetch.ends}
        if fetch.delta:
            if self._watch is None:
                raise InvalidRequestError("a ReplicaFetch listing moved ends only, before one listing every end")
            self.have.update(self.moved)
            return
        self.have = dict(self.moved)
        if self._watch is None:
            self._watch = self._source.service.store.watch_ends()
        self._watch.take()  # the whole look below sees every move up to now
        self._rescan = True

    def candidates(self, topics: Mapping[str, int]) -> set[QueueRef]:
        """The queues an answer looks at (see the class docstring)."""
        if self._rescan:
            self._rescan = False
            return {(topic, queue_id) for topic, count in topics.items() for queue_id in range(count)}
        return self._watch.take() | self.left if self._watch is not None else set()

    def close(self) -> None:
        if self._watch is not None:
            self._source.service.store.unwatch_ends(self._watch)
            self._watch = None
        if self._follower_id is not None:
            self._source.stream_closed(self._follower_id)
            self._follower_id = None
