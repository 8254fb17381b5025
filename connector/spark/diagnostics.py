"""Why a streaming query failed, in full: the messages of its exception's whole cause chain.

When a task of a micro-batch fails and the sink's abort of the batch fails as well, Spark ends a
query that writes to a data source with the fixed message "Writing job failed."; the task's error
(for instance a ``BrokerUnavailableError`` naming the broker, the queue and option
``pollTimeoutMs``) is further down the exception's cause chain, which PySpark's
``query.exception()`` does not print. ``failure_reasons(query)`` lists it.
"""

from __future__ import annotations

__all__ = ["failure_reasons"]

_MAX_DEPTH = 20


def failure_reasons(query) -> list[str]:
    """The messages of ``query``'s exception and of each of its causes, outermost first.

    Empty while the query has not failed. ``query`` is a ``pyspark.sql.streaming.StreamingQuery``.
    """
    failure = query._jsq.exception()
    if not failure.isDefined():
        return []
    reasons: list[str] = []
    error = failure.get()
    while error is not None and len(reasons) < _MAX_DEPTH:
        reasons.append(str(error.getMessage() or error.toString()))
        error = error.getCause()
    return reasons
