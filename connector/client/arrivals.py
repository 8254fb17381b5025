"""Waiting for the next message on the broker: ``AwaitMessages``, one long poll over many queues.

A consumer that caught up on every queue it holds has nothing to pull until a producer sends.
Pulling each queue again after a pause costs a round trip per queue and delivers the next
message up to that pause late (the push consumers paused up to 200 ms: 84-91 ms median delivery
at one message every 300 ms). Instead the consumer asks each broker holding some of its queues
(each group's master, in a cluster) to answer as soon as one of them holds a message past the
consumer's position, and pulls then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

import grpc

from broker.wire.errors import OrderlyMQError, from_rpc_error
from connector.client.connection import BrokerConnection, pb
from connector.client.routed import RoutedConnection

__all__ = ["ArrivalWait", "by_broker", "common_start"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
QueueRef = tuple[str, int]


def by_broker(connection: RoutedConnection, items: Iterable[_T], ref: Callable[[_T], QueueRef]
              ) -> list[tuple[BrokerConnection | None, list[_T]]]:
    """``items`` grouped by the broker that serves their queue (``ref(item)``): the one broker, or
    in a cluster the master of each queue's group (None for queues whose route cannot be read now)."""
    items = list(items)
    if not items:
        return []
    try:
        if not connection.clustered():
            return [(connection.bootstrap, items)]
    except OrderlyMQError:
        return [(None, items)]
    grouped: dict[int, tuple[BrokerConnection | None, list[_T]]] = {}
    for item in items:
        try:
            broker = connection.for_queue(*ref(item))
        except OrderlyMQError:
            broker = None
        grouped.setdefault(id(broker), (broker, []))[1].append(item)
    return list(grouped.values())


def common_start(boot_ids: Iterable[int]) -> int:
    """The broker start that answered every one of a broker's queues last, 0 unless they agree."""
    starts = set(boot_ids)
    return starts.pop() if len(starts) == 1 else 0


class ArrivalWait:
    """Waits of one consumer (of any of its threads); ``interrupt`` (a new assignment) and
    ``close`` (a shutdown) end those under way from another thread at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: set[grpc.Future] = set()  # of every wait under way
        self._closed = False
        self._interrupted = False  # while none was under way: the next wait ends at once

    def wait(self, positions: list[tuple[BrokerConnection | None, int, list[tuple[str, int, int]]]],
             timeout_s: float) -> bool | None:
        """Wait until a broker names a queue ready past its ``(topic, queue id, offset)`` position,
        at most ``timeout_s``; ``positions`` per broker, with the broker start they were read from
        (0: unknown), another start making every queue ready. True: some queue is ready; False: none
        was within the time (or the wait was interrupted); None: a broker could not wait
        (unreachable, a route unknown, a version without ``AwaitMessages``): the caller pauses instead."""
        if any(broker is None for broker, _, _ in positions):
            return None
        ended = threading.Event()
        calls = [self._start(broker, boot_id, queues, timeout_s, ended) for broker, boot_id, queues in positions]
        with self._lock:
            if self._closed or self._interrupted:
                self._interrupted, calls_to_end = False, calls
            else:
                self._calls.update(calls)
                calls_to_end = []
        for call in calls_to_end:
            call.cancel()
        ended.wait()  # every call ends by its deadline
        for call in calls:
            call.cancel()
        with self._lock:
            self._calls.difference_update(calls)
        return _outcome(calls)

    def interrupt(self) -> None:
        with self._lock:
            calls = list(self._calls)
            self._interrupted = not calls
        for call in calls:
            call.cancel()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.interrupt()

    @staticmethod
    def _start(broker: BrokerConnection, boot_id: int, queues: list[tuple[str, int, int]], timeout_s: float,
               ended: threading.Event) -> grpc.Future:
        request = pb.AwaitMessagesRequest(
            positions=[pb.QueuePosition(topic=topic, queue_id=queue_id, offset=offset)
                       for topic, queue_id, offset in queues],
            wait_ms=int(timeout_s * 1000), boot_id=boot_id)
        call = broker.on_current_stub(lambda stub: stub.AwaitMessages.future(
            request, timeout=timeout_s + broker.timeout, metadata=broker.metadata))
        call.add_done_callback(lambda _call: ended.set())
        return call


def _outcome(calls: list[grpc.Future]) -> bool | None:
    """True if a finished call named a ready queue; None if one failed; else False."""
    failed = False
    for call in calls:
        if call.cancelled() or not call.done():
            continue
        error = call.exception()
        if error is None:
            if call.result().ready:
                return True
        else:
            failed = True
            log.debug("waiting for messages failed: %s", from_rpc_error(error))
    return None if failed else False
