"""What the clients of a broker's lean port share (``broker.wire.frames``): learning the port,
bounding waits and writing parts; and, from ``broker.wire.frames`` (where a broker group's
replication shares them), opening a connection of one kind and checking the broker's hello."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Sequence

from broker.proto import orderlymq_pb2 as pb
from broker.wire.frames import WrongVersionError, check_hello, open_lean, read_exactly
from connector.client.connection import BrokerConnection

__all__ = ["WrongVersionError", "check_hello", "lean_port_of", "limit_receives", "limit_waits", "open_lean",
           "read_exactly", "write_parts"]

_HEALTH_TIMEOUT_S = 2.0
_IOV_MAX = os.sysconf("SC_IOV_MAX")  # the parts one sendmsg takes
_TIMEVAL = struct.Struct("@ll")  # struct timeval: seconds, microseconds


def lean_port_of(conn: BrokerConnection) -> int:
    """The lean port of ``conn``'s current broker, as its ``Health`` tells; 0 when it serves none
    (TLS, access control), does not answer, or ``conn`` uses TLS (the port is
    plaintext): gRPC serves the calls then."""
    if conn.tls is not None:
        return 0
    try:
        return conn.call("Health", pb.HealthRequest(), timeout=_HEALTH_TIMEOUT_S, retry=False).send_port
    except Exception:  # noqa: BLE001 - any failure: gRPC serves the calls meanwhile
        return 0


def limit_waits(sock: socket.socket, timeout: float) -> None:
    """Make ``sock`` blocking, with each send and receive ended by the kernel after ``timeout``
    seconds (``SO_SNDTIMEO``, ``SO_RCVTIMEO``; it then raises ``BlockingIOError``). A socket with
    Python's own timeout polls before each of them: two more system calls per round trip, each a
    hand-over of the GIL, which threads sending side by side wait for."""
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))
    limit_receives(sock, timeout)


def limit_receives(sock: socket.socket, timeout: float) -> None:
    """``limit_waits`` for receives alone: a long poll's answer may come its wait later."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))


def _timeval(timeout: float) -> bytes:
    seconds = int(timeout)
    return _TIMEVAL.pack(seconds, max(int((timeout - seconds) * 1e6), 0 if seconds else 1))  # 0: no limit


def write_parts(sock: socket.socket, parts: Sequence) -> None:
    """Write ``parts`` (bytes-like: bytes, Arrow buffers) one after the other, as few system calls
    as the socket takes, without joining them: a batch of megabytes is not copied on its way out."""
    views = [memoryview(part).cast("B") for part in parts if len(part)]
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first:first + _IOV_MAX])
        while sent:
            if sent < len(views[first]):
                views[first], sent = views[first][sent:], 0
            else:
                sent -= len(views[first])
                first += 1
