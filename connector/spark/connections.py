"""Broker connections kept for the life of a Spark Python process.

Spark runs the driver-side work of a streaming sink (planning the write, ``commit(messages,
batchId)``, the hand-over of the source group's offsets) in Python workers that it keeps and
reuses from one micro-batch to the next. A connection opened for each of those calls paid a new
channel, and a routed one read again the route of every topic it touched, each micro-batch; one
kept per process pays that once. Its routes stay cached for their TTL and are read again when a
broker group answers that one is stale (``RoutedConnection``); its channels reconnect by
themselves after a broker restart.

Never closed by their users: they live as long as the process (a worker Spark stops takes them
along). Keyed by the process id too, so a forked child never uses its parent's channels.
"""

from __future__ import annotations

import os
import threading

from connector.client.routed import RoutedConnection
from connector.spark.security import ConnectionSecurity

__all__ = ["shared_connection"]

_connections: dict[tuple, RoutedConnection] = {}
_lock = threading.Lock()


def shared_connection(brokers: str, security: ConnectionSecurity, *, timeout: float = 30.0) -> RoutedConnection:
    """This process's connection to ``brokers`` with ``security``; ``timeout`` bounds each call
    and its retries while a broker is down (as ``RoutedConnection``'s ``timeout`` and
    ``retry_timeout``)."""
    key = (os.getpid(), brokers, security, timeout)
    with _lock:
        conn = _connections.get(key)
        if conn is None:
            conn = _connections[key] = RoutedConnection(
                brokers, timeout=timeout, retry_timeout=timeout, **security.connect_kwargs()
            )
        return conn
