"""Topic routes (queue counts) cached per client, refreshed after ``ttl`` seconds."""

from __future__ import annotations

import threading
import time

from connector.client.connection import BrokerConnection, pb
from connector.client.messages import MessageQueue

__all__ = ["RouteCache"]


class RouteCache:
    """``queues(topic)`` from ``DescribeTopic``, cached; ``TopicNotFoundError`` for a missing topic."""

    def __init__(self, connection: BrokerConnection, *, ttl: float = 30.0) -> None:
        self._conn = connection
        self.ttl = ttl
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[float, list[MessageQueue]]] = {}

    def queues(self, topic: str, *, refresh: bool = False, deadline: float | None = None) -> list[MessageQueue]:
        """The topic's queues; a lookup gives up at ``deadline`` (``time.monotonic()``) when given."""
        now = time.monotonic()
        with self._lock:
            cached = self._routes.get(topic)
        if cached is not None and not refresh and now - cached[0] < self.ttl:
            return cached[1]
        route = self._conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic), deadline=deadline)
        queues = [MessageQueue(topic, i) for i in range(route.queue_count)]
        with self._lock:
            self._routes[topic] = (now, queues)
        return queues

    def invalidate(self, topic: str) -> None:
        with self._lock:
            self._routes.pop(topic, None)
