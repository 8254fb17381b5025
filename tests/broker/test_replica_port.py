"""Replication fetches on the lean port (broker/replica_port.py, broker/cluster/fetches.py) at a
broker that cannot answer them: the error a gRPC status would carry, then the connection closes.
A group's replication over the port is judged in tests/faults/test_cluster_replication.py."""

from __future__ import annotations

import socket
import threading

import pytest

from broker.cluster.fetches import LeanFetches
from broker.proto import orderlymq_pb2 as pb
from broker.wire.errors import InvalidRequestError
from broker.wire.frames import LENGTH, WrongVersionError, read_exactly
from tests.broker.test_send_port import _send_port


def _lean_fetches(address: str) -> LeanFetches:
    return LeanFetches(address.rpartition(":")[0], _send_port(address))


def test_a_broker_outside_a_group_answers_a_fetch_with_an_error_and_closes(broker):
    fetches = _lean_fetches(broker.address)
    try:
        with pytest.raises(InvalidRequestError, match="not in a broker group"):
            fetches.exchange(pb.ReplicaFetch(broker_id=1, group_epoch=1, handshake=True))
        with pytest.raises(ConnectionError):
            fetches.exchange(pb.ReplicaFetch(broker_id=1, group_epoch=1))
    finally:
        fetches.close()
    assert broker.service.metrics.registry.get_sample_value(
        "orderlymq_rpc_errors_total", {"method": "ReplicaPort", "code": "INVALID_ARGUMENT"}) == 1


def test_a_malformed_fetch_is_answered_with_an_error(broker):
    fetches = _lean_fetches(broker.address)
    try:
        garbage = b"\xff" * 7
        fetches._sock.sendall(LENGTH.pack(len(garbage)) + garbage)
        (size,) = LENGTH.unpack(read_exactly(fetches._sock, LENGTH.size))
        answer = pb.ReplicaData.FromString(bytes(read_exactly(fetches._sock, size)))
    finally:
        fetches.close()
    assert answer.error_kind == "InvalidRequestError" and "ReplicaFetch" in answer.error_message


def test_a_lean_port_that_closes_at_the_hello_is_a_master_of_another_version():
    """A broker of a version before replication on the lean port closes the connection at the
    hello (an unknown kind): the fetcher tells that from a port that fails, and stays on gRPC."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        def read_the_hello_and_close() -> None:
            conn = server.accept()[0]
            with conn:
                conn.recv(64)

        closing = threading.Thread(target=read_the_hello_and_close)
        closing.start()
        with pytest.raises(WrongVersionError, match="closed its lean port at the hello"):
            LeanFetches("127.0.0.1", server.getsockname()[1])
        closing.join()
