"""Receive, ack, change invisibility, dead-letter: RocketMQ consumption over our locks and offsets.

The broker consumes each queue on behalf of a group's RocketMQ consumers under one queue lock,
held by the client id ``GATEWAY_CLIENT``: our own consumers and Spark readers of the same group
then cannot read that queue at the same time, and every offset commit is fenced by the lock's
epoch. Between RocketMQ consumers the order rules of ``broker.rocketmq.deliveries`` hold.

A lock that lapsed (nobody received from the queue for a lease) and is taken back keeps the
delivery state when the group's committed offset shows nobody else consumed meanwhile; otherwise
the state is rebuilt from the committed offset and receipts issued before are refused (their
messages are delivered again: at least once, in order).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import pyarrow as pa

from broker.clocks import steady_ms
from broker.proto import orderlymq_pb2 as pb
from broker.rocketmq.deliveries import QueueDeliveries
from broker.rocketmq.mapping import MESSAGE_ID_PROPERTY, message_id_of, to_rocketmq
from broker.rocketmq.protocol import Code, definition
from broker.rocketmq.receipts import Receipt
from broker.rocketmq.statuses import RocketMQStatusError
from broker.storage.arrivals import Arrivals
from broker.wire.one_message import encode_one

__all__ = ["AUTO_RENEW_MS", "GATEWAY_CLIENT", "Consumption", "dead_letter_topic"]

log = logging.getLogger(__name__)

GATEWAY_CLIENT = "rocketmq-clients"
AUTO_RENEW_MS = 60_000  # a push consumer's messages stay invisible this long past its last heartbeat
DLQ_ORIGIN_PROPERTY = "rocketmq.dlq_origin"


def dead_letter_topic(group: str) -> str:
    return f"%DLQ%{group}"


def _rows(table: pa.Table) -> list[dict]:
    """Stored rows as Python values, timestamps as ms."""
    for name in ("born_timestamp", "store_timestamp"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, name, table.column(name).cast(pa.int64()))
    return table.to_pylist()


class Consumption:
    """The delivery states of every (group, topic, queue) RocketMQ consumers read."""

    def __init__(self, broker, clock: Callable[[], int] = steady_ms) -> None:
        self.broker = broker
        self.store = broker.store
        self.locks = broker.locks
        self.offsets = broker.offsets
        self.metrics = broker.metrics
        self.max_bytes = broker.config.max_pull_bytes
        self.clock = clock
        self._states: dict[tuple[str, str, int], QueueDeliveries] = {}
        self._mutex = threading.Lock()
        self._wakeups: dict[tuple[str, str], Arrivals] = {}

    def wakeups(self, group: str, topic: str) -> Arrivals:
        """Resolved when a message of the group's topic becomes deliverable again (ack, nack, a client
        leaving): a FIFO long poll waiting behind messages in flight goes on at once."""
        with self._mutex:
            return self._wakeups.setdefault((group, topic), Arrivals(threading.Lock()))

    def _wake(self, group: str, topic: str) -> None:
        wakeups = self._wakeups.get((group, topic))
        if wakeups is not None:
            wakeups.wake_all()

    # -- delivery state under the group's queue lock ---------------------------------------------

    def _state(self, group: str, topic: str, queue_id: int) -> QueueDeliveries | None:
        """The queue's state with its lock held (taken or renewed); None if another client has it."""
        epoch = self.locks.lock_batch(group, GATEWAY_CLIENT, topic, [queue_id]).get(queue_id)
        if epoch is None:
            return None
        key = (group, topic, queue_id)
        with self._mutex:
            state = self._states.get(key)
            if state is not None and state.held_epoch != epoch:
                if self._still_ours(state, key):
                    state.held_epoch = epoch
                else:
                    log.info("queue %s/%d of group %s was consumed by another client: RocketMQ deliveries "
                             "restart from its committed offset", topic, queue_id, group)
                    state = None
            if state is None:
                state = self._states[key] = self._fresh(key, epoch)
            return state

    def _still_ours(self, state: QueueDeliveries, key: tuple[str, str, int]) -> bool:
        offset, by = self.offsets.committed(*key)
        return offset == state.stored and (offset < 0 or by == GATEWAY_CLIENT)

    def _fresh(self, key: tuple[str, str, int], epoch: int) -> QueueDeliveries:
        group, topic, queue_id = key
        stored, _ = self.offsets.committed(group, topic, queue_id)
        queue = self.store.queue(topic, queue_id)
        start = max(stored, queue.min_offset) if stored >= 0 else queue.min_offset  # a new group: earliest
        return QueueDeliveries(committed=start, epoch=epoch, stored=stored)

    def _commit(self, key: tuple[str, str, int], state: QueueDeliveries) -> None:
        """Store the state's committed offset under the group's queue lock, renewed (or taken back
        after a lapse nobody used) first; a queue another client took meanwhile refuses it."""
        if state.committed == state.stored:
            return
        group, topic, queue_id = key
        epoch = self.locks.lock_batch(group, GATEWAY_CLIENT, topic, [queue_id]).get(queue_id)
        if epoch is not None and epoch != state.held_epoch and self._still_ours(state, key):
            state.held_epoch = epoch
        if epoch != state.held_epoch:
            self._states.pop(key, None)
            raise RocketMQStatusError(Code.INVALID_RECEIPT_HANDLE, f"queue {topic}/{queue_id} of group {group!r} "
                                      "was taken by another consumer of the group; the message will be delivered "
                                      "again")
        self.broker.CommitOffset(pb.CommitOffsetRequest(group=group, topic=topic, queue_id=queue_id,
                                                        offset=state.committed, client_id=GATEWAY_CLIENT,
                                                        epoch=state.held_epoch))  # fenced, replicated
        state.stored = state.committed

    def _held(self, group: str, topic: str, receipt: Receipt) -> tuple[tuple[str, str, int], QueueDeliveries]:
        key = (group, topic, receipt.queue_id)
        state = self._states.get(key)
        if receipt.topic != topic:
            raise RocketMQStatusError(Code.INVALID_RECEIPT_HANDLE, f"the receipt handle is for topic "
                                      f"{receipt.topic!r}, not {topic!r}")
        if state is None or state.epoch != receipt.epoch:
            raise RocketMQStatusError(Code.INVALID_RECEIPT_HANDLE, f"message {topic}/{receipt.queue_id}@"
                                      f"{receipt.offset} was handed out before queue {receipt.queue_id} of group "
                                      f"{group!r} changed hands or the broker restarted; it will be delivered again")
        return key, state

    # -- the RPCs --------------------------------------------------------------------------------

    def receive(self, group: str, topic: str, queue_ids: Sequence[int], client_id: str, max_messages: int,
                invisible_ms: int, auto_renew: bool, tags: frozenset[str] | None) -> list[definition.Message]:
        """Messages of the first of ``queue_ids`` that has some to deliver (none: an empty list)."""
        for queue_id in queue_ids:
            state = self._state(group, topic, queue_id)
            if state is None:
                continue
            with state.lock:
                messages = self._take(group, topic, queue_id, state, client_id, max_messages, invisible_ms,
                                      auto_renew, tags)
            if messages:
                return messages
        return []

    def _take(self, group, topic, queue_id, state: QueueDeliveries, client_id, max_messages, invisible_ms,
              auto_renew, tags) -> list[definition.Message]:
        now = self.clock()
        if state.blocked(now):
            return []
        queue = self.store.queue(topic, queue_id)
        if state.committed < queue.min_offset:
            log.warning("retention removed offsets %d..%d of %s/%d before group %s consumed them", state.committed,
                        queue.min_offset - 1, topic, queue_id, group)
            state.jump(queue.min_offset)
        due = state.due(now)
        start = due[0] if due else state.next_offset
        if start >= queue.max_offset:
            return []
        result = queue.read(start, state.next_offset - start + max_messages, self.max_bytes)
        redeliver, messages = set(due), []
        for row in _rows(result.table):
            offset = row["queue_offset"]
            if offset < state.next_offset and offset not in redeliver:
                continue  # acked, or in flight
            if tags is not None and row["tag"] not in tags:
                state.skip(offset)
                continue
            attempt = state.deliver(offset, client_id, now + invisible_ms, auto_renew)
            receipt = Receipt(topic, queue_id, offset, attempt, state.epoch, client_id).encode()
            messages.append(to_rocketmq(row, topic, queue_id, receipt_handle=receipt, delivery_attempt=attempt,
                                        invisible_ms=invisible_ms))
            if len(messages) >= max_messages:
                break
        self._commit((group, topic, queue_id), state)  # offsets the filter skipped
        if messages:
            self.metrics.served(topic, queue_id, len(messages), sum(len(m.body) for m in messages))
        return messages

    def ack(self, group: str, topic: str, handle: str) -> None:
        receipt = Receipt.decode(handle)
        key, state = self._held(group, topic, receipt)
        with state.lock:
            if not state.ack(receipt.offset, receipt.attempt):
                raise _not_in_flight(topic, receipt, ": acked already, or delivered again after its invisible "
                                                     "duration ran out")
            self._commit(key, state)
        self._wake(group, topic)

    def change_invisible(self, group: str, topic: str, handle: str, invisible_ms: int) -> str:
        """Make a received message visible again in ``invisible_ms``; returns its receipt handle."""
        receipt = Receipt.decode(handle)
        _, state = self._held(group, topic, receipt)
        with state.lock:
            if not state.change_invisible(receipt.offset, receipt.attempt, self.clock() + invisible_ms):
                raise _not_in_flight(topic, receipt)
        self._wake(group, topic)
        return handle

    def dead_letter(self, group: str, topic: str, handle: str) -> None:
        """Store the message in the group's dead letter topic (one queue), then ack it."""
        receipt = Receipt.decode(handle)
        key, state = self._held(group, topic, receipt)
        with state.lock:
            if not state.holds(receipt.offset, receipt.attempt):
                raise _not_in_flight(topic, receipt)
            row = _rows(self.store.queue(topic, receipt.queue_id).read(receipt.offset, 1, self.max_bytes).table)[0]
            properties = dict(row["properties"] or ())
            properties[DLQ_ORIGIN_PROPERTY] = f"{topic}/{receipt.queue_id}/{receipt.offset}"
            properties.setdefault(MESSAGE_ID_PROPERTY, message_id_of(properties, receipt.queue_id, receipt.offset))
            dlq = dead_letter_topic(group)
            self.broker.CreateTopic(pb.CreateTopicRequest(topic=dlq, queue_count=1, if_not_exists=True))
            batch = encode_one({"key": row["key"], "tag": row["tag"], "body": row["body"], "properties": properties,
                                "born_timestamp": row["born_timestamp"]})
            self.broker.Send(pb.SendRequest(topic=dlq, queue_id=0, batch=batch))
            state.ack(receipt.offset, receipt.attempt)
            self._commit(key, state)
        self._wake(group, topic)

    def heartbeat(self, group: str, client_id: str) -> None:
        """A live consumer: keep its auto-renewed messages invisible and the group's locks held."""
        until = self.clock() + AUTO_RENEW_MS
        for (g, topic, queue_id), state in list(self._states.items()):
            if g != group:
                continue
            with state.lock:
                state.renew(client_id, until)
                busy = bool(state.in_flight)
            if busy:
                self._state(group, topic, queue_id)

    def release(self, group: str, client_id: str) -> int:
        """A consumer left: what it held is visible to the group again now. Returns how many."""
        now, released = self.clock(), 0
        for (g, topic, _), state in list(self._states.items()):
            if g == group:
                with state.lock:
                    released += state.release(client_id, now)
                self._wake(group, topic)
        return released


def _not_in_flight(topic: str, receipt: Receipt, why: str = "") -> RocketMQStatusError:
    """The answer to an ack, nack or dead-lettering under a receipt that no longer holds its message."""
    return RocketMQStatusError(Code.INVALID_RECEIPT_HANDLE, f"message {topic}/{receipt.queue_id}@{receipt.offset} is "
                                                            f"not in flight under this receipt{why}")
