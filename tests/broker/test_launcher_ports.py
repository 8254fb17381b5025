"""Ports of child servers: with ``ORDERLYMQ_PORT_RANGE`` they come from that range only, and a
broker killed and started again serves on its port (which no other worker of a test run is given)."""

from __future__ import annotations

import os
import socket

import pytest

from broker.launcher import PORT_RANGE_ENV, BrokerProcess, free_port
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from tests.support import pull_all


def _free_block(size: int) -> range:
    """``size`` consecutive loopback ports free now, below the kernel's ephemeral ports."""
    for first in range(12_000, 19_000, size):
        block = range(first, first + size)
        try:
            for port in block:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return block
    pytest.skip("no free block of loopback ports below 19000")


def test_each_test_worker_takes_ports_from_a_block_of_its_own():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    first = int(os.environ[PORT_RANGE_ENV].split("-")[0])
    # gw0 from 20000, gw1 from 21500...: not the block of the process that started the workers
    assert first == (20_000 + int(worker[2:]) * 1_500 if worker.startswith("gw") else 30_500), (worker, first)


def test_free_port_picks_only_from_the_range_and_skips_ports_taken(monkeypatch):
    block = _free_block(4)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{block[0]}-{block[-1]}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", block[1]))
        taken.listen()
        picked = {free_port() for _ in range(12)}
    assert picked == set(block) - {block[1]}


def test_free_port_says_which_range_is_bad_or_full(monkeypatch):
    monkeypatch.setenv(PORT_RANGE_ENV, "30000-20000")
    with pytest.raises(ValueError, match="ORDERLYMQ_PORT_RANGE='30000-20000' is not a range of ports"):
        free_port()
    block = _free_block(1)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{block[0]}-{block[0]}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", block[0]))
        with pytest.raises(RuntimeError, match=f"no free loopback port in ORDERLYMQ_PORT_RANGE={block[0]}"):
            free_port()


def test_a_broker_restarted_serves_on_its_port_from_the_range_and_keeps_every_message(tmp_path, monkeypatch):
    block = _free_block(8)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{block[0]}-{block[-1]}")
    broker = BrokerProcess(tmp_path / "data", "--flush", "sync").start()
    try:
        port = broker.port
        assert port in block
        with Admin(broker.address) as admin:
            admin.create_topic("orders", 2)
        sent = [(f"order-{i % 3}", f"order-{i % 3}:{i}") for i in range(30)]
        with Producer(broker.address) as producer:
            for key, body in sent[:15]:
                producer.send("orders", body, key=key)
            broker.kill9()
            broker.start()
            for key, body in sent[15:]:
                producer.send("orders", body, key=key)
        assert broker.port == port
        with BrokerConnection(broker.address) as conn:
            stored = [row for q in range(2) for row in pull_all(conn, "orders", q).to_pylist()]
        for key in {k for k, _ in sent}:
            assert [row["body"].decode() for row in stored if row["key"] == key] == [b for k, b in sent if k == key]
    finally:
        broker.stop()
