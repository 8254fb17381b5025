"""Who consumed a queue since this query left it: the group's committed offsets, and the one rule.

A streaming query commits the group's offsets with its client id (fenced by the lock epoch), and
the broker remembers which client committed each one (``GetOffset.committed_by``). When the query
finds its lock gone or changed hands (a broker restart fences every holder; a lease that lapsed
lets another client in), or starts again from a checkpoint, those offsets tell whether another
client consumed the queue meanwhile. ``moved_by_other`` is that rule, used by the driver (lock
renewal, restart from a checkpoint) and by the tasks (a lock lost mid-batch) alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.wire.errors import FencedError
from connector.client.connection import BrokerConnection, pb
from connector.spark.offsets import QueueRef

__all__ = ["GroupOffset", "check_not_consumed", "group_offset", "moved_by_other"]


@dataclass(frozen=True)
class GroupOffset:
    """The group's committed position in one queue and the client id that committed it.

    ``offset`` is -1 when the group never committed there; ``committed_by`` is "" for a commit
    made without a client id (an unfenced commit, such as an offset reset) or none at all.
    """

    offset: int
    committed_by: str

    def describe(self) -> str:
        if self.offset < 0:
            return "no committed offset"
        by = f"client {self.committed_by!r}" if self.committed_by else "a commit without a client id"
        return f"offset {self.offset} committed by {by}"


def group_offset(conn: BrokerConnection, group: str, ref: QueueRef) -> GroupOffset:
    """The group's committed offset of queue ``ref`` as the broker has it now."""
    topic, queue_id = ref
    answer = conn.call("GetOffset", pb.GetOffsetRequest(group=group, topic=topic, queue_id=queue_id))
    return GroupOffset(answer.offset, answer.committed_by)


def moved_by_other(found: GroupOffset, client_id: str, expected: int | None) -> bool:
    """Whether ``found`` shows that someone other than ``client_id`` consumed the queue.

    ``expected`` is where this client left the group's offset (None when it does not know). The
    offset still there, never committed, or last moved by this client itself: nobody else
    consumed. Moved by another client id, or by a commit without one: someone did.
    """
    if found.offset < 0 or found.committed_by == client_id:
        return False
    return expected is None or found.offset != expected


def check_not_consumed(conn: BrokerConnection, group: str, client_id: str, ref: QueueRef, expected: int | None,
                       *, context: str) -> GroupOffset:
    """The group's offset of ``ref``; ``FencedError`` when another client consumed the queue.

    ``context`` says what happened (e.g. "the lock of queue orders/1 was lost and granted again at
    epoch 7"); the error names both positions and the other client.
    """
    found = group_offset(conn, group, ref)
    if moved_by_other(found, client_id, expected):
        topic, queue_id = ref
        left = "an unknown position" if expected is None else f"offset {expected}"
        raise FencedError(
            f"{context}, and another consumer of group {group!r} read queue {topic}/{queue_id} meanwhile: "
            f"client {client_id!r} left it at {left}, the group now has {found.describe()}. This query stops "
            "so that the two do not both consume the queue; restart it to go on from the group's offsets"
        )
    return found
