"""The clock a group's leases count on (``node.py``): ``broker.clocks.steady_s``.

``time.monotonic()`` (``CLOCK_MONOTONIC``) stands still while the host is suspended, but ZooKeeper
expiring a session and slaves keeping their promises count that time: a master resumed from a
suspend must count it too, or it would believe its leases still held while another master serves.
"""

from __future__ import annotations

from broker.clocks import steady_s as now

__all__ = ["now"]
