"""The lean send port: ``SendRequest`` frames over plain TCP (``broker.wire.frames``), on the
broker's event loop.

A round trip of an empty gRPC call costs more than storing a small message, so a producer's
synchronous one-message sends come here: a request small enough to be stored on the loop (the
same rule as gRPC's, ``_Transport.send_on_loop``) is parsed, stored and answered inside one
``data_received``, with no task, no thread and no HTTP/2 framing. Others (big batches, transactions,
``flush = "sync"``) go through ``_Transport.send`` like a ``SendStream`` request, and the requests
after them wait their turn: answers leave in request order, which is what keeps a pipelining
client's queues in order. Everything a send does (idempotent sequences, error answers, metrics)
is ``BrokerService.Send``'s, as on gRPC.

Only served without TLS, access control or a broker group (``serves_send_port``): this port has
neither encryption nor credentials, and a group's failover is handled by gRPC clients only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import grpc

from broker.config import BrokerConfig
from broker.proto import orderlymq_pb2 as pb
from broker.wire.frames import HELLO_SIZE, LENGTH, VERSION, hello, parse_hello

__all__ = ["SendPort", "serve_send_port", "serves_send_port"]

log = logging.getLogger(__name__)

_STATUS_NAMES = {status.value[0]: status.name for status in grpc.StatusCode}
_MAX_QUEUED = 1024  # requests waiting behind a slow one before the connection stops being read


def serves_send_port(config: BrokerConfig, access_control: bool) -> bool:
    return config.send_port >= 0 and not config.tls and not access_control and not config.clustered


class SendPort:
    """The listening socket and its open connections."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.port = 0
        self.connections: set[_SendConnection] = set()

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
        lambda: _SendConnection(transport, config.max_request_bytes, port.connections), config.host, config.send_port)
    port.port = port.server.sockets[0].getsockname()[1]
    return port


class _SendConnection(asyncio.Protocol):
    """One client connection: frames in, answers out in the same order."""

    def __init__(self, transport, max_frame: int, registry: set[_SendConnection]) -> None:
        self._registry = registry
        self._sends = transport  # broker.server._Transport: where a send runs, how a failure is answered
        self._max_frame = max_frame
        self._buffer = bytearray()
        self._greeted = False
        self._queued: deque[tuple[pb.SendRequest | pb.SendResponse, int, float]] = deque()  # (request, size, started)
        self._worker: asyncio.Task | None = None
        self._paused: set[str] = set()  # why reading is paused: "queued", "writing"
        self._conn: asyncio.Transport | None = None
        self._closing = False  # an oversized frame was refused: close once answered

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._conn = transport
        self._registry.add(self)

    def abort(self) -> None:
        if self._conn is not None:
            self._conn.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        if self._worker is not None:
            self._worker.cancel()  # a send already handed to a thread completes; its answer is not sent
        self._queued.clear()

    def eof_received(self) -> bool:
        """The client sent its last request: answer what is queued, then close."""
        self._closing = True
        if self._worker is None:
            self._conn.close()
        return True  # keep the transport open until then

    def pause_writing(self) -> None:
        self._pause("writing")

    def resume_writing(self) -> None:
        self._resume("writing")

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        buffer = self._buffer
        buffer += data
        if not self._greeted and not self._greet():
            return
        at, end = 0, len(buffer)
        while end - at >= LENGTH.size:
            (size,) = LENGTH.unpack_from(buffer, at)
            if size > self._max_frame:
                self._refuse_frame(size)
                return
            if end - at - LENGTH.size < size:
                break
            start = at + LENGTH.size
            self._request(bytes(buffer[start:start + size]))
            at = start + size
        del buffer[:at]

    # -- requests ------------------------------------------------------------------------------

    def _greet(self) -> bool:
        if len(self._buffer) < HELLO_SIZE:
            return False
        if parse_hello(bytes(self._buffer[:HELLO_SIZE])) is None:
            log.warning("send port: a client that does not speak the send protocol connected; closed")
            self._conn.close()
            return False
        del self._buffer[:HELLO_SIZE]
        self._conn.write(hello(VERSION))  # a client asking another version closes the connection
        self._greeted = True
        return True

    def _request(self, raw: bytes) -> None:
        self._enqueue(self._sends.parse_send(raw), len(raw), time.perf_counter())

    def _enqueue(self, request: pb.SendRequest | pb.SendResponse, size: int, started: float) -> None:
        """Answer now when nothing waits and it may be stored on the loop; else queue it."""
        if self._worker is None and (isinstance(request, pb.SendResponse) or self._sends.send_on_loop(request, size)):
            self._answer(self._store_now(request), started)
            return
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
            if isinstance(request, pb.SendResponse):
                answer = request
            else:
                try:
                    answer = await self._sends.send(request, size)
                except Exception as exc:  # noqa: BLE001 - answered, the connection stays open
                    answer = self._sends.send_failure(request, exc)
            self._answer(answer, started)
            if len(self._queued) < _MAX_QUEUED // 2:
                self._resume("queued")
        self._worker = None

    def _answer(self, answer: pb.SendResponse, started: float) -> None:
        code = _STATUS_NAMES.get(answer.error_code, "UNKNOWN") if answer.error_code else None
        self._sends.metrics.rpc_done("SendPort", started, code)
        payload = answer.SerializeToString()
        self._conn.write(LENGTH.pack(len(payload)) + payload)
        if self._closing and not self._queued:
            self._conn.close()

    def _refuse_frame(self, size: int) -> None:
        """Answer an oversized frame with an error, after the requests before it, then close: the
        rest of the frame cannot be told from the next one."""
        self._closing = True
        self._conn.pause_reading()
        self._enqueue(pb.SendResponse(
            error_code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], error_kind="InvalidRequestError",
            error_message=f"a send of {size} bytes is over the broker's limit of {self._max_frame} bytes "
                          "(max_request_bytes); send smaller batches"), 0, time.perf_counter())

    # -- flow control --------------------------------------------------------------------------

    def _pause(self, why: str) -> None:
        if not self._paused:
            self._conn.pause_reading()
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why in self._paused:
            self._paused.discard(why)
            if not self._paused:
                self._conn.resume_reading()
