"""spark_jobs/export.py: a topic range lands in Parquet complete and, per queue, in offset order."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq

from connector.client import Admin, Producer
from connector.history import check_keyed
from tests.jobs.cluster import ROOT, spark_env


def test_export_writes_every_message_in_queue_order(broker, topic_name, tmp_path):
    Admin(broker.address).create_topic(topic_name, 3)
    with Producer(broker.address) as producer:
        producer.send_batch(topic_name, [{"key": f"k{i % 7}", "body": f"k{i % 7}:{i // 7}"} for i in range(700)])
    out = tmp_path / "export"
    result = subprocess.run([sys.executable, "spark_jobs/export.py", "--brokers", broker.address, "--topic", topic_name,
                             "--out", str(out)], cwd=ROOT, env=spark_env(tmp_path), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"exported 700 messages of {topic_name}" in result.stdout
    table = pq.read_table(out).to_pandas()
    for _, part in table.groupby("queue_id", observed=True):
        assert list(part["queue_offset"]) == list(range(len(part))), "complete and in offset order per queue"
    # A Parquet file is a set of rows: queue order is their queue_offset.
    events = [body.decode().split(":") for body in table.sort_values(["queue_id", "queue_offset"])["body"]]
    verdict = check_keyed({f"k{k}": 100 for k in range(7)}, [(key, int(seq)) for key, seq in events])
    assert verdict.ok and verdict.deliveries == 700, str(verdict)
