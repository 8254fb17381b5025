"""Test helpers shared by the suites: a broker subprocess that can be killed, raw RPC helpers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa

from broker.wire import codec
from connector.client.connection import BrokerConnection, pb

ROOT = Path(__file__).resolve().parent.parent


class BrokerProcess:
    """``python -m broker`` in a subprocess on an ephemeral loopback port; ``kill9()`` and
    ``start()`` again on the same data dir (the port is kept across restarts)."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}-broker.log"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> BrokerProcess:
        port_file = self.data_dir.parent / f"{self.data_dir.name}.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "broker", "--data-dir", str(self.data_dir), "--port", str(self.port),
               "--port-file", str(port_file), *self.args]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("broker did not start")
            time.sleep(0.05)
        self.port = int(port_file.read_text())
        return self

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            return self.proc.wait(timeout=30)
        return self.proc.returncode if self.proc else 0

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def send_rows(conn: BrokerConnection, topic: str, queue_id: int, rows: list[dict], **fields) -> pb.SendResponse:
    """Send message dicts as one batch with a raw Send RPC."""
    batch = codec.encode(codec.messages_to_batch(rows))
    return conn.call("Send", pb.SendRequest(topic=topic, queue_id=queue_id, batch=batch, **fields))


def pull_all(conn: BrokerConnection, topic: str, queue_id: int, offset: int = 0, **fields):
    """Every message of a queue from ``offset`` as a pyarrow Table (raw Pull RPCs)."""
    tables = []
    while True:
        resp = conn.call("Pull", pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, **fields))
        if resp.batches:
            tables.append(codec.decode_many(resp.batches))
        offset = resp.next_offset
        if offset >= resp.max_offset:
            return pa.concat_tables(tables) if tables else codec.empty_stored_table()
