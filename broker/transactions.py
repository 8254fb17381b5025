"""Staged producer transactions that survive a broker restart.

A producer begins a transaction under an id of its choosing, stages sends into it, then commits or
aborts. Life cycle::

    (new) --begin--> OPEN --prepare_commit--> COMMITTING --mark_committed--> COMMITTED
                      |
                      +--abort / idle past its timeout--> ABORTED

The server makes a commit visible by appending the staged batches to the queues between
``prepare_commit`` and ``mark_committed``. A crash in between leaves the transaction COMMITTING with
its staged data kept; ``committing()`` lists such transactions so the server re-applies them at
start (its appends are idempotent). Finished ids are remembered, so a replayed CommitTxn of a
committed id is an idempotent success and a begin of a finished id reports how it ended.

On disk, under ``directory``:

- ``staged/<sha256 of id>.stage``: one file per live transaction (``broker.staged_files``, which
  recycles finished ones), a frame per send holding ``[u16 topic length][topic][i32 queue id][Arrow
  IPC payload]``. A frame is fsynced before ``stage`` returns, so only an unacknowledged frame can be
  torn by a crash; on load a file is cut at its first incomplete or corrupt frame.
- ``txn-journal.log``: the same framing around one JSON state change per frame, fsynced per change.
- ``txn-state.json``: a snapshot of every record, written with ``write_json_atomic`` when the journal
  grows as long as the table. Replaying the journal over the snapshot is idempotent (each frame holds
  a whole record), so a crash between writing the snapshot and emptying the journal is harmless.

The journal keeps each state change O(1) on disk, where rewriting one JSON file per change would
cost O(remembered ids) with up to 100,000 finished ids remembered.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import crc32c

from broker.clocks import steady_ms, wall_ms
from broker.persist import fsync_dir, read_json, write_failure_as_error, write_json_atomic
from broker.proto import orderlymq_pb2 as pb
from broker.staged_files import FRAME_HEADER, POOL_BYTES, StagedFiles, split_frames
from broker.wire.errors import (
    InternalBrokerError,
    InvalidRequestError,
    TransactionError,
    TransactionNotFoundError,
)

__all__ = ["ABORTED", "COMMITTED", "COMMITTING", "MAX_TXN_ID_LENGTH", "OPEN", "TransactionManager", "prepare_change",
           "staged_file_name"]

log = logging.getLogger(__name__)

OPEN, COMMITTING, COMMITTED, ABORTED = "OPEN", "COMMITTING", "COMMITTED", "ABORTED"
MAX_TXN_ID_LENGTH = 256

_STATE_VERSION = 1
_ENTRY_HEADER = struct.Struct(">H")  # topic length; the queue id follows the topic
_QUEUE_ID = struct.Struct(">i")
_STRIPES = 64
_REASON_TIMEOUT, _REASON_ABORT = "timeout", "abort"


class TransactionManager:
    """Durable staged transactions keyed by producer-chosen ids; loads its state on construction.

    Parameters
    ----------
    directory : Path
        Where state and staged data live (created if missing); one manager per directory.
    timeout_ms : int
        Default idle time after which an OPEN transaction is aborted.
    clock : callable returning int
        Wall-clock ms: recorded with every state change; how long finished ids are remembered
        counts on it. Injected by tests.
    steady : callable returning int
        Steady ms (``broker.clocks``), which idle timeouts count on: a step of the system clock
        neither aborts every open transaction nor keeps idle ones open. Injected by tests.
    fsync : bool
        False skips every fsync (tests, or a broker that accepts losing the last changes on power loss).
    keep_finished, finished_retention_ms : int
        A finished id is forgotten only once it is older than ``finished_retention_ms`` (24 h) *and*
        not among the ``keep_finished`` (100,000) most recent ones.
    stage_pool_bytes : int
        How many bytes of finished transactions' staged-data files are kept to be written over.

    Notes
    -----
    Thread-safe. Calls for one id are serialised (a striped lock per id, so staging into different
    transactions runs in parallel); the record table and journal sit behind one short mutex.
    Activity times are kept in memory: after a restart every OPEN transaction gets a fresh timeout.
    """

    def __init__(
        self,
        directory: Path,
        timeout_ms: int = 60_000,
        clock: Callable[[], int] = wall_ms,
        fsync: bool = True,
        *,
        steady: Callable[[], int] = steady_ms,
        keep_finished: int = 100_000,
        finished_retention_ms: int = 24 * 3600 * 1000,
        stage_pool_bytes: int = POOL_BYTES,
    ):
        _check_timeout(timeout_ms, allow_zero=False)
        self._dir = Path(directory)
        self._staged_dir = self._dir / "staged"
        self._files = StagedFiles(self._staged_dir, fsync, stage_pool_bytes)
        self._state_path = self._dir / "txn-state.json"
        self._journal_path = self._dir / "txn-journal.log"
        self._timeout_ms = timeout_ms
        self._clock = clock
        self._steady = steady
        self._fsync = fsync
        self._keep_finished = keep_finished
        self._finished_retention_ms = finished_retention_ms
        self._mutex = threading.Lock()
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._txns: dict[str, dict[str, Any]] = {}
        self._activity: dict[str, int] = {}  # OPEN ids -> last activity (steady ms)
        self._staged_counts: dict[str, int] = {}  # OPEN and COMMITTING ids -> sends staged
        # Ids begun by this process -> the messages in each send staged, while every send told its count:
        # a commit then need not read the staged payloads' batches to count them.
        self._staged_rows: dict[str, list[int]] = {}
        self._finished: OrderedDict[str, int] = OrderedDict()  # finished ids, oldest first
        self._journal_records = 0
        replayed = self._load()
        self._journal: BinaryIO = open(self._journal_path, "ab", buffering=0)  # noqa: SIM115 - lives as long as the manager
        if self._fsync:  # the journal and its directories must survive a power loss, not only their contents
            for directory in (self._staged_dir, self._dir, self._dir.parent):
                fsync_dir(directory)
        self._journal_size = self._journal.tell()
        if replayed:
            # Fold the journal into the snapshot now, so the next start replays nothing.
            self._compact()

    # ---- public API -------------------------------------------------------------------------

    def begin(self, txn_id: str, timeout_ms: int = 0) -> str:
        """Open ``txn_id`` (``timeout_ms`` 0: the default), or report the state of an existing id.

        Begun again while OPEN, a transaction's activity is refreshed and, with ``timeout_ms``, its
        timeout set: a producer keeps a transaction alive while it waits between sends, and gives
        one it has staged everything into longer to wait for its commit.

        Returns
        -------
        str
            OPEN for a new or open transaction; COMMITTING, COMMITTED or ABORTED, unchanged, for an
            id already past OPEN.
        """
        _check_id(txn_id)
        _check_timeout(timeout_ms, allow_zero=True)
        with self._stripe(txn_id), self._mutex:
            rec = self._txns.get(txn_id)
            if rec is None:
                rec = {"state": OPEN, "timeout_ms": timeout_ms or self._timeout_ms, "updated_ms": self._clock()}
                self._record([(txn_id, rec)])
                self._activity[txn_id] = self._steady()
                self._staged_counts[txn_id] = 0
                self._staged_rows[txn_id] = []
                return OPEN
            if rec["state"] == OPEN:
                if self._idle_expired(txn_id, rec):
                    self._abort_locked(txn_id, _REASON_TIMEOUT)
                    return ABORTED
                if timeout_ms and timeout_ms != rec["timeout_ms"]:
                    self._record([(txn_id, {**rec, "timeout_ms": timeout_ms, "updated_ms": self._clock()})])
                self._activity[txn_id] = self._steady()
            return rec["state"]

    def timeout_ms(self, txn_id: str) -> int:
        """The idle timeout of ``txn_id`` (0 for an unknown id)."""
        with self._mutex:
            rec = self._txns.get(txn_id)
            return 0 if rec is None else rec["timeout_ms"]

    def stage(self, txn_id: str, topic: str, queue_id: int, payload: bytes, sequence: int | None = None,
              rows: int | None = None) -> bool:
        """Append one send (an Arrow IPC payload for ``topic``/``queue_id``, of ``rows`` messages
        where the caller knows: ``staged_rows``), durable on return.

        With ``sequence`` (the send's number in the transaction, from 0) the send is idempotent: one
        numbered below the count already staged is a resend of a staged one and is not staged again,
        so a producer may resend a send whose answer it lost, even across a broker restart.

        Returns
        -------
        bool
            False for such a resend, True when the send was staged.

        Raises
        ------
        TransactionNotFoundError
            Unknown id.
        TransactionError
            The transaction is not OPEN (committing, committed, aborted or just timed out), or
            ``sequence`` is past the count staged: earlier sends are missing.
        """
        _check_id(txn_id)
        if not isinstance(topic, str) or not topic:
            raise InvalidRequestError(f"topic must be a non-empty string, got {topic!r}")
        if not isinstance(queue_id, int) or isinstance(queue_id, bool) or not 0 <= queue_id < 2**31:
            raise InvalidRequestError(f"queue id must be an integer >= 0, got {queue_id!r}")
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise InvalidRequestError(f"payload must be bytes, got {type(payload).__name__}")
        if sequence is not None and sequence < 0:
            raise InvalidRequestError(f"a staged send's sequence must be >= 0, got {sequence}")
        topic_bytes = topic.encode("utf-8")
        if len(topic_bytes) > 0xFFFF:
            raise InvalidRequestError("topic name is longer than 65535 bytes")
        # Written as parts: a payload may be up to max_request_bytes and is not worth copying.
        parts = [_ENTRY_HEADER.pack(len(topic_bytes)) + topic_bytes + _QUEUE_ID.pack(queue_id), payload]
        with self._stripe(txn_id):
            with self._mutex:
                self._require_open(txn_id, "stage a send in")
                self._activity[txn_id] = self._steady()
                count = self._staged_counts.get(txn_id, 0)
            if sequence is not None and sequence != count:
                if sequence < count:
                    return False
                raise TransactionError(
                    f"transaction {txn_id!r} has {count} staged send(s), but this send is number {sequence} (from 0): "
                    "the sends in between are missing (lost in a failover); stage everything again in a new transaction"
                )
            with write_failure_as_error(self._dir.parent, f"stage a send in transaction {txn_id!r}"):
                self._files.append(staged_file_name(txn_id), parts)
            with self._mutex:
                self._staged_counts[txn_id] = count + 1
                known = self._staged_rows.get(txn_id)
                if known is not None and rows is not None:
                    known.append(rows)
                else:
                    self._staged_rows.pop(txn_id, None)
            return True

    def prepare_commit(self, txn_id: str, ends: Callable[[list[tuple[str, int]]], dict[tuple[str, int], int]]
                       | None = None, replay: bool = False) -> tuple[bool, list[tuple[str, int, memoryview]]]:
        """Move ``txn_id`` to COMMITTING (durably) and return what to apply. ``ends`` gives the end
        offsets of the staged sends' queues: recorded with the move (``commit_starts``), they say
        where a commit re-applied later finds what its first attempt appended. ``replay``: a
        slave replaying its master's move, which the idle time here does not overrule.

        Returns
        -------
        (bool, list of (topic, queue_id, payload))
            ``(True, [])`` for an id already COMMITTED; otherwise ``(False, entries)`` with the staged
            sends in the order they were staged. A COMMITTING id (a retry, or recovery after a crash)
            returns its entries again.

        Raises
        ------
        TransactionNotFoundError
            Unknown id.
        TransactionError
            The transaction was aborted (by AbortTxn or timeout).
        """
        _check_id(txn_id)
        with self._stripe(txn_id):
            with self._mutex:
                rec = self._txns.get(txn_id)
                if rec is None:
                    raise _not_found(txn_id)
                if rec["state"] == COMMITTED:
                    return True, []
                if rec["state"] != COMMITTING:
                    rec = self._require_open(txn_id, "commit", check_idle=not replay)
            # Holding the id's stripe: no send can be staged into it while it is read.
            entries = list(self._read_staged(txn_id))
            if rec["state"] == OPEN:
                starts = ends(sorted({(topic, queue_id) for topic, queue_id, _ in entries})) if ends else {}
                with self._mutex:
                    self._record([(txn_id, {**rec, "state": COMMITTING, "updated_ms": self._clock(),
                                            "starts": [[topic, queue_id, at] for (topic, queue_id), at in starts.items()]})])
                    self._activity.pop(txn_id, None)
            return False, entries

    def staged_rows(self, txn_id: str) -> list[int] | None:
        """The messages in each send staged in ``txn_id``, in order; None unless every send was
        staged by this process with its count."""
        with self._mutex:
            known = self._staged_rows.get(txn_id)
            return None if known is None else list(known)

    def commit_starts(self, txn_id: str) -> dict[tuple[str, int], int]:
        """The end offsets of its queues when ``txn_id`` moved to COMMITTING, where recorded."""
        with self._mutex:
            rec = self._txns.get(txn_id) or {}
            return {(topic, queue_id): at for topic, queue_id, at in rec.get("starts", ())}

    def mark_committed(self, txn_id: str) -> None:
        """Record that the staged sends of a COMMITTING transaction are applied; drop its staged data.

        A COMMITTED id is left as it is.

        Raises
        ------
        TransactionNotFoundError
            Unknown id.
        TransactionError
            The transaction is not COMMITTING (``prepare_commit`` was not called, or it was aborted).
        """
        _check_id(txn_id)
        with self._stripe(txn_id), self._mutex:
            rec = self._txns.get(txn_id)
            if rec is None:
                raise _not_found(txn_id)
            if rec["state"] == COMMITTED:
                return
            if rec["state"] != COMMITTING:
                raise TransactionError(
                    f"transaction {txn_id!r} is {rec['state']}, not COMMITTING; prepare_commit must come first"
                )
            self._finish_locked(txn_id, COMMITTED, None)

    def abort(self, txn_id: str) -> None:
        """Abort an OPEN transaction and drop its staged data; aborting an ABORTED one is a no-op.

        Raises
        ------
        TransactionNotFoundError
            Unknown id.
        TransactionError
            The transaction is committed or being committed.
        """
        _check_id(txn_id)
        with self._stripe(txn_id), self._mutex:
            rec = self._txns.get(txn_id)
            if rec is None:
                raise _not_found(txn_id)
            state = rec["state"]
            if state == COMMITTED:
                raise TransactionError(f"transaction {txn_id!r} is already committed; it cannot be aborted")
            if state == COMMITTING:
                raise TransactionError(
                    f"transaction {txn_id!r} is being committed; it cannot be aborted, retry CommitTxn instead"
                )
            if state == OPEN:
                self._abort_locked(txn_id, _REASON_ABORT)

    def expire(self) -> list[str]:
        """Abort OPEN transactions idle past their timeout and forget old finished ids.

        Returns
        -------
        list[str]
            The ids aborted by this call.
        """
        with self._mutex:
            candidates = [tid for tid in self._activity if self._idle_expired(tid, self._txns[tid])]
        aborted = []
        for txn_id in candidates:
            with self._stripe(txn_id), self._mutex:
                rec = self._txns.get(txn_id)
                # Re-check: a send may have refreshed it, or a commit moved it on, since the scan.
                if rec is not None and rec["state"] == OPEN and self._idle_expired(txn_id, rec):
                    self._abort_locked(txn_id, _REASON_TIMEOUT)
                    aborted.append(txn_id)
        with self._mutex:
            self._forget_old_locked(self._clock())
        return aborted

    def open_count(self) -> int:
        """How many transactions are open (begun, neither committed nor aborted)."""
        with self._mutex:
            return len(self._activity)

    def open_transactions(self) -> list[tuple[str, str, int, int | None, int]]:
        """``(id, state, ms idle, ms until aborted, staged bytes)`` of every transaction not yet
        finished (OPEN, or COMMITTING after a crash: never aborted, None), the longest idle first."""
        with self._mutex:
            tick, now = self._steady(), self._clock()
            live = []
            for tid, rec in self._txns.items():
                if rec["state"] == OPEN:
                    idle = tick - self._activity[tid]
                    live.append((tid, OPEN, idle, max(0, rec["timeout_ms"] - idle)))
                elif rec["state"] == COMMITTING:
                    live.append((tid, COMMITTING, max(0, now - rec["updated_ms"]), None))
        return [(tid, state, idle, left, self._files.size(staged_file_name(tid)))
                for tid, state, idle, left in sorted(live, key=lambda t: (-t[2], t[0]))]

    def kept_file_bytes(self) -> int:
        """Bytes of finished transactions' staged files kept to be written over."""
        return self._files.pooled_bytes()

    def committing(self) -> list[str]:
        """Ids left COMMITTING (by a crash between prepare and mark), oldest first."""
        with self._mutex:
            found = [(rec["updated_ms"], tid) for tid, rec in self._txns.items() if rec["state"] == COMMITTING]
            return [tid for _, tid in sorted(found)]

    def state(self, txn_id: str) -> str | None:
        """OPEN, COMMITTING, COMMITTED, ABORTED, or None for an unknown (or forgotten) id."""
        _check_id(txn_id)
        with self._mutex:
            rec = self._txns.get(txn_id)
            return None if rec is None else rec["state"]

    # ---- copying a table (a broker group's slaves copy their master's) ----------------------

    def table(self) -> list[tuple[str, str, int]]:
        """Every remembered id as ``(txn id, state, timeout_ms)``, in no particular order."""
        with self._mutex:
            return [(tid, rec["state"], rec["timeout_ms"]) for tid, rec in self._txns.items()]

    def staged(self, txn_id: str) -> list[tuple[str, int, bytes]]:
        """The sends staged in ``txn_id`` so far, in order (``(topic, queue id, payload)``)."""
        with self._stripe(txn_id):
            return [(topic, queue_id, bytes(payload)) for topic, queue_id, payload in self._read_staged(txn_id)]

    def import_finished(self, txn_id: str, state: str) -> None:
        """Remember ``txn_id`` as finished (COMMITTED or ABORTED), as another manager has it."""
        _check_id(txn_id)
        if state not in (COMMITTED, ABORTED):
            raise InvalidRequestError(f"a finished transaction is COMMITTED or ABORTED, not {state!r}")
        with self._stripe(txn_id), self._mutex:
            rec = self._txns.get(txn_id)
            if rec is not None and rec["state"] == state:
                return
            if rec is None:
                self._txns[txn_id] = {"state": OPEN, "timeout_ms": self._timeout_ms, "updated_ms": self._clock()}
            self._finish_locked(txn_id, state, None)

    def close(self) -> None:
        """Release the journal file; the manager must not be used afterwards."""
        with self._mutex:
            self._journal.close()
        self._files.close()

    # ---- state changes (callers hold the id's stripe and the mutex) -------------------------

    def _require_open(self, txn_id: str, action: str, check_idle: bool = True) -> dict[str, Any]:
        rec = self._txns.get(txn_id)
        if rec is None:
            raise _not_found(txn_id)
        if check_idle and rec["state"] == OPEN and self._idle_expired(txn_id, rec):
            self._abort_locked(txn_id, _REASON_TIMEOUT)
            rec = self._txns[txn_id]
        if rec["state"] == ABORTED:
            raise _aborted(txn_id, rec)
        if rec["state"] != OPEN:
            raise TransactionError(
                f"cannot {action} transaction {txn_id!r}: it is {rec['state']}; begin a new transaction"
            )
        return rec

    def _idle_expired(self, txn_id: str, rec: dict[str, Any]) -> bool:
        tick = self._steady()
        return tick - self._activity.get(txn_id, tick) >= rec["timeout_ms"]

    def _abort_locked(self, txn_id: str, reason: str) -> None:
        self._finish_locked(txn_id, ABORTED, reason)

    def _finish_locked(self, txn_id: str, state: str, reason: str | None) -> None:
        now = self._clock()
        rec = {**self._txns[txn_id], "state": state, "updated_ms": now}
        if reason is not None:
            rec["reason"] = reason
        self._record([(txn_id, rec)])
        self._activity.pop(txn_id, None)
        self._staged_counts.pop(txn_id, None)
        self._staged_rows.pop(txn_id, None)
        self._finished[txn_id] = now
        self._finished.move_to_end(txn_id)
        # After the journal says finished: a crash before this leaves an orphan, pooled on load.
        self._files.release(staged_file_name(txn_id))

    def _forget_old_locked(self, now: int) -> None:
        excess = len(self._finished) - self._keep_finished
        forget = []
        for txn_id, finished_ms in self._finished.items():  # oldest first
            if len(forget) >= excess or now - finished_ms < self._finished_retention_ms:
                break
            forget.append(txn_id)
        if not forget:
            return
        self._record([(tid, None) for tid in forget])
        for tid in forget:
            del self._finished[tid]

    # ---- files ------------------------------------------------------------------------------

    def _stripe(self, txn_id: str) -> threading.Lock:
        return self._stripes[hash(txn_id) % _STRIPES]

    def _read_staged(self, txn_id: str) -> Iterator[tuple[str, int, memoryview]]:
        """The staged sends, each payload a view of the file mapped into memory."""
        bodies, corrupt_at = self._files.frames(staged_file_name(txn_id))
        if corrupt_at is not None:
            raise InternalBrokerError(f"staged data of transaction {txn_id!r} ({self._staged_dir / staged_file_name(txn_id)}) "
                                      f"is corrupt at byte {corrupt_at}; abort the transaction")
        for body in bodies:
            (topic_len,) = _ENTRY_HEADER.unpack_from(body, 0)
            topic = bytes(body[2 : 2 + topic_len]).decode("utf-8")
            (queue_id,) = _QUEUE_ID.unpack_from(body, 2 + topic_len)
            yield topic, queue_id, body[6 + topic_len :]

    def _record(self, changes: list[tuple[str, dict[str, Any] | None]]) -> None:
        """Journal whole records (None: forget the id), then apply them to the table.

        Nothing changes in memory unless the journal write succeeded.
        """
        data = b"".join(
            _frame(json.dumps({"id": tid, "rec": rec}, separators=(",", ":")).encode()) for tid, rec in changes
        )
        try:
            with write_failure_as_error(self._dir.parent, "record a transaction state change"):
                # Unbuffered: a failed write leaves no bytes behind in a buffer to be written later.
                if self._journal.write(data) != len(data):
                    raise OSError(errno.ENOSPC, f"short write to {self._journal_path}")
                if self._fsync:
                    os.fsync(self._journal.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                self._journal.truncate(self._journal_size)
            raise
        self._journal_size += len(data)
        self._journal_records += len(changes)
        for tid, rec in changes:
            if rec is None:
                self._txns.pop(tid, None)
            else:
                self._txns[tid] = rec
        # Amortised O(1) per change: the snapshot is rewritten once per table-length of changes.
        if self._journal_records > max(1000, len(self._txns)):
            try:
                self._compact()
            except OSError:
                # The changes are durable in the journal already; compaction is retried next time.
                log.exception("could not compact the transaction journal into %s", self._state_path)

    def _compact(self) -> None:
        write_json_atomic(self._state_path, self._snapshot(), fsync=self._fsync)
        self._journal.truncate(0)
        self._journal.seek(0)
        if self._fsync:
            os.fsync(self._journal.fileno())
        self._journal_size = 0
        self._journal_records = 0

    def _snapshot(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, "txns": self._txns}

    def _load(self) -> int:
        """Read snapshot and journal, cut torn tails, pool orphans; return how many changes were replayed."""
        snapshot = read_json(self._state_path, None)
        try:
            if snapshot is not None:
                if snapshot.get("version") != _STATE_VERSION:
                    raise ValueError(f"unsupported version {snapshot.get('version')!r}")
                for tid, rec in snapshot["txns"].items():
                    self._txns[str(tid)] = _valid_record(rec)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise InternalBrokerError(f"transaction state file {self._state_path} is not valid ({exc})") from exc

        replayed = self._replay_journal()
        tick = self._steady()
        live = {tid: staged_file_name(tid) for tid, rec in self._txns.items() if rec["state"] in (OPEN, COMMITTING)}
        counts = self._files.load(live.values())
        for tid, name in live.items():
            self._staged_counts[tid] = counts[name]
            if self._txns[tid]["state"] == OPEN:
                self._activity[tid] = tick
        for tid, rec in sorted(self._txns.items(), key=lambda item: item[1]["updated_ms"]):
            if rec["state"] in (COMMITTED, ABORTED):
                self._finished[tid] = rec["updated_ms"]
        return replayed

    def _replay_journal(self) -> int:
        try:
            data = self._journal_path.read_bytes()
        except FileNotFoundError:
            return 0
        bodies, end = split_frames(data)
        for body in bodies:
            try:
                change = json.loads(bytes(body))
                tid, rec = str(change["id"]), change["rec"]
                if rec is None:
                    self._txns.pop(tid, None)
                else:
                    self._txns[tid] = _valid_record(rec)
            except (KeyError, TypeError, ValueError) as exc:
                raise InternalBrokerError(f"transaction journal {self._journal_path} is not valid ({exc})") from exc
        if end != len(data):
            log.warning("cutting %d bytes of torn transaction journal at %s", len(data) - end, self._journal_path)
            with open(self._journal_path, "r+b") as f:
                f.truncate(end)
                if self._fsync:
                    os.fsync(f.fileno())
        return len(bodies)


def _frame(body: bytes) -> bytes:
    return FRAME_HEADER.pack(len(body), crc32c.crc32c(body)) + body


def staged_file_name(txn_id: str) -> str:
    """The name of ``txn_id``'s staged-data file: ids are arbitrary producer strings, hashed into a
    safe, fixed-length name."""
    return f"{hashlib.sha256(txn_id.encode('utf-8')).hexdigest()[:40]}.stage"


def _valid_record(rec: Any) -> dict[str, Any]:
    ok = (
        isinstance(rec, dict)
        and rec.get("state") in (OPEN, COMMITTING, COMMITTED, ABORTED)
        and all(isinstance(rec.get(key), int) for key in ("timeout_ms", "updated_ms"))
    )
    if not ok:
        raise ValueError(f"bad transaction record {rec!r}")
    return rec


def prepare_change(txn_id: str, starts: dict[tuple[str, int], int]) -> pb.TxnChange:
    """What tells a broker group's slaves that ``txn_id`` moved to COMMITTING from ``starts``
    (``broker.cluster.txnlog``)."""
    return pb.TxnChange(kind=pb.TxnChange.PREPARE, txn_id=txn_id, starts=[
        pb.QueuePosition(topic=topic, queue_id=queue_id, offset=at) for (topic, queue_id), at in starts.items()])


def _check_id(txn_id: str) -> None:
    if not isinstance(txn_id, str) or not txn_id or len(txn_id) > MAX_TXN_ID_LENGTH:
        shown = txn_id if not isinstance(txn_id, str) else f"{len(txn_id)} characters"
        raise InvalidRequestError(
            f"transaction id must be a string of 1 to {MAX_TXN_ID_LENGTH} characters, got {shown}"
        )


def _check_timeout(timeout_ms: int, allow_zero: bool) -> None:
    low = 0 if allow_zero else 1
    if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < low:
        raise InvalidRequestError(f"transaction timeout_ms must be an integer >= {low}, got {timeout_ms!r}")


def _not_found(txn_id: str) -> TransactionNotFoundError:
    return TransactionNotFoundError(
        f"transaction {txn_id!r} not found: begin it first (finished ids are remembered for at least 24 h)"
    )


def _aborted(txn_id: str, rec: dict[str, Any]) -> TransactionError:
    if rec.get("reason") == _REASON_TIMEOUT:
        how = f"timed out after {rec['timeout_ms']} ms without activity"
    else:
        how = "by AbortTxn"
    return TransactionError(f"transaction {txn_id!r} was aborted ({how}); begin a new transaction")
