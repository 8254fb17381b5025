"""Write keyed events with the sink while the first attempt of partition 0 fails halfway.

Run as a separate process (``python write_fail_once.py BROKERS TOPIC``): task retries need a
``local[N,F]`` master, which the shared test session does not have.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from pyspark import TaskContext  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.types import StringType  # noqa: E402

from connector.spark import register  # noqa: E402

KEYS, PER_KEY = 8, 250


def body(key, seq):
    ctx = TaskContext.get()
    if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and seq == PER_KEY - 10:
        raise RuntimeError("injected failure of the first attempt")
    return json.dumps({"key": key, "seq": seq})


def main(brokers: str, topic: str) -> None:
    spark = (
        SparkSession.builder.master("local[2,2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50")
        .getOrCreate()
    )
    register(spark)
    events = [(f"k{k}", s) for s in range(PER_KEY) for k in range(KEYS)]
    df = spark.createDataFrame(events, "key string, seq int").repartition(2, "key").sortWithinPartitions("seq")
    out = df.select("key", F.udf(body, StringType())("key", "seq").alias("body"))
    out.write.format("orderlymq").option("brokers", brokers).option("topic", topic).option("shardingKey", "key").mode(
        "append"
    ).save()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
