"""The client of a broker's lean send port (``broker.wire.frames``): one request, its answer.

A synchronous one-message send spends most of its time in gRPC's per-call work; the broker's send
port carries the same ``SendRequest`` / ``SendResponse`` over plain TCP instead. The port is
learned from ``Health`` (0: the broker serves none: TLS, access control or a broker group), asked
again a while after it was missing or failed. Each round trip runs on the caller's thread over a
connection of a small pool, so concurrent callers do not wait for each other.

A failure says whether the request may have reached the broker (``SendPortFailure.written``): the
sender then resends it over gRPC with the same producer id and sequence, stored at most once.
"""

from __future__ import annotations

import socket
import threading
import time

from broker.proto import orderlymq_pb2 as pb
from broker.wire.frames import HELLO_SIZE, LENGTH, VERSION, hello, parse_hello
from connector.client.connection import BrokerConnection

__all__ = ["SendPortClient", "SendPortFailure"]

_RETRY_AFTER_S = 5.0  # a missing or failing send port is looked up again after this long
_HEALTH_TIMEOUT_S = 2.0
_MAX_IDLE = 8  # connections kept for reuse


class SendPortFailure(Exception):
    """No answer from the send port; ``written``: the request may have reached the broker."""

    def __init__(self, why: str, written: bool) -> None:
        super().__init__(why)
        self.written = written


class _Link:
    """One connection; answers come in request order."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.timeout = timeout
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(hello())
        version = parse_hello(bytes(self._read(HELLO_SIZE)[:HELLO_SIZE]))
        if version != VERSION:
            self.sock.close()
            raise OSError(f"the broker's send port speaks version {version}, not {VERSION}")

    def _read(self, size: int) -> bytearray:
        """At least ``size`` bytes: one answer is outstanding at most, so never part of the next."""
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the broker closed the send port connection")
            data += chunk
        return data

    def round_trip(self, payload: bytes, timeout: float) -> bytes:
        if timeout < self.timeout or timeout > self.timeout + 1.0:  # a little early is fine, late is not
            self.sock.settimeout(timeout)
            self.timeout = timeout
        self.sock.sendall(LENGTH.pack(len(payload)) + payload)
        data = self._read(LENGTH.size)
        end = LENGTH.size + LENGTH.unpack_from(data)[0]
        if len(data) < end:
            data += self._read(end - len(data))
        return bytes(data[LENGTH.size:end])

    def close(self) -> None:
        self.sock.close()


class SendPortClient:
    """Round trips to the send port of ``connection``'s current broker; thread-safe."""

    def __init__(self, connection: BrokerConnection) -> None:
        self._conn = connection
        self._lock = threading.Lock()
        self._idle: list[_Link] = []
        self._address = ""  # the broker the port and the idle links belong to
        self._port = 0
        self._ask_at = 0.0  # monotonic time of the next Health lookup while the port is unknown

    def ready(self) -> bool:
        """Whether sends may go to the send port now (looks the port up when due)."""
        if self._conn.tls is not None:
            return False  # the send port is plaintext: never used by a TLS client
        address = self._conn.address
        if address == self._address and self._port:
            return True
        if address == self._address and time.monotonic() < self._ask_at:
            return False
        self._discover(address)
        return bool(self._port)

    def _discover(self, address: str) -> None:
        try:
            port = self._conn.call("Health", pb.HealthRequest(), timeout=_HEALTH_TIMEOUT_S, retry=False).send_port
        except Exception:  # noqa: BLE001 - any failure: gRPC serves the sends meanwhile
            port = 0
        with self._lock:
            self._drop_idle()
            self._address, self._port = address, port
            self._ask_at = time.monotonic() + _RETRY_AFTER_S

    def _drop_idle(self) -> None:
        for link in self._idle:
            link.close()
        self._idle.clear()

    def round_trip(self, request: pb.SendRequest, deadline: float) -> pb.SendResponse:
        """Send ``request`` and wait for its answer until ``deadline`` (``time.monotonic()``)."""
        payload = request.SerializeToString()
        with self._lock:
            link = self._idle.pop() if self._idle else None
            host, port = self._address.rpartition(":")[0], self._port
        if link is None:
            try:
                link = _Link(host, port, max(deadline - time.monotonic(), 0.001))
            except OSError as exc:
                self._failed()
                raise SendPortFailure(f"cannot reach the send port {host}:{port}: {exc}", written=False) from None
        try:
            answer = pb.SendResponse.FromString(link.round_trip(payload, max(deadline - time.monotonic(), 0.001)))
        except Exception as exc:  # noqa: BLE001 - the request may have been written: the caller resends it
            link.close()
            self._failed()
            raise SendPortFailure(f"send port {host}:{port}: {exc}", written=True) from None
        with self._lock:
            if len(self._idle) < _MAX_IDLE and port == self._port:
                self._idle.append(link)
                link = None
        if link is not None:
            link.close()
        return answer

    def _failed(self) -> None:
        """Back to gRPC for a while: the port is looked up again later."""
        with self._lock:
            self._port = 0
            self._ask_at = time.monotonic() + _RETRY_AFTER_S
            self._drop_idle()

    def close(self) -> None:
        with self._lock:
            self._port = 0
            self._drop_idle()
