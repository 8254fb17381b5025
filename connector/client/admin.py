"""Administration: topics, consumer progress (committed offsets and lag), lock holders, members,
and read-only views of every group and open transaction (what ``orderlymq console`` shows).

The Python side of RocketMQ's ``mqadmin`` (``updateTopic``, ``topicList``, ``topicStatus``,
``deleteTopic``, ``consumerProgress``); the ``orderlymq`` command line is built on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from connector.client.connection import Credentials, TlsOptions, pb
from connector.client.locking import lease_left_ms
from connector.client.routed import RoutedConnection

__all__ = ["Admin", "BrokerGroup", "GroupOffset", "GroupState", "LockHolder", "OpenTransaction", "QueueProgress",
           "QueueStatus", "TopicInfo"]


@dataclass(frozen=True)
class BrokerGroup:
    """A broker group of a cluster: its master ("" while it elects one), every live broker (master
    first) and, in a topic's route, the queue ids it holds."""

    broker_name: str
    master_address: str
    addresses: tuple[str, ...]
    queue_ids: tuple[int, ...] = ()

    @classmethod
    def from_protocol(cls, group: pb.GroupRoute) -> BrokerGroup:
        return cls(group.broker_name, group.master_address, tuple(group.addresses), tuple(group.queue_ids))


@dataclass(frozen=True)
class TopicInfo:
    """A topic's route: its name, broker (in a cluster: its groups' names joined by ","), number of
    queues and, in a cluster, the groups holding them."""

    name: str
    broker_name: str
    queue_count: int
    groups: tuple[BrokerGroup, ...] = ()

    def group_of(self, queue_id: int) -> str:
        """The group holding ``queue_id`` ("" on a single broker)."""
        return next((g.broker_name for g in self.groups if queue_id in g.queue_ids), "")

    @classmethod
    def from_route(cls, route: pb.TopicRoute) -> TopicInfo:
        return cls(route.topic, route.broker_name, route.queue_count,
                   tuple(BrokerGroup.from_protocol(g) for g in route.groups))


@dataclass(frozen=True)
class QueueStatus:
    """One queue's stored range: offsets ``[min_offset, max_offset)``."""

    topic: str
    queue_id: int
    min_offset: int
    max_offset: int

    @property
    def count(self) -> int:
        return self.max_offset - self.min_offset


@dataclass(frozen=True)
class QueueProgress:
    """A group's position in one queue (a row of ``mqadmin consumerProgress``).

    ``consumer_offset`` is the next offset the group will consume, -1 when it never committed;
    ``lag`` counts the messages stored after it (all stored messages when it never committed).
    """

    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int
    lock_holder: str | None = None


@dataclass(frozen=True)
class LockHolder:
    """Who holds a queue lock, with which fencing epoch, until when (ms since the epoch), and how
    long its lease had left as the broker answered (counted on the broker's clock)."""

    topic: str
    queue_id: int
    client_id: str
    epoch: int
    expires_at_ms: int
    lease_left_ms: int


@dataclass(frozen=True)
class GroupOffset:
    """A group's committed offset of one queue (the next to consume) and who committed it."""

    topic: str
    queue_id: int
    offset: int
    committed_by: str


@dataclass(frozen=True)
class GroupState:
    """A consumer group as the broker knows it: committed offsets, live members, queue locks."""

    name: str
    offsets: tuple[GroupOffset, ...]
    consumers: tuple[str, ...]
    locks: tuple[LockHolder, ...]

    @classmethod
    def from_protocol(cls, info: pb.GroupInfo) -> GroupState:
        return cls(
            info.group,
            tuple(GroupOffset(o.topic, o.queue_id, o.offset, o.committed_by) for o in info.offsets),
            tuple(info.consumers),
            tuple(_holder(lk, lk.topic) for lk in info.locks),
        )


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction begun and not yet finished; an OPEN one is aborted at ``expires_at_ms``
    unless it sees activity (0 for one left COMMITTING, which the broker finishes on start)."""

    txn_id: str
    state: str
    last_activity_ms: int
    expires_at_ms: int
    staged_bytes: int


class Admin:
    """Administrative calls against a broker; thread-safe.

    Parameters
    ----------
    brokers : str
        ``"host:port[,host:port]"``.
    timeout, retry_timeout : float
        Seconds per RPC attempt, and how long an unreachable broker is retried.
    tls, credentials : TlsOptions, Credentials, optional
        TLS to the broker, and the access key / secret of a broker with access control
        (docs/security.md); credentials default to ORDERLYMQ_ACCESS_KEY / ORDERLYMQ_SECRET_KEY.
    """

    def __init__(self, brokers: str, *, timeout: float = 10.0, retry_timeout: float = 30.0,
                 tls: TlsOptions | None = None, credentials: Credentials | None = None) -> None:
        self.connection = RoutedConnection(brokers, timeout=timeout, retry_timeout=retry_timeout, tls=tls,
                                           credentials=credentials)

    def _call(self, method: str, request, *, retry: bool = True):
        return self.connection.call(method, request, retry=retry)

    # -- topics --------------------------------------------------------------------------------

    def create_topic(self, name: str, queues: int, *, if_not_exists: bool = False) -> TopicInfo:
        """Create topic ``name`` with ``queues`` MessageQueues; ``TopicExistsError`` if it exists
        (unless ``if_not_exists``: then the existing route is returned)."""
        request = pb.CreateTopicRequest(topic=name, queue_count=queues, if_not_exists=if_not_exists)
        # Not retried blindly: a create that reached the broker would then fail with TopicExistsError.
        return TopicInfo.from_route(self._call("CreateTopic", request, retry=if_not_exists))

    def grow_topic(self, name: str, queues: int) -> TopicInfo:
        """Raise the queue count of ``name`` to ``queues`` (it can only grow)."""
        return TopicInfo.from_route(self._call("UpdateTopic", pb.UpdateTopicRequest(topic=name, queue_count=queues)))

    def describe_topic(self, name: str) -> TopicInfo:
        """The topic's route; ``TopicNotFoundError`` when it does not exist."""
        return TopicInfo.from_route(self._call("DescribeTopic", pb.DescribeTopicRequest(topic=name)))

    def list_topics(self) -> list[TopicInfo]:
        """Every topic, sorted by name."""
        response = self._call("ListTopics", pb.ListTopicsRequest())
        return sorted((TopicInfo.from_route(r) for r in response.topics), key=lambda t: t.name)

    def delete_topic(self, name: str) -> None:
        """Delete a topic with its messages, offsets and locks."""
        self._call("DeleteTopic", pb.DeleteTopicRequest(topic=name), retry=False)

    def topic_status(self, name: str) -> list[QueueStatus]:
        """Every queue's stored offset range (``mqadmin topicStatus``)."""
        info = self.describe_topic(name)
        out = []
        for qid in range(info.queue_count):
            r = self._call("QueryOffsets", pb.QueryOffsetsRequest(topic=name, queue_id=qid))
            out.append(QueueStatus(name, qid, r.min_offset, r.max_offset))
        return out

    # -- groups --------------------------------------------------------------------------------

    def committed_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset of a queue (the next to consume), -1 when none."""
        request = pb.GetOffsetRequest(group=group, topic=topic, queue_id=queue_id)
        return self._call("GetOffset", request).offset

    def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Set the group's committed offset of a queue (unfenced: stop the group's consumers first)."""
        request = pb.CommitOffsetRequest(group=group, topic=topic, queue_id=queue_id, offset=offset)
        self._call("CommitOffset", request)

    def consumer_progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Per queue: stored max offset, the group's committed offset, lag, and the lock holder."""
        holders = {h.queue_id: h.client_id for h in self.lock_holders(group, topic)}
        out = []
        for status in self.topic_status(topic):
            committed = self.committed_offset(group, topic, status.queue_id)
            start = committed if committed >= 0 else status.min_offset
            out.append(
                QueueProgress(
                    topic=topic,
                    queue_id=status.queue_id,
                    broker_offset=status.max_offset,
                    consumer_offset=committed,
                    lag=max(0, status.max_offset - start),
                    lock_holder=holders.get(status.queue_id),
                )
            )
        return out

    def lock_holders(self, group: str, topic: str) -> list[LockHolder]:
        """The live queue locks of ``group`` on ``topic``, by queue id."""
        response = self._call("QueryLocks", pb.QueryLocksRequest(group=group, topic=topic))
        return sorted(
            (
                _holder(lk, lk.topic or topic)
                for lk in response.locks
            ),
            key=lambda h: h.queue_id,
        )

    def consumers(self, group: str) -> list[str]:
        """The live members of a consumer group (sorted client ids)."""
        return list(self._call("ListConsumers", pb.ListConsumersRequest(group=group)).client_ids)

    def groups(self) -> list[GroupState]:
        """Every group with a committed offset, a live member or a queue lock, sorted by name."""
        return [GroupState.from_protocol(g) for g in self._call("ListGroups", pb.ListGroupsRequest()).groups]

    def open_transactions(self) -> list[OpenTransaction]:
        """Transactions not yet committed or aborted, oldest activity first."""
        response = self._call("ListTransactions", pb.ListTransactionsRequest())
        return [
            OpenTransaction(t.txn_id, t.state, t.last_activity_ms, t.expires_at_ms, t.staged_bytes)
            for t in response.transactions
        ]

    def cluster_groups(self) -> list[BrokerGroup]:
        """A cluster's broker groups with their brokers (empty for a single broker)."""
        return [BrokerGroup.from_protocol(g) for g in self._call("DescribeCluster", pb.DescribeClusterRequest()).groups]

    def health(self) -> dict[str, str]:
        """The broker's status, name and version."""
        r = self._call("Health", pb.HealthRequest())
        return {"status": r.status, "broker_name": r.broker_name, "version": r.version}

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _holder(lock: pb.QueueLock, topic: str) -> LockHolder:
    return LockHolder(topic, lock.queue_id, lock.client_id, lock.epoch, lock.expires_at_ms, lease_left_ms(lock))
