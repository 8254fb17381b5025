"""``ConsumePool``: the threads that call a push consumer's listener.

A ``concurrent.futures.ThreadPoolExecutor`` without the future: a concurrent consumer hands the
pool one call per message (``consume_batch_size`` 1), and the executor made a ``Future`` (a
condition, its lock, two lists) and a work item for each. Thousands of them wait in the queue at a
time, long enough to reach the garbage collector's oldest generation, whose full passes then took
a fifth of the consumer's time. Here a call is a tuple in a queue, and nobody waits for its outcome:
the consumers' calls handle their own failures.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["ConsumePool"]

log = logging.getLogger(__name__)


class ConsumePool:
    """``threads`` threads named ``<name>_<n>`` running the calls submitted, in submission order."""

    def __init__(self, threads: int, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # no call is queued behind the threads' stop marks
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{n}", daemon=True) for n in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a pool thread; ``RuntimeError`` once the pool is shut down."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the consume pool is shut down")
            self._calls.put((fn, args))

    def shutdown(self, wait: bool = True) -> None:
        """Run the calls already submitted, then end the threads (waiting for them with ``wait``)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._calls.put(None)
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, args = call
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a pool thread must survive anything its call raises
                log.exception("a consume call failed")
