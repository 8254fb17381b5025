"""Broker connections, and pull connections to a broker's lean port, kept for the life of a Spark
Python process.

Spark runs the driver-side work of a streaming sink (planning the write, ``commit(messages,
batchId)``, the hand-over of the source group's offsets) in Python workers that it keeps and
reuses from one micro-batch to the next. A connection opened for each of those calls paid a new
channel, and a routed one read again the route of every topic it touched, each micro-batch; one
kept per process pays that once. Its routes stay cached for their TTL and are read again when a
broker group answers that one is stale (``RoutedConnection``); its channels reconnect by
themselves after a broker restart.

The source's tasks likewise read through one connection per broker (group) and process, and hand
their pull connection back when a read ends cleanly (``lease_pull_link``, ``give_back_pull_link``):
a query running five micro-batches a second over eight queues would otherwise open and close
eighty connections a second. A kept pull connection whose broker stopped is found closed when it
is leased, and replaced.

Never closed by their users: they live as long as the process (a worker Spark stops takes them
along). Keyed by the process id too, so a forked child never uses its parent's channels.
"""

from __future__ import annotations

import os
import threading

from connector.client.connection import BrokerConnection
from connector.client.pull_port import PullLink, PullLinkPool
from connector.client.routed import RoutedConnection
from connector.client.send_port import SendPortClient
from connector.spark.security import ConnectionSecurity

__all__ = ["give_back_pull_link", "lease_pull_link", "shared_connection", "shared_direct_connection",
           "shared_send_port"]

_connections: dict[tuple, RoutedConnection | BrokerConnection] = {}
_pull_links = PullLinkPool(max_idle=4)  # per connection: a process runs one task at a time, one link each
_send_ports: dict[tuple[int, str, float], SendPortClient] = {}
_lock = threading.Lock()


def shared_connection(brokers: str, security: ConnectionSecurity, *, timeout: float = 30.0) -> RoutedConnection:
    """This process's connection to ``brokers`` with ``security``; ``timeout`` bounds each call
    and its retries while a broker is down (as ``RoutedConnection``'s ``timeout`` and
    ``retry_timeout``)."""
    return _shared(RoutedConnection, brokers, security, timeout)


def shared_direct_connection(addresses: str, security: ConnectionSecurity, *, timeout: float) -> BrokerConnection:
    """This process's plain connection to ``addresses`` (a broker, or a broker group that it follows
    to its master by itself); ``timeout`` bounds each call and its retries."""
    return _shared(BrokerConnection, addresses, security, timeout)


def _shared(kind: type, addresses: str, security: ConnectionSecurity, timeout: float):
    key = (os.getpid(), kind, addresses, security, timeout)
    with _lock:
        conn = _connections.get(key)
        if conn is None:
            conn = _connections[key] = kind(addresses, timeout=timeout, retry_timeout=timeout,
                                            **security.connect_kwargs())
        return conn


def lease_pull_link(conn: BrokerConnection) -> PullLink | None:
    """A pull connection to the lean port of ``conn``'s broker: one handed back earlier, else a new
    one; None when the broker serves no lean port (then pulls go over gRPC)."""
    return _pull_links.lease(conn)


def shared_send_port(conn: BrokerConnection) -> SendPortClient:
    """This process's client of the lean send port of ``conn``'s broker, ``conn`` being one of the
    process's shared connections: the sink's tasks send over it, and its idle connections wait
    for the next task."""
    key = _link_key(conn)
    with _lock:
        client = _send_ports.get(key)
        if client is None:
            client = _send_ports[key] = SendPortClient(conn)
        return client


def _link_key(conn: BrokerConnection) -> tuple[int, str, float]:
    return os.getpid(), conn.address, conn.timeout


def give_back_pull_link(conn: BrokerConnection, link: PullLink) -> None:
    """Keep ``link`` for the next read of ``conn``'s broker in this process (no answer left unread)."""
    _pull_links.give_back(conn, link)
