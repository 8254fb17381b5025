"""Run a broker as a child process (the "embedded" broker of the demo, benchmarks and tests).

``BrokerProcess(data_dir).start()`` returns once the broker serves, on an ephemeral loopback port
unless one is given; ``kill9()`` and ``start()`` again reuse the data dir and the port.

A restarted server takes its port back, which anything else on the machine may have taken while
it was down: the kernel hands its ephemeral ports to every ``bind`` of port 0 and every
``connect``. A test run whose workers start and stop servers side by side sets
``ORDERLYMQ_PORT_RANGE`` (``first-last``, below the kernel's ephemeral range) to a range of its
own for each worker: ``free_port`` then picks from it, and brokers are given a port from it, so
no other worker's server can answer a client in its place.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["PORT_RANGE_ENV", "BrokerProcess", "free_port"]

PORT_RANGE_ENV = "ORDERLYMQ_PORT_RANGE"
_ranges: dict[str, Iterator[int]] = {}  # each range's ports, in a cycle from a random one


def free_port() -> int:
    """A loopback port free now, for a child server whose port must be named before it starts: one
    of ``ORDERLYMQ_PORT_RANGE``'s when it is set (module docstring), else one the kernel picks."""
    spec = os.environ.get(PORT_RANGE_ENV)
    if not spec:
        return _bound_port(0)
    ports = _ranges.get(spec) or _ranges.setdefault(spec, _cycle(_port_range(spec)))
    for _ in _port_range(spec):
        with contextlib.suppress(OSError):
            return _bound_port(next(ports))
    raise RuntimeError(f"no free loopback port in {PORT_RANGE_ENV}={spec}")


def _port_range(spec: str) -> range:
    try:
        first, last = (int(part) for part in spec.split("-"))
    except ValueError:
        first = last = 0
    if not 0 < first <= last <= 65535:
        raise ValueError(f"{PORT_RANGE_ENV}={spec!r} is not a range of ports such as 20000-21499")
    return range(first, last + 1)


def _cycle(ports: range) -> Iterator[int]:
    start = random.randrange(len(ports))  # processes sharing a range (a test and its children) start apart
    return (ports[(start + i) % len(ports)] for i in itertools.count())


def _bound_port(port: int) -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(self, data_dir: str | Path, *args: str, port: int = 0, log_path: str | Path | None = None,
                 env: dict[str, str] | None = None, wrapper: Sequence[str] = ()) -> None:
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.port = port
        self.env = env  # added to the environment the broker process inherits
        self.wrapper = list(wrapper)  # a command the broker runs under (``prlimit --nofile=...``)
        self.proc: subprocess.Popen | None = None
        self.code_dir = Path(__file__).resolve().parent.parent  # where ``python -m broker`` runs from
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if not self.port and os.environ.get(PORT_RANGE_ENV):
            self.port = free_port()  # its restarts take it back (module docstring)
        port_file = self.data_dir / ".port"
        port_file.unlink(missing_ok=True)
        cmd = [*self.wrapper, sys.executable, "-m", "broker", "--data-dir", str(self.data_dir),
               "--port", str(self.port), "--port-file", str(port_file), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.code_dir,
                                         env=None if self.env is None else {**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with code {self.proc.returncode}:\n{self.log_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.kill9()
                raise TimeoutError(f"broker did not start within {timeout:.0f}s; see {self.log_path}")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.proc.returncode if self.proc else 0

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
