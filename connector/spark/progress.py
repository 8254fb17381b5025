"""How far a streaming query is behind, per queue, read from Spark's own query progress.

The source reports the latest offsets it saw (``reportLatestOffset``), so each source entry of a
``StreamingQueryProgress`` carries ``endOffset`` (where the micro-batch stopped) and
``latestOffset`` (the end of every queue when the batch was planned). Their difference is the
backlog left for later batches: with ``maxMessagesPerTrigger`` it is what admission control held
back; without a limit it is 0 at planning time, and messages sent since show up in the next batch.

What the Python Data Source API (PySpark 4.x) does not allow: a Python source cannot add custom
metrics to the progress (no ``ReportsSourceMetrics``, as Kafka's ``avgOffsetsBehindLatest``, nor
``CustomMetric``), so the lag is computed here from the two offsets instead of being reported.

Example::

    query = df.writeStream.format("console").start()
    ...
    lag = lag_by_queue(query.lastProgress)      # {("orders", 0): 120, ("orders", 1): 0, ...}
    behind = sum(lag.values())
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from connector.spark.offsets import QueueRef, positions_of

__all__ = ["lag_by_queue"]


def lag_by_queue(progress: Mapping[str, Any] | str | None) -> dict[QueueRef, int]:
    """Per ``(topic, queue id)``: messages stored but not yet read by the query, as of ``progress``.

    Parameters
    ----------
    progress : StreamingQueryProgress, dict or str
        ``query.lastProgress``, an element of ``query.recentProgress``, a listener's
        ``event.progress``, or the progress JSON. None (no batch yet) gives ``{}``.

    Returns
    -------
    dict
        ``latestOffset - endOffset`` of every queue of the query's orderlymq sources (never
        negative; a queue read by two sources counts the one further behind); ``{}`` when no
        source reported latest offsets yet.
    """
    if progress is None:
        return {}
    if isinstance(progress, str):
        progress = json.loads(progress)
    lag: dict[QueueRef, int] = {}
    for source in progress["sources"]:
        end, latest = _offset(source["endOffset"]), _offset(source["latestOffset"])
        if end is None or latest is None or "queues" not in end:
            continue  # another kind of source, or an orderlymq source that saw no latest offsets yet
        ends, latests = positions_of(end), positions_of(latest)
        for ref, latest_position in latests.items():
            lag[ref] = max(lag.get(ref, 0), latest_position - ends.get(ref, latest_position))
    return lag


def _offset(value: Any) -> Mapping | None:
    """An offset of the progress as a dict: Spark gives JSON text or an already parsed object."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:  # a source whose offsets are not JSON
            return None
    return value if isinstance(value, Mapping) else None
