"""What the clients of a broker's lean port share (``broker.wire.frames``): opening a connection
of one kind (sends or pulls) and checking the broker's hello."""

from __future__ import annotations

import socket

from broker.wire.frames import HELLO_SIZE, SENDS, VERSION, hello, parse_hello

__all__ = ["WrongVersionError", "check_hello", "open_lean", "read_exactly"]


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


class WrongVersionError(OSError):
    pass


def read_exactly(sock: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        read = sock.recv_into(view[got:])
        if not read:
            raise ConnectionError("the broker closed the lean port connection")
        got += read
    return data
