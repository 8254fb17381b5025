"""Pulls over a broker's lean port (``broker.pull_port``), for readers that pull megabyte batches
back to back: the Spark source's tasks.

Over gRPC, receiving a 1.5 MB pull costs the reader about as much CPU as the broker spends reading
and encoding it, in copies and wake-ups. ``PullLink`` carries the same ``PullRequest`` and
``PullResponse`` over one plain TCP connection: ``issue`` writes a request without waiting,
``receive`` reads the next answer (answers come in request order) and raises the failure it names
as the gRPC call would. Anything wrong with the connection itself raises ``PullPortFailure``:
the reader then pulls over gRPC (a pull is safe to repeat).
"""

from __future__ import annotations

import socket

from broker.proto import orderlymq_pb2 as pb
from broker.wire.errors import InternalBrokerError
from broker.wire.frames import LENGTH, PULLS
from broker.wire.pull_response import PullReply, decode_pull_response
from connector.client.connection import BrokerConnection
from connector.client.lean_port import check_hello, lean_port_of, limit_waits, open_lean, read_exactly

__all__ = ["PullLink", "PullPortFailure", "open_pull_link"]


class PullPortFailure(OSError):
    """The pull port connection failed (closed, timed out, unreadable): pull over gRPC instead."""


def open_pull_link(conn: BrokerConnection) -> PullLink | None:
    """A pull connection to the lean port of ``conn``'s broker; None when it serves none (TLS,
    access control) or cannot be reached: then pulls go over gRPC. In a broker group only the
    master answers pulls there (a slave answers ``NotMasterError``)."""
    port = lean_port_of(conn)
    if not port:
        return None
    try:
        return PullLink(conn.address.rpartition(":")[0], port, conn.timeout)
    except OSError:
        return None


class PullLink:
    """One pull connection; ``timeout`` bounds each wait for the broker (the reader's poll timeout)."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self._sock = open_lean(host, port, timeout, PULLS)
        self._timeout = timeout
        try:
            check_hello(self._sock, PULLS)
            limit_waits(self._sock, timeout)
        except BaseException:
            self._sock.close()
            raise

    def issue(self, request: pb.PullRequest) -> None:
        payload = request.SerializeToString()
        try:
            self._sock.sendall(LENGTH.pack(len(payload)) + payload)
        except OSError as exc:
            raise PullPortFailure(f"writing a pull failed: {exc}") from None

    def receive(self) -> PullReply:
        """The answer to the oldest pull issued; the error it names raised as an ``OrderlyMQError``."""
        try:
            reply = decode_pull_response(self._frame())
        except InternalBrokerError as exc:
            raise PullPortFailure(f"reading a pull's answer failed: {exc}") from None
        reply.raise_error()
        return reply

    def skip(self) -> None:
        """Read past the answer to the oldest pull issued, which is no longer wanted."""
        self._frame()

    def _frame(self) -> bytearray:
        try:
            (size,) = LENGTH.unpack(read_exactly(self._sock, LENGTH.size))
            return read_exactly(self._sock, size)
        except BlockingIOError:  # the kernel's timeout (limit_waits)
            raise PullPortFailure(f"the broker did not answer a pull within {self._timeout:.3g} s") from None
        except OSError as exc:
            raise PullPortFailure(f"reading a pull's answer failed: {exc}") from None

    def idle_and_open(self) -> bool:
        """Whether the broker still holds this idle link open: a broker that stopped has closed it."""
        timeout = self._sock.gettimeout()
        self._sock.settimeout(0)  # a peek, never a wait
        try:
            self._sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True  # nothing to read: open, and no answer pending
        except OSError:
            return False
        finally:
            self._sock.settimeout(timeout)
        return False  # closed, or bytes no pull asked for

    def close(self) -> None:
        self._sock.close()
