"""Separate-process Spark jobs: a task that fails once, and the backfill job (python and spark-submit)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from broker.wire.routing import queue_for_key
from tests.spark.helpers import assert_delivered, create_topic, topic_delivered, topic_events
from tests.support import pull_all

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_task_failing_once_leaves_no_duplicate_and_no_reordering(broker, conn, topic_name):
    create_topic(conn, topic_name, 3)
    result = run([sys.executable, str(ROOT / "tests/spark/jobs/write_fail_once.py"), broker.address, topic_name])
    assert "injected failure of the first attempt" in result.stderr  # the retry really happened
    out = topic_events(conn, topic_name)
    for queue_id, events in out.items():
        assert all(queue_for_key(key, 3) == queue_id for key, _ in events)
    assert_delivered([(f"k{k}", s) for k in range(8) for s in range(250)], topic_delivered(out))


@pytest.mark.slow
def test_backfill_dry_run_and_spark_submit(broker, conn, topic_name, tmp_path):
    create_topic(conn, topic_name, 4)
    rng = random.Random(3)
    events = [(f"acct-{k}", t) for k in range(10) for t in range(20)]
    rng.shuffle(events)  # the table is not in event order
    table = pa.table({"account": [k for k, _ in events], "ts": [t for _, t in events], "amount": [1.5] * len(events)})
    path = tmp_path / "history.parquet"
    pq.write_table(table, path)
    args = ["--input", str(path), "--brokers", broker.address, "--topic", topic_name, "--key", "account"]
    args += ["--event-time", "ts"]

    dry = run([sys.executable, str(ROOT / "spark_jobs/backfill.py"), *args, "--dry-run", "--master", "local[2]"])
    expected = {q: 0 for q in range(4)}
    for key, _ in events:
        expected[queue_for_key(key, 4)] += 1
    for queue_id, count in expected.items():
        assert f"queue {queue_id}: {count} rows" in dry.stdout
    assert all(len(pull_all(conn, topic_name, q)) == 0 for q in range(4))

    run([str(VENV_BIN / "spark-submit"), "--master", "local[2]", str(ROOT / "spark_jobs/backfill.py"), *args])
    for queue_id in range(4):
        rows = [json.loads(b) for b in pull_all(conn, topic_name, queue_id).column("body").to_pylist()]
        assert all(queue_for_key(r["account"], 4) == queue_id for r in rows)
        accounts = sorted({r["account"] for r in rows})
        assert_delivered([(a, t) for a in accounts for t in range(20)], [(r["account"], r["ts"]) for r in rows])
    assert sum(len(pull_all(conn, topic_name, q)) for q in range(4)) == len(events)
