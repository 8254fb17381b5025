"""One broker per data directory.

Two brokers on one data directory (a restart script that starts the new one before the old one has
exited, a second broker started with the same config on another port) would each append at the
end of the segments as they know it, overwriting each other's acknowledged records, and each
recovery would cut what the other is writing. So a broker holds an exclusive ``flock`` on
``<data dir>/broker.lock`` from before it reads anything until it has closed everything; a second
one fails to start, naming the holder. The kernel drops the lock when the holder exits, however it
exits (kill -9 included), so a stale lock file never blocks a start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from broker.persist import make_durable_dir

__all__ = ["DataDirInUseError", "DataDirLock"]

LOCK_FILE = "broker.lock"


class DataDirInUseError(OSError):
    """Another process holds the data directory."""


class DataDirLock:
    """The exclusive lock of ``data_dir`` (created if missing), held until ``release``."""

    def __init__(self, data_dir: Path) -> None:
        make_durable_dir(data_dir)
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder()
            self.release()
            raise DataDirInUseError(
                f"data dir {data_dir} is in use by another broker{holder}: two brokers on one data dir would "
                "overwrite each other's messages. Stop that broker first, or give this one another data_dir"
            ) from None
        # The pid only names the holder to a refused broker; a full disk may refuse to store it.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def _holder(self) -> str:
        try:
            pid = os.pread(self._fd, 32, 0).decode().strip()
        except (OSError, UnicodeDecodeError):
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""

    def release(self) -> None:
        """Let another broker open the data directory (the file stays: removing it would race a new holder)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
