"""The main job: the demo pipeline in short mode, and on a real standalone cluster via spark-submit.
Both check the demo's own per-key verdict (order, duplicates, loss) from its summary JSON."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.jobs.cluster import ROOT, StandaloneCluster, spark_env


def check_summary(path, produced: int) -> None:
    summary = json.loads(path.read_text())
    assert summary["ok"], summary
    assert summary["messages produced"] == produced
    assert summary["notifications checked"] == produced
    assert (summary["out-of-order"], summary["duplicates"], summary["lost"]) == (0, 0, 0)


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


def test_demo_on_a_standalone_cluster_with_spark_submit(tmp_path):
    summary = tmp_path / "summary.json"
    with StandaloneCluster(tmp_path) as cluster:
        result = cluster.submit(ROOT / "spark_jobs" / "demo.py", "--quick", "--data-dir", str(tmp_path / "demo"),
                                "--summary-json", str(summary), "--trigger", "500 milliseconds")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    check_summary(summary, 3_000)
