"""Keeping a sink task's transactions alive while the task waits for its rows.

A broker aborts an open transaction idle past its timeout (``txn_timeout_ms``, 60 s by default),
which is what frees the staged rows of a task that died. A task that lives but waits longer
than that for its input (upstream sorts or aggregates before its first row, or pauses between
rows) would lose its transaction the same way and fail at its next send, and so would every
retry. So while the task runs, a thread begins its transactions again (``BeginTxn`` of an open id
refreshes it) a few times per timeout; it stops when the task ends, and a task that dies stops
refreshing, so its transactions still end with the timeout.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from broker.wire.errors import OrderlyMQError

__all__ = ["KeepAlive"]

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUT_MS = 60_000  # brokers that do not say their timeout have this one by default
_REFRESHES_PER_TIMEOUT = 4
_LONGEST_INTERVAL_S = 15.0


class KeepAlive:
    """Calls ``refresh`` every quarter of ``timeout_ms()`` (at most every 15 s) until ``stop``."""

    def __init__(self, refresh: Callable[[], object], timeout_ms: Callable[[], int]) -> None:
        self._refresh = refresh
        self._timeout_ms = timeout_ms
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start refreshing (once; later calls do nothing)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="orderlymq-sink-keepalive", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop refreshing. A refresh under way may still end afterwards: it only resets the idle
        time of a transaction that is open (of a finished one it changes nothing)."""
        self._stopped.set()

    def _interval_s(self) -> float:
        timeout_ms = self._timeout_ms() or _DEFAULT_TIMEOUT_MS
        return min(timeout_ms / 1000 / _REFRESHES_PER_TIMEOUT, _LONGEST_INTERVAL_S)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s()):
            try:
                self._refresh()
            except OrderlyMQError as exc:  # the task's own next send reports what is wrong
                log.warning("could not refresh the task's transactions: %s", exc)
            except Exception:  # noqa: BLE001 - were this thread to end, the transactions would time out
                log.exception("refreshing the task's transactions failed unexpectedly; trying again")
