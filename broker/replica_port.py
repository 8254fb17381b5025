"""A broker group's replication on the lean port: a connection whose hello says ``REPLICAS``
(``broker.wire.frames``).

A slave copies its master by a stream of fetches, each answered with what follows its copy; a send
that waits for its slaves waits for the fetch after the one that carried it. Over gRPC the two
brokers spent some 2 ms of CPU per synchronous send replicated, most of it in gRPC's transport and
the slave's thread hand-offs; over this port about 1.4 ms (docs/cluster.md). Each ``ReplicaFetch``
frame gets the ``ReplicaData`` frame the gRPC ``Replicate`` stream would send, from the same code
(``broker.cluster.replication.FetchStream``). A failure (this broker is not the master of the
fetch's term, a malformed fetch) is answered with a ``ReplicaData`` whose ``error_*`` fields say it
as the gRPC status would, and closes the connection. Served like the rest of the port only
without TLS and access control.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from google.protobuf.message import DecodeError

from broker.framed_connection import FramedConnection
from broker.proto import orderlymq_pb2 as pb
from broker.wire.errors import InvalidRequestError, to_status
from broker.wire.frames import LENGTH

__all__ = ["ReplicaConnection"]

log = logging.getLogger(__name__)


class ReplicaConnection(FramedConnection):
    """One slave's fetches, answered in order (a slave has one in flight)."""

    def __init__(self, transport, max_frame: int, registry: set) -> None:
        super().__init__(max_frame, registry)
        cluster = transport.service.cluster  # broker.cluster.node: None outside a broker group
        self._metrics = transport.metrics
        self._stream = None if cluster is None else cluster.fetch_stream()

    def _request(self, raw: bytes) -> None:
        self._queued.append(raw)
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._serve())

    def _refuse_frame(self, size: int) -> None:
        log.warning("lean port: a replica fetch of %d bytes is over the limit of %d; closed", size, self._max_frame)
        self._conn.close()

    async def _serve(self) -> None:
        started = time.perf_counter()
        try:
            while self._queued:
                raw, started = self._queued.popleft(), time.perf_counter()
                fetch = _fetch(raw)
                if self._stream is None:
                    raise InvalidRequestError("this broker is not in a broker group: it has no slaves")
                answer = (await self._stream.answer(fetch)).SerializeToString()
                self._conn.writelines([LENGTH.pack(len(answer)), answer])
                self._metrics.rpc_done("ReplicaPort", started)
        except Exception as exc:  # noqa: BLE001 - every failure is answered, as a gRPC status would say it
            code, message, kind = to_status(exc)
            self._metrics.rpc_done("ReplicaPort", started, code.name)
            if code == grpc.StatusCode.INTERNAL:
                log.error("a replica fetch on the lean port failed", exc_info=exc)
            answer = pb.ReplicaData(error_code=code.value[0], error_kind=kind, error_message=message).SerializeToString()
            self._conn.writelines([LENGTH.pack(len(answer)), answer])
            self._closing = True
            self._conn.close()
        finally:
            self._worker = None

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._stream is not None:
            self._stream.close()


def _fetch(raw: bytes) -> pb.ReplicaFetch:
    try:
        return pb.ReplicaFetch.FromString(raw)
    except DecodeError:
        raise InvalidRequestError(f"malformed ReplicaFetch ({len(raw)} bytes)") from None
