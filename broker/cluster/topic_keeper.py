"""A group master's local part of the cluster's topics: create, grow and delete what ZooKeeper's
routes say this group holds, and refuse requests for queues another group holds.

A group keeps every topic of the cluster it holds queues of with the topic's full queue count
(a queue of another group is an empty directory: no file is created before a first append), so
replication, epochs and recovery stay per queue id as on a single broker; only the queues the
route gives this group are served. ``cluster-topics.json`` remembers which incarnation (the
route's ``id``) each local topic is (slaves note it too), so a topic deleted and created again
under the same name starts empty, and a topic the broker held before it joined a cluster (a single
broker turned into a group) is registered as its group's rather than taken for a deleted one.
"""

from __future__ import annotations

import logging
import threading

from broker.cluster.topics import TopicLayout, TopicRegistry
from broker.persist import read_json, write_json_atomic
from broker.service import BrokerService
from broker.wire.errors import WrongGroupError

__all__ = ["TopicKeeper"]

log = logging.getLogger(__name__)


class TopicKeeper:
    """One broker's local part of the cluster's topics: ``keep`` as master, ``note`` as slave,
    ``check_holds`` for every request on a queue."""

    def __init__(self, service: BrokerService, registry: TopicRegistry, group: str) -> None:
        self.service = service
        self.registry = registry
        self.group = group
        self._path = service.store.data_dir / "cluster-topics.json"
        self._incarnations: dict[str, str] = read_json(self._path, {})
        self.layouts: dict[str, TopicLayout] = {}  # what this broker serves by, as master
        self._seen_version = -1
        self._marked: dict[str, TopicLayout] = {}  # marked ready in ZooKeeper by this broker as master
        self._noted: tuple[int, set[str]] | None = None  # (ZooKeeper's topic version, local topics) noted as slave
        self._lock = threading.Lock()

    def check_holds(self, topic: str, queue_id: int) -> None:
        """Raise ``WrongGroupError`` when the route gives the queue to another group."""
        layout = self.layouts.get(topic)
        if layout is None or not 0 <= queue_id < layout.queue_count:
            return  # the store answers for unknown topics and queue ids
        holder = layout.groups[queue_id]
        if holder != self.group:
            raise WrongGroupError(
                f"queue {queue_id} of topic {topic!r} is held by broker group {holder}, not by {self.group}: "
                "send it to that group's master (clients refresh the topic's route and do so by themselves)")

    def keep(self, force: bool = False) -> None:
        """As master: make the local topics match ZooKeeper's routes (when they changed, or ``force``)."""
        version = self.registry.version()
        if version == self._seen_version and not force:
            return
        if force:
            self._marked.clear()
        layouts = self.registry.current(reread=force)
        with self._lock:
            local, incarnations = self.service.store.topics(), dict(self._incarnations)
            for topic in local.keys() - layouts.keys():
                if topic in self._incarnations:
                    self._drop(topic)  # deleted from the cluster
                else:
                    layouts[topic] = self._adopt(topic, local[topic])
            for topic, layout in layouts.items():
                if self.group in layout.groups:
                    self._hold(topic, layout)
                elif topic in local:
                    self._drop(topic)  # the cluster's topic of that name is another one now
            self.layouts = layouts
            if self._incarnations != incarnations:
                write_json_atomic(self._path, self._incarnations)
        self._seen_version = version

    def note(self) -> None:
        """As slave: remember which incarnation of each topic the copied topic table holds, so that,
        promoted, this broker tells a topic deleted from the cluster from one it held before joining."""
        version, local = self.registry.version(), self.service.store.topics()
        if (version, set(local)) == self._noted:
            return
        layouts = self.registry.current()
        with self._lock:
            noted = {t: layouts[t].id for t, n in local.items() if t in layouts and n <= layouts[t].queue_count}
            if any(self._incarnations.get(t) != i for t, i in noted.items()):
                self._incarnations.update(noted)
                write_json_atomic(self._path, self._incarnations)
        self._noted = (version, set(local))

    def _adopt(self, topic: str, count: int) -> TopicLayout:
        """A topic this broker held before it joined the cluster (a single broker turned into a
        group): registered with every queue in this group, its messages kept."""
        layout = self.registry.adopt(topic, count, self.group)
        log.warning("topic %s (%d queues) was held here before this broker joined the cluster: registered in "
                    "ZooKeeper as broker group %s's", topic, count, self.group)
        return layout

    def _drop(self, topic: str) -> None:
        service = self.service
        service.offsets.drop_topic(topic)
        service.locks.drop_topic(topic)
        service.store.delete_topic(topic)
        self._incarnations.pop(topic, None)
        self._marked.pop(topic, None)
        service._changed(offsets=True)  # noqa: SLF001 - slaves copy the topic table
        log.info("deleted topic %s: ZooKeeper no longer routes it", topic)

    def _hold(self, topic: str, layout: TopicLayout) -> None:
        if self._marked.get(topic) == layout:
            return
        store = self.service.store
        local = store.topics().get(topic)
        known = self._incarnations.get(topic)
        if local is not None and ((known is not None and known != layout.id) or local > layout.queue_count):
            self._drop(topic)  # an earlier topic of the same name
            local = None
        if local is None:
            store.create_topic(topic, layout.queue_count)
            log.info("created topic %s: queues %s of %d are this group's", topic,
                     sorted(layout.queues_of(self.group)), layout.queue_count)
        elif local < layout.queue_count:
            store.grow_topic(topic, layout.queue_count)
        self._incarnations[topic] = layout.id
        self.service._changed()  # noqa: SLF001
        self.registry.mark_ready(topic, self.group, layout)
        self._marked[topic] = layout
