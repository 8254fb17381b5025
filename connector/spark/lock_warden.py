"""A helper process that releases a streaming query's queue locks when the reader process dies.

Spark runs the driver-side stream reader in a Python process that it stops with SIGTERM (and may
kill outright, or lose with the whole driver); a lock not released lingers until its lease ends
and keeps every other query of the group waiting. So the reader starts one warden per query, in
its own session (a signal to the driver's process group does not reach it). The reader tells it,
over a pipe, the epochs it holds (one JSON line per change) and, when it released the locks
itself, ``released``. When the pipe closes without ``released`` (the reader died), the warden
unlocks every queue that the client still holds at the epoch it was told, and exits. Checking
the epoch first means a lock taken again meanwhile (a restart of the query with the same client
id) is left alone. In a cluster each queue is asked of, and unlocked on, its broker group's master.

Run as ``main([brokers, group, client id])`` in a process of its own (``Warden`` starts it); TLS
and credentials come through its environment (``ConnectionSecurity``), never its command line.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from broker.wire.errors import OrderlyMQError
from connector.client.routed import RoutedConnection
from connector.spark.locks import describe_holder, unlock
from connector.spark.metadata import Connection
from connector.spark.offsets import QueueRef
from connector.spark.security import ConnectionSecurity

__all__ = ["Warden", "main"]

log = logging.getLogger(__name__)

RELEASED = "released"
# ``-c`` rather than ``-m``: the package imports this module, so ``-m`` would run a second copy.
# The warden waits for the pipe to close before importing anything: the client and pyspark cost
# 0.7 s of CPU to import, paid only when the reader died holding locks, not beside every query.
_ENTRY = (
    "import sys\n"
    "lines = sys.stdin.read().splitlines()\n"
    f"if {RELEASED!r} not in lines:\n"
    "    from connector.spark.lock_warden import main\n"
    "    sys.exit(main(sys.argv[1:], lines))\n"
)
_ROOT = Path(__file__).resolve().parents[2]
_UNLOCK_RETRY_S = 10.0  # a broker down longer than this frees the locks itself (they live in memory)


class Warden:
    """The reader's side of the warden: start it, tell it the held epochs, dismiss it."""

    def __init__(self, brokers: str, group: str, client_id: str,
                 security: ConnectionSecurity | None = None) -> None:
        env_path = [str(_ROOT)] + [p for p in sys.path if p]
        secured = security.environment() if security is not None else {}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _ENTRY, brokers, group, client_id],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=str(_ROOT), start_new_session=True,
            env={**os.environ, "PYTHONPATH": ":".join(env_path), **secured}, text=True,
        )

    @property
    def pid(self) -> int:
        return self._proc.pid

    def holds(self, epochs: Mapping[QueueRef, int]) -> None:
        """Tell the warden the epochs now held (all of them)."""
        self._send(json.dumps([[topic, queue_id, epoch] for (topic, queue_id), epoch in sorted(epochs.items())]))

    def dismiss(self) -> None:
        """The locks were released: the warden exits without unlocking anything."""
        self._send(RELEASED)
        self._close()

    def _send(self, line: str) -> None:
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except (OSError, ValueError):  # the warden is gone: nothing to tell it
            pass

    def _close(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass


def _watch(lines) -> dict[QueueRef, int] | None:
    """Read the reader's lines until the pipe closes; the epochs to unlock (None once released)."""
    held: dict[QueueRef, int] = {}
    for line in lines:
        line = line.strip()
        if line == RELEASED:
            return None
        if line:
            held = {(str(t), int(q)): int(e) for t, q, e in json.loads(line)}
    return held


def release_orphaned(conn: Connection, group: str, client_id: str, held: Mapping[QueueRef, int]) -> list:
    """Unlock the queues of ``held`` that ``client_id`` still holds at the same epoch; those unlocked."""
    stale = []
    for ref, epoch in sorted(held.items()):
        lock = describe_holder(conn, group, ref)
        if lock is not None and lock.client_id == client_id and lock.epoch == epoch:
            stale.append(ref)
    unlock(conn, group, client_id, stale)
    return stale


def main(argv: list[str] | None = None, lines: Iterable[str] | None = None) -> int:
    """Unlock what the reader held when it died; ``lines``: what it wrote (default: read stdin to its end)."""
    brokers, group, client_id = (argv if argv is not None else sys.argv[1:])[:3]
    held = _watch(sys.stdin if lines is None else lines)
    if not held:
        return 0
    try:
        security = ConnectionSecurity.from_environment()
        with RoutedConnection(brokers, timeout=5, retry_timeout=_UNLOCK_RETRY_S, **security.connect_kwargs()) as conn:
            released = release_orphaned(conn, group, client_id, held)
    except OrderlyMQError as exc:
        print(f"orderlymq lock warden: could not release the locks of {client_id!r}: {exc}", file=sys.stderr)
        return 1
    print(f"orderlymq lock warden: the reader of {client_id!r} died; released {released}", file=sys.stderr)
    return 0

