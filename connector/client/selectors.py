"""Queue selectors: which MessageQueue of a topic a message goes to (RocketMQ's MessageQueueSelector).

A selector is any callable ``(queues, message, arg) -> MessageQueue | int``; ``queues`` lists the
topic's queues in queue-id order. The built-in ones, by name:

``"hash"``
    The routing function of ``broker.wire.routing.queue_for_key`` on the message key (on ``arg`` when
    the message has no key). The default when a key is given. A null key is an error.
``"modulo"``
    ``arg % len(queues)`` for an integer ``arg`` (the seeds' ``orderId % mqs.size()``); falls back to an
    integer key. Same queue as ``"hash"`` for integer keys.
``"random"``
    A uniformly random queue.
``"round_robin"``
    The next queue in turn, per topic. A producer keeps one instance for its whole life, so its
    position per topic carries over from send to send.

No selector is implied for a message without a key: the producer asks for ``key=``, a selector or
a ``queue_id`` (a keyless message has no order to keep, so where it goes is the caller's choice).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

from broker.wire.errors import InvalidOptionError, InvalidRequestError, QueueOutOfRangeError
from broker.wire.routing import queue_for_key
from connector.client.messages import Message, MessageQueue

__all__ = [
    "SELECTORS",
    "QueueSelector",
    "SelectByHash",
    "SelectByModulo",
    "SelectRandom",
    "SelectRoundRobin",
    "resolve_selector",
    "select_queue",
]

QueueSelector = Callable[[Sequence[MessageQueue], Message, Any], MessageQueue | int]


class SelectByHash:
    """``queue_for_key(key, N)``: pmod for integers, Spark's ``pmod(xxhash64(key), N)`` otherwise."""

    name = "hash"

    def __call__(self, queues: Sequence[MessageQueue], message: Message, arg: Any = None) -> int:
        key = message.key if message.key is not None else arg
        if key is None:
            raise InvalidRequestError(
                f"the hash selector needs a sharding key, but a message to topic {message.topic!r} has none: "
                "pass key=..., or choose another selector (round_robin, random) or a queue_id"
            )
        return queue_for_key(key, len(queues))


class SelectByModulo:
    """``arg % N`` for an integer ``arg`` (or, without ``arg``, an integer key)."""

    name = "modulo"

    def __call__(self, queues: Sequence[MessageQueue], message: Message, arg: Any = None) -> int:
        value = arg if arg is not None else message.key
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(
                f"the modulo selector needs an integer arg (e.g. an order id), got {type(value).__name__} {value!r}"
            )
        return value % len(queues)


class SelectRandom:
    """A uniformly random queue."""

    name = "random"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def __call__(self, queues: Sequence[MessageQueue], message: Message, arg: Any = None) -> int:
        return self._rng.randrange(len(queues))


class SelectRoundRobin:
    """Each topic's queues in turn (thread-safe)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, itertools.count] = {}

    def __call__(self, queues: Sequence[MessageQueue], message: Message, arg: Any = None) -> int:
        with self._lock:
            counter = self._counters.setdefault(message.topic, itertools.count(random.randrange(1 << 16)))
            return next(counter) % len(queues)


SELECTORS: dict[str, type] = {cls.name: cls for cls in (SelectByHash, SelectByModulo, SelectRandom, SelectRoundRobin)}


def resolve_selector(selector: str | QueueSelector | None) -> QueueSelector | None:
    """A selector object for a name, a callable, or None (the per-message default)."""
    if selector is None:
        return None
    if isinstance(selector, str):
        cls = SELECTORS.get(selector)
        if cls is None:
            raise InvalidOptionError(
                f"unknown selector {selector!r}; use one of {', '.join(sorted(SELECTORS))} or a callable"
            )
        return cls()
    if not callable(selector):
        raise InvalidOptionError(
            f"selector must be a name or a callable (queues, message, arg) -> queue, got {type(selector).__name__}"
        )
    return selector


def select_queue(selector: QueueSelector, queues: Sequence[MessageQueue], message: Message, arg: Any) -> int:
    """Run ``selector`` and check its answer: a queue of this topic, within range."""
    chosen = selector(queues, message, arg)
    if isinstance(chosen, MessageQueue):
        if chosen.topic != message.topic:
            raise QueueOutOfRangeError(
                f"selector returned queue {chosen} of another topic for a message to {message.topic!r}"
            )
        queue_id = chosen.queue_id
    elif isinstance(chosen, int) and not isinstance(chosen, bool):
        queue_id = chosen
    else:
        raise QueueOutOfRangeError(
            f"selector returned {chosen!r} ({type(chosen).__name__}); it must return a MessageQueue or a queue id"
        )
    if not 0 <= queue_id < len(queues):
        raise QueueOutOfRangeError(
            f"selector returned queue {queue_id} but topic {message.topic!r} has queues 0..{len(queues) - 1}"
        )
    return queue_id
