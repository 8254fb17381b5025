"""``BusyLoop``: after a synchronous send on the lean port, the broker's event loop polls for the
next request for a moment (``busy_poll_us``) instead of sleeping.

A synchronous sender's next request comes a few tens of microseconds after its answer. A loop
asleep in ``epoll_wait`` by then is woken by the kernel, and on a virtual machine that wake-up (an
idle CPU's, then the thread's, its caches gone cold) costs more than storing the message. A loop
still polling just reads the request. Measured here (two cores, one thread of ``Producer.send`` on
the same host, polling for its answers too): 10,000 sends/s with the loop asleep, 20,000 with it
polling, against Redis's 8,600 synchronous ``XADD``; the broker used 55 µs of CPU per send
asleep, 50 polling (a whole core, as it never sleeps while sends come back to back).

A poll starts after a read that brought one request of one message, answered at once: a
synchronous sender's (``broker.send_port``). A pipelining producer's batches start none: its
threads need the CPU a poll would take (500,000 pipelined sends were 7% slower with them).

How: a callback that schedules itself again (``call_soon``) until ``busy_poll_us`` after the last
such request. With a callback ready the loop looks at its sockets without waiting (``epoll_wait``
with no timeout), so it serves every connection meanwhile, gRPC's too.

A poll takes a CPU and holds the GIL nearly all the time, so one runs only:

- in a broker process of its own, unless configured otherwise (``busy_poll_limit_us``);
- while the machine has a CPU to spare (``broker.wire.spare_cpu.SpareCpu``), as the client's
  polls;
- while no call is under way on the broker's worker threads (``ThreadHops.under_way``): a thread
  back from a read or an fsync waits for the GIL, and a thread that never sleeps gives it up only
  when asked, after the interpreter's switch interval (5 ms). Pulls (on those threads) every 2 ms
  beside a polling loop took 5.0-10.5 ms at p99 without this rule, 2.2-2.5 with it, 2.1 with no
  poll;
- while polls find requests (``MissedPolls``): sends further apart than ``busy_poll_us`` start a
  poll only now and then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from broker.metrics import BrokerMetrics
from broker.thread_hops import ThreadHops
from broker.wire.spare_cpu import SPARE_CPU, MissedPolls

__all__ = ["BusyLoop", "busy_poll_limit_us"]

_OWN_PROCESS_US = 200  # busy_poll_us = -1 in a broker process of its own: covers a client's turn between sends


def busy_poll_limit_us(configured: int, own_process: bool) -> int:
    """``busy_poll_us`` as configured, or for -1 what suits where the broker runs: none beside
    another program's threads, which a polling loop would keep from the GIL."""
    if configured >= 0:
        return configured
    return _OWN_PROCESS_US if own_process else 0


class BusyLoop:
    """The polls of one broker's event loop, for up to ``limit_us`` after each synchronous send on
    the lean port (``limit_us=0``: never)."""

    def __init__(self, limit_us: float, threads: ThreadHops, metrics: BrokerMetrics,
                 cpu_to_spare: Callable[[], bool] = SPARE_CPU) -> None:
        self.limit_s = limit_us / 1e6
        self._threads = threads
        self._metrics = metrics
        self._cpu_to_spare = cpu_to_spare
        self._misses = MissedPolls()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop polling now, None when none
        self._until = 0.0  # perf_counter() at which the poll ends unless another request comes
        self._began = 0.0
        self._requests = 0  # requests seen while this poll runs

    @property
    def polling(self) -> bool:
        return self._loop is not None

    def request_seen(self) -> None:
        """On the loop, once a request is handled: poll for the next one, if a poll is due."""
        if not self.limit_s:
            return
        now = time.perf_counter()
        self._until = now + self.limit_s
        if self._loop is not None:
            self._requests += 1
        elif not self._threads.under_way and self._misses.due() and self._cpu_to_spare():
            self._loop, self._began, self._requests = asyncio.get_running_loop(), now, 0
            self._loop.call_soon(self._poll)

    def _poll(self) -> None:
        now = time.perf_counter()
        if now < self._until and not self._threads.under_way and self._cpu_to_spare():
            self._loop.call_soon(self._poll)
            return
        self._loop = None
        self._metrics.loop_polled(now - self._began)
        if self._requests:
            self._misses.found()
        elif now >= self._until:  # ended for want of a request, not to give way
            self._misses.missed()
