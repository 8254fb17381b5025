"""A failed fsync of a segment, and what the store does about it.

Linux marks the pages of a failed writeback clean: reads still see them, no later fsync writes
them, and the next fsync of the file succeeds. With ``flush = "async"`` the sends in those pages
were acknowledged already; retrying the flush would call them durable, and every record appended
after them would sit behind a hole that a power cut turns into a cut of the queue at restart,
losing sends acknowledged long after the failure. So a failed flush is never retried:

- the queue's segment is cut back to what its last successful fsync made durable, and the
  segments rolled after it are removed (the sends acknowledged since are lost, the loss
  ``flush = "async"`` allows on a power cut);
- every other queue is fsynced one last time, and cut back the same way where that fails too;
- every later append is refused (``BrokerUnavailableError``: clients resend once the broker is
  back), and ``happened`` is set: the broker process stops with exit code 1, for the disk to be
  checked before it is started again.

With ``flush = "sync"`` an append whose fsync fails is cut back and refused by itself
(``Segment.append``): nothing acknowledged is lost, and the broker goes on.
"""

from __future__ import annotations

import logging
import threading

from broker.wire.errors import BrokerUnavailableError

__all__ = ["LostWrites"]

log = logging.getLogger(__name__)


class LostWrites:
    """Whether a store lost writes to a failed fsync; shared by its queues. Thread-safe."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.happened = threading.Event()
        self._mutex = threading.Lock()

    def record(self, what: str, exc: OSError) -> None:
        """Record a failed fsync of ``what`` (the first one is the reason given from then on)."""
        with self._mutex:
            if self.reason is None:
                self.reason = f"an fsync of {what} failed ({exc.strerror or exc})"
                log.critical("%s: sends acknowledged since its previous fsync may be lost; the broker stores "
                             "nothing more and stops. Check the disk, then start it again", self.reason)
        self.happened.set()

    def check(self) -> None:
        """Refuse an append once writes were lost."""
        if self.reason is not None:
            raise BrokerUnavailableError(f"the broker stopped storing: {self.reason}; it stops for its disk to be "
                                         "checked. Send again once it is back")
