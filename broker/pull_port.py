"""Pulls on the lean port: a connection whose hello says ``PULLS`` (``broker.wire.frames``).

A Spark task pulls megabyte batches back to back. Over gRPC, the transport's copies and wake-ups
cost the broker more CPU than reading and encoding a batch, and cost the task about as much again.
Here each ``PullRequest`` frame is answered with the ``PullResponse`` a gRPC ``Pull`` returns,
handed to the socket straight from its parts (no joined copy), or with one whose ``error_*`` fields
name the failure; the connection stays open. Everything a pull does (checks, fencing, long-poll
wait, metrics) is ``_Transport._pull``'s, as on gRPC.

Pulls are answered one at a time, in request order. The next one starts only once the previous
answer is with the socket and its buffer is below the high-water mark, so a client that stops
reading holds one answer of the broker's memory at most.
"""

from __future__ import annotations

import asyncio
from collections import deque

from broker.framed_connection import FramedConnection
from broker.wire.errors import RequestTooLargeError
from broker.wire.frames import LENGTH
from broker.wire.pull_response import encode_pull_error

__all__ = ["PullConnection"]

_MAX_QUEUED = 4  # a reader issues one pull ahead: more waiting than this stops the connection being read


class PullConnection(FramedConnection):
    """One client's pulls: frames in, answers out in the same order."""

    def __init__(self, transport, max_frame: int, registry: set) -> None:
        super().__init__(max_frame, registry)
        self._pulls = transport  # broker.server._Transport: what a pull does, its answer when it fails
        self._queued: deque[bytes | Exception]  # raw requests, or a refusal to answer in turn
        self._writable = asyncio.Event()
        self._writable.set()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._writable.clear()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._writable.set()

    def _request(self, raw: bytes | Exception) -> None:
        self._queued.append(raw)
        if len(self._queued) >= _MAX_QUEUED:
            self._pause("queued")
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._serve())

    def _refuse_frame(self, size: int) -> None:
        self._request(RequestTooLargeError(
            f"a pull request of {size} bytes is over the broker's limit of {self._max_frame} bytes "
            "(max_request_bytes): this is not an orderlymq client, or a broken one"))

    async def _serve(self) -> None:
        while self._queued:
            request = self._queued.popleft()
            self._resume("queued")
            if isinstance(request, Exception):
                parts = [encode_pull_error(request)]
            else:
                parts = await self._pulls.port_pull(request)
            self._conn.writelines([LENGTH.pack(sum(len(part) for part in parts)), *parts])
            await self._writable.wait()
        self._worker = None
        if self._closing:
            self._conn.close()
