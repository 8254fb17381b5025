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
     ├── DamagedRecordError            DATA_LOSS (damaged on disk; ``next_offset`` is readable)
     ├── FencedError                   FAILED_PRECONDITION (stale epoch / not the lock holder)
     ├── LockUnavailableError          ABORTED (client-side: another client holds the lock)
     ├── TransactionError              FAILED_PRECONDITION
     │    └── TransactionNotFoundError NOT_FOUND
     ├── RequestTooLargeError          RESOURCE_EXHAUSTED
     ├── TopicGrewError                FAILED_PRECONDITION (sink: queue count changed mid-stream)
     ├── BrokerUnavailableError (ConnectionError)  UNAVAILABLE / DEADLINE_EXCEEDED
     └── InternalBrokerError           INTERNAL

The broker raises these; ``to_status`` turns one into (code, message, kind) and
``status_metadata`` into the trailing metadata that names it, exactly once in the server;
``from_rpc_error`` turns a ``grpc.RpcError`` back into the same class in the client.
"""

from __future__ import annotations

import grpc

__all__ = [
    "ERROR_KIND_KEY",
    "NEXT_OFFSET_KEY",
    "BadBatchError",
    "BadTagExpressionError",
    "BrokerUnavailableError",
    "DamagedRecordError",
    "FencedError",
    "InternalBrokerError",
    "InvalidOptionError",
    "InvalidRequestError",
    "LockUnavailableError",
    "OffsetOutOfRangeError",
    "OrderlyMQError",
    "QueueOutOfRangeError",
    "RequestTooLargeError",
    "TopicExistsError",
    "TopicGrewError",
    "TopicNotFoundError",
    "TransactionError",
    "TransactionNotFoundError",
    "error_class_for_kind",
    "from_rpc_error",
    "from_status",
    "status_metadata",
    "to_status",
]

ERROR_KIND_KEY = "orderlymq-error"
NEXT_OFFSET_KEY = "orderlymq-next-offset"


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


class DamagedRecordError(OrderlyMQError):
    """Messages stored at the asked offset are damaged on disk (a checksum mismatch, or a range
    recovery had to cut); everything from ``next_offset`` on can still be read."""

    code = grpc.StatusCode.DATA_LOSS

    def __init__(self, message: str, next_offset: int = -1) -> None:
        super().__init__(message)
        self.next_offset = next_offset


class FencedError(OrderlyMQError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class LockUnavailableError(OrderlyMQError):
    code = grpc.StatusCode.ABORTED


class TransactionError(OrderlyMQError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class TransactionNotFoundError(TransactionError):
    code = grpc.StatusCode.NOT_FOUND


class RequestTooLargeError(OrderlyMQError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class TopicGrewError(OrderlyMQError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class BrokerUnavailableError(OrderlyMQError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


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
    grpc.StatusCode.PERMISSION_DENIED: InternalBrokerError,
    grpc.StatusCode.UNAUTHENTICATED: InternalBrokerError,
}


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """(status code, message, error kind) for an exception raised while serving a request."""
    if isinstance(exc, OrderlyMQError):
        return exc.code, str(exc), type(exc).__name__
    return grpc.StatusCode.INTERNAL, f"internal broker error: {type(exc).__name__}: {exc}", "InternalBrokerError"


def status_metadata(exc: BaseException) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that lets the client rebuild ``exc`` precisely."""
    _, _, kind = to_status(exc)
    pairs = [(ERROR_KIND_KEY, kind)]
    if isinstance(exc, DamagedRecordError) and exc.next_offset >= 0:
        pairs.append((NEXT_OFFSET_KEY, str(exc.next_offset)))
    return tuple(pairs)


def from_status(code: grpc.StatusCode, message: str, kind: str = "", next_offset: int = -1) -> OrderlyMQError:
    """The error a client raises for a failed call: the precise class when the broker named it."""
    cls = error_class_for_kind(kind) if kind else None
    if cls is None:
        cls = _CLASS_FOR_CODE.get(code, InternalBrokerError)
    if cls is BrokerUnavailableError and not message:
        message = "broker unavailable"
    if issubclass(cls, DamagedRecordError):
        return cls(message, next_offset)
    return cls(message)


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
    return from_status(code, message or "", kind, int(next_offset) if next_offset.isdigit() else -1)
