"""One broker per data dir: a second broker started on a data dir in use is refused, naming the
holder, and the first goes on serving with nothing lost; once the holder is gone (kill -9 included)
the data dir opens again with everything in it."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.data_dir_lock import DataDirInUseError
from broker.launcher import BrokerProcess
from broker.server import start_broker
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.history import check_keyed
from tests.support import send_keyed_rounds, stored_keyed

TOPIC, QUEUES, KEYS = "guarded", 4, 8


def _send(address: str, expected: dict[str, int], per_key: int) -> None:
    """``per_key`` more messages of every key, bodies ``key:seq``."""
    with Producer(address) as producer:
        send_keyed_rounds(lambda key, body: producer.send_async(TOPIC, body, key=key), expected, per_key, KEYS)
        producer.flush()


def _assert_holds(address: str, expected: dict[str, int]) -> None:
    with BrokerConnection(address) as conn:
        verdict = check_keyed(expected, stored_keyed(conn, TOPIC, QUEUES))
    assert verdict.ok and verdict.duplicated == 0, str(verdict)


def test_a_second_broker_on_a_data_dir_in_use_is_refused(tmp_path):
    first = BrokerProcess(tmp_path / "data", log_path=tmp_path / "first.log").start()
    try:
        with Admin(first.address) as admin:
            admin.create_topic(TOPIC, QUEUES)
        expected: dict[str, int] = {}
        _send(first.address, expected, 20)
        second = BrokerProcess(tmp_path / "data", log_path=tmp_path / "second.log")
        with pytest.raises(RuntimeError, match=rf"data dir .*data is in use by another broker \(pid {first.pid}\)"):
            second.start()
        _send(first.address, expected, 20)  # the first broker serves on, its files untouched
        _assert_holds(first.address, expected)
    finally:
        first.kill9()  # the kernel drops the lock with the process
    second.start()
    try:
        _assert_holds(second.address, expected)
    finally:
        second.stop()


def test_an_embedded_broker_releases_its_data_dir_when_stopped(tmp_path):
    config = BrokerConfig(port=0, data_dir=str(tmp_path / "data"), send_port=-1)
    running = start_broker(config)
    try:
        with pytest.raises(DataDirInUseError, match="in use by another broker"):
            start_broker(config)
    finally:
        running.stop()
    start_broker(config).stop()
