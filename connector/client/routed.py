"""The client's connection to a single broker or to a cluster of broker groups, behind one ``call``.

``RoutedConnection(brokers)`` bootstraps from any address(es), like Kafka's bootstrap servers. On a
single broker every call goes to it, as through a ``BrokerConnection``. In a cluster
(docs/cluster.md) a topic's queues are spread over broker groups and each call goes where the
topic's route says:

- a call on one queue (``Send``, ``Pull``, ``QueryOffsets``, ``CommitOffset``, ``GetOffset``) to
  the master of the group holding it, through one ``BrokerConnection`` per group that follows its
  master by itself (``NotMasterError``);
- ``LockBatch`` / ``UnlockBatch`` split by group, answers merged; ``QueryLocks`` asks every group
  of the topic; ``Heartbeat`` and ``LeaveGroup`` go to every group of the consumer's topics and
  ``ListConsumers`` answers the members any of them knows. A group that does not answer such a
  split call within a few seconds (its master failing over) is left out of that round, so it
  does not hold up the others' lock renewals and heartbeats;
- topic administration, ``Health`` and the console views to the bootstrap broker (any answers).

A group that answers ``WrongGroupError`` (the route is stale: the topic was deleted and created
again) or ``TopicNotFoundError`` makes the route be read again and the call be sent once more.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from broker.wire.errors import BrokerUnavailableError, TopicNotFoundError, WrongGroupError
from connector.client.connection import BrokerConnection, Credentials, TlsOptions, pb
from connector.client.routes import RouteCache, TopicRoute

__all__ = ["RoutedConnection"]

log = logging.getLogger(__name__)

_PER_QUEUE = frozenset({"Send", "Pull", "QueryOffsets", "CommitOffset", "GetOffset"})
_SPLIT = {"LockBatch": "locked", "UnlockBatch": "unlocked"}  # split by group, this answer field merged
_ANSWER_TYPES = {"LockBatch": pb.LockBatchResponse, "UnlockBatch": pb.UnlockBatchResponse}
_GROUP_WAIT_S = 3.0  # how long a call split over several groups waits for one of them


class RoutedConnection:
    """A connection to the broker or cluster of ``brokers``; thread-safe, cheap to share.

    Parameters are ``BrokerConnection``'s; ``route_ttl`` is how long a topic's route is cached.
    """

    def __init__(self, brokers: str, *, timeout: float = 30.0, retry_timeout: float = 30.0,
                 tls: TlsOptions | None = None, credentials: Credentials | None = None,
                 route_ttl: float = 30.0) -> None:
        self.bootstrap = BrokerConnection(brokers, timeout=timeout, retry_timeout=retry_timeout, tls=tls,
                                          credentials=credentials)
        self.routes = RouteCache(self.bootstrap, ttl=route_ttl)
        self.routes.listeners.append(self._follow_masters)
        self._groups: dict[str, BrokerConnection] = {}
        self._group_topics: dict[str, list[str]] = {}  # consumer group -> topics of its heartbeats
        self._lock = threading.Lock()

    # -- what BrokerConnection offers ----------------------------------------------------------

    @property
    def address(self) -> str:
        return self.bootstrap.address

    @property
    def addresses(self) -> list[str]:
        return self.bootstrap.addresses

    @property
    def timeout(self) -> float:
        return self.bootstrap.timeout

    @property
    def retry_timeout(self) -> float:
        return self.bootstrap.retry_timeout

    @property
    def tls(self) -> TlsOptions | None:
        return self.bootstrap.tls

    @property
    def credentials(self) -> Credentials | None:
        return self.bootstrap.credentials

    @property
    def metadata(self):
        return self.bootstrap.metadata

    # -- groups --------------------------------------------------------------------------------

    def clustered(self) -> bool:
        """Whether the brokers are a cluster of groups (asked once, of the bootstrap broker)."""
        if self.routes.clustered is None:
            self.routes.clustered = bool(self.bootstrap.call("Health", pb.HealthRequest()).role)
        return self.routes.clustered

    def for_group(self, broker_name: str) -> BrokerConnection:
        """The connection to group ``broker_name``'s master ("" : the bootstrap broker, a single one)."""
        if not broker_name:
            return self.bootstrap
        with self._lock:
            conn = self._groups.get(broker_name)
        if conn is not None:
            return conn
        raise BrokerUnavailableError(f"broker group {broker_name!r} is not in any route read by this client; "
                                     "ask for a topic's route first (routes.route(topic))")

    def for_queue(self, topic: str, queue_id: int, *, deadline: float | None = None) -> BrokerConnection:
        """The connection to the master of the group holding ``queue_id`` of ``topic``."""
        if self.routes.clustered is False:
            return self.bootstrap
        return self.for_group(self.routes.route(topic, deadline=deadline).group_of(queue_id))

    def groups(self) -> list[str]:
        """Every group of the cluster with a live broker (asked now); [""] for a single broker."""
        if not self.clustered():
            return [""]
        answer = self.bootstrap.call("DescribeCluster", pb.DescribeClusterRequest())
        self._learn([(g.broker_name, g.master_address, tuple(g.addresses)) for g in answer.groups])
        return [g.broker_name for g in answer.groups]

    def _follow_masters(self, route: TopicRoute) -> None:
        self._learn([(g.broker_name, g.master_address, g.addresses) for g in route.groups.values()])

    def _learn(self, groups: list[tuple[str, str, tuple[str, ...]]]) -> None:
        """Fresh news of groups: open connections to those new to this client, point the others at their master."""
        with self._lock:
            for name, master, addresses in groups:
                conn = self._groups.get(name)
                if conn is None:
                    if not addresses:
                        continue  # no live broker now: BrokerUnavailableError when it is asked for
                    self._groups[name] = BrokerConnection(
                        ",".join(addresses), timeout=self.bootstrap.timeout,
                        retry_timeout=self.bootstrap.retry_timeout, tls=self.bootstrap.tls,
                        credentials=self.bootstrap.credentials)
                else:
                    conn.follow(master, addresses)

    # -- calls ---------------------------------------------------------------------------------

    def call(self, method: str, request: Any, *, timeout: float | None = None, retry: bool = True,
             deadline: float | None = None) -> Any:
        """``BrokerConnection.call``, sent where the topic's route says (see the module docstring)."""
        kwargs = {"timeout": timeout, "retry": retry, "deadline": deadline}
        if self.routes.clustered is False or not _routed(method):
            return self.bootstrap.call(method, request, **kwargs)
        if method in ("Heartbeat", "LeaveGroup", "ListConsumers"):
            return self._membership(method, request, kwargs)
        try:
            route = self.routes.route(request.topic, deadline=deadline)
        except TopicNotFoundError:
            return self.bootstrap.call(method, request, **kwargs)  # it answers for the missing topic itself
        if not route.clustered:
            return self.bootstrap.call(method, request, **kwargs)
        try:
            return self._routed_call(route, method, request, kwargs)
        except (WrongGroupError, TopicNotFoundError):
            route = self.routes.route(request.topic, refresh=True, deadline=deadline)
            return self._routed_call(route, method, request, kwargs)

    def _routed_call(self, route: TopicRoute, method: str, request: Any, kwargs: dict) -> Any:
        if method in _PER_QUEUE:
            return self.for_group(route.group_of(request.queue_id)).call(method, request, **kwargs)
        if method in _SPLIT:
            field = _SPLIT[method]
            parts = []
            for group, queue_ids in route.queues_by_group(request.queue_ids).items():
                part = type(request)()
                part.CopyFrom(request)
                del part.queue_ids[:]
                part.queue_ids.extend(queue_ids)
                parts.append((group, part))
            merged = _ANSWER_TYPES[method]()
            for answer in self._each_group(method, parts, kwargs):
                getattr(merged, field).extend(getattr(answer, field))
            return merged
        # QueryLocks: every group of the topic
        merged = pb.QueryLocksResponse()
        for group in route.groups:
            merged.locks.extend(self.for_group(group).call(method, request, **kwargs).locks)
        return merged

    def _each_group(self, method: str, parts: list[tuple[str, Any]], kwargs: dict) -> list[Any]:
        """The answers of each group to its request. With several groups, one that does not answer
        within ``_GROUP_WAIT_S`` (its master failing over) is left out: its queues are not locked
        this round, it misses this heartbeat; the others are served meanwhile. Raises only when
        no group answered."""
        if len(parts) == 1:
            group, part = parts[0]
            return [self.for_group(group).call(method, part, **kwargs)]
        answers, failure = [], None
        for group, part in parts:
            wait = time.monotonic() + _GROUP_WAIT_S
            deadline = wait if kwargs["deadline"] is None else min(wait, kwargs["deadline"])
            try:
                answers.append(self.for_group(group).call(method, part, **(kwargs | {"deadline": deadline})))
            except BrokerUnavailableError as exc:
                log.info("%s to broker group %s left out this round: %s", method, group, exc)
                failure = exc
        if not answers and failure is not None:
            raise failure
        return answers

    def _membership(self, method: str, request: Any, kwargs: dict) -> Any:
        """Consumers register with every group of their topics; the members are those any of them knows."""
        if method == "Heartbeat":
            with self._lock:
                self._group_topics[request.group] = list(request.topics)
        with self._lock:
            topics = list(self._group_topics.get(request.group, ()))
        holders: set[str] = set()
        for topic in topics:
            try:
                holders.update(q.broker_name for q in self.routes.route(topic, deadline=kwargs["deadline"]).queues)
            except TopicNotFoundError:
                continue  # the consumer reports a missing topic itself
        groups = sorted(holders)
        if not groups or not all(groups):
            return self.bootstrap.call(method, request, **kwargs)
        answers = self._each_group(method, [(g, request) for g in groups], kwargs)
        if method != "ListConsumers":
            return answers[0]
        members = sorted({c for answer in answers for c in answer.client_ids})
        return pb.ListConsumersResponse(client_ids=members)

    def close(self) -> None:
        with self._lock:
            groups, self._groups = list(self._groups.values()), {}
        for conn in groups:
            conn.close()
        self.bootstrap.close()

    def __enter__(self) -> RoutedConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getstate__(self) -> dict:
        return {"bootstrap": self.bootstrap, "route_ttl": self.routes.ttl}

    def __setstate__(self, state: dict) -> None:
        boot = state["bootstrap"]
        self.__init__(",".join(boot.addresses), timeout=boot.timeout, retry_timeout=boot.retry_timeout,
                      tls=boot.tls, credentials=boot.credentials, route_ttl=state["route_ttl"])


def _routed(method: str) -> bool:
    return method in _PER_QUEUE or method in _SPLIT or method in ("QueryLocks", "Heartbeat", "LeaveGroup",
                                                                   "ListConsumers")
