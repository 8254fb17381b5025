"""One way for every job to get a SparkSession: under spark-submit it uses the master that
spark-submit set; run with plain ``python`` it starts ``local[2]`` with conf/ as SPARK_CONF_DIR."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def prepare_environment() -> None:
    """Settings a local run needs before the JVM starts (loopback, this interpreter, conf/)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "conf"))


def spark_session(app_name: str, master: str | None = None):
    """The job's SparkSession; ``master`` applies only outside spark-submit."""
    prepare_environment()
    from pyspark.sql import SparkSession

    from connector.spark.local_fs import local_fs_conf

    builder = SparkSession.builder.appName(app_name)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit: we choose the master and class path
        builder = builder.master(master or "local[2]").config(map=local_fs_conf())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark  # format("orderlymq") is found through the installed pyspark_orderlymq module
