"""Smoke test of ``make bench ARGS=--quick``: it runs and writes valid JSON (figures are not judged)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from bench.scratch_broker import ScratchBroker
from broker.wire import codec
from connector.client.connection import BrokerConnection, pb
from tests.jobs.cluster import ROOT, spark_env


@pytest.mark.slow
def test_quick_benchmarks_write_valid_json(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "spark_jobs/bench.py", "--quick", "--out", str(out)], cwd=ROOT,
                            env=spark_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["mode"] == "quick"
    workloads = {row["workload"] for row in doc["rows"]}
    for expected in ("broker ingest, batched (async flush), sustained (its page-cache window written first)",
                     "broker ingest, batched (async flush), a broker just started",
                     "pipelined acked sends, order verified",
                     "pipelined acked sends, a callback per send, order verified",
                     "ConcurrentConsumer of a backlog, one message per listener call, each once",
                     "OrderlyConsumer delivery latency p50, a message every 300 ms",
                     "spark source: orderlymq -> noop (AvailableNow)",
                     "spark sink: benchmem -> orderlymq (exactly once)",
                     "spark sink task: CPU per row written (exactly once)",
                     "peers: synchronous send, orderlymq vs Redis Streams",
                     "peers: ordered consume, orderlymq vs NATS JetStream"):
        assert expected in workloads
    for row in doc["rows"]:
        assert math.isfinite(row["figure"]) and row["figure"] > 0, row
    sync = next(row for row in doc["rows"] if row["workload"] == "peers: synchronous send, orderlymq vs Redis Streams")
    cpu = sync["extra"]["CPU µs per send (server, client)"]
    assert set(cpu) == {"orderlymq", "Redis Streams"} and all(us > 0 for pair in cpu.values() for us in pair), cpu
    source = next(row for row in doc["rows"] if row["workload"] == "spark source: orderlymq -> noop (AvailableNow)")
    assert source["extra"]["round ratios"] == [round(source["ratio"], 3)]  # --quick measures one round
    sinks = {row["workload"]: row["extra"] for row in doc["rows"] if row["workload"].startswith("spark sink: ")}
    exactly_once = sinks["spark sink: benchmem -> orderlymq (exactly once)"]
    at_least_once = sinks["spark sink: benchmem -> orderlymq (at least once)"]
    assert exactly_once["broker CPU s per run, median"] > 0 and at_least_once["broker CPU s per run, median"] > 0
    assert exactly_once["broker CommitTxn s per run, median"] > 0  # its tasks' transactions were committed
    assert at_least_once["broker CommitTxn s per run, median"] == 0  # no transactions at least once


def test_a_benchmarks_broker_takes_its_data_away_when_it_stops(tmp_path):
    """A full run writes tens of gigabytes: each benchmark's broker data goes with it (its log stays)."""
    data = tmp_path / "ingest"
    with ScratchBroker(data, "--log-level", "WARNING") as broker, BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="t", queue_count=1))
        conn.call("Send", pb.SendRequest(topic="t", queue_id=0,
                                         batch=codec.encode(codec.messages_to_batch([{"key": "k", "body": b"x"}]))))
        assert any((data / "topics" / "t").iterdir())
    assert not data.exists()
    assert (tmp_path / "ingest-broker.log").exists()
