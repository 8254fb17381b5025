"""The clock a group's leases count on (``node.py``): ``CLOCK_BOOTTIME`` where the system has it.

``time.monotonic()`` (``CLOCK_MONOTONIC``) stands still while the host is suspended, but ZooKeeper
expiring a session and slaves keeping their promises count that time: a master resumed from a
suspend must count it too, or it would believe its leases still held while another master serves.
"""

from __future__ import annotations

import functools
import time

__all__ = ["now"]

now = functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME) if hasattr(time, "CLOCK_BOOTTIME") \
    else time.monotonic
