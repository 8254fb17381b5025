"""The lean port's framing (version 1): ``SendRequest`` / ``SendResponse``, ``PullRequest`` /
``PullResponse``, or a broker group's ``ReplicaFetch`` / ``ReplicaData``, over plain TCP.

A gRPC call costs about as much as storing a small message several times over, and gRPC's copies
and wake-ups cost a Spark task's pull of a megabyte batch more than the broker's reading of it, so
producers' sends, the Spark source's pulls and a group's replication may use a lean port instead
(docs/client.md). The connection opens with a hello each way, ``HELLO`` + version (u16) + what the
connection carries (u16: ``SENDS``, ``PULLS`` or ``REPLICAS``); the broker answers with the version
it speaks and echoes what the connection carries, and a client that gets another version, or
another kind (a broker that only takes sends answers ``SENDS``), closes the connection. Then each
request is a frame, u32 length (little endian) + a serialized request, and each answer a frame
holding the response, in request order, with the failure of a request in its ``error_*`` fields
like a ``SendStream`` answer. A frame longer than the broker's limit gets an error answer and the
connection closes.
"""

from __future__ import annotations

import socket
import struct

__all__ = ["HELLO", "HELLO_SIZE", "LENGTH", "PULLS", "REPLICAS", "SENDS", "VERSION", "WrongVersionError",
           "check_hello", "hello", "open_lean", "parse_hello", "read_exactly"]

HELLO = b"OMQS"
VERSION = 1
SENDS, PULLS, REPLICAS = 0, 1, 2  # what a connection carries, named in its hello
LENGTH = struct.Struct("<I")
_HELLO = struct.Struct("<4sHH")
HELLO_SIZE = _HELLO.size


def hello(version: int = VERSION, carries: int = SENDS) -> bytes:
    return _HELLO.pack(HELLO, version, carries)


def parse_hello(raw: bytes) -> tuple[int, int] | None:
    """(version, what the connection carries) of a hello; None when ``raw`` is not a hello."""
    magic, version, carries = _HELLO.unpack(raw)
    return (version, carries) if magic == HELLO else None


def read_exactly(sock: socket.socket, size: int) -> bytearray:
    """``size`` bytes from a blocking socket; ``ConnectionError`` when the other side closed it first."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        read = sock.recv_into(view[got:])
        if not read:
            raise ConnectionError("the lean port connection was closed")
        got += read
    return data


class WrongVersionError(OSError):
    pass


def open_lean(host: str, port: int, timeout: float, carries: int = SENDS) -> socket.socket:
    """A connection to the lean port, our hello sent."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(hello(VERSION, carries))
    except BaseException:
        sock.close()
        raise
    return sock


def check_hello(sock: socket.socket, carries: int = SENDS) -> None:
    """Read the broker's hello; ``WrongVersionError`` unless it speaks our version and takes ``carries``."""
    greeting = parse_hello(bytes(read_exactly(sock, HELLO_SIZE)))
    if greeting != (VERSION, carries):
        raise WrongVersionError(f"the broker's lean port answered the hello {greeting} (version, kind), not "
                                f"{(VERSION, carries)}: a broker of another version")
