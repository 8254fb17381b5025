"""The routing function (``broker.wire.routing``) for Spark: ``queue_ids`` over whole Arrow
columns (the routing module's), and ``queue_expr``, the same function in Spark SQL:
``pmod(xxhash64(key), N)`` or ``pmod(key, N)``.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, ByteType, DataType, IntegerType, LongType, ShortType, StringType

from broker.wire.routing import queue_ids

__all__ = ["INTEGER_KEY_TYPES", "is_key_type", "queue_expr", "queue_ids"]

INTEGER_KEY_TYPES = (ByteType, ShortType, IntegerType, LongType)


def is_key_type(data_type: DataType) -> bool:
    """Can a Spark column of ``data_type`` be a sharding key?"""
    return isinstance(data_type, (*INTEGER_KEY_TYPES, StringType, BinaryType))


def queue_expr(key: Column | str, data_type: DataType, queue_count: int) -> Column:
    """Spark SQL's queue id of ``key``: identical to ``queue_for_key`` for every key."""
    column = F.col(key) if isinstance(key, str) else key
    if isinstance(data_type, INTEGER_KEY_TYPES):
        return F.pmod(column.cast("long"), F.lit(queue_count).cast("long")).cast("int")
    if isinstance(data_type, (StringType, BinaryType)):
        return F.pmod(F.xxhash64(column), F.lit(queue_count).cast("long")).cast("int")
    raise TypeError(f"a sharding key must be an integer, string or binary column, not {data_type.simpleString()}")
