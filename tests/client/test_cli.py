"""The ``orderlymq`` command line, run as a subprocess against a real broker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from connector.client import Producer, PullConsumer

ROOT = Path(__file__).resolve().parents[2]


def cli(broker, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "connector.cli"]
    if broker is not None:
        command += ["--brokers", broker.address]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "160", **(env or {})},
        timeout=60,
    )


def test_topic_commands(broker, topic_name):
    created = cli(broker, "topic", "create", topic_name, "--queues", "3")
    assert created.returncode == 0, created.stderr
    assert f"topic {topic_name}: 3 queues" in created.stdout
    listed = cli(None, "topic", "list", env={"ORDERLYMQ_BROKERS": broker.address})
    assert topic_name in listed.stdout and "3" in listed.stdout
    described = cli(broker, "topic", "describe", topic_name)
    assert described.returncode == 0 and "max offset" in described.stdout
    grown = cli(broker, "topic", "grow", topic_name, "--queues", "5")
    assert grown.returncode == 0 and f"topic {topic_name}: now 5 queues" in grown.stdout
    shrunk = cli(broker, "topic", "grow", topic_name, "--queues", "2")
    assert shrunk.returncode == 1 and "can only grow" in shrunk.stderr
    assert cli(broker, "topic", "delete", topic_name).returncode == 0
    assert topic_name not in cli(broker, "topic", "list").stdout


def test_send_then_tail_shows_messages_in_queue_order(broker, topic_name):
    cli(broker, "topic", "create", topic_name, "--queues", "2")
    sent = cli(broker, "send", topic_name, "step-0", "--key", "order-9", "--tag", "TagA")
    assert sent.returncode == 0, sent.stderr
    assert "at offset 0" in sent.stdout
    with Producer(broker.address) as producer:
        for i in range(1, 4):
            producer.send(topic_name, f"step-{i}", key="order-9", tag="TagA")
    tail = cli(broker, "tail", topic_name, "--from", "earliest", "--max", "10")
    lines = [line.split("\t") for line in tail.stdout.splitlines()]
    assert [(line[1], line[2], line[3], line[4]) for line in lines] == [
        (str(i), "order-9", "TagA", f"step-{i}") for i in range(4)
    ]
    assert cli(broker, "tail", topic_name, "--from", "latest").stdout == ""
    assert len(cli(broker, "tail", topic_name, "--max", "2").stdout.splitlines()) == 2
    keyless = cli(broker, "send", topic_name, "no key")
    assert keyless.returncode == 1 and "no sharding key" in keyless.stderr and "--" not in keyless.stdout
    assert f"to {topic_name}[1] at offset" in cli(broker, "send", topic_name, "x", "--queue", "1").stdout
    assert cli(broker, "send", topic_name, "y", "--selector", "round_robin").returncode == 0


def test_progress_and_locks(broker, topic_name):
    cli(broker, "topic", "create", topic_name, "--queues", "2")
    with Producer(broker.address) as producer:
        for i in range(3):
            producer.send(topic_name, str(i), queue_id=0)
    with PullConsumer(broker.address, group="billing", client_id="worker-1") as consumer:
        consumer.lock(topic_name, 0)
        consumer.commit(topic_name, 0, 1)
        progress = cli(broker, "progress", "billing", topic_name)
        locks = cli(broker, "locks", "billing", topic_name)
    assert progress.returncode == 0, progress.stderr
    assert "worker-1" in progress.stdout and "total lag: 2" in progress.stdout
    assert locks.returncode == 0 and "worker-1" in locks.stdout
    assert "no queue is locked" in cli(broker, "locks", "billing", topic_name).stdout


def test_errors_are_one_line_and_exit_1(broker):
    missing = cli(broker, "topic", "describe", "no-such-topic")
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr.count("\n") == 1 and "no-such-topic" in missing.stderr
    assert "Traceback" not in missing.stderr
    down = subprocess.run(
        [sys.executable, "-m", "connector.cli", "--brokers", "127.0.0.1:1", "--timeout", "0.3", "topic", "list"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert down.returncode == 1 and "127.0.0.1:1" in down.stderr and down.stderr.count("\n") == 1
    usage = cli(broker, "topic", "create", "x")
    assert usage.returncode == 1 and "--queues" in usage.stderr and usage.stderr.count("\n") == 1
    bad = cli(broker, "topic", "create", "bad name!", "--queues", "1")
    assert bad.returncode == 1 and "invalid topic name" in bad.stderr
