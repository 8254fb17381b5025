"""The official RocketMQ 5 Node.js client (npm ``rocketmq-client-nodejs``, pinned in node/package-lock.json):
FIFO producer → orderlymq → SimpleConsumer, per message group in order; the groups land in our keys' queues.

The client is installed once with ``npm ci`` into a cache outside the tree (``ORDERLYMQ_NODE_CACHE``,
default ``~/.cache/orderlymq-tests/rocketmq-node``); without node/npm or the registry the test is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from broker.wire.routing import queue_for_key
from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import Delivery, Send, check
from tests.support import pull_all

NODE_DIR = Path(__file__).parent / "node"
QUEUES, KEYS, PER_KEY = 3, 4, 6


@pytest.fixture(scope="module")
def node_client() -> Path:
    if not (shutil.which("node") and shutil.which("npm")):
        pytest.skip("node and npm are not installed")
    lock = (NODE_DIR / "package-lock.json").read_bytes()
    cache = Path(os.environ.get("ORDERLYMQ_NODE_CACHE", Path.home() / ".cache" / "orderlymq-tests" / "rocketmq-node"))
    target = cache / hashlib.sha256(lock).hexdigest()[:12]
    if not (target / "node_modules" / "rocketmq-client-nodejs").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(NODE_DIR / name, target / name)
        done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=target,
                              capture_output=True, text=True, timeout=300)
        if done.returncode:
            pytest.skip(f"npm ci of rocketmq-client-nodejs failed: {done.stderr[-500:]}")
    shutil.copy(NODE_DIR / "roundtrip.js", target / "roundtrip.js")
    return target


def test_node_fifo_producer_and_simple_consumer(node_client, broker, topic_name):
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, queues=QUEUES)
    run = subprocess.run(["node", "roundtrip.js", broker.address, topic_name, str(KEYS), str(PER_KEY)],
                         cwd=node_client, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    sends = [Send(f"node-{k}", seq, True) for seq in range(PER_KEY) for k in range(KEYS)]
    received = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    verdict = check(sends, [Delivery(e["key"], e["seq"], "node") for e in received])
    assert verdict.ok and verdict.deliveries == len(sends), str(verdict)
    with BrokerConnection(broker.address) as conn:
        for queue_id in range(QUEUES):
            keys = set(pull_all(conn, topic_name, queue_id).column("key").to_pylist())
            assert all(queue_for_key(key, QUEUES) == queue_id for key in keys)
