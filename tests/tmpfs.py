"""A small tmpfs mounted for one test, and a ballast file that fills it: a real full disk.

Mounting needs root (``mount -t tmpfs``); where it is refused, the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["Ballast", "mounted_tmpfs", "open_fds"]


@contextlib.contextmanager
def mounted_tmpfs(path: Path, size_kib: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size_kib`` KiB on ``path`` (created) for the block; unmounted after."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


class Ballast:
    """A file that takes the free space of a file system, and gives it back on demand."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "ballast"

    def fill(self, leave_bytes: int = 0) -> int:
        """Grow the ballast until the file system is full (or only ``leave_bytes`` are left);
        returns the ballast's size."""
        chunk = b"\0" * 4096
        with open(self.path, "ab", buffering=0) as f:
            while True:
                st = os.statvfs(f.name)
                if leave_bytes and st.f_bavail * st.f_frsize <= leave_bytes:
                    break
                try:
                    if f.write(chunk) < len(chunk):
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
        return self.path.stat().st_size if self.path.exists() else 0

    def free(self, keep_bytes: int = 0) -> None:
        """Give back the space, all of it or all but ``keep_bytes``."""
        if self.path.exists():
            os.truncate(self.path, keep_bytes)


def open_fds(pid: int, under: Path | None = None) -> int:
    """How many file descriptors process ``pid`` holds (from /proc); only files below ``under`` if given."""
    fds = os.listdir(f"/proc/{pid}/fd")
    if under is None:
        return len(fds)
    targets = []
    for fd in fds:
        with contextlib.suppress(OSError):  # closed meanwhile
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return sum(t.startswith(f"{under}/") for t in targets)
