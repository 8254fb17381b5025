"""Queues whose log lost its tail after this query read it, and where the query reads on.

A broker with ``flush = "async"`` that loses power loses the messages of its last moments, some
of which a query may have read; the producers' next messages are then stored at those offsets
again. A query going on from its position would skip them. So each position the source puts
in its offsets comes with ``readAtMs``: the broker's clock when the queue's end was read
(``QueryOffsetsResponse.now_ms``), at or after which every message below the position had been
stored. After a queue's lock came back at a new epoch (the broker restarted, or the query did),
or another start of the broker answered for the queue, the message just below the position is
looked at: missing, or stored after that time, it is another one, and the query reads on from the
first offset stored since (the log's cut), instead of skipping what was stored there. Nothing the
query read is read again: those messages are gone.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping

from connector.client.connection import BrokerConnection
from connector.client.pull_consumer import message_at
from connector.spark import metadata
from connector.spark.offsets import Positions, QueueRef, positions_of, read_at_of

__all__ = ["LostTails", "stored_at", "written_again"]

log = logging.getLogger(__name__)


class LostTails:
    """The cuts found by the driver: ``{queue: [(first offset stored again, since when), ...]}``
    in the order found; "since when" is the store time of the message at the cut (every position
    past the cut read later is one of the new log), or the broker's time when the cut was found
    while nothing was stored there yet."""

    def __init__(self, conn: BrokerConnection) -> None:
        self._conn = conn
        self._cuts: dict[QueueRef, list[tuple[int, int]]] = {}
        self._verified: dict[QueueRef, Hashable] = {}  # what each queue was last looked at under

    def check(self, under: Mapping[QueueRef, Hashable], *offsets: Mapping) -> None:
        """Look at the queues whose ``under`` (their lock epoch and the broker's start) changed since
        they were last looked at, at each position of ``offsets`` (source offsets) that carries its
        read time."""
        changed = [ref for ref, now in under.items() if self._verified.get(ref) != now]
        for offset in offsets:
            positions, read_at = positions_of(offset), read_at_of(offset)
            for ref in changed:
                if positions.get(ref) and ref in read_at:
                    self._look(ref, positions[ref], read_at[ref])
        self._verified.update((ref, under[ref]) for ref in changed)

    def effective(self, positions: Positions, read_at: Mapping[QueueRef, int]) -> Positions:
        """``positions`` with each one past a cut of its queue, read before the log was written
        again there (so a position in the log that lost its tail), moved back to the cut."""
        out = dict(positions)
        for ref, cuts in self._cuts.items():
            pos, at = out.get(ref), read_at.get(ref)
            if pos is None or at is None:
                continue
            for cut, since in cuts:
                if pos > cut and at < since:
                    pos = cut
            out[ref] = pos
        return out

    def _look(self, ref: QueueRef, position: int, read_at: int) -> None:
        state = metadata.queue_state(self._conn, ref)
        if state.max_offset >= position:
            stored = stored_at(self._conn, ref, position - 1)
            if stored is None or stored <= read_at:  # the same message (or gone by retention: cannot tell)
                return
        cut = written_again(self._conn, ref, position, read_at)
        since = stored_at(self._conn, ref, cut)
        found = (cut, state.now_ms if since is None else since)
        cuts = self._cuts.setdefault(ref, [])
        if found in cuts:
            return  # looked at again (a new epoch): known
        cuts.append(found)
        log.warning(
            "queue %s/%d lost its tail after this query read up to offset %d (the broker lost power with "
            "flush = \"async\", or the topic was deleted and created again): offsets from %d on hold messages stored "
            "since, and the query reads on from there", ref[0], ref[1], position, cut)


def written_again(conn: BrokerConnection, ref: QueueRef, position: int, read_at: int) -> int:
    """Where the log was written again below ``position``, read at ``read_at``: the first offset
    stored since then (the log's end when none was), or ``position`` when none below it was."""
    return min(metadata.queue_state(conn, ref, timestamp=read_at + 1).offset_for_timestamp, position)


def stored_at(conn: BrokerConnection, ref: QueueRef, offset: int) -> int | None:
    """The store timestamp (ms) of the message at ``offset``; None when none can be read there."""
    found = message_at(conn, ref[0], ref[1], offset)
    return None if found is None else found.store_timestamp
