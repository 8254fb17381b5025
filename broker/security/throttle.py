"""Failed authentications slow the next ones down, so secrets cannot be guessed at RPC speed.

Counted per (caller's host, access key): after ``FREE_FAILURES`` wrong secrets in a row, that
key's secrets from that host are refused unchecked (no scrypt) for a pause that doubles with
each further failure, from ``FIRST_PAUSE_S`` up to ``MAX_PAUSE_S``; a right secret clears the
count. Access keys not in the ACL file count together per host (``UNKNOWN_KEYS``), so names
cannot be guessed at RPC speed either. Credentials already verified are recognised without a
check, so clients that connected before a guessing run keep working, and other hosts and keys
are not slowed down. Attempts that arrive together before the first failures are counted are
each checked (at most the broker's worker threads at once).
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FIRST_PAUSE_S", "FREE_FAILURES", "MAX_PAUSE_S", "UNKNOWN_KEYS", "FailureThrottle", "peer_host"]

FREE_FAILURES = 5
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 60.0
#: The count of a host's access keys that are not in the ACL file (not a valid access key itself).
UNKNOWN_KEYS = " unknown"
_FORGET_AFTER_S = 15 * 60.0  # a count untouched this long starts over
_MEMORY_LIMIT = 10_000  # (host, key) pairs remembered; the oldest are forgotten beyond it


def peer_host(peer: str) -> str:
    """The host of a gRPC peer (``ipv4:10.0.0.1:5555`` -> ``10.0.0.1``): its port changes with
    every connection, the host does not."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return urllib.parse.unquote(rest.rpartition(":")[0]) or rest
    return peer


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    paused_until: float = 0.0


class FailureThrottle:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[tuple[str, str], _Failures] = {}

    def pause_left(self, host: str, key: str) -> float:
        """Seconds before a secret of ``key`` from ``host`` may be checked again (0: now)."""
        with self._lock:
            failures = self._failures.get((host, key))
            return max(0.0, failures.paused_until - self._clock()) if failures else 0.0

    def failed(self, host: str, key: str) -> None:
        now = self._clock()
        with self._lock:
            failures = self._failures.pop((host, key), None)
            if failures is None or now - failures.last > _FORGET_AFTER_S:
                failures = _Failures()
            failures.count += 1
            failures.last = now
            if failures.count >= FREE_FAILURES:
                failures.paused_until = now + min(MAX_PAUSE_S, FIRST_PAUSE_S * 2 ** (failures.count - FREE_FAILURES))
            self._failures[(host, key)] = failures  # re-inserted: the dict stays oldest first
            while len(self._failures) > _MEMORY_LIMIT:
                del self._failures[next(iter(self._failures))]

    def succeeded(self, host: str, key: str) -> None:
        with self._lock:
            self._failures.pop((host, key), None)
