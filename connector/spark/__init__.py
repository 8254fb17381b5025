"""The Spark data source ``orderlymq`` (PySpark Python Data Source API): a streaming and batch
source with one partition per MessageQueue under the group's queue locks, and an exactly-once,
order-keeping sink. See ``docs/spark.md``.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from connector.spark.ordering import ordered_for_write
from connector.spark.source import OrderlyMQDataSource

__all__ = ["OrderlyMQDataSource", "ordered_for_write", "register"]


def register(spark: SparkSession) -> None:
    """Register ``format("orderlymq")`` in ``spark`` (not needed when orderlymq is pip-installed)."""
    spark.dataSource.register(OrderlyMQDataSource)
