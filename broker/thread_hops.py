"""``ThreadHops``: the broker's worker threads, as its event loop hands them calls.

What may block (fsync, file writes, big reads and encodes, a scrypt) leaves the loop for a thread:
every pull, most unary RPCs. ``loop.run_in_executor`` cost the loop about 100 µs of CPU a call
here (a ``concurrent.futures.Future`` with its condition, a work item, and an asyncio future
chained to it through three callbacks). A hop here is a tuple in a queue the threads take from and
an asyncio future resolved with ``call_soon_threadsafe``: about half.

As with the executor, threads start as calls find none idle, up to ``threads``; a call whose
awaiting task was cancelled before a thread took it is skipped; ``shutdown`` lets the calls
already handed over finish (their answers are dropped once the loop is closed).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ThreadHops", "settle"]

log = logging.getLogger(__name__)

_STOP = None  # taken by one thread, which then ends


def settle(future: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    """On the future's loop: its result, or ``exc``; nothing once it is done (cancelled by its
    awaiting task, or settled already)."""
    if future.done():
        return
    if exc is None:
        future.set_result(result)
    else:
        future.set_exception(exc)


class ThreadHops:
    """Up to ``threads`` threads named ``name``-N running calls for an event loop: ``await hops.run(fn, *args)``."""

    def __init__(self, threads: int, name: str) -> None:
        self._limit = threads
        self._name = name
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call and not yet promised one
        self._closed = False
        self.under_way = 0  # calls handed over and not yet answered (read on the loop: ``broker.busy_loop``)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on one of the threads; its result or its exception."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._hand_over((loop, future, fn, args))
        self.under_way += 1
        try:
            return await future
        finally:
            self.under_way -= 1

    def _hand_over(self, call: tuple) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the broker's worker threads are shut down")
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._limit:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            self._calls.put(call)

    def _work(self) -> None:
        while True:
            call = self._calls.get()
            if call is _STOP:
                return
            loop, future, fn, args = call
            if not future.cancelled():
                self._run(loop, future, fn, args)
            with self._lock:
                self._idle += 1

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, future: asyncio.Future, fn: Callable[..., Any], args: tuple) -> None:
        try:
            result, exc = fn(*args), None
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting task, as the executor does
            result, exc = None, error
        try:
            loop.call_soon_threadsafe(settle, future, result, exc)
        except RuntimeError:  # the loop is closed: the broker is stopping and nobody awaits the answer
            log.debug("a call ended after the event loop closed; its answer is dropped")

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new calls; each thread ends after the calls handed over before it."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._calls.put(_STOP)
        if wait:
            for thread in threads:
                thread.join()
