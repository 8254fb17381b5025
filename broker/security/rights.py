"""What each RPC of ``orderlymq.v1`` asks for: (action, resource) pairs, all required.

Publishing needs ``publish`` on the topic; reading needs ``subscribe`` on the topic, and what
moves or guards a group's progress (offsets, queue locks, membership) also ``subscribe`` on the
group; topic changes need ``admin``; broker-wide listings ``admin`` on ``broker``. A topic's
route (``DescribeTopic``) is shown to anyone with any right on it (``DESCRIBE``): producers look
it up too; a slave's ``Replicate`` stream needs ``replicate`` on ``broker``, which no other
right implies. A method missing from the table is refused, so a new RPC cannot slip through
unchecked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker.security.acl import BROKER_RESOURCE, REPLICATE

__all__ = ["ANY_PUBLISH", "AUTHENTICATED_ONLY", "DESCRIBE", "RPC_RIGHTS", "required_rights"]

Right = tuple[str, str]

#: The transaction RPCs name no topic (their sends do, and each send is checked): they need a
#: publish right on some topic.
ANY_PUBLISH = ("publish", "")
#: Not an action of the ACL file: any of publish, subscribe or admin on the resource.
DESCRIBE = "describe"
#: Answered to any authenticated user.
AUTHENTICATED_ONLY: tuple[Right, ...] = ()


def _topic(action: str) -> Callable[[Any], tuple[Right, ...]]:
    return lambda r: ((action, f"topic:{r.topic}"),)


def _topic_and_group(r: Any) -> tuple[Right, ...]:
    return (("subscribe", f"topic:{r.topic}"), ("subscribe", f"group:{r.group}"))


def _pull(r: Any) -> tuple[Right, ...]:
    # A fenced pull names its group: the lock it relies on belongs to that group.
    return _topic_and_group(r) if r.group else (("subscribe", f"topic:{r.topic}"),)


def _group(r: Any) -> tuple[Right, ...]:
    return (("subscribe", f"group:{r.group}"),)


def _heartbeat(r: Any) -> tuple[Right, ...]:
    return (("subscribe", f"group:{r.group}"), *(("subscribe", f"topic:{t}") for t in r.topics))


RPC_RIGHTS: dict[str, Callable[[Any], tuple[Right, ...]]] = {
    "CreateTopic": _topic("admin"),
    "UpdateTopic": _topic("admin"),
    "DeleteTopic": _topic("admin"),
    "DescribeTopic": _topic(DESCRIBE),
    "ListTopics": lambda r: AUTHENTICATED_ONLY,
    "DescribeCluster": lambda r: AUTHENTICATED_ONLY,
    "Health": lambda r: AUTHENTICATED_ONLY,
    "Send": _topic("publish"),
    "SendStream": _topic("publish"),
    "BeginTxn": lambda r: (ANY_PUBLISH,),
    "CommitTxn": lambda r: (ANY_PUBLISH,),
    "AbortTxn": lambda r: (ANY_PUBLISH,),
    "Pull": _pull,
    "QueryOffsets": _topic("subscribe"),
    "AwaitMessages": lambda r: tuple(("subscribe", f"topic:{topic}") for topic in sorted({p.topic for p in r.positions})),
    "CommitOffset": _topic_and_group,
    "GetOffset": _topic_and_group,
    "LockBatch": _topic_and_group,
    "UnlockBatch": _topic_and_group,
    "QueryLocks": _topic_and_group,
    "Heartbeat": _heartbeat,
    "LeaveGroup": _group,
    "ListConsumers": _group,
    "ListGroups": lambda r: (("admin", BROKER_RESOURCE),),
    "ListTransactions": lambda r: (("admin", BROKER_RESOURCE),),
    # orderlymq.v1.Replication: a broker group's slave copying everything its master holds.
    "Replicate": lambda r: ((REPLICATE, BROKER_RESOURCE),),
}


def required_rights(method: str, request: Any) -> tuple[Right, ...] | None:
    """The rights ``method`` needs for ``request``; None for a method this table does not know."""
    rights = RPC_RIGHTS.get(method)
    return None if rights is None else rights(request)
