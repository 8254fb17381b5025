"""One error tree for broker and client, and its one mapping to and from gRPC status.

::

    OrderlyMQError
     ├── TopicNotFoundError            NOT_FOUND
     ├── TopicExistsError              ALREADY_EXISTS
     ├── InvalidRequestError (ValueError)        INVALID_ARGUMENT
     │    ├── QueueOutOfRangeError
     │    ├── BadBatchError
     │    ├── BadTagExpressionError
     │    └── InvalidOptionError        (client-side option validation)
     ├── OffsetOutOfRangeError         OUT_OF_RANGE
     │    └── MessagesLostError        (client-side: retention removed messages not yet consumed)
     ├── DamagedRecordError            DATA_LOSS (damaged on disk; ``next_offset`` is readable)
     ├── FencedError                   FAILED_PRECONDITION (stale epoch / not the lock holder)
     │    └── GroupOffsetConflictError (client-side: a checkpoint behind offsets another client moved)
     ├── LockUnavailableError          ABORTED (client-side: another client holds the lock)
     ├── TransactionError              FAILED_PRECONDITION
     │    └── TransactionNotFoundError NOT_FOUND
     ├── RequestTooLargeError          RESOURCE_EXHAUSTED
     ├── DiskFullError                 RESOURCE_EXHAUSTED (no space in the data dir; nothing was stored)
     ├── TopicGrewError                FAILED_PRECONDITION (sink: queue count changed mid-stream)
     ├── WrongGroupError               FAILED_PRECONDITION (a cluster: the queue is held by another
     │                                 broker group; the client refreshes its route)
     ├── UnauthenticatedError          UNAUTHENTICATED (no, unknown or wrong credentials)
     ├── PermissionDeniedError         PERMISSION_DENIED (the user may not do this to that resource)
     ├── BrokerUnavailableError (ConnectionError)  UNAVAILABLE / DEADLINE_EXCEEDED
     │    ├── SendOutcomeUnknownError  (client-side: a send reached the wire, its answer did not)
     │    ├── NotMasterError           (a slave of a broker group, or a master that lost its role;
     │    │                             ``master`` names the group's master when known)
     │    └── ReplicationTimeoutError  (a sync send stored but not replicated in time: resend it)
     └── InternalBrokerError           INTERNAL

The broker raises these; ``to_status`` turns one into (code, message, kind) and
``status_metadata`` into the trailing metadata that names it, exactly once in the server;
``from_rpc_error`` turns a ``grpc.RpcError`` back into the same class in the client.
"""

from __future__ import annotations

import errno

import grpc

__all__ = [
    "ERROR_KIND_KEY",
    "NEXT_OFFSET_KEY",
    "BadBatchError",
    "BadTagExpressionError",
    "BrokerUnavailableError",
    "DamagedRecordError",
    "DiskFullError",
    "FencedError",
    "GroupOffsetConflictError",
    "InternalBrokerError",
    "InvalidOptionError",
    "InvalidRequestError",
    "LockUnavailableError",
    "MASTER_KEY",
    "MessagesLostError",
    "NotMasterError",
    "OffsetOutOfRangeError",
    "OrderlyMQError",
    "PermissionDeniedError",
    "QueueOutOfRangeError",
    "ReplicationTimeoutError",
    "RequestTooLargeError",
    "SendOutcomeUnknownError",
    "TopicExistsError",
    "TopicGrewError",
    "TopicNotFoundError",
    "TransactionError",
    "TransactionNotFoundError",
    "UnauthenticatedError",
    "WrongGroupError",
    "error_class_for_kind",
    "from_answer",
    "from_rpc_error",
    "from_status",
    "status_metadata",
    "to_status",
]

ERROR_KIND_KEY = "orderlymq-error"
NEXT_OFFSET_KEY = "orderlymq-next-offset"
MASTER_KEY = "orderlymq-master"


class OrderlyMQError(Exception):
    """Root of every error orderlymq raises."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN


class TopicNotFoundError(OrderlyMQError):
    code = grpc.StatusCode.NOT_FOUND


class TopicExistsError(OrderlyMQError):
    code = grpc.StatusCode.ALREADY_EXISTS


class InvalidRequestError(OrderlyMQError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class QueueOutOfRangeError(InvalidRequestError):
    pass


class BadBatchError(InvalidRequestError):
    pass


class BadTagExpressionError(InvalidRequestError):
    pass


class InvalidOptionError(InvalidRequestError):
    pass


class OffsetOutOfRangeError(OrderlyMQError):
    code = grpc.StatusCode.OUT_OF_RANGE


class MessagesLostError(OffsetOutOfRangeError):
    """Retention removed messages of a queue before this consumer read them.

    ``[first_lost, first_kept)`` of queue ``queue_id`` of ``topic`` is gone: ``lost`` messages.
    Raised (or handed to a consumer's ``on_data_loss``) by the client, never sent on the wire.
    """

    def __init__(self, message: str, topic: str = "", queue_id: int = -1, first_lost: int = -1,
                 first_kept: int = -1) -> None:
        super().__init__(message)
        self.topic = topic
        self.queue_id = queue_id
        self.first_lost = first_lost
        self.first_kept = first_kept

    @property
    def lost(self) -> int:
        """How many messages were removed unread."""
        return max(self.first_kept - self.first_lost, 0)


class DamagedRecordError(OrderlyMQError):
    """Messages stored at the asked offset are damaged on disk (a checksum mismatch, or a range
    recovery had to cut); everything from ``next_offset`` on can still be read."""

    code = grpc.StatusCode.DATA_LOSS

    def __init__(self, message: str, next_offset: int = -1) -> None:
        super().__init__(message)
        self.next_offset = next_offset


class FencedError(OrderlyMQError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class GroupOffsetConflictError(FencedError):
    """A streaming query restarted from its checkpoint found its group's offsets moved by another
    client since it stopped (Spark source option ``groupOffsetConflict``; never sent on the wire).

    ``conflicts`` maps each ``(topic, queue_id)`` to ``(checkpoint position, group offset, client
    id that committed it)``.
    """

    def __init__(self, message: str, conflicts: dict | None = None) -> None:
        super().__init__(message)
        self.conflicts = dict(conflicts or {})


class LockUnavailableError(OrderlyMQError):
    code = grpc.StatusCode.ABORTED


class TransactionError(OrderlyMQError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class TransactionNotFoundError(TransactionError):
    code = grpc.StatusCode.NOT_FOUND


class RequestTooLargeError(OrderlyMQError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DiskFullError(OrderlyMQError):
    """The broker's data directory has no space left (ENOSPC) or its quota is used up (EDQUOT).

    The change asked for was not made: nothing half-written is ever served or counted, so the
    same request may be sent again once space is freed. ``data_dir`` names the directory.
    """

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, data_dir: str = "") -> None:
        super().__init__(message)
        self.data_dir = data_dir


class TopicGrewError(OrderlyMQError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class WrongGroupError(OrderlyMQError):
    """In a cluster, the queue asked for is held by another broker group than this broker's:
    nothing was done; ask the group the topic's route names (clients refresh it by themselves)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class UnauthenticatedError(OrderlyMQError):
    """The call carried no credentials, an unknown access key or a wrong secret."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(OrderlyMQError):
    """The authenticated user lacks the right (publish, subscribe, admin) on the resource."""

    code = grpc.StatusCode.PERMISSION_DENIED


class BrokerUnavailableError(OrderlyMQError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class SendOutcomeUnknownError(BrokerUnavailableError):
    """A send was written to the broker but no answer came back in time: it may be stored or not.

    Do not send the message again (that could store it twice). The producer settles the outcome
    itself when the broker answers again: it resends the batch under the same ``producer_id`` and
    ``sequence``, which the broker stores at most once, before any later message of the queue, so
    the key's order holds. ``Producer.resolve(error)`` waits for that and returns where the
    message is stored. ``batch_index`` is the position of this send's first message in the batch
    ``sequence`` of queue ``queue_id``; ``count`` the number of its messages.
    """

    def __init__(self, message: str, topic: str = "", queue_id: int = -1, producer_id: str = "",
                 sequence: int = -1, batch_index: int = 0, count: int = 1) -> None:
        super().__init__(message)
        self.topic = topic
        self.queue_id = queue_id
        self.producer_id = producer_id
        self.sequence = sequence
        self.batch_index = batch_index
        self.count = count


class NotMasterError(BrokerUnavailableError):
    """This broker is not its group's master: nothing was done; send the request to ``master``
    (``host:port``, "" while the group elects one)."""

    def __init__(self, message: str, master: str = "") -> None:
        super().__init__(message)
        self.master = master


class ReplicationTimeoutError(BrokerUnavailableError):
    """A send was stored by the master but not by its sync-state set in time, so it was not
    acknowledged; resend it with the same producer id and sequence (it is stored at most once)."""


class InternalBrokerError(OrderlyMQError):
    code = grpc.StatusCode.INTERNAL


def _all_error_classes() -> list[type[OrderlyMQError]]:
    found, todo = [], [OrderlyMQError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def error_class_for_kind(kind: str) -> type[OrderlyMQError] | None:
    """The error class named ``kind`` (its ``__name__``), or None if unknown."""
    for cls in _all_error_classes():
        if cls.__name__ == kind:
            return cls
    return None


_CLASS_FOR_CODE = {
    grpc.StatusCode.NOT_FOUND: TopicNotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: TopicExistsError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidRequestError,
    grpc.StatusCode.OUT_OF_RANGE: OffsetOutOfRangeError,
    grpc.StatusCode.FAILED_PRECONDITION: FencedError,
    grpc.StatusCode.ABORTED: LockUnavailableError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: RequestTooLargeError,
    grpc.StatusCode.UNAVAILABLE: BrokerUnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: BrokerUnavailableError,
    grpc.StatusCode.CANCELLED: BrokerUnavailableError,
    grpc.StatusCode.INTERNAL: InternalBrokerError,
    grpc.StatusCode.UNKNOWN: InternalBrokerError,
    grpc.StatusCode.UNIMPLEMENTED: InternalBrokerError,
    grpc.StatusCode.DATA_LOSS: DamagedRecordError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """(status code, message, error kind) for an exception raised while serving a request."""
    if isinstance(exc, OrderlyMQError):
        return exc.code, str(exc), type(exc).__name__
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        return grpc.StatusCode.UNAVAILABLE, _out_of_files(exc.errno), BrokerUnavailableError.__name__
    return grpc.StatusCode.INTERNAL, f"internal broker error: {type(exc).__name__}: {exc}", "InternalBrokerError"


def _out_of_files(code: int) -> str:
    """What a broker that cannot open one more file tells its clients."""
    if code == errno.ENFILE:
        return ("the broker's host cannot open one more file (its system-wide table is full); close files there; "
                "retrying is safe")
    import resource  # the broker's own limit, read where the broker runs

    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return (f"the broker has all {limit} files it may open in use (RLIMIT_NOFILE): raise its limit (ulimit -n, or "
            "LimitNOFILE in a systemd unit) and restart it, or close idle clients; retrying is safe")


def status_metadata(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that lets the client rebuild ``exc`` precisely."""
    _, _, kind = to_status(exc)
    pairs = [(ERROR_KIND_KEY, kind)]
    if isinstance(exc, DamagedRecordError) and exc.next_offset >= 0:
        pairs.append((NEXT_OFFSET_KEY, str(exc.next_offset)))
    if isinstance(exc, NotMasterError) and exc.master:
        pairs.append((MASTER_KEY, exc.master))
    return tuple(pairs)


def from_status(code: grpc.StatusCode, message: str, kind: str = "", next_offset: int = -1,
                master: str = "") -> OrderlyMQError:
    """The error a client raises for a failed call: the precise class when the broker named it."""
    cls = error_class_for_kind(kind) if kind else None
    if cls is None:
        cls = _CLASS_FOR_CODE.get(code, InternalBrokerError)
    if cls is BrokerUnavailableError and not message:
        message = "broker unavailable"
    if issubclass(cls, DamagedRecordError):
        return cls(message, next_offset)
    if issubclass(cls, NotMasterError):
        return cls(message, master)
    return cls(message)


_STATUS_BY_VALUE = {status.value[0]: status for status in grpc.StatusCode}


def from_answer(code: int, message: str, kind: str = "", next_offset: int = -1) -> OrderlyMQError:
    """The error an answer's ``error_*`` fields carry (a ``SendStream`` or lean port answer), as the
    status of a failed call would raise it; ``code`` is the ``grpc.StatusCode`` value."""
    return from_status(_STATUS_BY_VALUE.get(code, grpc.StatusCode.UNKNOWN), message, kind, next_offset)


def from_rpc_error(err: grpc.RpcError) -> OrderlyMQError:
    """Translate a ``grpc.RpcError`` (the only place the client does so)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    metadata: dict[str, str] = {}
    try:
        metadata = {key: value for key, value in err.trailing_metadata() or ()}
    except Exception:  # noqa: BLE001 - some RpcErrors (e.g. channel failures) carry no metadata
        metadata = {}
    kind = metadata.get(ERROR_KIND_KEY, "")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not kind:
        message = f"broker unavailable ({code.name}): {message}"
    next_offset = metadata.get(NEXT_OFFSET_KEY, "")
    return from_status(code, message or "", kind, int(next_offset) if next_offset.isdigit() else -1,
                       metadata.get(MASTER_KEY, ""))
