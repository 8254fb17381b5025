"""``ordered_for_write``: lay a DataFrame out so each queue is written, in order, by one task."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame

from connector.spark.sharding import queue_expr

__all__ = ["ordered_for_write"]

_QUEUE_COLUMN = "__orderlymq_queue"


def ordered_for_write(
    df: DataFrame, shardingKey: str, orderBy: str | Column | Sequence[str | Column], queues: int
) -> DataFrame:
    """Repartition ``df`` by target queue and sort each partition by ``orderBy``.

    The target queue is computed in Spark SQL exactly as the sink routes (``pmod(xxhash64(key), N)``
    for string/binary keys, ``pmod(key, N)`` for integers), so all rows of a queue land in one
    partition, sorted by ``orderBy``: one task then writes each queue in order.

    Parameters
    ----------
    df : DataFrame
        The rows to write.
    shardingKey : str
        The key column (the sink's ``shardingKey`` option).
    orderBy : str, Column or list of them
        The order within a key (an event time, a sequence number).
    queues : int
        The topic's queue count (``orderlymq topic describe``).
    """
    if queues <= 0:
        raise ValueError(f"queues must be the topic's queue count (> 0), got {queues}")
    if shardingKey not in df.columns:
        raise ValueError(
            f"shardingKey column {shardingKey!r} is not in the DataFrame (columns: {', '.join(df.columns)})"
        )
    order = [orderBy] if isinstance(orderBy, (str, Column)) else list(orderBy)
    target = queue_expr(shardingKey, df.schema[shardingKey].dataType, queues)
    return (
        df.withColumn(_QUEUE_COLUMN, target)
        .repartition(queues, _QUEUE_COLUMN)
        .sortWithinPartitions(_QUEUE_COLUMN, *order)
        .drop(_QUEUE_COLUMN)
    )
