"""The lean port: ``SendRequest`` frames, or ``PullRequest`` ones (``broker.pull_port``), over plain
TCP (``broker.wire.frames``), on the broker's event loop. A connection's hello says which it
carries.

A round trip of an empty gRPC call costs more than storing a small message, so a producer's
synchronous one-message sends come here: a request small enough to be stored on the loop (the
same rule as gRPC's, ``_Transport.answers_at_once``) is parsed, stored and answered inside one
``buffer_updated``, with no task, no thread and no HTTP/2 framing. Others (big batches, transactions,
``flush = "sync"``) go through ``_Transport.send`` like a ``SendStream`` request, and the requests
after them wait their turn: answers leave in request order, which is what keeps a pipelining
client's queues in order. Everything a send does (idempotent sequences, error answers, metrics)
is ``BrokerService.Send``'s, as on gRPC.

Only served without TLS or access control (``serves_send_port``): this port has neither
encryption nor credentials. In a broker group every send goes through ``_Transport.send``, since
it may wait for the slaves, and is answered when gRPC's would be; a slave answers
``NotMasterError`` and the client resends on its stream, which finds the new master.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque

import grpc

from broker.config import BrokerConfig
from broker.framed_connection import FramedConnection
from broker.proto import orderlymq_pb2 as pb
from broker.pull_port import PullConnection
from broker.replica_port import ReplicaConnection
from broker.wire.frames import HELLO_SIZE, LENGTH, PULLS, REPLICAS, SENDS, VERSION, hello, parse_hello

__all__ = ["SendPort", "serve_send_port", "serves_send_port"]

log = logging.getLogger(__name__)

_STATUS_NAMES = {status.value[0]: status.name for status in grpc.StatusCode}
_MAX_QUEUED = 1024  # requests waiting behind a slow one before the connection stops being read
# Answers to the frames of one read are written together, up to this many: one write per answer
# woke a pipelining client once per answer; more would hold the first answers of a long burst back.
_ANSWERS_PER_WRITE = 64


def serves_send_port(config: BrokerConfig, access_control: bool) -> bool:
    return config.send_port >= 0 and not config.tls and not access_control


class SendPort:
    """The listening socket and its open connections."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0
        self.connections: set = set()  # _Greeter, _SendConnection or PullConnection

    async def close(self) -> None:
        """Stop listening and end every connection (a client then resends over a new one)."""
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.abort()


async def serve_send_port(config: BrokerConfig, transport) -> SendPort:
    """Listen on ``config.host:config.send_port``."""
    port = SendPort()
    port.server = await asyncio.get_running_loop().create_server(
        lambda: _Greeter(transport, config, port.connections), config.host, config.send_port)
    port.port = port.server.sockets[0].getsockname()[1]
    return port


def _keep_alive(sock, config: BrokerConfig) -> None:
    """TCP keepalive as the gRPC port's: probed once quiet for ``keepalive_ms``, closed when
    ``keepalive_timeout_ms`` of probes go unanswered (where the system lets a socket say so:
    macOS names the idle time TCP_KEEPALIVE)."""
    probes = 3
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))
    for option, value in ((idle, config.keepalive_ms // 1000),
                          (getattr(socket, "TCP_KEEPINTVL", None), config.keepalive_timeout_ms // 1000 // probes),
                          (getattr(socket, "TCP_KEEPCNT", None), probes)):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, max(1, value))


class _Greeter(asyncio.Protocol):
    """A new connection until its hello: then the connection of the kind it asks for."""

    def __init__(self, transport, config: BrokerConfig, registry: set) -> None:
        self._transport = transport  # broker.server._Transport
        self._config = config
        self._max_frame = config.max_request_bytes
        self._registry = registry
        self._buffer = bytearray()
        self._conn: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._conn = transport
        self._registry.add(self)
        _keep_alive(transport.get_extra_info("socket"), self._config)

    def abort(self) -> None:
        self._conn.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) < HELLO_SIZE:
            return
        greeting = parse_hello(bytes(self._buffer[:HELLO_SIZE]))
        kind = _CONNECTIONS.get(greeting[1]) if greeting is not None else None
        if kind is None:
            log.warning("lean port: a client that does not speak its protocol (hello %r) connected; closed",
                        bytes(self._buffer[:HELLO_SIZE]))
            self._conn.close()
            return
        self._conn.write(hello(VERSION, greeting[1]))  # a client asking another version closes the connection
        connection = kind(self._transport, self._max_frame, self._registry)
        self._registry.discard(self)
        self._conn.set_protocol(connection)
        connection.connection_made(self._conn)
        if len(self._buffer) > HELLO_SIZE:  # a stream's requests, written without waiting for the hello
            connection.feed(bytes(self._buffer[HELLO_SIZE:]))


class _Stored:
    """A send stored on arrival (``_Transport.store_now``): its answer, given once ``replicated``
    is done (None: at once)."""

    __slots__ = ("answer", "replicated", "request")

    def __init__(self, request: pb.SendRequest, answer: pb.SendResponse, replicated: asyncio.Future | None) -> None:
        self.request = request
        self.answer = answer
        self.replicated = replicated


class _SendConnection(FramedConnection):
    """One client's sends: frames in, answers out in the same order.

    In a broker group, a send that may be stored on the loop is stored as it arrives, and answered
    once its slaves hold it: the sends behind it are stored meanwhile, so that a pipelining client's
    batches wait for one round of the slaves' fetches together, not for one round each. One with no
    slave to wait for and no answer before it is answered at once, as outside a group. A request
    that runs elsewhere (a thread: big batches, transactions) holds the ones behind it back until it
    is done, so that the log keeps the order the requests came in."""

    def __init__(self, transport, max_frame: int, registry: set) -> None:
        super().__init__(max_frame, registry)
        self._sends = transport  # broker.server._Transport: where a send runs, how a failure is answered
        # (request, size, started); a request stored on arrival is queued as its _Stored
        self._queued: deque[tuple[pb.SendRequest | pb.SendResponse | _Stored, int, float]]
        self._unstored = 0  # requests queued or being handled that are not stored yet
        self._unwritten: list[bytes] = []  # answers to the frames of one read, written together
        self._messages_answered = 0  # by the answers given during the read being handled; -1: not one answer of one

    def buffer_updated(self, nbytes: int) -> None:
        self._messages_answered = 0
        super().buffer_updated(nbytes)
        self._write_answers()
        if self._messages_answered == 1:  # a synchronous sender's: its next send comes soon (broker.busy_loop)
            self._sends.busy_loop.request_seen()

    # -- requests ------------------------------------------------------------------------------

    def _request(self, raw: bytes | memoryview) -> None:
        self._enqueue(self._sends.parse_send(raw), len(raw), time.perf_counter())

    def _enqueue(self, request: pb.SendRequest | pb.SendResponse, size: int, started: float) -> None:
        """Answer now when nothing waits and it may be stored on the loop; else queue it."""
        if self._worker is None and (isinstance(request, pb.SendResponse) or self._sends.answers_at_once(request, size)):
            self._answer(self._store_now(request), started)
            return
        if isinstance(request, pb.SendResponse):
            self._queued.append((request, size, started))
        elif not self._unstored and self._sends.stores_before_answering(request, size):
            stored = _Stored(request, *self._sends.store_now(request))
            if self._worker is None and stored.replicated is None:  # no slave to wait for, no answer before it
                self._answer(stored.answer, started)
                return
            self._queued.append((stored, size, started))
        else:
            self._unstored += 1
            self._queued.append((request, size, started))
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._drain())
        if len(self._queued) >= _MAX_QUEUED:
            self._pause("queued")

    def _store_now(self, request: pb.SendRequest | pb.SendResponse) -> pb.SendResponse:
        if isinstance(request, pb.SendResponse):  # malformed: its error answer
            return request
        try:
            return self._sends.service.Send(request)
        except Exception as exc:  # noqa: BLE001 - answered, the connection stays open
            return self._sends.send_failure(request, exc)

    async def _drain(self) -> None:
        """Answer the queued requests in order, each where ``_Transport.send`` runs it."""
        while self._queued:
            request, size, started = self._queued.popleft()
            self._answer(await self._settled(request, size), started)
            if len(self._queued) < _MAX_QUEUED // 2:
                self._resume("queued")
        self._write_answers()
        self._worker = None

    async def _settled(self, request: pb.SendRequest | pb.SendResponse | _Stored, size: int) -> pb.SendResponse:
        """A queued request's answer; the answers before it are written before any wait."""
        if isinstance(request, pb.SendResponse):
            return request
        if isinstance(request, _Stored):
            if request.replicated is None:
                return request.answer
            if not request.replicated.done():
                self._write_answers()
            try:
                await request.replicated
            except Exception as exc:  # noqa: BLE001 - answered, the connection stays open
                return self._sends.send_failure(request.request, exc)
            return request.answer
        self._write_answers()
        try:
            return await self._sends.send(request, size)
        except Exception as exc:  # noqa: BLE001 - answered, the connection stays open
            return self._sends.send_failure(request, exc)
        finally:
            self._unstored -= 1

    def _answer(self, answer: pb.SendResponse, started: float) -> None:
        self._messages_answered = 1 if self._messages_answered == 0 and answer.count == 1 else -1
        payload = answer.SerializeToString()
        self._unwritten.append(LENGTH.pack(len(payload)) + payload)
        if len(self._unwritten) >= _ANSWERS_PER_WRITE:
            self._write_answers()
        code = _STATUS_NAMES.get(answer.error_code, "UNKNOWN") if answer.error_code else None
        self._sends.metrics.rpc_done("SendPort", started, code)
        if self._closing and not self._queued:
            self._write_answers()
            self._conn.close()

    def _write_answers(self) -> None:
        """The answers waiting, in one write (see ``_ANSWERS_PER_WRITE``)."""
        if self._unwritten:
            answers, self._unwritten = self._unwritten, []
            self._conn.write(b"".join(answers))

    def _refuse_frame(self, size: int) -> None:
        self._enqueue(pb.SendResponse(
            error_code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], error_kind="InvalidRequestError",
            error_message=f"a send of {size} bytes is over the broker's limit of {self._max_frame} bytes "
                          "(max_request_bytes); send smaller batches"), 0, time.perf_counter())


_CONNECTIONS = {SENDS: _SendConnection, PULLS: PullConnection, REPLICAS: ReplicaConnection}
