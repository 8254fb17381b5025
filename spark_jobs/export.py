"""Export a range of a topic to Parquet (an audit copy, or input for batch jobs).

Reads ``spark.read.format("orderlymq")`` between starting and ending offsets or timestamps and
writes Parquet partitioned by queue, each queue's rows in offset order. Runs with spark-submit or
plain python::

    python spark_jobs/export.py --brokers 127.0.0.1:9876 --topic orders --out export/orders
    spark-submit spark_jobs/export.py --brokers 127.0.0.1:9876 --topic orders --out export/orders \\
        --starting-timestamp 1735689600000 --ending-offsets latest
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_jobs.session import spark_session  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Export an orderlymq topic range to Parquet.")
    p.add_argument("--brokers", required=True, help="host:port[,host:port]")
    p.add_argument("--topic", required=True)
    p.add_argument("--out", required=True, help="output directory (Parquet, partitioned by queue_id)")
    p.add_argument("--starting-offsets", default="earliest", help="earliest | latest | per-queue JSON")
    p.add_argument("--ending-offsets", default="latest", help="earliest | latest | per-queue JSON")
    p.add_argument("--starting-timestamp", help="ms since the epoch: first message stored at or after it")
    p.add_argument("--ending-timestamp", help="ms since the epoch: stop before the first message stored at it")
    p.add_argument("--tags", help="tag filter expression, e.g. 'TagA || TagC'")
    p.add_argument("--mode", default="errorifexists", choices=("errorifexists", "overwrite", "append"))
    p.add_argument("--master", help="Spark master when not run by spark-submit (default local[2])")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spark = spark_session("orderlymq-export", args.master)
    try:
        reader = (spark.read.format("orderlymq").option("brokers", args.brokers).option("topic", args.topic)
                  .option("startingOffsets", args.starting_offsets).option("endingOffsets", args.ending_offsets))
        for option, value in (("startingTimestamp", args.starting_timestamp),
                              ("endingTimestamp", args.ending_timestamp), ("tags", args.tags)):
            if value:
                reader = reader.option(option, value)
        df = reader.load()
        # One task per queue already; sorting within partitions keeps each file in offset order.
        (df.sortWithinPartitions("queue_id", "queue_offset")
           .write.mode(args.mode).partitionBy("queue_id").parquet(args.out))
        written = spark.read.parquet(args.out)
        counts = {r["queue_id"]: r["count"] for r in written.groupBy("queue_id").count().collect()}
        print(f"exported {sum(counts.values())} messages of {args.topic} to {args.out}")
        for queue_id in sorted(counts):
            print(f"  queue {queue_id}: {counts[queue_id]}")
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
