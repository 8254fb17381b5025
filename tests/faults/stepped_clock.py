"""A broker whose wall clock a test steps while it runs, as an NTP correction at boot, ``date -s``
or a virtual machine resumed from a snapshot steps a host's.

The broker runs under Debian's libfaketime (``make faketime``; make test installs it), which moves
the wall clock the process reads and leaves its steady clock alone, as a real step does. Each step
is read back from the broker's answers before the test goes on.
"""

from __future__ import annotations

import glob
import time
from pathlib import Path

import pytest

from connector.client.connection import BrokerConnection, pb
from tests.support import wait_until

__all__ = ["HOUR_S", "SteppedClock", "lock_queue"]

HOUR_S = 3600
_PROBE_GROUP = "clock-probe"


class SteppedClock:
    """The wall clock of the processes started with ``env()``: real time plus an offset that
    ``step`` changes while they run. ``topic`` must exist before the first step: a lock of its
    queue 0, by a group of the clock's own, tells the broker's wall clock."""

    def __init__(self, path: Path, topic: str) -> None:
        libraries = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
        if not libraries:
            pytest.fail("libfaketime is not installed: run `make faketime` (make test does)")
        self.library, self.path, self.topic, self.offset_s = libraries[0], path, topic, 0
        path.write_text("+0\n")

    def env(self) -> dict[str, str]:
        return {"LD_PRELOAD": self.library, "FAKETIME_TIMESTAMP_FILE": str(self.path),
                "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_CACHE_DURATION": "1"}

    def step(self, conn: BrokerConnection, seconds: int) -> None:
        """Step the broker's wall clock by ``seconds``, and wait until it reads the new time."""
        self.offset_s += seconds
        self.path.write_text(f"{self.offset_s:+d}\n")
        target_ms = self.offset_s * 1000
        assert wait_until(lambda: abs(self._broker_wall_ms(conn) - time.time() * 1000 - target_ms) < 5_000, 30)

    def _broker_wall_ms(self, conn: BrokerConnection) -> int:
        """A lease ends at the broker's wall time plus what it has left."""
        (lock,) = lock_queue(conn, self.topic, "probe", group=_PROBE_GROUP)
        return lock.expires_at_ms - lock.expires_in_ms


def lock_queue(conn: BrokerConnection, topic: str, client_id: str, group: str = "g") -> list[pb.QueueLock]:
    """``LockBatch`` of ``topic``'s queue 0: its lock, or nothing when another client holds it."""
    request = pb.LockBatchRequest(group=group, client_id=client_id, topic=topic, queue_ids=[0])
    return list(conn.call("LockBatch", request).locked)
