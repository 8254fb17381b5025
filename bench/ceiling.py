"""The transport ceiling: a gRPC server whose handler does nothing with the bytes it receives.

``python -m bench.ceiling --port-file F`` serves ``/bench.Ceiling/Push`` (unary: bytes in, 8 bytes
out) on 127.0.0.1 in its own process, like the broker, so both are measured the same way.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from connector.client.connection import CHANNEL_OPTIONS

PUSH = "/bench.Ceiling/Push"
OPTIONS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]


def serve(port_file: Path) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=OPTIONS)
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: b"\x00" * 8)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Ceiling", {"Push": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_file.write_text(str(port))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: done.set())
    done.wait()
    server.stop(0)


class CeilingProcess:
    """The ceiling server in a child process."""

    def __init__(self, workdir: Path) -> None:
        self.port_file = workdir / "ceiling.port"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def __enter__(self) -> CeilingProcess:
        self.port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.ceiling", "--port-file", str(self.port_file)],
                                     cwd=Path(__file__).resolve().parent.parent)
        while not self.port_file.exists():
            if self.proc.poll() is not None:
                raise RuntimeError("ceiling server failed to start")
            time.sleep(0.05)
        time.sleep(0.05)
        self.port = int(self.port_file.read_text())
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


def ceiling_channel(address: str) -> grpc.Channel:
    """A client channel configured like ``BrokerConnection``'s, so both sides of a comparison
    pay the same client costs (gRPC's own retry buffering off, for one)."""
    return grpc.insecure_channel(address, options=CHANNEL_OPTIONS)


def push_callable(channel: grpc.Channel):
    return channel.unary_unary(PUSH, request_serializer=None, response_deserializer=None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port-file", type=Path, required=True)
    serve(parser.parse_args().port_file)
