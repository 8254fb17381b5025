"""The main job: the demo pipeline in short mode, and on a real standalone cluster via spark-submit
(with the backfill job). The demo checks its own per-key verdict (order, duplicates, loss); the
backfill is checked by consuming the topic it wrote."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from broker.launcher import BrokerProcess
from connector.client import Admin, PullConsumer
from tests.jobs.cluster import ROOT, StandaloneCluster, spark_env


def check_summary(path, produced: int) -> None:
    summary = json.loads(path.read_text())
    assert summary["ok"], summary
    assert summary["messages produced"] == produced
    assert summary["notifications checked"] == produced
    assert (summary["out-of-order"], summary["duplicates"], summary["lost"]) == (0, 0, 0)


@pytest.mark.slow
def test_demo_quick_mode_runs_to_a_clean_summary(tmp_path):
    summary = tmp_path / "summary.json"
    result = subprocess.run(
        [sys.executable, "spark_jobs/demo.py", "--quick", "--data-dir", str(tmp_path / "demo"),
         "--summary-json", str(summary), "--trigger", "500 milliseconds"],
        cwd=ROOT, env=spark_env(tmp_path), capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "every notification arrived in order and exactly once" in result.stdout
    check_summary(summary, 3_000)


def write_history(path, keys: int, per_key: int) -> None:
    """A historical table whose rows are shuffled: only event_time says each key's order."""
    rng = random.Random(3)
    rows = [(f"acct-{k}", seq, 1_700_000_000_000 + seq * 1000 + k) for k in range(keys) for seq in range(per_key)]
    rng.shuffle(rows)
    pq.write_table(pa.table({"account": [r[0] for r in rows], "seq": [r[1] for r in rows],
                             "event_time": [r[2] for r in rows]}), path)


@pytest.mark.slow
def test_demo_and_backfill_on_a_standalone_cluster_with_spark_submit(tmp_path):
    summary = tmp_path / "summary.json"
    history = tmp_path / "history.parquet"
    write_history(history, keys=40, per_key=25)
    with StandaloneCluster(tmp_path) as cluster:
        result = cluster.submit(ROOT / "spark_jobs" / "demo.py", "--quick", "--data-dir", str(tmp_path / "demo"),
                                "--summary-json", str(summary), "--trigger", "500 milliseconds")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        check_summary(summary, 3_000)
        with BrokerProcess(tmp_path / "backfill-broker") as broker:
            with Admin(broker.address) as admin:
                admin.create_topic("ledger", 4)
            backfill = cluster.submit(ROOT / "spark_jobs" / "backfill.py", "--input", str(history), "--brokers",
                                      broker.address, "--topic", "ledger", "--key", "account", "--event-time",
                                      "event_time")
            assert backfill.returncode == 0, backfill.stdout[-3000:] + backfill.stderr[-3000:]
            seen: dict[str, list[int]] = {}
            with PullConsumer(broker.address) as consumer:
                for q in range(4):
                    offset = 0
                    while True:
                        result = consumer.pull("ledger", q, offset, max_messages=1000)
                        for m in result:
                            seen.setdefault(m.key, []).append(json.loads(m.body)["seq"])
                        offset = result.next_offset
                        if offset >= result.max_offset:
                            break
    assert seen == {f"acct-{k}": list(range(25)) for k in range(40)}, "each key's events in event-time order, once"
