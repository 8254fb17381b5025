"""A lean port connection once the hellos are exchanged (``broker.wire.frames``): length-prefixed
frames in, each handed to ``_request`` in order; what sends and pulls share (``broker.send_port``,
``broker.pull_port``).

Frames are read with ``asyncio.BufferedProtocol``: small ones into a buffer of the connection,
a big one (a batch of megabytes) by the kernel straight into a buffer of its own, handed on as it
is. Received as ``bytes`` and gathered, a megabyte batch was copied three times more on its way
to the disk. A big frame's buffer is allocated, not zeroed (``numpy.empty``): its memory is
taken as its bytes arrive, so a client announcing frames it never sends holds none. (An anonymous
mapping per frame would too, but its page faults and unmapping cost the broker more CPU than the
copies saved.)
"""

from __future__ import annotations

import abc
import asyncio
from collections import deque

import numpy as np

from broker.wire.frames import LENGTH

_BIG_FRAME = 64 * 1024  # a frame this large is read into a buffer of its own
_READ_SIZE = 256 * 1024  # the buffer of smaller frames: any of them fits in it with room to spare


class FramedConnection(asyncio.BufferedProtocol, abc.ABC):
    """Frames in; subclasses answer each (``_request``) and refuse an oversized one (``_refuse_frame``)."""

    def __init__(self, max_frame: int, registry: set) -> None:
        self._registry = registry  # the port's open connections, ended when it closes
        self._max_frame = max_frame
        self._buffer = bytearray(_READ_SIZE)  # small frames and the starts of big ones
        self._start = self._filled = 0  # the unparsed bytes of _buffer: [_start, _filled)
        self._frame: np.ndarray | None = None  # a big frame, read in place
        self._frame_filled = 0
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

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:  # exactly the rest of the frame: the next one starts in _buffer
            return memoryview(self._frame)[self._frame_filled:]
        return memoryview(self._buffer)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._closing:
            return
        if self._frame is None:
            self._filled += nbytes
            self._parse()
            return
        self._frame_filled += nbytes
        if self._frame_filled == len(self._frame):
            frame, self._frame = self._frame, None
            self._request(memoryview(frame))

    def feed(self, data: bytes) -> None:
        """Take ``data`` as if read from the connection (what came with the hello)."""
        view = memoryview(data)
        while len(view) and not self._closing:
            room = self.get_buffer(len(view))
            taken = min(len(room), len(view))
            room[:taken] = view[:taken]
            room.release()
            self.buffer_updated(taken)
            view = view[taken:]

    def _parse(self) -> None:
        buffer, at, end = self._buffer, self._start, self._filled
        while end - at >= LENGTH.size:
            (size,) = LENGTH.unpack_from(buffer, at)
            if size > self._max_frame:
                self._closing = True
                self._conn.pause_reading()
                self._refuse_frame(size)
                return
            start = at + LENGTH.size
            if end - start >= size:
                with memoryview(buffer) as view:
                    self._request(bytes(view[start:start + size]))
                at = start + size
                continue
            if size >= _BIG_FRAME:  # what arrived of it moves to its own buffer, the rest is read there
                self._frame, self._frame_filled = np.empty(size, np.uint8), end - start
                with memoryview(buffer) as view:
                    self._frame[:end - start] = view[start:end]
                at = end
            break
        self._keep_room(at)

    def _keep_room(self, at: int) -> None:
        """Drop the parsed bytes; a small frame's start moves to a new buffer once room runs short (never
        resized in place: the loop may still hold a view of it)."""
        left = self._filled - at
        if not left:
            self._start = self._filled = 0
        elif len(self._buffer) - self._filled >= _BIG_FRAME + LENGTH.size:
            self._start = at
        else:
            buffer = bytearray(_READ_SIZE)
            with memoryview(self._buffer) as view:
                buffer[:left] = view[at:self._filled]
            self._buffer, self._start, self._filled = buffer, 0, left

    @abc.abstractmethod
    def _request(self, raw: bytes | memoryview) -> None:
        """Answer one request (a big one comes as a view of the buffer it was read into), after those before it."""

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
