"""A small SQLite database for the broker's keyed state (committed offsets, fencing epochs).

Each change is one SQLite transaction on a write-ahead log (WAL) with ``synchronous=FULL``: the
WAL is fsynced before the commit returns, so a change is durable on return and a crash leaves the
old or the new state, never a mix. A change costs a B-tree update and one fsync whatever the size
of the table; a JSON file rewritten per change cost a full copy of the table instead.

The WAL is checkpointed into the database every ``_CHECKPOINT_PAGES`` pages and trimmed back to
``_WAL_LIMIT_BYTES``, so the files stay small. After a checkpoint the WAL is written again from its
start, reusing space already allocated: most changes keep working on a full disk, and those that
need more space fail with ``DiskFullError`` and change nothing.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from broker.persist import disk_full_error
from broker.wire.errors import InternalBrokerError

__all__ = ["StateDB"]

_CHECKPOINT_PAGES = 256
_WAL_LIMIT_BYTES = 1 << 20
_FULL = (sqlite3.SQLITE_FULL,)


class StateDB:
    """One SQLite file holding tables created by ``schema`` (idempotent DDL).

    Parameters
    ----------
    path : Path
        The database file; its directory is created if missing.
    schema : str
        ``CREATE TABLE IF NOT EXISTS ...`` statements run at open.
    what : str
        What the database holds, for error messages ("committed offsets").
    sync : bool, default True
        False sets ``synchronous=NORMAL`` (durable against a process crash, not a power loss).

    Notes
    -----
    Not thread-safe by itself: callers hold their own mutex around every call.
    """

    def __init__(self, path: Path, schema: str, what: str, *, sync: bool = True) -> None:
        self.path = Path(path)
        self.what = what
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._errors("open"):
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            with self._errors("open"):
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute(f"PRAGMA synchronous={'FULL' if sync else 'NORMAL'}")
                self._conn.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_PAGES}")
                self._conn.execute(f"PRAGMA journal_size_limit={_WAL_LIMIT_BYTES}")
                self._conn.executescript(
                    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);" + schema)
        except BaseException:
            self._conn.close()
            raise

    @contextlib.contextmanager
    def transaction(self, action: str) -> Iterator[sqlite3.Connection]:
        """A write transaction: committed (durably) at the end of the block, rolled back if it
        raises. ``action`` says what the change does, for the error message."""
        with self._errors(action):
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """Every row a query returns."""
        with self._errors("read"):
            return self._conn.execute(sql, params).fetchall()

    def meta(self, name: str) -> str | None:
        found = self.rows("SELECT value FROM meta WHERE name = ?", (name,))
        return found[0][0] if found else None

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.close()

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """SQLite's errors as the broker's: a full disk is a ``DiskFullError``, anything else an
        ``InternalBrokerError`` naming the file."""
        try:
            yield
        except sqlite3.Error as exc:
            if getattr(exc, "sqlite_errorcode", None) in _FULL:
                raise disk_full_error(self.path.parent, f"{action} ({self.what} in {self.path.name})") from exc
            raise InternalBrokerError(
                f"{self.what} database {self.path} failed to {action}: {exc}; if the file is damaged, restore it "
                "from a backup or move it away to start that state from empty"
            ) from exc
