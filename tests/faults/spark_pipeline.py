"""The streaming job of fault scenario 4: ``orderlymq`` topic -> a Python UDF -> ``orderlymq`` topic,
exactly once, keyed by the same sharding key. Run with spark-submit (or plain python, local[2]).

The UDF fails exactly once in the whole run, on a first task attempt: the task that manages to
create ``--fail-marker`` raises (the marker records where); Spark retries it. With
``--hold-marker`` every call of the UDF creates that file and then waits (up to ``HOLD_S``), so
the first micro-batch never completes and a test can kill the driver in it. With ``--trigger
interval`` the query runs until killed; with ``--trigger available-now`` it processes what the
source holds when it starts and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from spark_jobs.session import spark_session  # noqa: E402

HOLD_S = 600.0  # longer than a test waits; bounded, so a worker left behind does not sleep forever


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="spark_pipeline.py", description=__doc__.splitlines()[0])
    p.add_argument("--brokers", required=True)
    p.add_argument("--source", required=True, help="topic read")
    p.add_argument("--sink", required=True, help="topic written")
    p.add_argument("--group", required=True, help="consumer group of the source")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--fail-marker", required=True, help="created by the one task attempt that fails")
    p.add_argument("--hold-marker", help="created by the UDF, which then holds its batch (for a kill in it)")
    p.add_argument("--max-per-trigger", type=int, default=100)
    p.add_argument("--trigger", choices=["interval", "available-now"], default="interval")
    return p.parse_args(argv)


def fail_once(marker: str, hold_marker: str | None = None):
    """A UDF returning its input, except that one first attempt of a task fails (once per marker),
    and that with ``hold_marker`` every call holds its batch."""
    from pyspark import TaskContext

    def forward(body):  # no type hints: they would make Spark look for a pandas UDF
        if hold_marker is not None:
            Path(hold_marker).touch()
            time.sleep(HOLD_S)
        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0 and not os.path.exists(marker):
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return body
            where = {"stage": ctx.stageId(), "partition": ctx.partitionId(), "attempt": ctx.attemptNumber(),
                     "pid": os.getpid()}
            os.write(fd, json.dumps(where).encode())
            os.close(fd)
            raise RuntimeError(f"injected failure of task attempt 0 (stage {ctx.stageId()}, partition "
                               f"{ctx.partitionId()})")
        return body

    return forward


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spark = spark_session("orderlymq-fault-pipeline")
    from pyspark.sql import functions as F

    forward = F.udf(fail_once(args.fail_marker, args.hold_marker), "binary")
    events = (spark.readStream.format("orderlymq")
              .option("brokers", args.brokers).option("topic", args.source)
              .option("consumerGroup", args.group).option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", str(args.max_per_trigger)).load())
    out = events.select(F.col("key"), forward(F.col("body")).alias("body"))
    writer = (out.writeStream.format("orderlymq")
              .option("brokers", args.brokers).option("topic", args.sink).option("shardingKey", "key")
              .option("checkpointLocation", args.checkpoint).queryName("fault-pipeline"))
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="500 milliseconds")
    query = writer.start()
    print(f"query {query.id} started", flush=True)
    query.awaitTermination()
    print(f"query {query.id} finished", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
