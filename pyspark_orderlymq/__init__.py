"""Makes ``format("orderlymq")`` work without a register call once orderlymq is installed.

Spark looks up modules named ``pyspark_*`` on the Python path and registers their
``DefaultSource`` under its ``name()``.
"""

from connector.spark.source import OrderlyMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
