"""RocketMQ status codes: every answer of the RocketMQ service carries one in its ``status`` field.

RocketMQ clients read the outcome from that field, not from the gRPC status (which stays OK), so
each failure is turned into a ``Status`` here, in one place: our own errors by ``status_for``, and
protocol-level refusals by raising ``RocketMQStatusError`` with the code the clients expect.
"""

from __future__ import annotations

from broker.rocketmq.protocol import Code, definition
from broker.wire.errors import (
    BadBatchError,
    BadTagExpressionError,
    DiskFullError,
    FencedError,
    InvalidRequestError,
    NotMasterError,
    OffsetOutOfRangeError,
    OrderlyMQError,
    ReplicationTimeoutError,
    RequestTooLargeError,
    TopicNotFoundError,
    TransactionError,
)

__all__ = ["RocketMQStatusError", "ok", "status", "status_for"]


class RocketMQStatusError(Exception):
    """A request refused with a RocketMQ ``code`` and a message a person can act on."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Most specific first: the first class an error is an instance of decides its code.
_CODES: tuple[tuple[type[OrderlyMQError], int], ...] = (
    (TopicNotFoundError, Code.TOPIC_NOT_FOUND),
    (BadTagExpressionError, Code.ILLEGAL_FILTER_EXPRESSION),
    (BadBatchError, Code.BAD_REQUEST),
    (InvalidRequestError, Code.BAD_REQUEST),
    (OffsetOutOfRangeError, Code.ILLEGAL_OFFSET),
    (FencedError, Code.PRECONDITION_FAILED),
    (TransactionError, Code.INVALID_TRANSACTION_ID),
    (RequestTooLargeError, Code.PAYLOAD_TOO_LARGE),
    (DiskFullError, Code.INTERNAL_SERVER_ERROR),
    (NotMasterError, Code.HA_NOT_AVAILABLE),  # a slave of a broker group: its message names the master
    (ReplicationTimeoutError, Code.SLAVE_PERSISTENCE_TIMEOUT),  # not acknowledged: the client resends
)


def status(code: int, message: str = "") -> definition.Status:
    return definition.Status(code=code, message=message)


def ok() -> definition.Status:
    return definition.Status(code=Code.OK, message="OK")


def status_for(exc: BaseException) -> definition.Status:
    """The RocketMQ status of a failure (INTERNAL_ERROR for anything unexpected)."""
    if isinstance(exc, RocketMQStatusError):
        return status(exc.code, exc.message)
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return status(code, str(exc))
    return status(Code.INTERNAL_ERROR, f"orderlymq broker error: {type(exc).__name__}: {exc}")
