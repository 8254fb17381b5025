"""What the connector asks the broker before reading or writing: routes, queue bounds, and the
translation of ``startingOffsets`` / ``endingOffsets`` / timestamps into per-queue positions.

In a cluster (docs/cluster.md) a topic's route also says which broker group holds each queue
(``placement``); a ``RoutedConnection`` sends each queue's calls there.

Errors name the option that led to the request and how to fix it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from broker.wire.errors import BrokerUnavailableError, InvalidOptionError, TopicNotFoundError
from connector.client.connection import BrokerConnection, pb
from connector.client.routed import RoutedConnection
from connector.spark.offsets import Positions, QueueRef
from connector.spark.options import EARLIEST, LATEST, OffsetSpec

__all__ = ["Connection", "QueueBounds", "all_queues", "at_once", "by_group", "describe_topics", "each_concurrently",
           "group_connection", "group_of", "placement", "queue_bounds", "queue_ends", "queue_state", "queue_states",
           "resolve_positions"]

log = logging.getLogger(__name__)

QueueBounds = tuple[int, int]  # (min offset still stored, offset the next message will get)

_T = TypeVar("_T")
_R = TypeVar("_R")
_MAX_CONCURRENT_CALLS = 8


def each_concurrently(call: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``[call(item) for item in items]`` with up to 8 calls in flight: one round trip per queue
    made one after the other is what a micro-batch of many queues waited for. The first error (in
    the order of ``items``) is raised once every call has ended."""
    if len(items) <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(min(len(items), _MAX_CONCURRENT_CALLS), thread_name_prefix="orderlymq-call") as pool:
        futures = [pool.submit(call, item) for item in items]
    return [future.result() for future in futures]


def at_once(*steps: Callable[[], _R]) -> list[_R]:
    """Call independent ``steps`` at the same time (``each_concurrently``); their results in order."""
    return each_concurrently(lambda step: step(), steps)


def describe_topics(
    conn: BrokerConnection, topics: Iterable[str], *, option: str = "topic"
) -> dict[str, pb.TopicRoute]:
    """``{topic: route}``; errors name ``option`` when a topic is missing or the broker is down."""
    routes = {}
    for topic in topics:
        try:
            routes[topic] = conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic))
            if isinstance(conn, RoutedConnection):
                conn.routes.remember(routes[topic])  # its calls on the topic's queues need no second read
        except TopicNotFoundError:
            raise TopicNotFoundError(
                f"topic {topic!r} (option '{option}') does not exist on broker {conn.address}: create it first, "
                f"e.g. `orderlymq topic create {topic} --queues 8`, or fix the name"
            ) from None
        except BrokerUnavailableError as exc:
            raise BrokerUnavailableError(
                f"cannot reach the broker named by option 'brokers' ({','.join(conn.addresses)}): {exc}"
            ) from None
    return routes


def all_queues(routes: dict[str, pb.TopicRoute]) -> list[QueueRef]:
    return [(topic, q) for topic, route in sorted(routes.items()) for q in range(route.queue_count)]


Connection = BrokerConnection | RoutedConnection  # a single broker's, or a cluster's routed by queue


def group_of(conn: Connection, ref: QueueRef) -> str:
    """The broker group holding queue ``ref`` ("" on a single broker)."""
    if not isinstance(conn, RoutedConnection) or conn.routes.clustered is False:
        return ""
    return conn.routes.route(ref[0]).group_of(ref[1])


def by_group(conn: Connection, queues: Iterable[QueueRef]) -> dict[str, list[QueueRef]]:
    """``queues`` (sorted) by the broker group holding them; all under "" on a single broker."""
    out: dict[str, list[QueueRef]] = {}
    for ref in sorted(set(queues)):
        out.setdefault(group_of(conn, ref), []).append(ref)
    return out


def group_connection(conn: Connection, group: str) -> BrokerConnection:
    """The connection to broker group ``group``'s master ("": the single broker)."""
    return conn.for_group(group) if isinstance(conn, RoutedConnection) else conn


def placement(route: pb.TopicRoute, queue_id: int) -> tuple[str, tuple[str, ...]]:
    """Where queue ``queue_id`` of a topic lives: its broker group's name and every live broker of
    the group, master first (a cluster), or the broker's name and ``()`` (a single broker)."""
    for group in route.groups:
        if queue_id in group.queue_ids:
            return group.broker_name, tuple(group.addresses)
    return route.broker_name, ()


def queue_state(conn: BrokerConnection, ref: QueueRef, timestamp: int | None = None) -> pb.QueryOffsetsResponse:
    """The bounds of one queue, the broker's clock, and the first offset stored at or after
    ``timestamp`` when one is given."""
    topic, queue_id = ref
    return conn.call(
        "QueryOffsets",
        pb.QueryOffsetsRequest(
            topic=topic, queue_id=queue_id, timestamp=timestamp or 0, has_timestamp=timestamp is not None
        ),
    )


def queue_bounds(conn: BrokerConnection, ref: QueueRef, timestamp: int | None = None) -> tuple[int, int, int]:
    """(min, max, offset for ``timestamp``) of one queue; the third is max when no timestamp."""
    response = queue_state(conn, ref, timestamp)
    at = response.offset_for_timestamp if timestamp is not None else response.max_offset
    return response.min_offset, response.max_offset, at


def queue_ends(conn: BrokerConnection, queues: Sequence[QueueRef]) -> Positions:
    """The offset the next message of each queue will get, asked of every queue at once."""
    return {ref: state.max_offset for ref, state in queue_states(conn, queues).items()}


def queue_states(conn: BrokerConnection, queues: Sequence[QueueRef]) -> dict[QueueRef, pb.QueryOffsetsResponse]:
    """``queue_state`` of every queue, asked at once."""
    return dict(zip(queues, each_concurrently(lambda ref: queue_state(conn, ref), queues), strict=True))


def resolve_positions(
    conn: BrokerConnection,
    spec: OffsetSpec,
    queues: Iterable[QueueRef],
    *,
    option: str,
    group: str | None = None,
    fail_on_data_loss: bool = True,
) -> Positions:
    """Per-queue positions that ``spec`` (the value of ``option``) denotes for ``queues``.

    Explicit offsets are checked against what the broker holds: past the end is always an error;
    below the earliest retained offset is an error with ``failOnDataLoss`` (the default), else the
    position moves up to the earliest offset with a warning.
    """
    out: Positions = {}
    queues = list(queues)
    if spec.kind == "offsets":
        _check_queue_ids(spec, queues, option)
    for ref in queues:
        topic, queue_id = ref
        low, high, at = queue_bounds(conn, ref, spec.timestamp if spec.kind == "timestamp" else None)
        if spec.kind == "earliest":
            out[ref] = low
        elif spec.kind == "latest":
            out[ref] = high
        elif spec.kind == "timestamp":
            out[ref] = max(at, low)
        elif spec.kind == "committed":
            committed = conn.call("GetOffset", pb.GetOffsetRequest(group=group, topic=topic, queue_id=queue_id)).offset
            out[ref] = low if committed < 0 else _in_range(committed, low, high, ref, option, fail_on_data_loss)
        else:
            # A queue left out of the JSON: from the earliest offset, or to the latest one.
            wanted = spec.offsets[topic].get(queue_id, LATEST if option == "endingOffsets" else EARLIEST)
            if wanted == EARLIEST:
                out[ref] = low
            elif wanted == LATEST:
                out[ref] = high
            else:
                out[ref] = _in_range(wanted, low, high, ref, option, fail_on_data_loss)
    return out


def _check_queue_ids(spec: OffsetSpec, queues: list[QueueRef], option: str) -> None:
    known = set(queues)
    for topic, per_queue in spec.offsets.items():
        for queue_id in per_queue:
            if (topic, queue_id) not in known:
                count = sum(1 for t, _ in queues if t == topic)
                raise InvalidOptionError(
                    f"option '{option}' names queue {queue_id} of topic {topic!r}, which has {count} queue(s) "
                    f"(ids 0..{count - 1}): fix the queue id"
                )


def _in_range(offset: int, low: int, high: int, ref: QueueRef, option: str, fail_on_data_loss: bool) -> int:
    topic, queue_id = ref
    if offset > high:
        raise InvalidOptionError(
            f"option '{option}': offset {offset} of queue {topic}/{queue_id} is past its end ({high} messages "
            f"stored): use an offset <= {high}, or -1 for the latest"
        )
    if offset < low:
        if fail_on_data_loss:
            raise InvalidOptionError(
                f"option '{option}': offset {offset} of queue {topic}/{queue_id} was removed by retention "
                f"(earliest retained offset is {low}): start at >= {low} (-2 for the earliest), or set "
                "failOnDataLoss=false to skip the lost messages"
            )
        log.warning(
            "queue %s/%d: offsets %d..%d were removed by retention; starting at %d (failOnDataLoss=false)",
            topic,
            queue_id,
            offset,
            low - 1,
            low,
        )
        return low
    return offset
