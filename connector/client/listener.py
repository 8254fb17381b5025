"""What listeners return and receive: RocketMQ's consume statuses and contexts.

An orderly listener is ``listener(messages, context) -> ConsumeOrderlyStatus``; a concurrent one is
``listener(messages, context) -> ConsumeConcurrentlyStatus``. ``messages`` is a list of
``Message`` of one queue in queue order (``consume_batch_size`` at most). An exception raised by a
listener, or a return of None, counts as ``SUSPEND_CURRENT_QUEUE_A_MOMENT`` / ``RECONSUME_LATER``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from connector.client.messages import Message, MessageQueue

__all__ = [
    "ConcurrentListener",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "OrderlyListener",
]


class ConsumeOrderlyStatus(enum.Enum):
    """Result of an orderly listener.

    SUCCESS
        Consumed; with ``auto_commit`` the offset moves past the messages.
    SUSPEND_CURRENT_QUEUE_A_MOMENT
        Retry the same messages after ``suspend_ms``; nothing after them is consumed meanwhile.
    COMMIT
        (``auto_commit=False``) commit everything consumed so far in this queue.
    ROLLBACK
        (``auto_commit=False``) consume again everything since the last commit, after ``suspend_ms``.
    """

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"


class ConsumeConcurrentlyStatus(enum.Enum):
    """Result of a concurrent listener: consumed, or retry later through the group's retry topic."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


@dataclass
class ConsumeOrderlyContext:
    """Per call of an orderly listener; the listener may change ``auto_commit`` and ``suspend_ms``
    for this call (RocketMQ's ``setAutoCommit`` / ``setSuspendCurrentQueueTimeMillis``)."""

    message_queue: MessageQueue
    auto_commit: bool
    suspend_ms: int


@dataclass
class ConsumeConcurrentlyContext:
    """Per call of a concurrent listener; ``retry_delay_ms`` may be changed for this call."""

    message_queue: MessageQueue
    retry_delay_ms: int


OrderlyListener = Callable[[list[Message], ConsumeOrderlyContext], ConsumeOrderlyStatus | None]
ConcurrentListener = Callable[[list[Message], ConsumeConcurrentlyContext], ConsumeConcurrentlyStatus | None]
