"""Transactions in a broker group: the master's changes, in order, and their replay on a slave.

The master records every change of its transaction table (begin, staged send, abort, commit) in
a ``TxnChangeLog`` once it is made, numbered ``(epoch << 32) + n``. A slave's fetch says the last
change it applied; the answer carries those after it. A slave new to this term (or behind what
the log still holds) gets the whole table instead (``table_changes``): it empties its own and
replays it. Changes are recorded under a shared hold and the table is copied under an exclusive
one, so a copy and the number it is sent with always agree.

A committed transaction's records reach the slave through its queues (with the producer id
``txn:<id>``, so a commit replayed on a new master stores nothing twice); the COMMIT change only
marks it committed there. Its PREPARE change, applied by the slaves before the first record is
appended, moves it to COMMITTING with the queue ends it started from: a slave promoted in the
middle of the commit finishes it (the master does so at its start), finding from those ends what
was appended already.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Iterator

from broker.proto import orderlymq_pb2 as pb
from broker.transactions import ABORTED, COMMITTED, COMMITTING, OPEN, TransactionManager, prepare_change
from broker.wire.errors import OrderlyMQError

__all__ = ["TxnChangeLog", "apply_changes", "table_changes"]

_KEPT_BYTES = 64 << 20  # payloads of staged sends kept for slaves that are behind

Kind = pb.TxnChange.Kind


class TxnChangeLog:
    """The transaction changes of one master's term."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._changes: deque[tuple[int, pb.TxnChange]] = deque()
        self._bytes = 0
        self._first = self._last = 0
        self._recording = 0  # changes being made and recorded now
        self._copying = False

    def begin_term(self, epoch: int) -> None:
        with self._cond:
            self._changes.clear()
            self._bytes = 0
            self._first = self._last = epoch << 32

    @property
    def last(self) -> int:
        return self._last

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Held while a change is made and recorded (many at once; never during a table copy)."""
        with self._cond:
            while self._copying:
                self._cond.wait()
            self._recording += 1
        try:
            yield
        finally:
            with self._cond:
                self._recording -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def copying(self) -> Iterator[int]:
        """Held while the table is copied; yields the number of the last change it includes."""
        with self._cond:
            while self._copying or self._recording:
                self._cond.wait()
            self._copying = True
            last = self._last
        try:
            yield last
        finally:
            with self._cond:
                self._copying = False
                self._cond.notify_all()

    def append(self, change: pb.TxnChange) -> int:
        with self._cond:
            self._last += 1
            self._changes.append((self._last, change))
            self._bytes += len(change.payload)
            while self._bytes > _KEPT_BYTES and len(self._changes) > 1:
                seq, dropped = self._changes.popleft()
                self._bytes -= len(dropped.payload)
                self._first = seq
            return self._last

    def holds(self, seq: int) -> bool:
        """Whether the log can tell the changes after ``seq`` (``since`` gives them)."""
        with self._cond:
            return self._holds(seq)

    def since(self, seq: int) -> list[pb.TxnChange] | None:
        """The changes after ``seq``; None when the log cannot tell (another term, or dropped)."""
        with self._cond:
            if not self._holds(seq):
                return None
            return [change for number, change in self._changes if number > seq]

    def _holds(self, seq: int) -> bool:
        return seq >> 32 == self._first >> 32 and self._first <= seq <= self._last


def table_changes(txns: TransactionManager) -> list[pb.TxnChange]:
    """The whole table as changes that rebuild it on an empty one."""
    changes = []
    for txn_id, state, timeout_ms in txns.table():
        if state in (COMMITTED, ABORTED):
            changes.append(pb.TxnChange(kind=Kind.FINISHED, txn_id=txn_id, state=state))
            continue
        changes.append(pb.TxnChange(kind=Kind.BEGIN, txn_id=txn_id, timeout_ms=timeout_ms))
        changes += [pb.TxnChange(kind=Kind.STAGE, txn_id=txn_id, topic=topic, queue_id=queue_id, payload=payload)
                    for topic, queue_id, payload in txns.staged(txn_id)]
        if state == COMMITTING:
            changes.append(prepare_change(txn_id, txns.commit_starts(txn_id)))
    return changes


def apply_changes(txns: TransactionManager, changes) -> None:
    """Replay the master's changes on a slave's table, in order."""
    for change in changes:
        if change.kind == Kind.BEGIN:
            txns.begin(change.txn_id, change.timeout_ms)
        elif change.kind == Kind.STAGE:
            txns.stage(change.txn_id, change.topic, change.queue_id, change.payload)
        elif change.kind == Kind.ABORT:
            with contextlib.suppress(OrderlyMQError):  # aborted already
                txns.abort(change.txn_id)
        elif change.kind == Kind.PREPARE:
            starts = {(p.topic, p.queue_id): p.offset for p in change.starts}
            if txns.state(change.txn_id) == OPEN:
                txns.prepare_commit(change.txn_id, lambda _queues, starts=starts: starts, replay=True)
        elif change.kind == Kind.COMMIT:
            state = txns.state(change.txn_id)
            if state == OPEN:
                txns.prepare_commit(change.txn_id, replay=True)
                state = COMMITTING
            if state == COMMITTING:
                txns.mark_committed(change.txn_id)
            elif state != COMMITTED:
                txns.import_finished(change.txn_id, COMMITTED)
        elif change.kind == Kind.FINISHED:
            txns.import_finished(change.txn_id, change.state)
