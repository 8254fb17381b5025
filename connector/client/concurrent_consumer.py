"""The concurrent consumer: RocketMQ's ``MessageListenerConcurrently``. No order, no queue locks.

Pulled messages are consumed in parallel on ``consume_threads`` threads, ``consume_batch_size``
at a time. A queue's committed offset is the lowest offset still being consumed, so a crash
replays at most the messages in flight. A listener returning ``RECONSUME_LATER`` (or raising) has
its messages sent to the group's retry topic ``%RETRY%<group>`` (consumed by the same group, each
message after ``retry_delay_ms``); after ``max_reconsume_times`` they go to ``%DLQ%<group>``. In
broadcasting mode, and when sending back fails, messages are retried locally after the delay.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

from connector.client.listener import ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus
from connector.client.messages import PROPERTY_ORIGIN_TOPIC, PROPERTY_RETRY_AT, PROPERTY_RETRY_DELAY_MS, Message
from connector.client.process_queue import ProcessQueue
from connector.client.push_consumer import PushConsumer, dlq_topic, retry_topic

__all__ = ["ConcurrentConsumer"]

log = logging.getLogger(__name__)


class ConcurrentConsumer(PushConsumer):
    """Consume subscribed topics in parallel, without per-queue order.

    Parameters are those of ``OrderlyConsumer`` except ``auto_commit``, ``suspend_ms`` and the lock
    settings, plus:

    retry_delay_ms : int
        How long a message waits before it is consumed again after ``RECONSUME_LATER`` (10 s).
    """

    def __init__(
        self,
        brokers: str,
        group: str,
        listener: Callable | None = None,
        *,
        retry_delay_ms: int = 10_000,
        **options,
    ) -> None:
        super().__init__(brokers, group, listener, **options)
        self.retry_delay_ms = retry_delay_ms

    def _prepare(self) -> None:
        if self.max_reconsume_times >= 0:
            self._ensure_topic(dlq_topic(self.group))
        if not self.broadcasting:
            self._ensure_topic(retry_topic(self.group))

    def _extra_topics(self) -> list[str]:
        return [] if self.broadcasting else [retry_topic(self.group)]

    def _release_all(self, pqs: list[ProcessQueue]) -> None:
        for pq in pqs:
            self._persist(pq)

    # -- consuming -----------------------------------------------------------------------------

    def _dispatch(self, pq: ProcessQueue, messages: list[Message]) -> None:
        pq.put_outstanding(messages)
        now_ms = time.time() * 1000
        for start in range(0, len(messages), self.consume_batch_size):
            batch = messages[start : start + self.consume_batch_size]
            self._submit(pq, batch, max((self._wait_ms(m, now_ms) for m in batch), default=0.0) / 1000)

    def _wait_ms(self, message: Message, now_ms: float) -> float:
        """How long a message sent back waits before it is consumed again: until its ``RETRY_AT``,
        a time on the clock of the process that sent it back, but never longer than the delay it
        was sent back with (or, sent back by a version that did not record it, ``retry_delay_ms``),
        so that a clock set back, or another machine's clock ahead of this one, cannot hold it for
        longer."""
        properties = message.properties
        try:
            due_ms = float(properties.get(PROPERTY_RETRY_AT) or 0)
            longest = float(properties.get(PROPERTY_RETRY_DELAY_MS) or self.retry_delay_ms)
        except ValueError:
            log.warning("message %s/%d has a malformed %s or %s property; consuming it now", message.topic,
                        message.queue_offset, PROPERTY_RETRY_AT, PROPERTY_RETRY_DELAY_MS)
            return 0.0
        return min(max(0.0, due_ms - now_ms), max(0.0, longest))

    def _submit(self, pq: ProcessQueue, batch: list[Message], delay: float = 0.0) -> None:
        if self._stop.is_set() or pq.dropped:
            return
        if delay > 0:
            assert self._scheduler is not None
            self._scheduler.call_later(delay, lambda: self._submit(pq, batch))
            return
        try:
            assert self._pool is not None
            self._pool.submit(self._consume, pq, batch)
        except RuntimeError:
            return  # shutting down: the offset stays before these messages

    @staticmethod
    def _as_delivered(message: Message) -> Message:
        """Messages from the retry topic are shown with their original topic, as in the seeds."""
        origin = message.properties.get(PROPERTY_ORIGIN_TOPIC)
        return dataclasses.replace(message, topic=origin) if origin else message

    def _consume(self, pq: ProcessQueue, batch: list[Message]) -> None:
        if pq.dropped or self._stop.is_set():
            return
        context = ConsumeConcurrentlyContext(pq.mq, self.retry_delay_ms)
        delivered = [self._as_delivered(m) for m in batch]
        try:
            status = self.listener(delivered, context)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - a failing listener means "later", as in the seeds
            log.exception("listener of %s failed at offset %d; retrying later", pq.mq, batch[0].queue_offset)
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        if not isinstance(status, ConsumeConcurrentlyStatus):
            if status is not None:
                log.error("listener returned %r, not a ConsumeConcurrentlyStatus; retrying later", status)
            status = ConsumeConcurrentlyStatus.RECONSUME_LATER
        retry_locally: list[Message] = []
        if status == ConsumeConcurrentlyStatus.RECONSUME_LATER:
            retry_locally = self._send_back_all(batch, context.retry_delay_ms)
        later = {id(m) for m in retry_locally}
        done = [m for m in batch if id(m) not in later]
        if done:
            self._commit(pq, pq.remove(done))
        if retry_locally:
            again = [dataclasses.replace(m, reconsume_times=m.reconsume_times + 1) for m in retry_locally]
            self._submit(pq, again, context.retry_delay_ms / 1000)

    def _send_back_all(self, batch: list[Message], delay_ms: int) -> list[Message]:
        """Route failed messages to the retry topic or the DLQ; those to retry locally are returned."""
        local = []
        retry_at = str(int(time.time() * 1000) + delay_ms)
        for m in batch:
            if self._max_reconsume_reached(m):
                if not self._send_back(dlq_topic(self.group), m):
                    local.append(m)
            elif self.broadcasting:
                local.append(m)
            else:
                nxt = dataclasses.replace(m, reconsume_times=m.reconsume_times + 1)
                if not self._send_back(retry_topic(self.group), nxt,
                                       {PROPERTY_RETRY_AT: retry_at, PROPERTY_RETRY_DELAY_MS: str(delay_ms)}):
                    local.append(m)
        return local
