"""The broker's two clocks: the wall clock for what people read, a steady one for what counts time.

- ``wall_ms``: milliseconds since the Unix epoch. Messages are stamped with it, and answers show
  it (when a lock's lease or a transaction ends), as do the records kept on disk.
- ``steady_ms`` / ``steady_s``: ``CLOCK_BOOTTIME`` where the system has it (``time.monotonic``
  elsewhere). Leases, idle timeouts and deadlines count on it. A step of the system clock (an NTP
  correction at boot, ``date -s``, a virtual machine resumed from a snapshot) moves the wall clock
  but not this one: stepped forward, the wall clock would expire every lease at once and abort
  every open transaction; stepped back, it would keep a dead client's locks that much longer. It
  counts the time a host spends suspended, as clients and ZooKeeper elsewhere do: a broker resumed
  from a suspend must not believe its leases still hold while others took over.
"""

from __future__ import annotations

import functools
import time

__all__ = ["steady_ms", "steady_s", "wall_ms"]

steady_s = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") \
    else time.monotonic


def steady_ms() -> int:
    """Milliseconds on the steady clock (its origin means nothing: compare two readings only)."""
    return int(steady_s() * 1000)


def wall_ms() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000
