"""The orderly consumer: RocketMQ's ``MessageListenerOrderly``, clustering or broadcasting.

In clustering mode each queue of a subscribed topic is consumed by one instance of the group at a
time, in queue order:

- rebalance (every ``rebalance_interval`` and when the member list changes) allocates the queues
  averagely over the sorted client ids; a newly allocated queue is locked on the broker before it
  is pulled, and skipped until a later rebalance when the lock is refused;
- every ``lock_interval`` all held queues are locked again (renewal); a queue whose lock was not
  renewed within ``lock_max_live`` is not consumed, and one whose fencing epoch changed meanwhile
  (its lease lapsed, or the broker restarted) goes on where it was when nobody committed past what
  this instance consumed and the queue still holds the last message it pulled, else starts over
  from the committed offset (``_relocked``);
- one thread at a time consumes a queue (``ProcessQueue.local_lock``), holding
  ``ProcessQueue.consume_lock`` while the listener runs; a queue rebalanced away is committed and
  unlocked only after that lock is free, the unlock delayed by ``unlock_delay`` while pulled
  messages remain (the seeds' ``unlockDelay``);
- offsets are committed, fenced by the lock epoch, as consumption succeeds and on shutdown.

A listener returning ``SUSPEND_CURRENT_QUEUE_A_MOMENT`` (or raising) gets the same messages again
after ``suspend_ms``, and nothing after them is consumed meanwhile; after ``max_reconsume_times``
suspensions they go to the group's dead-letter topic ``%DLQ%<group>`` and consumption moves on.

Example
-------
>>> def listener(messages, context):                                        # doctest: +SKIP
...     for m in messages:
...         print(m.key, m.queue_offset, m.text)
...     return ConsumeOrderlyStatus.SUCCESS
>>> consumer = OrderlyConsumer("127.0.0.1:9876", "order-service", listener)  # doctest: +SKIP
>>> consumer.subscribe("orders", "TagA || TagC")                            # doctest: +SKIP
>>> consumer.start()                                                        # doctest: +SKIP
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from broker.wire import codec
from broker.wire.errors import OrderlyMQError
from connector.client.connection import pb
from connector.client.listener import ConsumeOrderlyContext, ConsumeOrderlyStatus
from connector.client.messages import Message, MessageQueue, same_stored
from connector.client.process_queue import ProcessQueue
from connector.client.push_consumer import PushConsumer, dlq_topic

__all__ = ["OrderlyConsumer"]

log = logging.getLogger(__name__)

_SLICE_SECONDS = 1.0  # a queue yields its consume thread after this long, so others get a turn


class OrderlyConsumer(PushConsumer):
    """Consume subscribed topics in queue order, one instance of the group per queue.

    Parameters
    ----------
    brokers : str
        ``"host:port[,host:port]"``.
    group : str
        Consumer group: instances sharing the queues and the committed offsets.
    listener : callable
        ``listener(messages, context) -> ConsumeOrderlyStatus`` (see ``connector.client.listener``).
    client_id : str, optional
        This instance's id (default: host, pid and a random suffix).
    message_model : {"clustering", "broadcasting"}
        Clustering shares the queues; broadcasting gives every instance every queue, with offsets in
        a local file under ``offset_store_dir`` (default ``~/.orderlymq/offsets``).
    consume_from : {"committed", "earliest", "latest", "timestamp"}
        Where a queue without a committed offset starts (committed offsets always win).
    consume_timestamp : int, optional
        ms since the epoch, for ``consume_from="timestamp"``.
    auto_commit : bool
        Commit after each ``SUCCESS``; when False the listener returns ``COMMIT`` / ``ROLLBACK``.
    suspend_ms : int
        Default pause of a queue after ``SUSPEND_CURRENT_QUEUE_A_MOMENT``.
    max_reconsume_times : int
        Suspensions of a message before it goes to ``%DLQ%<group>``; -1 retries forever.
    rebalance_interval, heartbeat_interval, lock_interval : float
        Seconds between rebalances, heartbeats, lock renewals (20, 5, 20).
    lock_max_live : float
        Seconds after the last successful lock that a queue may still be consumed (30; keep it
        below the broker's lease).
    unlock_delay : float
        Seconds an unlock of a queue rebalanced away waits while pulled messages remain (20).
    pull_batch_size, consume_batch_size, consume_threads, pull_threshold_per_queue : int
        Messages per pull (128), messages per listener call (1), listener threads, buffered messages
        per queue (1000). RocketMQ pulls 32 at a time; here a pull costs the broker about a
        millisecond whatever its size, and 32 at a time cut a backlog's consumption by more than half.
    idle_pull_ms : int
        Caught up on every queue it holds, the consumer waits on the brokers for the next message
        (``AwaitMessages``) and pulls as soon as one arrives; where they cannot wait (a broker of a
        version without it), it pauses between pulls instead, from 10 ms doubling up to this (200).
    timeout, retry_timeout : float
        Seconds per RPC attempt, and how long an unreachable broker is retried.
    on_data_loss : callable, optional
        ``on_data_loss(error)`` with a ``MessagesLostError`` (``topic``, ``queue_id``, ``first_lost``,
        ``first_kept``, ``lost``) when retention removed messages of a queue before they were
        consumed; when it returns, the queue continues at ``first_kept``. Without it (default) such a
        queue stops being consumed, and the error is logged and listed in ``data_losses``.
    tls, credentials : TlsOptions, Credentials, optional
        TLS to the broker, and the access key / secret of a broker with access control
        (docs/security.md); credentials default to ORDERLYMQ_ACCESS_KEY / ORDERLYMQ_SECRET_KEY.
    """

    orderly = True

    def __init__(
        self,
        brokers: str,
        group: str,
        listener: Callable | None = None,
        *,
        auto_commit: bool = True,
        suspend_ms: int = 1000,
        lock_interval: float = 20.0,
        lock_max_live: float = 30.0,
        unlock_delay: float = 20.0,
        **options,
    ) -> None:
        super().__init__(brokers, group, listener, **options)
        self.auto_commit = auto_commit
        self.suspend_ms = suspend_ms
        self.lock_interval = lock_interval
        self.lock_max_live = lock_max_live
        self.unlock_delay = unlock_delay
        self._relock_lock = threading.Lock()

    @property
    def clustering(self) -> bool:
        return not self.broadcasting

    def _prepare(self) -> None:
        if self.max_reconsume_times >= 0:
            self._ensure_topic(dlq_topic(self.group))

    def _thread_targets(self):
        targets = super()._thread_targets()
        if self.clustering:
            targets.append(("lock", self._lock_loop))
        return targets

    def _consumable(self, pq: ProcessQueue) -> bool:
        return self.broadcasting or (pq.locked and not pq.lock_expired(self.lock_max_live))

    def _pullable(self, pq: ProcessQueue) -> bool:
        return super()._pullable(pq) and (self.broadcasting or pq.locked)

    def _pull_request(self, pq: ProcessQueue) -> pb.PullRequest:
        request = super()._pull_request(pq)
        if self.clustering:
            request.group, request.client_id, request.epoch = self.group, self.client_id, pq.epoch
        return request

    # -- broker locks --------------------------------------------------------------------------

    def _lock(self, topic: str, queue_ids: list[int]) -> dict[int, int]:
        request = pb.LockBatchRequest(group=self.group, client_id=self.client_id, topic=topic, queue_ids=queue_ids)
        return {lk.queue_id: lk.epoch for lk in self.connection.call("LockBatch", request).locked}

    def _unlock(self, mq: MessageQueue) -> None:
        request = pb.UnlockBatchRequest(
            group=self.group, client_id=self.client_id, topic=mq.topic, queue_ids=[mq.queue_id]
        )
        self.connection.call("UnlockBatch", request)

    def _create_process_queue(self, mq: MessageQueue) -> ProcessQueue | None:
        if self.broadcasting:
            return super()._create_process_queue(mq)
        epoch = self._lock(mq.topic, [mq.queue_id]).get(mq.queue_id)
        if epoch is None:
            log.info("consumer %s: %s is locked by another client; will retry", self.client_id, mq)
            return None
        return self._new_process_queue(mq, epoch)

    def _lock_loop(self) -> None:
        while not self._stop.wait(self.lock_interval):
            try:
                self.lock_all()
            except OrderlyMQError as exc:
                log.warning("consumer %s could not renew its locks: %s", self.client_id, exc)

    def lock_all(self) -> None:
        """Renew the broker locks of every held queue (run every ``lock_interval``)."""
        with self._table_lock:
            by_topic: dict[str, list[ProcessQueue]] = defaultdict(list)
            for pq in self.table.values():
                if not pq.dropped:
                    by_topic[pq.mq.topic].append(pq)
        for topic, pqs in by_topic.items():
            held = self._lock(topic, [pq.mq.queue_id for pq in pqs])
            for pq in pqs:
                epoch = held.get(pq.mq.queue_id)
                if epoch is None:
                    if pq.locked:
                        log.warning("consumer %s could not renew the lock of %s", self.client_id, pq.mq)
                    pq.locked = False
                elif epoch != pq.epoch:
                    self._relocked(pq, epoch)
                else:
                    pq.mark_locked(epoch)

    def _try_lock_now(self, pq: ProcessQueue) -> bool:
        try:
            epoch = self._lock(pq.mq.topic, [pq.mq.queue_id]).get(pq.mq.queue_id)
        except OrderlyMQError:
            return False
        if epoch is None:
            pq.locked = False
            return False
        if epoch != pq.epoch:
            return self._relocked(pq, epoch)
        pq.mark_locked(epoch)
        return True

    def _fenced(self, pq: ProcessQueue) -> None:
        """Lock ``pq`` again now rather than at the next renewal: after a broker restart every
        consumer's pulls and commits are fenced until then."""
        pq.locked = False
        if not pq.dropped:
            self._try_lock_now(pq)

    def _relocked(self, pq: ProcessQueue, epoch: int) -> bool:
        """``pq``'s lock was granted again at a new ``epoch`` (its lease lapsed, or the broker
        restarted, which fences every holder): go on where it is when that is safe, else start it over
        from the committed offset. Returns whether it goes on."""
        with self._relock_lock:  # the lock thread and a consume thread may both get the new epoch
            if epoch == pq.epoch:
                pq.mark_locked(epoch)
                return True
            if not pq.dropped and self._may_go_on(pq, epoch):
                log.info("consumer %s re-locked %s at a new epoch; nothing was consumed past it meanwhile, "
                         "going on at offset %d", self.client_id, pq.mq, pq.next_offset)
                pq.mark_locked(epoch)
                self._commit_wakeup.set()  # what it consumed while the lock was away
                return True
            log.warning("consumer %s re-locked %s at a new epoch; restarting it from the committed offset",
                        self.client_id, pq.mq)
            pq.locked = False
            pq.dropped = True
            self._rebalance_now.set()
            return False

    def _may_go_on(self, pq: ProcessQueue, epoch: int) -> bool:
        """Whether ``pq`` may go on at ``epoch`` rather than start over: without the lock another
        instance may have consumed and committed, and a broker restarted after a power cut may
        have lost its log's tail and stored other messages at those offsets. It may when the
        group's committed offset is not past what ``pq`` consumed (committing that moves it
        forward; what another instance consumed meanwhile it consumed again, as a restart would)
        and the last message ``pq`` pulled is still the one at its offset (a log is only ever cut
        back from its tail, so everything before it is too)."""
        last, consumed = pq.last_pulled, pq.consumed_offset()
        if last is None or consumed < 0:  # nothing consumed: starting over redelivers nothing
            return False
        request = self._pull_request(pq)
        request.offset, request.max_messages, request.epoch = last.queue_offset, 1, epoch
        try:
            committed = self.store.read(pq.mq)
            response = self.connection.call("Pull", request, retry=False)
        except OrderlyMQError as exc:
            log.warning("consumer %s could not check %s after re-locking it: %s", self.client_id, pq.mq, exc)
            return False
        found = Message.from_table(codec.decode_many(response.batches), pq.mq.topic, pq.mq.queue_id)
        return committed <= consumed and bool(found) and same_stored(found[0], last)

    def _remove_unnecessary(self, pq: ProcessQueue) -> bool:
        if self.broadcasting:
            return super()._remove_unnecessary(pq)
        if not pq.consume_lock.acquire(timeout=min(1.0, self.lock_interval)):
            return False  # a listener is running: try again at the next rebalance
        try:
            self._persist(pq)
            if pq.has_temp_message() and self.unlock_delay > 0:
                assert self._scheduler is not None
                self._scheduler.call_later(self.unlock_delay, lambda: self._delayed_unlock(pq))
            else:
                self._unlock_quietly(pq.mq)
            return True
        finally:
            pq.consume_lock.release()

    def _delayed_unlock(self, pq: ProcessQueue) -> None:
        with self._table_lock:
            current = self.table.get(pq.mq)
        if current is None or current.dropped:
            self._unlock_quietly(pq.mq)

    def _unlock_quietly(self, mq: MessageQueue) -> None:
        try:
            self._unlock(mq)
        except OrderlyMQError as exc:
            log.warning("consumer %s could not unlock %s (its lease will expire): %s", self.client_id, mq, exc)

    def _discard(self, pq: ProcessQueue) -> bool:
        if not pq.consume_lock.acquire(timeout=min(1.0, self.lock_interval)):
            return False
        pq.consume_lock.release()
        return True

    def _release_all(self, pqs: list[ProcessQueue]) -> None:
        for pq in pqs:
            with pq.consume_lock:
                self._persist(pq)
        if self.clustering:
            by_topic: dict[str, list[int]] = defaultdict(list)
            for pq in pqs:
                by_topic[pq.mq.topic].append(pq.mq.queue_id)
            for topic, ids in by_topic.items():
                request = pb.UnlockBatchRequest(group=self.group, client_id=self.client_id, topic=topic, queue_ids=ids)
                try:
                    self.connection.call("UnlockBatch", request, retry=False)
                except OrderlyMQError as exc:
                    log.warning("consumer %s could not unlock %s (leases will expire): %s", self.client_id, topic, exc)

    # -- consuming -----------------------------------------------------------------------------

    def _dispatch(self, pq: ProcessQueue, messages: list[Message]) -> None:
        pq.put(messages)
        self._submit(pq)

    def _submit(self, pq: ProcessQueue, delay: float = 0.0) -> None:
        if self._stop.is_set() or pq.dropped:
            return
        if delay > 0:
            assert self._scheduler is not None
            self._scheduler.call_later(delay, lambda: self._submit(pq))
            return
        if not pq.try_schedule():
            return
        try:
            assert self._pool is not None
            self._pool.submit(self._consume_request, pq)
        except RuntimeError:  # the pool is shutting down
            pq.unschedule()

    def _consume_request(self, pq: ProcessQueue) -> None:
        retry_in = 0.0
        try:
            with pq.local_lock:
                retry_in = self._consume_queue(pq)
        except Exception:  # noqa: BLE001 - a consume thread must survive anything
            log.exception("consumer %s: consuming %s failed", self.client_id, pq.mq)
            retry_in = self.suspend_ms / 1000
        finally:
            pq.unschedule()
        if retry_in > 0:
            self._submit(pq, retry_in)
        elif pq.has_temp_message():
            self._submit(pq)

    def _consume_queue(self, pq: ProcessQueue) -> float:
        """Consume ``pq`` until empty, suspended or out of time; seconds until a retry is due (0: none)."""
        deadline = time.monotonic() + _SLICE_SECONDS
        while time.monotonic() < deadline:
            if pq.dropped or self._stop.is_set():
                return 0.0
            wait = pq.suspended_until - time.monotonic()
            if wait > 0:
                return wait
            if self.clustering and not self._consumable(pq) and not self._try_lock_now(pq):
                return 0.0 if pq.dropped else min(1.0, self.lock_interval)
            messages = pq.take(self.consume_batch_size)
            if not messages:
                return 0.0
            with pq.consume_lock:
                if pq.dropped:
                    return 0.0
                context = ConsumeOrderlyContext(pq.mq, self.auto_commit, self.suspend_ms)
                status = self._call_listener(messages, context)
                go_on = self._process_result(pq, messages, status, context)
            if not go_on:
                return pq.suspended_until - time.monotonic()
        return 0.0

    def _call_listener(self, messages: list[Message], context: ConsumeOrderlyContext) -> ConsumeOrderlyStatus:
        try:
            status = self.listener(messages, context)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - a failing listener suspends the queue, as in the seeds
            log.exception(
                "listener of %s failed at offset %d; suspending the queue",
                context.message_queue,
                messages[0].queue_offset,
            )
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        if status is None:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        if not isinstance(status, ConsumeOrderlyStatus):
            log.error("listener returned %r, not a ConsumeOrderlyStatus; suspending the queue", status)
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return status

    def _process_result(
        self, pq: ProcessQueue, messages: list[Message], status: ConsumeOrderlyStatus, context: ConsumeOrderlyContext
    ) -> bool:
        """Apply a listener's answer; False when the queue is suspended."""
        S = ConsumeOrderlyStatus
        if context.auto_commit:
            if status in (S.SUCCESS, S.COMMIT):
                return self._commit_consumed(pq)
            return self._suspend(pq, messages, context)
        if status == S.SUCCESS:
            return True
        if status == S.COMMIT:
            return self._commit_consumed(pq)
        if status == S.ROLLBACK:
            pq.rollback()
            pq.suspended_until = time.monotonic() + context.suspend_ms / 1000
            return False
        return self._suspend(pq, messages, context)

    def _commit_consumed(self, pq: ProcessQueue) -> bool:
        offset = pq.commit()
        if offset is not None:
            self._commit(pq, offset)
        return True

    def _suspend(self, pq: ProcessQueue, messages: list[Message], context: ConsumeOrderlyContext) -> bool:
        """Send messages past ``max_reconsume_times`` to the DLQ; consume the others again later."""
        again = []
        for m in messages:
            if self._max_reconsume_reached(m) and self._send_back(dlq_topic(self.group), m):
                log.warning(
                    "%s@%d went to %s after %d attempts",
                    pq.mq,
                    m.queue_offset,
                    dlq_topic(self.group),
                    m.reconsume_times + 1,
                )
                continue
            again.append(m)
        if not again:
            return self._commit_consumed(pq) if context.auto_commit else True
        pq.consume_again(again)
        pq.suspended_until = time.monotonic() + context.suspend_ms / 1000
        return False
