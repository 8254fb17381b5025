"""A batch read of a TLS + ACL broker whose credentials come from Spark conf only, as a user puts
them in spark-defaults.conf: ``spark.executorEnv.ORDERLYMQ_ACCESS_KEY`` / ``..._SECRET_KEY``.

Usage: read_with_conf_credentials.py BROKER TOPIC CA_FILE ACCESS_KEY; the secret comes on stdin
(never on a command line). Prints the rows' bodies in order, one JSON line each."""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

from connector.spark import register


def main(broker: str, topic: str, ca_file: str, access_key: str) -> None:
    secret = sys.stdin.readline().strip()
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.executorEnv.ORDERLYMQ_ACCESS_KEY", access_key)
             .config("spark.executorEnv.ORDERLYMQ_SECRET_KEY", secret).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    rows = (spark.read.format("orderlymq").option("brokers", broker).option("topic", topic)
            .option("tls.caFile", ca_file).load().orderBy("queue_id", "queue_offset").collect())
    for row in rows:
        print(json.dumps({"body": row["body"].decode()}))
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:5])
