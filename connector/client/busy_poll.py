"""``BusyPoll``: a synchronous send polls for its answer for a moment before it sleeps.

A thread asleep in ``recv`` is woken by the kernel when the answer arrives; on a broker nearby (the
same host, loopback) that wake-up costs more than the broker's work. A thread still polling when
the answer arrives just reads it. Measured here (two cores, one thread's ``Producer.send`` over
the send port, alternating runs): 4,000-4,650 sends/s asleep, 6,150-7,900 polling for up to
500 us, the caller's process using 126-160 us of CPU per send instead of 93-107 (a core while it
waits). A poll of up to 50 us mostly missed; 200 and 500 did alike on a bare connection.

Polling takes a CPU, so it is done only where one is to spare:

- only by a send alone in its process (``SENDING``; another one beginning ends the poll): threads
  sending side by side overlap their waits anyway, and a polling thread takes the CPU and the GIL
  from them;
- only while the machine has a CPU to spare (``SpareCpu``: its runnable threads, as
  ``/proc/loadavg`` counts them every ``_LOOK_EVERY_S``, averaged over the last
  ``_AVERAGE_OVER_S``, as a moment's extra thread is no reason to stop); once it has none, not
  for about a second. The CPUs counted are those the process may run on, or its container's CPU
  quota where that is fewer (``usable_cpus``). Two processes each sending alone on two cores
  sent 6,000 messages/s polling without this look (the broker had no CPU left) against 12,000
  asleep; with it, as many as asleep. The looks go on while none is to spare: looks a second
  apart kept a moment's burst of threads in the average for many seconds (a lone sender in the
  benchmark, after the broker suite, sent 3,100-4,300 messages/s asleep, 5,500-8,350 polling);
- polls that keep ending with no answer (a broker far away, one that fsyncs every send) stop: one
  round trip in ``_PROBE_EVERY`` polls then, to notice when answers come quickly again.
"""

from __future__ import annotations

import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["SENDING", "BusyPoll", "SpareCpu", "usable_cpus"]

_MISSES_BEFORE_PROBING = 4  # polls in a row that ended with no answer: from then on, only probes
_PROBE_EVERY = 16  # round trips per poll once polls keep missing
_LOOK_EVERY_S = 0.02  # how often the machine's runnable threads are counted
_BUSY_PAUSE_S = 1.0  # no poll for about this long after the machine last had no CPU to spare
_AVERAGE_OVER_S = 0.2  # the time constant of the average of runnable threads
_LOOK_WEIGHS_AT_MOST = 0.2  # one look, however long after the last one: a moment is not the average
_CGROUPS = Path("/sys/fs/cgroup")


def usable_cpus(cgroups: Path = _CGROUPS, own: Path = Path("/proc/self/cgroup")) -> float:
    """The CPUs this process may use: those it may run on, or fewer where a CPU quota of its
    cgroup or of one above it says so (a container's ``--cpus``: ``cpu.max`` of cgroup v2,
    ``cpu.cfs_quota_us`` of v1)."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min([affinity, *_quotas(cgroups, own)])


def _quotas(cgroups: Path, own: Path) -> list[float]:
    """Every CPU quota from the process's cgroup up to the root of the hierarchy mounted here."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        return []
    quotas = []
    for line in lines:
        _id, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one hierarchy, quota and period in cpu.max
            quotas += _each_level(cgroups, path, lambda d: _ratio((d / "cpu.max").read_text().split()))
        elif "cpu" in controllers.split(","):  # cgroup v1: the cpu controller's own hierarchy
            root = next((cgroups / name for name in (controllers, "cpu,cpuacct", "cpu") if (cgroups / name).is_dir()),
                        None)
            if root is not None:
                quotas += _each_level(root, path, lambda d: _ratio(
                    [(d / "cpu.cfs_quota_us").read_text(), (d / "cpu.cfs_period_us").read_text()]))
    return quotas


def _each_level(root: Path, path: str, quota_of: Callable[[Path], float | None]) -> list[float]:
    """``quota_of`` each directory from ``root/path`` up to ``root`` that exists (in a container
    the path may name the host's view of its cgroup, which is the root here)."""
    found, level = [], root / path.strip("/")
    while True:
        try:
            quota = quota_of(level)
        except (OSError, ValueError, IndexError):
            quota = None
        if quota is not None:
            found.append(quota)
        if level == root or root not in level.parents:
            return found
        level = level.parent


def _ratio(fields: list[str]) -> float | None:
    """Quota over period; None for no quota ("max" or -1)."""
    quota, period = fields[0].strip(), int(fields[1])
    if quota in ("max", "-1") or period <= 0:
        return None
    return int(quota) / period


class SpareCpu:
    """Whether the machine has a CPU to spare for a poll: it ran, on average over the last
    ``_AVERAGE_OVER_S``, fewer than ``cpus`` + 0.5 runnable threads (the poller included), and
    has for about ``_BUSY_PAUSE_S``. Callable; thread-safe enough for a heuristic (a look racing
    another only repeats it)."""

    def __init__(self, cpus: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.cpus = usable_cpus() if cpus is None else cpus
        self.spare = True
        self._clock = clock
        self._runnable = 0.0  # the average of the looks, each weighed by the time since the one before
        self._looked: float | None = None  # clock() of the last look
        self._look_at = 0.0  # clock() of the next look
        self._busy_until = 0.0  # clock() until which none is to spare

    def __call__(self) -> bool:
        now = self._clock()
        if now >= self._look_at:
            self._look_at = now + _LOOK_EVERY_S
            self.look(_runnable_now(), now)
        return self.spare

    def look(self, runnable: int, now: float) -> bool:
        """Count ``runnable`` threads, seen at ``now`` (``clock()``), into the average; whether a
        CPU is to spare now."""
        since = math.inf if self._looked is None else max(now - self._looked, 0.0)
        self._looked = now
        weight = min(1.0 - math.exp(-since / _AVERAGE_OVER_S), _LOOK_WEIGHS_AT_MOST)
        self._runnable += weight * (runnable - self._runnable)
        if self._runnable >= self.cpus + 0.5:
            self._busy_until = now + _BUSY_PAUSE_S * random.uniform(0.5, 1.5)
        self.spare = now >= self._busy_until
        return self.spare


def _runnable_now() -> int:
    try:
        with open("/proc/loadavg", "rb") as loadavg:
            return int(loadavg.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return 1  # no such count on this system: as if idle


_SPARE_CPU = SpareCpu()  # the process's: every producer's polls look at the same machine


class _Sending:
    """The sends under way in the process; ``with SENDING:`` around a send, from its call to its
    answer, so that only a lone one polls."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def forked(self) -> None:
        """In a child process: none of the parent's sends is under way here (and its lock may have
        been held when the process forked)."""
        self.count = 0
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        with self._lock:
            self.count += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.count -= 1


SENDING = _Sending()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SENDING.forked)


class BusyPoll:
    """How a round trip waits for its answer: polling the connection (non-blocking reads) for up
    to ``limit_us`` microseconds, then asleep in ``recv``; ``limit_us=0`` never polls.
    ``cpu_to_spare`` says whether the machine has a CPU to spare for it now."""

    def __init__(self, limit_us: float, cpu_to_spare: Callable[[], bool] = _SPARE_CPU) -> None:
        if limit_us < 0:
            raise ValueError(f"busy_poll_us must be 0 (never poll) or more, not {limit_us}")
        self.limit_s = limit_us / 1e6
        self.polls = self.answered = 0  # polls begun, and those that read an answer (counts, not locked)
        self._cpu_to_spare = cpu_to_spare
        self._misses = 0  # polls in a row that ended with no answer
        self._skipped = 0

    def read(self, sock: socket.socket, buffer: bytearray) -> int:
        """What has arrived of the answer, read into ``buffer`` within the limit; 0 when nothing
        did (or no poll was due): the caller then sleeps in ``recv``."""
        if not self.limit_s or SENDING.count > 1 or not self._due() or not self._cpu_to_spare():
            return 0
        self.polls += 1
        end = time.perf_counter() + self.limit_s
        while True:
            try:
                read = sock.recv_into(buffer, 0, socket.MSG_DONTWAIT)
            except BlockingIOError:
                if SENDING.count > 1:
                    return 0  # not a miss: another thread's send began
                if time.perf_counter() < end:
                    continue
                self._misses += 1
                return 0
            if not read:
                raise ConnectionError("the broker closed the lean port connection")
            self._misses = 0
            self.answered += 1
            return read

    def _due(self) -> bool:
        if self._misses < _MISSES_BEFORE_PROBING:
            return True
        self._skipped += 1
        return self._skipped % _PROBE_EVERY == 0
