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
- only while the machine has a CPU to spare (``broker.wire.spare_cpu.SpareCpu``): a lone sender
  in the benchmark, after the broker suite, sent 3,100-4,300 messages/s asleep, 5,500-8,350
  polling;
- polls that keep ending with no answer (a broker far away, one that fsyncs every send) stop:
  one round trip in sixteen polls then (``MissedPolls``), to notice when answers come quickly
  again.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

from broker.wire.spare_cpu import SPARE_CPU, MissedPolls

__all__ = ["SENDING", "BusyPoll"]


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

    def __init__(self, limit_us: float, cpu_to_spare: Callable[[], bool] = SPARE_CPU) -> None:
        if limit_us < 0:
            raise ValueError(f"busy_poll_us must be 0 (never poll) or more, not {limit_us}")
        self.limit_s = limit_us / 1e6
        self.polls = self.answered = 0  # polls begun, and those that read an answer (counts, not locked)
        self._cpu_to_spare = cpu_to_spare
        self._misses = MissedPolls()

    def read(self, sock: socket.socket, buffer: bytearray) -> int:
        """What has arrived of the answer, read into ``buffer`` within the limit; 0 when nothing
        did (or no poll was due): the caller then sleeps in ``recv``."""
        if not self.limit_s or SENDING.count > 1 or not self._misses.due() or not self._cpu_to_spare():
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
                self._misses.missed()
                return 0
            if not read:
                raise ConnectionError("the broker closed the lean port connection")
            self._misses.found()
            self.answered += 1
            return read
