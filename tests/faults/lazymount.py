"""A handle on one ``tests/faults/lazyfs.py`` mount: start it, cut its power, unmount, mount again.

``LazyMount(root).mount()`` serves ``root/mnt`` from ``root/backing``; ``power_cut(pid)`` kills the
writer process with SIGKILL, drops every change not fsynced and unmounts; ``mount()`` again then shows only what survived, as a machine would after a reboot.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["LazyMount", "fuse_missing"]

_FS = Path(__file__).with_name("lazyfs.py")


def fuse_missing() -> str | None:
    """Why a FUSE mount cannot work here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing: install Debian's fuse3 (make test does)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:  # OSError: libfuse3.so missing
        return f"mfusepy cannot load libfuse ({exc}): pip install '.[test]' and Debian's libfuse3-3"
    return None


class LazyMount:
    """The lazy file system of ``root/backing``, mounted on ``root/mnt``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.backing, self.mountpoint = self.root / "backing", self.root / "mnt"
        self.control = str(self.root / "lazyfs.sock")
        self.log_path = self.root / "lazyfs.log"
        self.proc: subprocess.Popen | None = None

    def mount(self, timeout: float = 30.0) -> LazyMount:
        """Mount and return once the file system answers on its control socket."""
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, str(_FS), str(self.backing), str(self.mountpoint),
                                          self.control], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"lazyfs exited with code {self.proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.unmount()
                raise TimeoutError(f"lazyfs did not mount {self.mountpoint} within {timeout:.0f}s: {self._log_tail()}")
            time.sleep(0.05)
        return self

    def _answers(self) -> bool:
        try:
            return self.command("ping") == "ok" and os.path.ismount(self.mountpoint)
        except OSError:
            return False

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""

    def command(self, line: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            sock.connect(self.control)
            sock.sendall(line.encode() + b"\n")
            return sock.makefile("r").readline().strip()

    def stats(self) -> dict:
        return json.loads(self.command("stats"))

    def fail_fsyncs(self, count: int, *, directories: bool = False) -> None:
        """The next ``count`` fsyncs of files fail with EIO, losing what they were to write (of
        directories, with ``directories``: failing to make their entries durable)."""
        assert self.command(f"fail-{'dir-' if directories else ''}fsync {count}") == "ok"

    def power_cut(self, *pids: int) -> dict:
        """Cut the power: the processes ``pids`` are killed with SIGKILL in the same instant,
        every un-fsynced change is forgotten, and the file system is unmounted. Returns what was
        dropped (dirty files, pages, directories). The caller reaps its killed children."""
        try:
            return json.loads(self.command(" ".join(["cut", *map(str, pids)])))
        finally:
            self.unmount()

    def unmount(self, timeout: float = 30.0) -> None:
        """Detach the mount (lazily: nothing may block it) and wait for the file system to exit."""
        subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True, check=False)
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def fsync_dir(self, path: Path) -> None:
        """fsync a directory on the mount (makes its entries durable)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
