"""A lean port connection once the hellos are exchanged (``broker.wire.frames``): length-prefixed
frames in, each handed to ``_request`` in order; what sends and pulls share (``broker.send_port``,
``broker.pull_port``)."""

from __future__ import annotations

import abc
import asyncio
from collections import deque

from broker.wire.frames import LENGTH


class FramedConnection(asyncio.Protocol, abc.ABC):
    """Frames in; subclasses answer each (``_request``) and refuse an oversized one (``_refuse_frame``)."""

    def __init__(self, max_frame: int, registry: set) -> None:
        self._registry = registry  # the port's open connections, ended when it closes
        self._max_frame = max_frame
        self._buffer = bytearray()
        self._paused: set[str] = set()  # why reading is paused, e.g. "writing"
        self._conn: asyncio.Transport | None = None
        self._closing = False  # no more requests are read: close once answered
        self._queued: deque = deque()  # requests waiting for the one being answered
        self._worker: asyncio.Task | None = None  # answers the queued requests in order

    def connection_made(self, transport: asyncio.Transport) -> None:
        self._conn = transport
        self._registry.add(self)

    def abort(self) -> None:
        if self._conn is not None:
            self._conn.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self)
        if self._worker is not None:
            self._worker.cancel()  # work already handed to a thread completes; its answer is not sent
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
        at, end = 0, len(buffer)
        while end - at >= LENGTH.size:
            (size,) = LENGTH.unpack_from(buffer, at)
            if size > self._max_frame:
                self._closing = True
                self._conn.pause_reading()
                self._refuse_frame(size)
                return
            if end - at - LENGTH.size < size:
                break
            start = at + LENGTH.size
            self._request(bytes(buffer[start:start + size]))
            at = start + size
        del buffer[:at]

    @abc.abstractmethod
    def _request(self, raw: bytes) -> None:
        """Answer one request, after those before it."""

    @abc.abstractmethod
    def _refuse_frame(self, size: int) -> None:
        """Answer an oversized frame with an error, after the requests before it, then close: the
        rest of the frame cannot be told from the next one."""

    def _pause(self, why: str) -> None:
        if not self._paused:
            self._conn.pause_reading()
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why in self._paused:
            self._paused.discard(why)
            if not self._paused and not self._closing:
                self._conn.resume_reading()
