"""Per-queue offsets as the source stores them in Spark's checkpoint: pure functions, no I/O.

A source offset is a JSON object::

    {"clientId": "spark-3f2c...", "group": "billing", "brokers": "127.0.0.1:9876",
     "queues": {"orders": {"0": 12, "1": 7}}}

``clientId`` is the consumer identity of the query (minted once in ``initialOffset`` and carried
in every offset, so a restart from the checkpoint re-acquires its own queue locks at once);
``group`` and ``brokers`` say whose offsets these are, so that the sink can advance the group's
offsets right after it made a batch visible (``connector.spark.handoff``); ``queues`` maps each
topic to ``{queue id: next offset to read}``; ``readAtMs`` (same shape, where known) the broker's
clock when the position was read, by which every message below it had been stored
(``connector.spark.lost_tails``); ``initial`` (same shape, the end of the first batch only) the
positions the query started from.

The initial offset is not a position: ``{"clientId": ..., "fresh": true}`` (``fresh_start``).
Spark does not checkpoint it, and asks for it again when it replays the first batch after a
restart; the positions are resolved only as the first batch is planned, and written into that
batch's end, so the replay reads from where the first run started, under the first run's
identity. The JSON is always built by
``to_json`` with sorted topics and numerically sorted queues, because Spark compares offsets by
their JSON: the same positions must always serialize the same way.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.wire.errors import InvalidOptionError

__all__ = ["Positions", "QueueRef", "admit", "carried_read_at", "client_id_of", "fresh_start", "initial_of",
           "is_fresh_start", "positions_of", "read_at_of", "to_json"]

QueueRef = tuple[str, int]
Positions = dict[QueueRef, int]


def to_json(client_id: str | None, positions: Mapping[QueueRef, int], *, group: str | None = None,
            brokers: str | None = None, read_at: Mapping[QueueRef, int] | None = None,
            initial: Mapping[QueueRef, int] | None = None) -> dict:
    """The canonical offset dict of ``positions``."""
    out: dict = {}
    if client_id is not None:
        out["clientId"] = client_id
    if group is not None:
        out["group"] = group
    if brokers is not None:
        out["brokers"] = brokers
    out["queues"] = _by_topic(positions)
    if read_at:
        out["readAtMs"] = _by_topic(read_at)
    if initial is not None:
        out["initial"] = _by_topic(initial)
    return out


def fresh_start(client_id: str, *, group: str | None = None, brokers: str | None = None) -> dict:
    """The initial offset of a new query: its identity, no positions yet."""
    named = {"clientId": client_id, "group": group, "brokers": brokers}
    return {key: value for key, value in named.items() if value is not None} | {"fresh": True}


def is_fresh_start(offset: Mapping) -> bool:
    return isinstance(offset, Mapping) and offset.get("fresh") is True and "queues" not in offset


def _by_topic(values: Mapping[QueueRef, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for topic, queue_id in sorted(values):
        out.setdefault(topic, {})[str(queue_id)] = int(values[(topic, queue_id)])
    return out


def positions_of(offset: Mapping) -> Positions:
    """The ``{(topic, queue): offset}`` of an offset dict (from ``to_json`` or a checkpoint)."""
    if not isinstance(offset, Mapping) or not isinstance(offset.get("queues"), Mapping):
        raise InvalidOptionError(
            f"checkpointed offset {offset!r} is not an orderlymq source offset: was the checkpoint written by "
            "another source? use a new checkpointLocation"
        )
    return _by_queue(offset["queues"])


def _by_queue(by_topic: Mapping) -> Positions:
    return {(topic, int(queue)): int(value) for topic, queues in by_topic.items() for queue, value in queues.items()}


def read_at_of(offset: Mapping) -> Positions:
    """The ``readAtMs`` of an offset dict (empty for one written before it was recorded)."""
    read_at = offset.get("readAtMs")
    return _by_queue(read_at) if isinstance(read_at, Mapping) else {}


def initial_of(offset: Mapping) -> Positions | None:
    """The positions the query started from, carried by the end of its first batch (None in any
    other offset, and in one written before they were recorded)."""
    initial = offset.get("initial")
    return _by_queue(initial) if isinstance(initial, Mapping) else None


def carried_read_at(begin: Positions, begun_at: Mapping[QueueRef, int], end: Positions,
                    ended_at: Mapping[QueueRef, int]) -> Positions:
    """The read times of ``end``: a queue's new one where it moved, else the one ``begin`` had
    (an idle query's offsets must stay the same JSON, or Spark would run a batch per trigger)."""
    out = {}
    for ref, pos in end.items():
        at = begun_at.get(ref) if pos == begin.get(ref) else ended_at.get(ref)
        if at is not None:
            out[ref] = at
    return out


def client_id_of(offset: Mapping) -> str:
    client_id = offset.get("clientId") if isinstance(offset, Mapping) else None
    if not client_id:
        raise InvalidOptionError(
            f"checkpointed offset {offset!r} carries no clientId: it was not written by a streaming orderlymq "
            "source; use a new checkpointLocation"
        )
    return str(client_id)


def admit(start: Mapping[QueueRef, int], latest: Mapping[QueueRef, int], max_rows: int | None) -> Positions:
    """End positions that admit at most ``max_rows`` offsets past ``start`` (all when None).

    The budget is shared max-min fairly: queues with little backlog take all of it, the rest
    split what remains evenly, and every trigger with a budget makes progress. Offsets, not
    rows, are counted, so with a tag filter a trigger may yield fewer rows than the budget.
    """
    end = {ref: max(latest.get(ref, pos), pos) for ref, pos in start.items()}
    for ref, pos in latest.items():
        end.setdefault(ref, pos)
    if max_rows is None:
        return end
    lag = {ref: end[ref] - start.get(ref, 0) for ref in end}
    backlog = sorted((ref for ref in lag if lag[ref] > 0), key=lambda ref: (lag[ref], ref))
    admitted = {ref: start.get(ref, 0) for ref in end}
    remaining = max_rows
    for i, ref in enumerate(backlog):
        if remaining <= 0:
            break
        share = max(remaining // (len(backlog) - i), 1)
        take = min(lag[ref], share)
        admitted[ref] += take
        remaining -= take
    return admitted


