"""What a busy poll asks before it spins: whether the machine has a CPU to spare (``SpareCpu``), and
whether polls lately found what they waited for (``MissedPolls``). Shared by the client's polls
for an answer (``connector.client.busy_poll``) and the broker's event loop polling for the next
request (``broker.busy_loop``).

A poll takes a CPU, so it is done only while the machine has one to spare: its runnable threads, as
``/proc/loadavg`` counts them every ``_LOOK_EVERY_S``, averaged over the last ``_AVERAGE_OVER_S``
(a moment's extra thread is no reason to stop); once it has none, not for about a second. The
CPUs counted are those the process may run on, or its container's CPU quota where that is fewer
(``usable_cpus``). Two processes each sending alone on two cores sent 6,000 messages/s polling
without this look (the broker had no CPU left) against 12,000 asleep; with it, as many as asleep.
The looks go on while none is to spare: looks a second apart kept a moment's burst of threads in
the average for many seconds.

Polls that keep ending with nothing (a broker far away, one that fsyncs every send, requests
seconds apart) stop: one in ``_PROBE_EVERY`` chances is taken then, to notice when what is waited
for comes quickly again.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["SPARE_CPU", "MissedPolls", "SpareCpu", "usable_cpus"]

_MISSES_BEFORE_PROBING = 4  # polls in a row that ended with nothing: from then on, only probes
_PROBE_EVERY = 16  # chances per poll once polls keep missing
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


SPARE_CPU = SpareCpu()  # the process's: every poll in it looks at the same machine


class MissedPolls:
    """Whether a poll is due: always, until ``_MISSES_BEFORE_PROBING`` polls in a row ended with
    nothing; then one chance in ``_PROBE_EVERY``, until a poll finds something again."""

    def __init__(self) -> None:
        self._misses = 0  # polls in a row that ended with nothing
        self._skipped = 0

    def due(self) -> bool:
        if self._misses < _MISSES_BEFORE_PROBING:
            return True
        self._skipped += 1
        return self._skipped % _PROBE_EVERY == 0

    def found(self) -> None:
        self._misses = 0

    def missed(self) -> None:
        self._misses += 1
