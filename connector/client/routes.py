"""Topic routes cached per client, refreshed after ``ttl`` seconds or when a broker says they are stale.

A single broker's route is a queue count. A cluster's (docs/cluster.md) also says which broker
group holds each queue id and where each group's master is; ``TopicRoute.queues`` then carry their
group as ``MessageQueue.broker_name``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from broker.wire.errors import BrokerUnavailableError
from connector.client.connection import BrokerConnection, pb
from connector.client.messages import MessageQueue

__all__ = ["GroupAddresses", "RouteCache", "TopicRoute"]


@dataclass(frozen=True)
class GroupAddresses:
    """Where a broker group is: its master ("" while it elects one) and every live broker, master first."""

    broker_name: str
    master_address: str
    addresses: tuple[str, ...]


@dataclass(frozen=True)
class TopicRoute:
    """A topic's queues (global ids 0..N-1, each with the group holding it; "" on a single broker)
    and, in a cluster, where each of those groups is."""

    topic: str
    queues: tuple[MessageQueue, ...]
    groups: dict[str, GroupAddresses]

    @property
    def clustered(self) -> bool:
        return bool(self.groups)

    def group_of(self, queue_id: int) -> str:
        """The group holding ``queue_id`` ("" on a single broker or for an id past the route)."""
        return self.queues[queue_id].broker_name if 0 <= queue_id < len(self.queues) else ""

    def queues_by_group(self, queue_ids=None) -> dict[str, list[int]]:
        """``queue_ids`` (default: all) by the group holding them, each list in the given order."""
        out: dict[str, list[int]] = {}
        for qid in range(len(self.queues)) if queue_ids is None else queue_ids:
            out.setdefault(self.group_of(qid), []).append(qid)
        return out

    @classmethod
    def from_protocol(cls, route: pb.TopicRoute) -> TopicRoute:
        holder = {}
        groups = {}
        for group in route.groups:
            groups[group.broker_name] = GroupAddresses(group.broker_name, group.master_address, tuple(group.addresses))
            holder.update((qid, group.broker_name) for qid in group.queue_ids)
        queues = tuple(MessageQueue(route.topic, q, holder.get(q, "")) for q in range(route.queue_count))
        return cls(route.topic, queues, groups)


class RouteCache:
    """``route(topic)`` from ``DescribeTopic`` (any broker answers it), cached;
    ``TopicNotFoundError`` for a missing topic."""

    def __init__(self, connection: BrokerConnection, *, ttl: float = 30.0) -> None:
        self._conn = connection
        self.ttl = ttl
        self._lock = threading.Lock()
        self._routes: dict[str, tuple[float, TopicRoute]] = {}
        self.clustered: bool | None = None  # known from the first route: a cluster's name groups
        self.listeners: list = []  # called with each fresh route (group connections follow masters)

    def route(self, topic: str, *, refresh: bool = False, deadline: float | None = None) -> TopicRoute:
        """The topic's route; a lookup gives up at ``deadline`` (``time.monotonic()``) when given."""
        now = time.monotonic()
        cached = self._routes.get(topic)  # one dict read is atomic: no lock for the per-send lookup
        if cached is not None and not refresh and now - cached[0] < self.ttl:
            return cached[1]
        try:
            answer = self._conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic), deadline=deadline)
        except BrokerUnavailableError:
            if cached is None or refresh:
                raise
            return cached[1]  # an expired route still serves while no broker answers (a failover)
        return self.remember(answer, read_at=now)

    def remember(self, answer: pb.TopicRoute, *, read_at: float | None = None) -> TopicRoute:
        """Cache a ``DescribeTopic`` answer (also one read by other code, to spare a second call)."""
        route = TopicRoute.from_protocol(answer)
        with self._lock:
            self._routes[route.topic] = (time.monotonic() if read_at is None else read_at, route)
            self.clustered = route.clustered
        for listener in self.listeners:
            listener(route)
        return route

    def queues(self, topic: str, *, refresh: bool = False, deadline: float | None = None) -> list[MessageQueue]:
        """The topic's queues (with their group in a cluster)."""
        return list(self.route(topic, refresh=refresh, deadline=deadline).queues)

    def invalidate(self, topic: str) -> None:
        with self._lock:
            self._routes.pop(topic, None)
