"""The client of a broker's lean send port (``broker.wire.frames``).

A synchronous one-message send spends most of its time in gRPC's per-call work; the broker's send
port carries the same ``SendRequest`` / ``SendResponse`` over plain TCP instead. The port is
learned from ``Health`` (0: the broker serves none: TLS or access control), asked
again a while after it was missing or failed. Each round trip runs on the caller's thread over a
connection of a small pool, so concurrent callers do not wait for each other.

A round trip may poll the connection for its answer for a moment before it sleeps in ``recv``
(``connector.client.busy_poll``).

A failure says whether the request may have reached the broker (``SendPortFailure.written``): the
sender then resends it over gRPC with the same producer id and sequence, stored at most once.

``PortStream`` carries a pipelining producer's batches the same way: what a ``SendStream`` call
does, answers in request order, for half the broker's CPU of a gRPC stream per 175 KB batch.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence

from google.protobuf.message import DecodeError

from broker.proto import orderlymq_pb2 as pb
from broker.wire.errors import BrokerUnavailableError
from broker.wire.frames import LENGTH
from broker.wire.send_request import EncodedSend, serialize_send
from connector.client.busy_poll import BusyPoll
from connector.client.connection import BrokerConnection
from connector.client.lean_port import (
    WrongVersionError,
    check_hello,
    lean_port_of,
    limit_waits,
    open_lean,
    write_parts,
)

__all__ = ["PortStream", "SendPortClient", "SendPortFailure"]

_RETRY_AFTER_S = 5.0  # a missing or failing send port is looked up again after this long
# A request unanswered this long means the connection went silent (the broker's host gone, a
# firewall dropping it: no close, no reset), as a gRPC connection's unanswered ping does; a
# broker merely slow costs a new connection and a resend, which it stores once.
_ANSWER_TIMEOUT_S = 15.0
_POLL_MS = 1000  # how often a stream waiting for an answer looks at the clock
_MAX_IDLE = 8  # connections kept for reuse
_JOINED_BYTES = 64 * 1024  # a request up to this size is joined into one write; bigger ones are not copied
_ANSWER_BUFFER_BYTES = 4096  # what a connection reads answers into (a bigger answer gets a bigger one)
_STREAM_READ_BYTES = 64 * 1024  # a stream reads its answers in bursts of up to this much


class SendPortFailure(Exception):
    """No answer from the send port; ``written``: the request may have reached the broker."""

    def __init__(self, why: str, written: bool) -> None:
        super().__init__(why)
        self.written = written


class _Link:
    """One connection; answers come in request order."""

    def __init__(self, host: str, port: int, timeout: float, busy_poll: BusyPoll | None = None) -> None:
        self.busy_poll = busy_poll or BusyPoll(0)
        self.sock = open_lean(host, port, timeout)
        self._buffer = bytearray(_ANSWER_BUFFER_BYTES)
        try:
            check_hello(self.sock)
            limit_waits(self.sock, timeout)
        except BaseException:
            self.sock.close()
            raise
        self.timeout = timeout
        self._readable = select.poll()  # nothing is due to arrive between round trips: a look at it
        self._readable.register(self.sock, select.POLLIN)

    def round_trip(self, parts: Sequence, timeout: float) -> bytes:
        """Send the request whose bytes are ``parts`` joined, and return its answer."""
        timeout = min(timeout, _ANSWER_TIMEOUT_S)
        if timeout < self.timeout or timeout > self.timeout + 1.0:  # a little early is fine, late is not
            limit_waits(self.sock, timeout)
            self.timeout = timeout
        try:
            return self._round_trip(parts)
        except BlockingIOError:  # what a blocking socket's kernel timeout raises
            raise TimeoutError(f"the broker did not take or answer the request within {self.timeout:.3g} s") from None

    def _round_trip(self, parts: Sequence) -> bytes:
        size = sum(len(part) for part in parts)
        if size <= _JOINED_BYTES:  # a one-message send: copied once into one write
            self.sock.sendall(b"".join([LENGTH.pack(size), *parts]))
        else:
            write_parts(self.sock, [LENGTH.pack(size), *parts])
        return self._answer()

    def _answer(self) -> bytes:
        """The next answer: one is outstanding at most, so what arrives is never part of the next."""
        buffer = self._buffer
        got = self.busy_poll.read(self.sock, buffer)
        while got < LENGTH.size:
            got += self._receive(buffer, got)
        end = LENGTH.size + LENGTH.unpack_from(buffer)[0]
        if end > len(buffer):  # bigger than the kept buffer (a long error message): one of its own
            buffer = buffer[:got] + bytearray(end - got)
        while got < end:
            got += self._receive(buffer, got)
        with memoryview(buffer) as view:
            return bytes(view[LENGTH.size:end])

    def _receive(self, buffer: bytearray, at: int) -> int:
        with memoryview(buffer) as view:
            read = self.sock.recv_into(view[at:])
        if not read:
            raise ConnectionError("the broker closed the lean port connection")
        return read

    def open(self) -> bool:
        """Whether the broker still holds this idle link open: one that stopped or restarted has
        closed it, which makes it readable (between round trips nothing is due to arrive)."""
        return not self._readable.poll(0)

    def close(self) -> None:
        self.sock.close()


class SendPortClient:
    """Round trips to the send port of ``connection``'s current broker, each polling for its answer
    for up to ``busy_poll_us`` (``BusyPoll``); thread-safe."""

    def __init__(self, connection: BrokerConnection, busy_poll_us: float = 0) -> None:
        self._conn = connection
        self._poll = BusyPoll(busy_poll_us)
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
            if self._idle_open():
                return True
        elif address == self._address and time.monotonic() < self._ask_at:
            return False
        self._discover(address)
        return bool(self._port)

    def _idle_open(self) -> bool:
        """Whether the idle link a round trip takes next is still open. A broker that stopped or
        restarted (maybe with another port, maybe another broker at the address) closed it: the
        port is then looked up again, rather than a request failing over it and leaving the port
        unused for ``_RETRY_AFTER_S``."""
        with self._lock:
            return not self._idle or self._idle[-1].open()

    def _discover(self, address: str) -> None:
        port = lean_port_of(self._conn)
        with self._lock:
            self._drop_idle()
            self._address, self._port = address, port
            self._ask_at = time.monotonic() + _RETRY_AFTER_S

    def _drop_idle(self) -> None:
        for link in self._idle:
            link.close()
        self._idle.clear()

    def round_trip(self, request: pb.SendRequest | Sequence, deadline: float) -> pb.SendResponse:
        """Send ``request`` (or the parts of one serialized, ``send_request_parts``) and wait for its
        answer until ``deadline`` (``time.monotonic()``)."""
        parts = [request.SerializeToString()] if isinstance(request, pb.SendRequest) else request
        with self._lock:
            link = self._idle.pop() if self._idle else None
            host, port = self._address.rpartition(":")[0], self._port
        if link is None:
            try:
                link = _Link(host, port, max(deadline - time.monotonic(), 0.001), self._poll)
            except OSError as exc:
                self.failed()
                raise SendPortFailure(f"cannot reach the send port {host}:{port}: {exc}", written=False) from None
        try:
            answer = pb.SendResponse.FromString(link.round_trip(parts, max(deadline - time.monotonic(), 0.001)))
        except Exception as exc:  # noqa: BLE001 - the request may have been written: the caller resends it
            link.close()
            self.failed()
            raise SendPortFailure(f"send port {host}:{port}: {exc}", written=True) from None
        with self._lock:
            if len(self._idle) < _MAX_IDLE and port == self._port:
                self._idle.append(link)
                link = None
        if link is not None:
            link.close()
        return answer

    def address(self) -> tuple[str, int] | None:
        """Where the port of the current broker listens, when sends may go there now."""
        if not self.ready():
            return None
        with self._lock:
            return (self._address.rpartition(":")[0], self._port) if self._port else None

    def failed(self) -> None:
        """Back to gRPC for a while: the port is looked up again later."""
        with self._lock:
            self._port = 0
            self._ask_at = time.monotonic() + _RETRY_AFTER_S
            self._drop_idle()

    def close(self) -> None:
        with self._lock:
            self._port = 0
            self._drop_idle()


class PortStream:
    """A ``SendStream`` over the send port, with the interface the pipelined sender uses of a
    gRPC stream call: its answers in request order by iterating it, ``cancel()`` to end it.

    Once connected, ``start`` has a thread write the requests as they come, without waiting for
    the broker's hello (a frozen broker's kernel takes them: written, as on a gRPC stream);
    iterating checks that hello, then reads the answers. A broken connection (or a cancelled
    stream, or requests left unanswered for ``_ANSWER_TIMEOUT_S``) ends the iteration with
    ``BrokerUnavailableError``, as an unavailable broker ends a gRPC stream: the sender then resends
    what was not answered. A port of another version is reported to ``client``, so that the next
    streams are gRPC ones.
    """

    def __init__(self, client: SendPortClient, host: str, port: int, connect_timeout: float) -> None:
        self._client = client
        self._where = f"{host}:{port}"
        self._sock = open_lean(host, port, connect_timeout)
        self._sock.settimeout(None)  # waits end by cancel(): the sender's watchdog owns the timeouts
        self._broken: str | None = None
        self._requests_ended = False
        self._written = self._answered = 0
        self._progress_at = time.monotonic()  # the last answer, or the first request waited for since

    def start(self, requests: Iterator[pb.SendRequest | EncodedSend]) -> PortStream:
        threading.Thread(target=self._write, args=(requests,), name="orderlymq-send-port-stream", daemon=True).start()
        return self

    def _write(self, requests: Iterator[pb.SendRequest | EncodedSend]) -> None:
        try:
            for request in requests:
                wire = serialize_send(request)
                if self._written == self._answered:
                    self._progress_at = time.monotonic()
                self._written += 1
                write_parts(self._sock, [LENGTH.pack(len(wire)), wire])
            self._requests_ended = True
            self._sock.shutdown(socket.SHUT_WR)  # the broker answers what it has, then closes
        except OSError as exc:
            self._break(f"writing failed: {exc}")

    def __iter__(self) -> Iterator[pb.SendResponse]:
        try:
            readable = select.poll()
            readable.register(self._sock, select.POLLIN)
            self._await_answer(readable)
            check_hello(self._sock)
            buffer = bytearray(_STREAM_READ_BYTES)
            start = end = 0  # the bytes read and not yet parsed: buffer[start:end]
            while True:
                if end - start >= LENGTH.size:
                    (size,) = LENGTH.unpack_from(buffer, start)
                    if end - start >= LENGTH.size + size:  # a whole answer
                        body = bytes(buffer[start + LENGTH.size:start + LENGTH.size + size])
                        start += LENGTH.size + size
                        self._answered += 1
                        self._progress_at = time.monotonic()
                        yield pb.SendResponse.FromString(body)
                        continue
                    if LENGTH.size + size > len(buffer):  # a long answer (an error's message): room for it
                        buffer.extend(bytes(LENGTH.size + size - len(buffer)))
                if start == end or end == len(buffer):  # nothing left to parse, or no room after it
                    buffer[:end - start] = buffer[start:end]
                    start, end = 0, end - start
                self._await_answer(readable)
                with memoryview(buffer) as view:
                    read = self._sock.recv_into(view[end:])
                if not read:
                    if start == end and self._requests_ended and self._broken is None:
                        return  # every request answered after the last one was written, as a gRPC stream ends
                    raise ConnectionError("the broker closed the lean port connection")
                end += read
        except (OSError, ValueError, DecodeError) as exc:
            if isinstance(exc, WrongVersionError):
                self._client.failed()
            self._break(f"reading failed: {exc}")
            raise BrokerUnavailableError(f"send port stream to {self._where}: {self._broken}") from None
        finally:
            self._sock.close()

    def _await_answer(self, readable: select.poll) -> None:
        """Until the next answer starts arriving (or the connection ends); ``ConnectionError`` once
        requests have waited ``_ANSWER_TIMEOUT_S`` with none arriving."""
        while not readable.poll(_POLL_MS):
            if self._written > self._answered and time.monotonic() - self._progress_at > _ANSWER_TIMEOUT_S:
                raise ConnectionError(f"no answer for {_ANSWER_TIMEOUT_S:g}s: the connection went silent")

    def cancel(self) -> None:
        self._break("cancelled")

    def _break(self, why: str) -> None:
        """End both directions: a blocked read or write returns at once (the reader closes)."""
        if self._broken is None:
            self._broken = why
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
