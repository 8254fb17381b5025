"""What the orderly and the concurrent consumer share (RocketMQ's DefaultMQPushConsumer):
group membership by heartbeat, rebalance, the pull loop, offsets and sending messages back.

Threads of one consumer: a service thread (heartbeat, membership watch, rebalance, offset flush),
a pull thread (every assigned queue in turn; pulls never block the broker, so a consumer holds at
most one pull at a time), a pool of ``consume_threads`` running listeners, and a scheduler for
delayed work. The subclass decides how pulled messages are consumed.

Retention gaps are never skipped silently: when messages a queue should deliver next were removed
by retention (its committed offset, or its pull position, is below the queue's first stored
offset), the consumer builds a ``MessagesLostError`` naming the queue and the lost range. With
``on_data_loss=None`` (the default) that queue stops being consumed (its lock is kept, so no other
instance skips the gap either), the error is logged and listed in ``data_losses``. With an
``on_data_loss(error)`` callback, the consumer calls it and, when it returns, continues from the
first message kept; when it raises, the queue stops as without a callback.
"""

from __future__ import annotations

import abc
import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.wire import codec
from broker.wire.errors import (
    BrokerUnavailableError,
    FencedError,
    InvalidOptionError,
    MessagesLostError,
    NotMasterError,
    OffsetOutOfRangeError,
    OrderlyMQError,
    TopicNotFoundError,
)
from broker.wire.tags import parse_tag_expression
from connector.client.arrivals import ArrivalWait, by_broker, common_start
from connector.client.connection import BrokerConnection, Credentials, TlsOptions, pb
from connector.client.consume_pool import ConsumePool
from connector.client.messages import (
    PROPERTY_ORIGIN_OFFSET,
    PROPERTY_ORIGIN_QUEUE_ID,
    PROPERTY_ORIGIN_TOPIC,
    PROPERTY_RECONSUME_TIMES,
    Message,
    MessageQueue,
)
from connector.client.offset_store import LocalOffsetStore, RemoteOffsetStore, check_consume_from, start_offset
from connector.client.process_queue import ProcessQueue
from connector.client.producer import Producer
from connector.client.pull_consumer import default_client_id, found_empty_last, still_stored
from connector.client.pull_port import PullLink, PullLinkPool, PullPortFailure
from connector.client.rebalance import ALLOCATORS, AllocateStrategy
from connector.client.routed import RoutedConnection
from connector.client.scheduler import Scheduler

__all__ = ["BROADCASTING", "CLUSTERING", "PushConsumer", "dlq_topic", "retry_topic"]

log = logging.getLogger(__name__)

CLUSTERING = "clustering"
BROADCASTING = "broadcasting"
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_.|-]{1,100}$")
_RESTART_S = 0.5  # pause before running a failed loop again
_AWAIT_S = 10.0  # one wait on the brokers for the next message; a new assignment ends it at once


def dlq_topic(group: str) -> str:
    """The group's dead-letter topic: ``%DLQ%<group>``."""
    return f"%DLQ%{group}"


def retry_topic(group: str) -> str:
    """The group's retry topic (concurrent consumers): ``%RETRY%<group>``."""
    return f"%RETRY%{group}"


class PushConsumer(abc.ABC):
    """Base class; use ``OrderlyConsumer`` or ``ConcurrentConsumer``. Parameters are documented there."""

    orderly = False

    def __init__(
        self,
        brokers: str,
        group: str,
        listener: Callable | None = None,
        *,
        client_id: str | None = None,
        message_model: str = CLUSTERING,
        consume_from: str = "committed",
        consume_timestamp: int | None = None,
        allocate: str | AllocateStrategy = "averagely",
        rebalance_interval: float = 20.0,
        heartbeat_interval: float = 5.0,
        pull_batch_size: int = 128,
        consume_batch_size: int = 1,
        consume_threads: int = 4,
        pull_threshold_per_queue: int = 1000,
        max_reconsume_times: int = 16,
        idle_pull_ms: int = 200,
        offset_store_dir: str | Path | None = None,
        timeout: float = 10.0,
        retry_timeout: float = 30.0,
        on_data_loss: Callable[[MessagesLostError], None] | None = None,
        tls: TlsOptions | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        if not isinstance(group, str) or not _GROUP_NAME.match(group):
            raise InvalidOptionError(f"group must be 1-100 letters, digits, '_', '.', '|' or '-', got {group!r}")
        if message_model not in (CLUSTERING, BROADCASTING):
            raise InvalidOptionError(f"message_model must be 'clustering' or 'broadcasting', got {message_model!r}")
        check_consume_from(consume_from, consume_timestamp)
        if isinstance(allocate, str):
            if allocate not in ALLOCATORS:
                raise InvalidOptionError(f"allocate must be one of {', '.join(ALLOCATORS)} or a callable")
            allocate = ALLOCATORS[allocate]
        for name, value in (
            ("pull_batch_size", pull_batch_size),
            ("consume_batch_size", consume_batch_size),
            ("consume_threads", consume_threads),
            ("pull_threshold_per_queue", pull_threshold_per_queue),
        ):
            if not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
        self.connection = RoutedConnection(brokers, timeout=timeout, retry_timeout=retry_timeout, tls=tls,
                                           credentials=credentials)
        self.brokers = brokers
        self.group = group
        self.listener = listener
        # Broadcasting keeps offsets in a file named after the client id, so its default must be stable.
        stable = f"{socket.gethostname()}@DEFAULT" if message_model == BROADCASTING else None
        self.client_id = client_id or stable or default_client_id()
        self.message_model = message_model
        self.consume_from = consume_from
        self.consume_timestamp = consume_timestamp
        self.allocate = allocate
        self.rebalance_interval = rebalance_interval
        self.heartbeat_interval = heartbeat_interval
        self.pull_batch_size = pull_batch_size
        self.consume_batch_size = consume_batch_size
        self.consume_threads = consume_threads
        self.pull_threshold_per_queue = pull_threshold_per_queue
        self.max_reconsume_times = max_reconsume_times
        self.idle_pull = idle_pull_ms / 1000
        self._arrivals = ArrivalWait()
        self._pass_failed = False  # a pull of the pull loop's current pass failed
        if on_data_loss is not None and not callable(on_data_loss):
            raise InvalidOptionError(f"on_data_loss must be a callable(error) or None, got {on_data_loss!r}")
        self.on_data_loss = on_data_loss
        self._data_losses: list[MessagesLostError] = []
        self.offset_store_dir = Path(offset_store_dir) if offset_store_dir else Path.home() / ".orderlymq" / "offsets"
        self.routes = self.connection.routes
        self.subscriptions: dict[str, str] = {}
        self.table: dict[MessageQueue, ProcessQueue] = {}
        self._table_lock = threading.Lock()
        self._stop = threading.Event()
        self._rebalance_now = threading.Event()
        self._commit_wakeup = threading.Event()
        self._members: list[str] = []
        self._threads: list[threading.Thread] = []
        self._pool: ConsumePool | None = None
        self._scheduler: Scheduler | None = None
        self._producer: Producer | None = None
        self._producer_lock = threading.Lock()
        self._started = False
        self.store: RemoteOffsetStore | LocalOffsetStore

    @property
    def broadcasting(self) -> bool:
        return self.message_model == BROADCASTING

    @property
    def data_losses(self) -> list[MessagesLostError]:
        """Retention gaps that stopped a queue (not accepted by ``on_data_loss``), oldest first."""
        with self._table_lock:
            return list(self._data_losses)

    # -- configuration -------------------------------------------------------------------------

    def subscribe(self, topic: str, tag_expression: str = "*") -> None:
        """Consume ``topic``, only messages whose tag matches ``tag_expression`` (``"TagA || TagB"``)."""
        parse_tag_expression(tag_expression)
        if self._started:
            raise InvalidOptionError("subscribe before start()")
        self.subscriptions[topic] = tag_expression

    def register_listener(self, listener: Callable) -> None:
        """Set the listener (same as passing it to the constructor)."""
        self.listener = listener

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Join the group, take this instance's queues and start consuming.

        Raises ``TopicNotFoundError`` for a subscribed topic that does not exist, and
        ``BrokerUnavailableError`` when no broker answers within ``retry_timeout``.
        """
        if self._started:
            raise InvalidOptionError("consumer already started")
        if self.listener is None:
            raise InvalidOptionError("no listener: pass listener=... or call register_listener() before start()")
        if not self.subscriptions:
            raise InvalidOptionError("no subscription: call subscribe(topic) before start()")
        for topic in self.subscriptions:
            self.routes.queues(topic, refresh=True)
        if self.broadcasting:
            self.store = LocalOffsetStore(self.offset_store_dir / self.client_id, self.group)
        else:
            self.store = RemoteOffsetStore(self.connection, self.group, self.client_id)
        self._prepare()
        self._started = True
        self._pool = ConsumePool(self.consume_threads, f"orderlymq-consume-{self.group}")
        self._scheduler = Scheduler(f"orderlymq-scheduler-{self.group}")
        try:
            self._heartbeat()
            self._rebalance()
        except BaseException:
            self.shutdown()
            raise
        for name, target in self._thread_targets():
            thread = threading.Thread(target=self._run_surviving, args=(name, target),
                                      name=f"orderlymq-{name}-{self.group}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run_surviving(self, name: str, loop: Callable[[], None]) -> None:
        """Run one of the consumer's loops until shutdown. One that fails unexpectedly is logged and
        run again: its thread dying would stop what it does (pulling every queue held, renewing
        their locks, committing) without a word."""
        while not self._stop.is_set():
            try:
                loop()
                return
            except Exception:  # noqa: BLE001 - the loop must outlive any failure
                log.exception("consumer %s: its %s loop failed; running it again", self.client_id, name)
                self._stop.wait(_RESTART_S)

    @abc.abstractmethod
    def _prepare(self) -> None:
        """Subclass hook run by ``start`` before the first rebalance."""

    def _thread_targets(self) -> list[tuple[str, Callable[[], None]]]:
        return [("service", self._service_loop), ("pull", self._pull_loop), ("commit", self._commit_loop)]

    def shutdown(self) -> None:
        """Stop pulling, let in-flight listeners finish, commit offsets and release the queues."""
        if not self._started or self._stop.is_set():
            return
        self._stop.set()
        self._arrivals.close()
        for thread in self._threads:
            thread.join(timeout=30)
        with self._table_lock:
            pqs = list(self.table.values())
        for pq in pqs:
            pq.dropped = True
        if self._scheduler is not None:
            self._scheduler.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._release_all(pqs)
        try:
            self.store.flush()
        except OSError as exc:
            log.error("consumer %s could not save its offsets: %s", self.client_id, exc)
        if self._producer is not None:
            self._producer.close()
        self._leave_group()
        self.connection.close()

    def _leave_group(self) -> None:
        # Members that leave cleanly are dropped at once, so the others rebalance now rather than
        # after the broker's heartbeat timeout.
        try:
            self.connection.call("LeaveGroup", pb.LeaveGroupRequest(group=self.group, client_id=self.client_id),
                                 retry=False)
        except OrderlyMQError as exc:
            log.warning("consumer %s could not leave group %s: %s", self.client_id, self.group, exc)

    @abc.abstractmethod
    def _release_all(self, pqs: list[ProcessQueue]) -> None:
        """Subclass hook: release whatever the queues hold on the broker."""

    def __enter__(self) -> PushConsumer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def assignment(self) -> list[MessageQueue]:
        """The queues this instance consumes now."""
        with self._table_lock:
            return sorted(mq for mq, pq in self.table.items() if not pq.dropped and self._consumable(pq))

    def _consumable(self, pq: ProcessQueue) -> bool:
        return True

    # -- membership and rebalance --------------------------------------------------------------

    def _heartbeat(self) -> None:
        if self.broadcasting:
            return
        request = pb.HeartbeatRequest(group=self.group, client_id=self.client_id, topics=sorted(self.subscriptions))
        self.connection.call("Heartbeat", request)
        members = list(self.connection.call("ListConsumers", pb.ListConsumersRequest(group=self.group)).client_ids)
        if members != self._members:
            log.info("group %s members: %s", self.group, members)
            self._members = members
            self._rebalance_now.set()

    def _service_loop(self) -> None:
        next_rebalance = time.monotonic() + self.rebalance_interval
        next_heartbeat = time.monotonic() + self.heartbeat_interval
        while not self._stop.is_set():
            now = time.monotonic()
            self._rebalance_now.wait(max(0.0, min(next_rebalance, next_heartbeat) - now))
            if self._stop.is_set():
                return
            now = time.monotonic()
            try:
                if now >= next_heartbeat:
                    next_heartbeat = now + self.heartbeat_interval
                    self._heartbeat()
                if self._rebalance_now.is_set() or now >= next_rebalance:
                    self._rebalance_now.clear()
                    next_rebalance = now + self.rebalance_interval
                    self._rebalance()
                self.store.flush()
            except OrderlyMQError as exc:
                log.warning("consumer %s: %s", self.client_id, exc)
                self._stop.wait(min(1.0, self.heartbeat_interval))
            except Exception:  # noqa: BLE001 - the service thread must survive anything
                log.exception("consumer %s: service loop failed", self.client_id)
                self._stop.wait(min(1.0, self.heartbeat_interval))

    def _rebalance(self) -> None:
        for topic in list(self.subscriptions) + self._extra_topics():
            try:
                self._rebalance_topic(topic)
            except TopicNotFoundError as exc:
                log.error("consumer %s: %s; stopped consuming it", self.client_id, exc)
                with self._table_lock:
                    gone = [pq for mq, pq in self.table.items() if mq.topic == topic]
                for pq in gone:
                    pq.dropped = True
                    self._forget(pq)

    def _extra_topics(self) -> list[str]:
        return []

    def _rebalance_topic(self, topic: str) -> None:
        queues = self.routes.queues(topic, refresh=True)
        if self.broadcasting:
            allocated = set(queues)
        else:
            if self.client_id not in self._members:
                return  # our heartbeat has not registered yet: taking nothing would drop every queue
            allocated = set(self.allocate(queues, self._members, self.client_id))
        with self._table_lock:
            current = {mq: pq for mq, pq in self.table.items() if mq.topic == topic}
        for mq, pq in current.items():
            if mq not in allocated:
                pq.dropped = True
                if self._remove_unnecessary(pq):
                    self._forget(pq)
                    log.info("consumer %s released %s", self.client_id, mq)
            elif pq.dropped and self._discard(pq):
                self._forget(pq)
        for mq in sorted(allocated):
            with self._table_lock:
                if mq in self.table:
                    continue
            pq = self._create_process_queue(mq)
            if pq is not None:
                with self._table_lock:
                    self.table[mq] = pq
                self._arrivals.interrupt()  # the pull loop may be waiting on the queues held before
                log.info("consumer %s took %s from offset %d", self.client_id, mq, pq.next_offset)

    def _forget(self, pq: ProcessQueue) -> None:
        with self._table_lock:
            if self.table.get(pq.mq) is pq:
                del self.table[pq.mq]

    def _create_process_queue(self, mq: MessageQueue) -> ProcessQueue | None:
        return self._new_process_queue(mq)

    def _new_process_queue(self, mq: MessageQueue, epoch: int = 0) -> ProcessQueue:
        """A process queue at the start offset, or stopped at a retention gap not accepted."""
        try:
            return ProcessQueue(mq, self._start_offset(mq), epoch)
        except MessagesLostError as lost:
            pq = ProcessQueue(mq, lost.first_lost, epoch)
            self._stop_at_gap(pq, lost)
            return pq

    def _start_offset(self, mq: MessageQueue) -> int:
        """Where ``mq`` starts; ``MessagesLostError`` when retention removed messages after the
        committed offset and ``on_data_loss`` does not accept it."""
        committed = self.store.read(mq)
        offset = start_offset(self.connection, mq, committed, self.consume_from, self.consume_timestamp)
        if 0 <= committed < offset:  # the committed offset was clamped up to the first message kept
            refused = self._data_lost(mq, committed, offset)
            if refused is not None:
                raise refused
        return offset

    # -- retention gaps ------------------------------------------------------------------------

    def _data_lost(self, mq: MessageQueue, first_lost: int, first_kept: int) -> MessagesLostError | None:
        """Report ``[first_lost, first_kept)`` of ``mq`` as lost; None when ``on_data_loss`` accepted it."""
        error = MessagesLostError(
            f"retention removed {first_kept - first_lost} message(s) of {mq} (offsets {first_lost} to "
            f"{first_kept - 1}) before group {self.group!r} consumed them. Pass on_data_loss=callable to accept "
            f"such gaps and continue from the first message kept, or keep messages longer (retention_ms / "
            f"retention_bytes of the broker)",
            topic=mq.topic,
            queue_id=mq.queue_id,
            first_lost=first_lost,
            first_kept=first_kept,
        )
        if self.on_data_loss is None:
            return error
        try:
            self.on_data_loss(error)
        except Exception as exc:  # noqa: BLE001 - the handler's refusal stops the queue
            log.error("consumer %s: on_data_loss raised %r; not consuming %s any more", self.client_id, exc, mq)
            return error
        log.warning("consumer %s: %s (accepted by on_data_loss; continuing at %d)", self.client_id, error, first_kept)
        return None

    def _stop_at_gap(self, pq: ProcessQueue, error: MessagesLostError) -> None:
        pq.lost = error
        log.error("consumer %s stopped consuming %s: %s", self.client_id, pq.mq, error)
        with self._table_lock:
            known = {(e.topic, e.queue_id, e.first_lost) for e in self._data_losses}
            if (error.topic, error.queue_id, error.first_lost) not in known:
                self._data_losses.append(error)

    def _out_of_range(self, pq: ProcessQueue, exc: OffsetOutOfRangeError) -> None:
        """A pull refused for its offset: a retention gap when below the queue's first message."""
        try:
            lowest, highest, _ = self._query_offsets(pq.mq)
        except OrderlyMQError as err:
            log.warning("consumer %s: %s; cannot query %s: %s", self.client_id, exc, pq.mq, err)
            return
        if pq.next_offset < lowest:
            refused = self._data_lost(pq.mq, pq.next_offset, lowest)
            if refused is not None:
                self._stop_at_gap(pq, refused)
                return
            pq.next_offset = lowest
            if pq.idle():
                self._commit(pq, lowest)  # so a restart does not report the same gap again
            return
        pq.next_offset = min(pq.next_offset, highest)  # beyond the end (a recreated topic): go back to it
        log.warning("consumer %s: %s; moved %s to %d", self.client_id, exc, pq.mq, pq.next_offset)

    def _query_offsets(self, mq: MessageQueue, timestamp: int | None = None) -> tuple[int, int, int]:
        """(min, max, the first offset stored at or after ``timestamp`` when given)."""
        r = self.connection.call("QueryOffsets", pb.QueryOffsetsRequest(
            topic=mq.topic, queue_id=mq.queue_id, timestamp=timestamp or 0, has_timestamp=timestamp is not None))
        return r.min_offset, r.max_offset, r.offset_for_timestamp

    def _remove_unnecessary(self, pq: ProcessQueue) -> bool:
        """A queue rebalanced away: True once it may leave the table."""
        self._persist(pq)
        return True

    def _discard(self, pq: ProcessQueue) -> bool:
        """A queue still ours whose local state is stale (fenced): True once it may be recreated."""
        return True

    # -- offsets -------------------------------------------------------------------------------

    def _commit(self, pq: ProcessQueue, offset: int) -> None:
        """Commit ``offset`` for ``pq`` soon, on the committer thread (fenced by its epoch when
        locked); commits of a queue never go backwards and coalesce while one is on the wire."""
        if pq.stage_commit(offset):
            self._commit_wakeup.set()

    def _commit_loop(self) -> None:
        while not self._stop.is_set():
            self._commit_wakeup.wait(1.0)
            self._commit_wakeup.clear()
            with self._table_lock:
                pqs = list(self.table.values())
            for pq in pqs:
                if pq.pending_commit is not None and not pq.dropped and (pq.locked or not pq.epoch):
                    self._persist(pq)  # an orderly queue's commit waits for its lock (fenced without)

    def _persist(self, pq: ProcessQueue) -> bool:
        """Send ``pq``'s staged commit now; False when the broker fenced it (the commit stays staged
        for when the queue is locked again)."""
        with pq.commit_lock:
            offset = pq.pending_commit
            if offset is None:
                return True
            try:
                self.store.commit(pq.mq, offset, pq.epoch or None)
            except FencedError as exc:
                log.warning("consumer %s: the broker refused the commit of %s: %s", self.client_id, pq.mq, exc)
            except OrderlyMQError as exc:
                log.warning("consumer %s could not commit %s at %d (retrying): %s", self.client_id, pq.mq, offset, exc)
                return True
            else:
                pq.commit_done(offset)
                return True
        self._fenced(pq)  # fenced: outside the commit lock, as re-locking calls the broker
        return False

    def _fenced(self, pq: ProcessQueue) -> None:
        """The broker refused ``pq``'s lock epoch (on a pull or a commit): not consumed until locked again."""
        pq.locked = False

    # -- pulling -------------------------------------------------------------------------------

    def _pullable(self, pq: ProcessQueue) -> bool:
        return not pq.dropped and pq.lost is None and pq.count < self.pull_threshold_per_queue

    def _pull_request(self, pq: ProcessQueue) -> pb.PullRequest:
        return pb.PullRequest(
            topic=pq.mq.topic,
            queue_id=pq.mq.queue_id,
            offset=pq.next_offset,
            max_messages=self.pull_batch_size,
            tag_expression=self.subscriptions.get(pq.mq.topic, "*"),
        )

    def _pull_loop(self) -> None:
        idle, in_vain = 0.01, False
        links = PullLinkPool()
        try:
            while not self._stop.is_set():
                with self._table_lock:
                    held = list(self.table.values())
                pqs = [pq for pq in held if self._pullable(pq)]
                self._pass_failed = False
                # Queues found at their end wait their turn while others have messages; every queue
                # is pulled before waiting.
                fresh, recent = found_empty_last(pqs, lambda pq: pq.found_empty_at)
                got = self._pull_pass(links, fresh) or self._pull_pass(links, recent)
                if got:
                    idle, in_vain = 0.01, False
                    continue
                # Caught up on every queue held, wait on the brokers; with a queue held back (too many
                # messages buffered, dropped, lost), a pull that failed (its queue may have moved), or
                # a queue ready whose pass found nothing anyway, pause (a pass that moved nothing must
                # not be repeated at once).
                caught_up = len(pqs) == len(held) and not self._pass_failed and not in_vain
                ready = self._await_messages(pqs) if caught_up else None
                in_vain = bool(ready)
                if ready is None:
                    self._stop.wait(idle)
                    idle = min(idle * 2, self.idle_pull)
        finally:
            links.close()

    def _pull_pass(self, links: PullLinkPool, pqs: list[ProcessQueue]) -> bool:
        """One pull of each of ``pqs``, over each broker's lean port where it serves one; whether
        messages came."""
        got = False
        for broker, its_pqs in self._by_broker(pqs):
            link = links.lease(broker) if broker is not None else None
            if link is not None:
                got = self._pull_on_link(links, broker, link, its_pqs) or got
            else:
                got = self._pull_each(its_pqs) or got
        return got

    def _await_messages(self, pqs: list[ProcessQueue]) -> bool | None:
        """Caught up on every queue held: wait on the brokers for the next message (``ArrivalWait``);
        None when they cannot wait, or a queue stopped being pullable during the pass (dropped,
        lost): the loop pauses instead."""
        if not pqs or self._stop.is_set() or not all(self._pullable(pq) for pq in pqs):
            return None
        positions = [(broker, common_start(pq.boot_id for pq in its_pqs),
                      [(pq.mq.topic, pq.mq.queue_id, pq.next_offset) for pq in its_pqs])
                     for broker, its_pqs in self._by_broker(pqs)]
        return self._arrivals.wait(positions, _AWAIT_S)

    def _by_broker(self, pqs: list[ProcessQueue]) -> list[tuple[BrokerConnection | None, list[ProcessQueue]]]:
        """``pqs`` grouped by the broker that answers their pulls (None: a route that cannot be
        read now, pulled over gRPC, whose call says why)."""
        return by_broker(self.connection, pqs, lambda pq: (pq.mq.topic, pq.mq.queue_id))

    def _pull_on_link(self, links: PullLinkPool, broker: BrokerConnection, link: PullLink,
                      pqs: list[ProcessQueue]) -> bool:
        """One pull per queue over ``broker``'s lean port, all written before the first answer is
        read: one round trip for every queue, where gRPC makes one per queue, one after the other.
        Returns whether messages came.

        A failing link is closed and the queues it did not answer are pulled over gRPC (a pull is
        safe to repeat). So are they when the link reaches a group's slave (a failover, or a first
        address that is a slave): gRPC's connection finds the master, and the next pass opens a
        link there."""
        got, answered = False, 0
        try:
            for pq in pqs:
                link.issue(self._pull_request(pq))
            for pq in pqs:
                try:
                    response = link.receive()
                except NotMasterError:
                    log.info("consumer %s: %s no longer masters its group; pulling over gRPC", self.client_id,
                             broker.address)
                    links.discard(broker, link)
                    return self._pull_each(pqs[answered:]) or got
                except OrderlyMQError as exc:  # what the broker answered (a PullPortFailure is not one)
                    answered += 1
                    if not self._pull_failed(pq, exc):  # the broker is unavailable: read past the rest
                        for _ in pqs[answered:]:
                            link.skip()
                        break
                    continue
                answered += 1
                got = self._pulled(pq, response) or got
        except PullPortFailure as exc:
            log.warning("consumer %s: pulling over the lean port of %s failed (%s); pulling over gRPC",
                        self.client_id, broker.address, exc)
            links.discard(broker, link)
            return self._pull_each(pqs[answered:]) or got
        links.give_back(broker, link)
        return got

    def _pull_each(self, pqs: list[ProcessQueue]) -> bool:
        """One pull per queue over gRPC, one after the other; whether messages came."""
        got = False
        for pq in pqs:
            if self._stop.is_set() or not self._pullable(pq):
                continue
            try:
                response = self.connection.call("Pull", self._pull_request(pq), retry=False)
            except OrderlyMQError as exc:
                if not self._pull_failed(pq, exc):
                    break
                continue
            got = self._pulled(pq, response) or got
        return got

    def _pull_failed(self, pq: ProcessQueue, exc: OrderlyMQError) -> bool:
        """Handle a failed pull of ``pq``; False when the broker is unavailable (stop this pass)."""
        self._pass_failed = True
        if isinstance(exc, FencedError):
            log.warning("consumer %s fenced on %s: %s", self.client_id, pq.mq, exc)
            self._fenced(pq)
        elif isinstance(exc, OffsetOutOfRangeError):
            self._out_of_range(pq, exc)
        elif isinstance(exc, BrokerUnavailableError):
            log.warning("consumer %s: %s", self.client_id, exc)
            self._stop.wait(0.5)
            return False
        else:
            log.error("consumer %s cannot pull %s: %s", self.client_id, pq.mq, exc)
        return True

    def _pulled(self, pq: ProcessQueue, response) -> bool:
        """Hand a pull's messages to the consume pool; whether there were any."""
        if pq.dropped or not self._reads_on(pq, response.boot_id):
            return False
        messages = Message.from_table(codec.decode_many(response.batches), pq.mq.topic, pq.mq.queue_id)
        previous, pq.next_offset = pq.next_offset, response.next_offset
        if messages:
            pq.last_pulled, pq.found_empty_at = messages[-1], 0.0
            self._dispatch(pq, messages)
            return True
        if response.next_offset == previous:
            pq.found_empty_at = time.monotonic()
        elif response.next_offset > previous and pq.idle():
            self._commit(pq, response.next_offset)  # everything up to here was filtered out by tag
        return False

    def _reads_on(self, pq: ProcessQueue, boot_id: int) -> bool:
        """Whether ``pq`` reads on after a pull answered by ``boot_id``. Answered by another start of
        the broker than the last pull, the log may have lost its tail meanwhile (a power cut with
        flush = "async") and stored other messages at those offsets: unless the last message
        pulled is still there, ``pq`` starts over from where the log was cut (or from the group's
        offset when lower; what was consumed past it is consumed again) rather than skip them."""
        previous, pq.boot_id = pq.boot_id, boot_id
        last = pq.last_pulled
        if not previous or previous == boot_id or last is None:
            return True
        try:
            if still_stored(self.connection, last):
                return True
            cut = self._query_offsets(pq.mq, last.store_timestamp + 1)[2]
            with pq.commit_lock:  # after a commit of the old position in flight, never before
                pq.dropped = True
                if self.store.read(pq.mq) > cut:
                    self.store.commit(pq.mq, cut)
        except OrderlyMQError as exc:
            log.warning("consumer %s: the broker restarted; cannot check what %s holds now (%s), starting it over "
                        "from the group's offset", self.client_id, pq.mq, exc)
            pq.dropped = True
        else:
            log.warning("consumer %s: %s lost its log's tail from offset %d on (a power cut): starting it over "
                        "there", self.client_id, pq.mq, cut)
        self._rebalance_now.set()
        return False

    @abc.abstractmethod
    def _dispatch(self, pq: ProcessQueue, messages: list[Message]) -> None:
        """Hand freshly pulled messages of ``pq`` to the consume pool."""

    # -- sending back --------------------------------------------------------------------------

    def _send_back(self, topic: str, message: Message, extra: dict[str, str] | None = None) -> bool:
        """Send a copy of ``message`` to ``topic`` (queue 0) with its origin; False when that failed."""
        with self._producer_lock:
            if self._producer is None:
                self._producer = Producer(
                    self.brokers,
                    producer_group=f"{self.group}-sendback",
                    timeout=self.connection.timeout,
                    retry_timeout=self.connection.retry_timeout,
                    tls=self.connection.tls,
                    credentials=self.connection.credentials,
                )
        props = dict(message.properties)
        props.setdefault(PROPERTY_ORIGIN_TOPIC, message.topic)
        props.setdefault(PROPERTY_ORIGIN_QUEUE_ID, str(message.queue_id))
        props.setdefault(PROPERTY_ORIGIN_OFFSET, str(message.queue_offset))
        props[PROPERTY_RECONSUME_TIMES] = str(message.reconsume_times)
        props.update(extra or {})
        try:
            key: Any = message.key
            self._producer.send(topic, message.body, key=key, tag=message.tag, properties=props, queue_id=0)
            return True
        except OrderlyMQError as exc:
            log.error(
                "consumer %s could not send %s@%s to %s: %s",
                self.client_id,
                message.queue_offset,
                message.queue,
                topic,
                exc,
            )
            return False

    def _ensure_topic(self, topic: str) -> None:
        request = pb.CreateTopicRequest(topic=topic, queue_count=1, if_not_exists=True)
        self.connection.call("CreateTopic", request)

    def _max_reconsume_reached(self, message: Message) -> bool:
        return 0 <= self.max_reconsume_times <= message.reconsume_times
