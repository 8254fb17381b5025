"""``orderlymq-cluster up`` (``make cluster``): a local cluster in one command, stopped by Ctrl-C."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from connector.client import Admin, Producer
from tests.support import wait_until


def _fixed_port_base() -> int:
    """A random base for the cluster's fixed ports, below the kernel's ephemeral range.

    Inside that range, another test's free port or outgoing connection can take a port between the
    choice and the broker's bind (seen as "Address already in use" under xdist).
    """
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return random.randrange(20_000, ephemeral_low - 100, 100)


def test_local_cluster_comes_up_serves_a_spread_topic_and_stops_on_ctrl_c(tmp_path):
    base = _fixed_port_base()
    proc = subprocess.Popen([sys.executable, "-m", "broker.cluster.local_cluster", "up", "--groups", "2",
                             "--brokers-per-group", "2", "--dir", str(tmp_path / "cluster"), "--base-port", str(base),
                             "--zookeeper-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: list[psutil.Process] = []
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("bootstrap: "):
                break
        assert lines and lines[-1].startswith("bootstrap: "), "".join(lines)
        bootstrap = lines[-1].split()[1]
        assert bootstrap == f"127.0.0.1:{base},127.0.0.1:{base + 10}"
        children = psutil.Process(proc.pid).children(recursive=True)
        with Admin(bootstrap) as admin:
            info = admin.create_topic("demo", 4)
            assert {g.broker_name for g in info.groups} == {"broker-a", "broker-b"}
        with Producer(bootstrap) as producer:
            stored = [producer.send("demo", b"x", key=f"k{i}") for i in range(20)]
        assert len({r.queue_id for r in stored}) > 1
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "stopping the cluster" in out
    assert wait_until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
                      timeout=30), "a broker or ZooKeeper outlived the cluster"
