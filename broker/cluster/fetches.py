"""The two ways a slave's fetches reach its master, one answer per fetch, in order.

``LeanFetches`` uses the master's lean port (``broker.replica_port``): a frame each way, read and
written by the fetcher's own thread. ``GrpcFetches`` uses the ``Replicate`` stream, which takes
TLS and credentials, and hands each fetch and answer between the fetcher and gRPC's threads.
"""

from __future__ import annotations

import contextlib
import queue
import socket

import grpc

from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.wire.errors import from_answer
from broker.wire.frames import LENGTH, REPLICAS, WrongVersionError, check_hello, open_lean, read_exactly

__all__ = ["GrpcFetches", "LeanFetches"]

_CONNECT_TIMEOUT_S = 5.0


class GrpcFetches:
    """Fetches on a ``Replicate`` stream of ``channel``."""

    def __init__(self, channel: grpc.Channel, metadata) -> None:
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._call = pb_grpc.ReplicationStub(channel).Replicate(iter(self._requests.get, None), metadata=metadata)

    def exchange(self, fetch: pb.ReplicaFetch) -> pb.ReplicaData:
        self._requests.put(fetch)
        return next(self._call)

    def cancel(self) -> None:
        """End the stream from another thread: a wait for an answer raises."""
        self._call.cancel()

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()


class LeanFetches:
    """Fetches on a connection to the lean port ``port`` of ``host``; ``OSError`` when it cannot
    be opened, ``WrongVersionError`` (one) when the broker does not take replication there (another
    version)."""

    def __init__(self, host: str, port: int) -> None:
        self._sock = open_lean(host, port, _CONNECT_TIMEOUT_S, REPLICAS)
        try:
            check_hello(self._sock, REPLICAS)
            self._sock.settimeout(None)  # an answer may take the master's idle wait: the fetcher's watch bounds it
        except ConnectionError as exc:
            self._sock.close()
            raise WrongVersionError(f"the master closed its lean port at the hello ({exc}): a version that does not "
                                    "take replication there") from exc
        except BaseException:
            self._sock.close()
            raise

    def exchange(self, fetch: pb.ReplicaFetch) -> pb.ReplicaData:
        payload = fetch.SerializeToString()
        self._sock.sendall(LENGTH.pack(len(payload)) + payload)
        (size,) = LENGTH.unpack(read_exactly(self._sock, LENGTH.size))
        answer = pb.ReplicaData.FromString(bytes(read_exactly(self._sock, size)))
        if answer.error_code:
            raise from_answer(answer.error_code, answer.error_message, answer.error_kind)
        return answer

    def cancel(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()
