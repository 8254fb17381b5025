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
import threading
import time

from broker.proto import orderlymq_pb2 as pb
from broker.wire.errors import InternalBrokerError
from broker.wire.frames import LENGTH, PULLS
from broker.wire.pull_response import PullReply, decode_pull_response
from connector.client.connection import BrokerConnection
from connector.client.lean_port import check_hello, lean_port_of, limit_receives, limit_waits, open_lean, read_exactly

__all__ = ["PullLink", "PullLinkPool", "PullPortFailure", "open_pull_link"]


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
        return PullLink(conn.address.rpartition(":")[0], port, conn.timeout, conn.address)
    except OSError:
        return None


class PullLink:
    """One pull connection; ``timeout`` bounds each wait for the broker (the reader's poll timeout)."""

    def __init__(self, host: str, port: int, timeout: float, address: str = "") -> None:
        self.address = address  # the gRPC address of the broker it reaches
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

    def receive(self, wait_s: float = 0.0) -> PullReply:
        """The answer to the oldest pull issued; the error it names raised as an ``OrderlyMQError``.
        ``wait_s``: how long that pull may long-poll (its ``wait_ms``), waited for beyond the timeout."""
        wait_s = max(wait_s, 0.0)  # a negative wait is the broker's to refuse
        if wait_s:
            limit_receives(self._sock, self._timeout + wait_s)
        try:
            reply = decode_pull_response(self._frame(self._timeout + wait_s))
        except InternalBrokerError as exc:
            raise PullPortFailure(f"reading a pull's answer failed: {exc}") from None
        finally:
            if wait_s:
                limit_receives(self._sock, self._timeout)
        reply.raise_error()
        return reply

    def skip(self) -> None:
        """Read past the answer to the oldest pull issued, which is no longer wanted."""
        self._frame(self._timeout)

    def _frame(self, timeout: float) -> bytearray:
        try:
            (size,) = LENGTH.unpack(read_exactly(self._sock, LENGTH.size))
            return read_exactly(self._sock, size)
        except BlockingIOError:  # the kernel's timeout (limit_waits)
            raise PullPortFailure(f"the broker did not answer a pull within {timeout:.3g} s") from None
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


LINK_RETRY_S = 5.0  # a broker that served no lean port, or whose link failed, is asked again after this long


class PullLinkPool:
    """A client's idle pull links, per broker connection (a group's, which follows its master),
    leased for one pull or one pass over queues and handed back when no answer is left unread.

    A lease with no idle link opens a new one: threads pulling at once each get their own. Where
    none could be opened (no lean port: TLS, access control; or the broker is down) or a leased one
    failed (``discard``), none is opened for ``LINK_RETRY_S``, unless the connection moved to
    another broker meanwhile (a group's new master). Thread-safe.
    """

    def __init__(self, max_idle: int = 4) -> None:
        self._max_idle = max_idle
        self._idle: dict[BrokerConnection, list[tuple[str, PullLink]]] = {}  # (address it reaches, link)
        self._failed: dict[BrokerConnection, tuple[float, str]] = {}  # the last failure: when, at which address
        self._lock = threading.Lock()

    def lease(self, conn: BrokerConnection) -> PullLink | None:
        while True:
            with self._lock:
                idle = self._idle.get(conn)
                address, link = idle.pop() if idle else ("", None)
                if link is None:
                    failed_at, failed_address = self._failed.get(conn, (-LINK_RETRY_S, ""))
                    if time.monotonic() - failed_at < LINK_RETRY_S and conn.address == failed_address:
                        return None
            if link is None:
                address = conn.address
                link = open_pull_link(conn)
                if link is None:
                    with self._lock:
                        self._failed[conn] = (time.monotonic(), address)
                return link
            if address == conn.address and link.idle_and_open():
                return link
            link.close()  # its broker stopped or restarted, or is no longer the group's master

    def give_back(self, conn: BrokerConnection, link: PullLink) -> None:
        """Keep ``link``, leased for ``conn`` (no answer left unread on it)."""
        with self._lock:
            idle = self._idle.setdefault(conn, [])
            if len(idle) < self._max_idle:
                idle.append((link.address, link))
                return
        link.close()

    def discard(self, conn: BrokerConnection, link: PullLink) -> None:
        """Close ``link``, leased for ``conn``, which failed or reached a group's slave."""
        link.close()
        with self._lock:
            self._failed[conn] = (time.monotonic(), link.address)

    def close(self) -> None:
        with self._lock:
            links = [link for idle in self._idle.values() for _, link in idle]
            self._idle.clear()
        for link in links:
            link.close()
