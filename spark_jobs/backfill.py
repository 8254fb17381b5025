"""Backfill a topic from a historical table, in order per key.

Reads a Parquet, CSV or JSON path, lays the rows out so that each queue is written by one task in
event-time order (``connector.spark.ordered_for_write``) and writes them with the ``orderlymq``
sink (exactly once: nothing is visible unless the whole job succeeds).

Runs with spark-submit or plain python::

    spark-submit spark_jobs/backfill.py --input data/orders.parquet --brokers 127.0.0.1:9876 \\
        --topic orders --key order_id --event-time created_at --body-column payload
    python spark_jobs/backfill.py --input orders.csv --format csv --brokers 127.0.0.1:9876 \\
        --topic orders --key order_id --event-time created_at --dry-run

``--dry-run`` prints how many rows each queue would receive and writes nothing. Without
``--body-column`` each row's body is the JSON of the whole row.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a source checkout (spark-submit puts only this directory on the path)
    sys.path.insert(0, str(ROOT))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from connector.client.connection import BrokerConnection, pb  # noqa: E402
from connector.spark import ordered_for_write, register  # noqa: E402
from connector.spark.sharding import queue_expr  # noqa: E402
from spark_jobs.session import spark_session  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Backfill an orderlymq topic from a table, in order per key.")
    parser.add_argument("--input", required=True, help="path of the historical table")
    parser.add_argument("--format", default="parquet", choices=("parquet", "csv", "json"))
    parser.add_argument("--brokers", required=True, help="host:port[,host:port]")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--key", required=True, help="sharding key column")
    parser.add_argument("--event-time", required=True, help="column that orders the events of a key")
    parser.add_argument("--body-column", help="body column (default: the JSON of the whole row)")
    parser.add_argument("--tag-column", help="tag column")
    parser.add_argument("--dry-run", action="store_true", help="print per-queue row counts, write nothing")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    return parser.parse_args(argv)


def _ship_sources(spark: SparkSession) -> None:
    """Give the executors the connector when it is used from a source checkout, not installed."""
    import connector

    if "site-packages" in connector.__file__:
        return
    archive = Path(tempfile.mkdtemp()) / "orderlymq-src.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for package in ("broker", "connector"):
            for path in (ROOT / package).rglob("*.py"):
                zf.write(path, path.relative_to(ROOT))
    spark.sparkContext.addPyFile(str(archive))


def load(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    reader = spark.read.format(args.format)
    if args.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    df = reader.load(args.input)
    if args.body_column is None:
        df = df.withColumn("body", F.to_json(F.struct(*df.columns)))
    return df


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    spark = spark_session(f"orderlymq-backfill-{args.topic}", args.master or "local[*]")
    _ship_sources(spark)
    register(spark)
    with BrokerConnection(args.brokers) as conn:
        queues = conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=args.topic)).queue_count
    df = load(spark, args)
    if args.dry_run:
        target = queue_expr(args.key, df.schema[args.key].dataType, queues)
        counts = {r["queue_id"]: r["count"] for r in df.groupBy(target.alias("queue_id")).count().collect()}
        print(f"topic {args.topic}: {queues} queues, {sum(counts.values())} rows")
        for queue_id in range(queues):
            print(f"  queue {queue_id}: {counts.get(queue_id, 0)} rows")
        return 0
    ordered = ordered_for_write(df, args.key, args.event_time, queues)
    writer = ordered.write.format("orderlymq").option("brokers", args.brokers).option("topic", args.topic)
    writer = writer.option("shardingKey", args.key).option("bodyColumn", args.body_column or "body")
    if args.tag_column:
        writer = writer.option("tagColumn", args.tag_column)
    writer.mode("append").save()
    print(f"backfill of {args.topic} committed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
