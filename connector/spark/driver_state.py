"""The state of the driver-side stream reader: connection, locks, the group's offsets.

It lives in the Python process Spark keeps for the reader during the life of the query, and is
never pickled. Two duties beyond holding the locks:

- **Committing the group's offsets** (fenced by the lock epochs), recording where this client
  left each queue; a commit refused because the lock was lost takes the lock again only when
  the group's offsets show that nobody else consumed the queue (``group_offsets``).
- **Checking a checkpoint against the group** on the first call of a query restarted from its
  checkpoint: when another client of the group moved the offsets since, the option
  ``groupOffsetConflict`` decides: ``fail`` (default) stops the query with both positions and
  the other client named; ``group`` reads on from the group's offsets; ``checkpoint`` reads on
  from the checkpoint's (re-reading what the other client read).
"""

from __future__ import annotations

import logging
import time

from broker.wire.errors import FencedError, GroupOffsetConflictError
from connector.client.connection import pb
from connector.spark import metadata
from connector.spark.group_offsets import GroupOffset, group_offset, moved_by_other
from connector.spark.lock_warden import Warden
from connector.spark.locks import LockKeeper
from connector.spark.lost_tails import LostTails
from connector.spark.offsets import Positions, QueueRef
from connector.spark.options import SourceOptions

__all__ = ["DriverState"]

log = logging.getLogger(__name__)

_ROUTES_TTL_S = 1.0


class DriverState:
    """Connection, locks and offset bookkeeping of the driver-side reader process."""

    def __init__(self, options: SourceOptions, client_id: str) -> None:
        self.options = options
        self.client_id = client_id
        self.group = options.consumer_group or ""
        self.conn = options.connect()
        self.locks = LockKeeper(self.conn, self.group, client_id, options.lock_timeout_ms, left_at=self._left_at)
        self.warden = Warden(options.brokers, self.group, client_id, options.security)
        self.locks.on_change = self.warden.holds
        self.last_latest: Positions | None = None
        self.last_read_at: Positions = {}  # the broker's clock as it answered for each queue of last_latest
        self.last_boot: Positions = {}  # the broker's start that answered for each queue of last_latest
        self.tails = LostTails(self.conn)
        self.routes: dict[str, pb.TopicRoute] = {}  # the topics' routes as last read (queue -> group)
        self._routes_read_at: float | None = None
        self._left: Positions = {}  # where this client left (committed or accepted) the group's offsets
        self._rebase: dict[QueueRef, tuple[int, int]] = {}  # groupOffsetConflict=group: (checkpoint, group)
        self.checked = False

    def _left_at(self, ref: QueueRef) -> int | None:
        return self._left.get(ref)

    def queues(self) -> list[QueueRef]:
        """Every queue of the topics, as read at most ``_ROUTES_TTL_S`` ago: new queues of a growing
        topic appear within it, and an idle query's latestOffset, asked every few milliseconds, does
        not read the routes each time."""
        if self._routes_read_at is None or time.monotonic() - self._routes_read_at >= _ROUTES_TTL_S:
            self._read_routes()
        return metadata.all_queues(self.routes)

    def _read_routes(self) -> None:
        read_at = time.monotonic()
        self.routes = metadata.describe_topics(self.conn, self.options.topics)
        self._routes_read_at = read_at

    def placement(self, ref: QueueRef) -> tuple[str, tuple[str, ...]]:
        """The broker (a cluster: the group) holding queue ``ref`` and its brokers, as last read."""
        if ref[0] not in self.routes:
            self._read_routes()
        return metadata.placement(self.routes[ref[0]], ref[1])

    def latest(self, queues: list[QueueRef]) -> Positions:
        states = metadata.queue_states(self.conn, queues)
        self.last_latest = {ref: state.max_offset for ref, state in states.items()}
        self.last_read_at = {ref: state.now_ms for ref, state in states.items()}
        self.last_boot = {ref: state.boot_id for ref, state in states.items()}
        return dict(self.last_latest)

    def check_tails(self, queues: list[QueueRef], *offsets: dict) -> None:
        """Look below the positions of ``offsets`` for a lost tail (``LostTails``) in the queues whose
        lock epoch, or the broker's start that last answered for them, changed since last looked at."""
        epochs = self.locks.epochs(queues)
        self.tails.check({ref: (epochs[ref], self.last_boot.get(ref, 0)) for ref in queues}, *offsets)

    # -- the group's offsets ---------------------------------------------------------------------

    def accept_group(self, queues: list[QueueRef]) -> dict[QueueRef, GroupOffset]:
        """Record the group's offsets of ``queues`` as this client's starting point (locks held)."""
        found = {ref: group_offset(self.conn, self.group, ref) for ref in queues}
        for ref, offset in found.items():
            if offset.offset >= 0:
                self._left[ref] = offset.offset
        return found

    def hold_and_accept(self, queues: list[QueueRef]) -> dict[QueueRef, GroupOffset]:
        """Hold ``queues``, then accept the group's offsets as this client's starting point; the one
        look at the group a start makes (``checked``)."""
        self.locks.epochs(queues)  # hold the queues before reading the group's committed offsets
        self.checked = True
        return self.accept_group(queues)

    def check_checkpoint(self, checkpoint: Positions, queues: list[QueueRef]) -> None:
        """Compare a checkpoint's positions with the group's offsets (once, on a restart)."""
        found = self.hold_and_accept(queues)
        conflicts = {
            ref: (pos, found[ref]) for ref, pos in sorted(checkpoint.items())
            if ref in found and moved_by_other(found[ref], self.client_id, pos)
        }
        if not conflicts:
            return
        mode = self.options.group_offset_conflict
        listed = "; ".join(
            f"{topic}/{queue_id}: checkpoint at {pos}, group at {offset.describe()}"
            for (topic, queue_id), (pos, offset) in conflicts.items()
        )
        if mode == "fail":
            others = sorted({offset.committed_by or "(a commit without a client id)" for _, offset in conflicts.values()})
            raise GroupOffsetConflictError(
                f"consumer group {self.group!r}: this query (client {self.client_id!r}) restarts from its checkpoint, "
                f"but client(s) {', '.join(others)} moved the group's offsets since it stopped ({listed}). Reading "
                "from the checkpoint would read again what they read. Set option groupOffsetConflict='group' to go "
                "on from the group's offsets, or 'checkpoint' to keep the checkpoint's, or use another "
                "consumerGroup",
                {ref: (pos, offset.offset, offset.committed_by) for ref, (pos, offset) in conflicts.items()},
            )
        log.warning("consumer group %r: offsets moved by another client since the checkpoint (%s); "
                    "groupOffsetConflict=%s", self.group, listed, mode)
        if mode == "group":
            self._rebase = {ref: (pos, offset.offset) for ref, (pos, offset) in conflicts.items()}

    def effective(self, positions: Positions, read_at: Positions) -> Positions:
        """Spark's positions (read at ``read_at``), moved to the group's where
        ``groupOffsetConflict=group`` applies, and back to where a queue's log lost its tail."""
        out = dict(positions)
        for ref, (checkpoint, group) in self._rebase.items():
            pos = positions.get(ref)
            if pos is None:
                continue
            if group > checkpoint:
                out[ref] = max(pos, group)
            elif pos == checkpoint:
                out[ref] = group
        return self.tails.effective(out, read_at)

    def commit(self, end: Positions) -> None:
        """Commit the group's offsets for the queues that moved, fenced by the lock epochs.

        Spark calls ``commit(end)`` lazily, when it plans the batch after the one ending at
        ``end``. ``latestOffset(start)`` and ``partitions(start, end)`` are only called once every
        batch up to ``start`` has completed, so they commit ``start`` too.
        """
        moved = self.uncommitted(end)
        if not moved:
            return
        epochs = self.locks.epochs(moved)

        def commit_queue(ref: QueueRef) -> None:
            try:
                self._commit_one(ref, moved[ref], epochs[ref])
            except FencedError:
                # The lock was lost (a broker restart fences every holder): take it again if nobody else
                # consumed the queue, else the FencedError names who did.
                self._commit_one(ref, moved[ref], self.locks.recover(ref))
            self._left[ref] = moved[ref]

        metadata.each_concurrently(commit_queue, sorted(moved))

    def uncommitted(self, end: Positions) -> Positions:
        """The positions of ``end`` this client has not committed (nor accepted) yet."""
        return {ref: pos for ref, pos in end.items() if self._left.get(ref) != pos}

    def _commit_one(self, ref: QueueRef, pos: int, epoch: int) -> None:
        topic, queue_id = ref
        request = pb.CommitOffsetRequest(
            group=self.group, topic=topic, queue_id=queue_id, offset=pos, client_id=self.client_id, epoch=epoch
        )
        self.conn.call("CommitOffset", request)

    def close(self) -> None:
        try:
            if self.locks.release():
                self.warden.dismiss()  # else it retries the unlock once this process has gone
        finally:
            self.conn.close()
