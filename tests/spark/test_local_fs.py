"""``ForklessLocalFileSystem``: Hadoop's local file system with permissions set through java.nio
(connector/spark/local_fs.py), which the shared session, the jobs and the benchmarks run on."""

from __future__ import annotations

import os
import stat

import pytest
from py4j.protocol import Py4JJavaError

from connector.spark.local_fs import FILE_SYSTEM, JAR


@pytest.fixture(scope="module")
def hadoop(spark):
    jvm = spark._jvm
    if not JAR.is_file():
        pytest.fail(f"{JAR} is not built: `make test` builds it (javac from a JDK 17)")

    def path(local) -> object:
        return jvm.org.apache.hadoop.fs.Path(f"file://{local}")

    fs = path("/").getFileSystem(spark._jsc.hadoopConfiguration())
    return jvm, fs, path


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_session_runs_on_it(hadoop):
    _, fs, _ = hadoop
    assert fs.getClass().getName() == FILE_SYSTEM


def test_permissions_are_set_as_asked(hadoop, tmp_path):
    jvm, fs, path = hadoop
    permission = jvm.org.apache.hadoop.fs.permission.FsPermission
    assert fs.mkdirs(path(tmp_path / "dir"), permission("751"))
    assert _mode(tmp_path / "dir") == 0o751
    for mode in ("640", "604", "000", "777"):
        (tmp_path / "file").write_bytes(b"x")
        fs.setPermission(path(tmp_path / "file"), permission(mode))
        assert _mode(tmp_path / "file") == int(mode, 8)
    # A sticky bit, which java.nio cannot set, goes through Hadoop's own chmod.
    fs.setPermission(path(tmp_path / "dir"), permission("1777"))
    assert _mode(tmp_path / "dir") == 0o1777


def test_a_missing_file_is_reported(hadoop, tmp_path):
    jvm, fs, path = hadoop
    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        fs.setPermission(path(tmp_path / "missing"), jvm.org.apache.hadoop.fs.permission.FsPermission("644"))


def test_spark_writes_and_reads_files_through_it(spark, tmp_path):
    """Files and directories get Hadoop's default modes (umask 022), checksums included."""
    spark.range(1000).repartition(3).write.parquet(str(tmp_path / "out"))
    assert sorted(r.id for r in spark.read.parquet(str(tmp_path / "out")).collect()) == list(range(1000))
    parts = [p for p in (tmp_path / "out").iterdir() if p.name.startswith("part-")]
    assert len(parts) == 3 and all(_mode(p) == 0o644 for p in parts)
    assert len(list((tmp_path / "out").glob(".part-*.crc"))) == 3
    assert _mode(tmp_path / "out") == 0o755


def _processes_started() -> int:
    """Processes started on this machine since boot (``/proc/stat``)."""
    with open("/proc/stat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("processes "))


def test_no_process_is_forked_to_set_permissions(hadoop, tmp_path):
    """Hadoop's own way starts processes to run ``chmod`` on every call: 50 calls started 100 here.
    The count is the whole machine's, so a few may be other tests' (each Spark task forks a Python
    worker)."""
    jvm, fs, path = hadoop
    (tmp_path / "file").write_bytes(b"x")
    target, permission = path(tmp_path / "file"), jvm.org.apache.hadoop.fs.permission.FsPermission("600")
    before = _processes_started()
    for _ in range(50):
        fs.setPermission(target, permission)
    assert _processes_started() - before < 25
