"""A cluster's topics in ZooKeeper: which broker group holds each queue (the topic's route).

Nodes under ``/orderlymq/<cluster>``::

    topics                       persistent; its version grows with every topic change (one watch),
                                 its data names the topic changed
    topics/<topic>               persistent: {"id": incarnation, "groups": [group of queue 0, of 1, ...]}
    topics/<topic>/ready/<group> persistent: {"id", "count"}: that group's master created its queues

Queue ids stay global to the topic (0..N-1) and the route maps each to a group, so the routing
function, committed offsets, locks and Spark offsets keyed by queue id mean the same in a cluster
as on a single broker. A topic is spread round-robin over the groups that have a master when it
is created (starting at a group picked by the topic's hash, so small topics do not all start on
the same group); growing it appends queue ids, spread over the groups alive then. Any broker
creates, grows, describes and deletes topics; each group's master creates its part locally
(``ClusterNode``) and marks it ready, and a create is answered once every group did.

Every broker keeps the routes it read (``TopicRegistry.current``): a change costs it a read of the
topic changed, not of every topic (with a thousand topics, reading them all took 0.4 s of
ZooKeeper round trips per change, on every broker).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
import zlib
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker.proto import orderlymq_pb2 as pb
from broker.storage.store import MAX_QUEUES, TOPIC_NAME, validate_topic_name
from broker.wire.errors import (
    BrokerUnavailableError,
    InvalidRequestError,
    TopicExistsError,
    TopicNotFoundError,
)
from broker.wire.limits import MAX_TOPIC_BYTES

__all__ = ["TopicLayout", "TopicRegistry"]

_READY_WAIT_S = 15.0  # how long a create or grow waits for every group's master to create its queues


@dataclass(frozen=True)
class TopicLayout:
    """One incarnation of a topic: ``groups[queue_id]`` is the group holding that queue."""

    id: str
    groups: tuple[str, ...]

    @property
    def queue_count(self) -> int:
        return len(self.groups)

    def queues_of(self, group: str) -> frozenset[int]:
        return frozenset(q for q, g in enumerate(self.groups) if g == group)

    def encoded(self) -> bytes:
        return json.dumps({"id": self.id, "groups": list(self.groups)}).encode()

    @classmethod
    def decoded(cls, raw: bytes) -> TopicLayout:
        doc = json.loads(raw)
        return cls(str(doc["id"]), tuple(str(g) for g in doc["groups"]))


def spread(topic: str, groups: list[str], first_queue: int, count: int) -> tuple[str, ...]:
    """Groups of queues ``first_queue..count-1``, round-robin over ``groups`` (sorted)."""
    ordered = sorted(groups)
    start = zlib.crc32(topic.encode()) % len(ordered)
    return tuple(ordered[(start + q) % len(ordered)] for q in range(first_queue, count))


def _check_count(count: int) -> None:
    if not 1 <= count <= MAX_QUEUES:
        raise InvalidRequestError(f"queue count must be between 1 and {MAX_QUEUES}, got {count}")


class TopicRegistry:
    """The cluster's topic routes, read and changed through one broker's ZooKeeper session."""

    def __init__(self, client: KazooClient, cluster: str) -> None:
        self.client = client
        self.cluster_root = f"/orderlymq/{cluster}"
        self.root = f"{self.cluster_root}/topics"
        self._known: dict[str, TopicLayout] = {}  # every topic's layout, as of _known_version
        self._known_version = (0, -2)  # (czxid, version) of the topics node; never one behind: all read first
        self._known_lock = threading.Lock()

    def start(self, on_change) -> None:
        self.client.ensure_path(self.root)
        self.client.DataWatch(self.root, lambda *_: on_change())

    def version(self) -> int:
        return self.client.exists(self.root).version

    def _touch(self, topic: str) -> None:
        """One watch tells every broker that a topic changed; the data says which (``current``)."""
        self.client.set(self.root, topic.encode())

    # -- reading -------------------------------------------------------------------------------

    def layout(self, topic: str) -> TopicLayout | None:
        try:
            raw, _ = self.client.get(f"{self.root}/{topic}")
        except NoNodeError:
            return None
        return TopicLayout.decoded(raw)

    def require(self, topic: str) -> TopicLayout:
        # A name no topic can have is never looked up: "a/ready/b" would read another node.
        layout = self.layout(topic) if TOPIC_NAME.match(topic) and topic not in (".", "..") else None
        if layout is None:
            if len(topic) > MAX_TOPIC_BYTES:
                validate_topic_name(topic)  # says why, briefly
            raise TopicNotFoundError(f"topic {topic!r} does not exist; create it first (orderlymq topic create {topic})")
        return layout

    def layouts(self) -> dict[str, TopicLayout]:
        """Every topic's layout, each read from ZooKeeper."""
        out = {}
        for topic in self.client.get_children(self.root):
            layout = self.layout(topic)
            if layout is not None:
                out[topic] = layout
        return out

    def current(self, reread: bool = False) -> dict[str, TopicLayout]:
        """Every topic's layout (a copy of those kept): up to date with the topics' version when
        called, read from ZooKeeper only where that changed them (all of them with ``reread``).

        One change behind, the topic the change names is read again, and the topic names are
        compared (a broker that crashed between changing a topic and announcing it left no name);
        further behind, or named by an earlier version (no name), everything is read.
        """
        with self._known_lock:
            raw, stat = self.client.get(self.root)
            version = (stat.czxid, stat.version)  # a node deleted and made again starts its versions anew
            if version != self._known_version or reread:
                if version == (self._known_version[0], self._known_version[1] + 1) and raw and not reread:
                    self._read_again(raw.decode())
                else:
                    self._known = self.layouts()
                self._known_version = version
            return dict(self._known)

    def _read_again(self, changed: str) -> None:
        """Under the lock: read ``changed`` and the topics created or deleted unannounced."""
        names = set(self.client.get_children(self.root))
        for topic in {changed} | (names - self._known.keys()) | (self._known.keys() - names):
            layout = self.layout(topic) if topic in names else None
            if layout is None:
                self._known.pop(topic, None)
            else:
                self._known[topic] = layout

    def groups(self) -> list[str]:
        """Every group that ever joined the cluster, by name."""
        groups = f"{self.cluster_root}/groups"
        return sorted(self.client.get_children(groups)) if self.client.exists(groups) else []

    def alive_groups(self) -> list[str]:
        """Groups whose master is elected now: those a new topic is spread over."""
        return [g for g in self.groups() if self.client.exists(f"{self.cluster_root}/groups/{g}/master")]

    def group_addresses(self, group: str) -> tuple[str, list[str]]:
        """(master address or "", every live member's address with the master first)."""
        root = f"{self.cluster_root}/groups/{group}"
        master = ""
        try:
            master = json.loads(self.client.get(f"{root}/master")[0])["address"]
        except NoNodeError:
            pass
        members = []
        for child in sorted(self.client.get_children(f"{root}/members") if self.client.exists(f"{root}/members")
                            else []):
            try:
                members.append(json.loads(self.client.get(f"{root}/members/{child}")[0])["address"])
            except NoNodeError:
                continue
        return master, ([master] if master else []) + [a for a in members if a != master]

    def route(self, topic: str, layout: TopicLayout, addresses: dict | None = None) -> pb.TopicRoute:
        """The route clients use: per group, its queues and where its master is."""
        addresses = {} if addresses is None else addresses  # shared by the routes of one answer
        names = sorted(set(layout.groups))
        route = pb.TopicRoute(topic=topic, broker_name=",".join(names), queue_count=layout.queue_count)
        for group in names:
            if group not in addresses:
                addresses[group] = self.group_addresses(group)
            master, members = addresses[group]
            route.groups.add(broker_name=group, master_address=master, addresses=members,
                             queue_ids=sorted(layout.queues_of(group)))
        return route

    # -- changing ------------------------------------------------------------------------------

    def _groups_for_new_queues(self, topic: str) -> list[str]:
        alive = self.alive_groups()
        if not alive:
            raise BrokerUnavailableError(
                f"no broker group of the cluster has a master now, so topic {topic!r} cannot be placed; "
                "start the brokers (orderlymq cluster status shows them) and retry")
        return alive

    def create(self, topic: str, count: int, if_not_exists: bool = False) -> TopicLayout:
        validate_topic_name(topic)
        _check_count(count)
        existing = self.layout(topic)
        if existing is None:
            layout = TopicLayout(uuid.uuid4().hex, spread(topic, self._groups_for_new_queues(topic), 0, count))
            try:
                self.client.create(f"{self.root}/{topic}", layout.encoded())
            except NodeExistsError:
                existing = self.layout(topic)
            else:
                self._touch(topic)
                self.wait_ready(topic, layout)
                return layout
        if existing is None or not if_not_exists:
            raise TopicExistsError(f"topic {topic!r} already exists with {existing.queue_count if existing else '?'} "
                                   "queues")
        self._announce_if_unready(topic, existing)
        return existing

    def adopt(self, topic: str, count: int, group: str) -> TopicLayout:
        """Register a topic a group already holds, every queue in it (the existing route if another
        broker registered the name first)."""
        layout = TopicLayout(uuid.uuid4().hex, (group,) * count)
        try:
            self.client.create(f"{self.root}/{topic}", layout.encoded())
        except NodeExistsError:
            return self.layout(topic) or layout
        self._touch(topic)
        return layout

    def grow(self, topic: str, count: int) -> TopicLayout:
        validate_topic_name(topic)
        _check_count(count)
        while True:
            try:
                raw, stat = self.client.get(f"{self.root}/{topic}")
            except NoNodeError:
                return self.require(topic)  # raises TopicNotFoundError
            current = TopicLayout.decoded(raw)
            if count < current.queue_count:
                raise InvalidRequestError(f"topic {topic!r} has {current.queue_count} queues; the count can only "
                                          f"grow (asked {count})")
            if count == current.queue_count:  # a retry, perhaps of a grow whose broker crashed before announcing it
                if self._announce_if_unready(topic, current):
                    self.wait_ready(topic, current)
                return current
            added = spread(topic, self._groups_for_new_queues(topic), current.queue_count, count)
            grown = TopicLayout(current.id, current.groups + added)
            try:
                self.client.set(f"{self.root}/{topic}", grown.encoded(), version=stat.version)
            except BadVersionError:  # grown concurrently: read it and decide again
                continue
            self._touch(topic)
            self.wait_ready(topic, grown)
            return grown

    def delete(self, topic: str) -> None:
        self.require(topic)
        try:
            self.client.delete(f"{self.root}/{topic}", recursive=True)
        except NoNodeError:
            raise TopicNotFoundError(f"topic {topic!r} does not exist") from None
        self._touch(topic)

    # -- the groups' part ----------------------------------------------------------------------

    def mark_ready(self, topic: str, group: str, layout: TopicLayout) -> None:
        path = f"{self.root}/{topic}/ready/{group}"
        data = json.dumps({"id": layout.id, "count": layout.queue_count}).encode()
        try:
            self.client.set(path, data)
        except NoNodeError:
            try:
                self.client.create(path, data, makepath=True)
            except NodeExistsError:
                self.client.set(path, data)

    def _announce_if_unready(self, topic: str, layout: TopicLayout) -> bool:
        """Announce ``topic`` again unless every group of ``layout`` has its queues: the broker
        that changed it may have crashed before announcing it. True when it did."""
        if all(self._ready(topic, group, layout) for group in set(layout.groups)):
            return False
        self._touch(topic)
        return True

    def _ready(self, topic: str, group: str, layout: TopicLayout) -> bool:
        try:
            doc = json.loads(self.client.get(f"{self.root}/{topic}/ready/{group}")[0])
        except NoNodeError:
            return False
        return doc["id"] == layout.id and doc["count"] >= layout.queue_count

    def wait_ready(self, topic: str, layout: TopicLayout) -> None:
        """Return once every group of ``layout`` created its queues (its master marks them)."""
        waiting = set(layout.groups)
        deadline = time.monotonic() + _READY_WAIT_S
        while waiting:
            waiting = {g for g in waiting if not self._ready(topic, g, layout)}
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise BrokerUnavailableError(
                    f"topic {topic!r} is registered with {layout.queue_count} queues but group(s) "
                    f"{', '.join(sorted(waiting))} have not created theirs within {_READY_WAIT_S:g}s (no master?); "
                    "they do once their master is back: check `orderlymq cluster status`")
            time.sleep(0.02)
