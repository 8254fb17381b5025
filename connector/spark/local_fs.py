"""Spark settings for checkpoints on a local disk: Hadoop's local file system with permissions set
through java.nio (``org.orderlymq.hadoop.ForklessLocalFileSystem``, built by ``make`` into
``connector/spark/jars``) instead of a forked ``chmod`` for every file it creates.

A streaming query writes its offset log and commit log each micro-batch, two files and two checksum
files; each fork of ``chmod`` costs a few milliseconds (see docs/spark.md for the figures).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FILE_SYSTEM", "JAR", "local_fs_conf"]

JAR = Path(__file__).resolve().parent / "jars" / "orderlymq-hadoop.jar"
FILE_SYSTEM = "org.orderlymq.hadoop.ForklessLocalFileSystem"


def local_fs_conf() -> dict[str, str]:
    """The settings a SparkSession needs at launch (the driver's class path is fixed then); empty
    when the jar is not built."""
    if not JAR.is_file():
        return {}
    return {"spark.driver.extraClassPath": str(JAR), "spark.executor.extraClassPath": str(JAR),
            "spark.hadoop.fs.file.impl": FILE_SYSTEM}
