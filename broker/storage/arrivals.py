"""Wake-ups for long polls: a queue's "messages arrived" signal, for threads and event loops alike.

A long-polling pull must not hold a thread while it waits (a thousand idle polls would exhaust
any pool), so the broker's event loop awaits an ``asyncio`` future instead. Appends run on other
threads, so ``Arrivals.notify_all`` (called by ``QueueLog.append`` under the queue's lock, like
any ``threading.Condition``) also resolves every registered future through
``loop.call_soon_threadsafe``: one call per loop, whatever the number of waiters.

Registration uses its own small lock, never the queue's: the queue's lock may be held across an
fsync (``flush = "sync"``), and the event loop must not block on that. A waiter registers first
and then checks the queue's end; the appender moves the end first and then notifies, so one of
them always sees the other and no wake-up is lost.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["Arrivals"]


class Arrivals(threading.Condition):
    """A ``threading.Condition`` whose ``notify_all`` also resolves asyncio futures."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self._futures_lock = threading.Lock()
        self._futures: dict[asyncio.AbstractEventLoop, set[asyncio.Future]] = {}

    def register(self) -> asyncio.Future:
        """A future of the running loop, resolved at the next ``notify_all``; ``discard`` it when done."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._futures_lock:
            self._futures.setdefault(loop, set()).add(future)
        return future

    def discard(self, future: asyncio.Future) -> None:
        with self._futures_lock:
            waiting = self._futures.get(future.get_loop())
            if waiting is not None:
                waiting.discard(future)
                if not waiting:
                    del self._futures[future.get_loop()]

    def notify_all(self) -> None:
        """Wake the threads waiting on the condition (the caller holds its lock) and every future."""
        if self._waiters:  # none, as a rule: every append calls this, and Condition's own check costs a µs
            super().notify_all()
        if not self._futures:  # the common case, read without the lock: a registration racing
            return  # this call re-checks the queue's end after registering
        with self._futures_lock:
            woken, self._futures = self._futures, {}
        for loop, futures in woken.items():
            try:
                loop.call_soon_threadsafe(_resolve, futures)
            except RuntimeError:  # that loop is closed: nobody is waiting there any more
                pass

    def wake_all(self) -> None:
        """``notify_all`` for callers that do not hold the condition's lock (close, delete)."""
        with self:
            self.notify_all()


def _resolve(futures: set[asyncio.Future]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
