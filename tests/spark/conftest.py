"""Spark-test fixtures: the session with ``format("orderlymq")`` registered, and a broker client."""

from __future__ import annotations

import pytest

from connector.client.connection import BrokerConnection
from tests.faults.brokers import broker_process


@pytest.fixture(scope="session")
def ospark(spark):
    """The session-scoped SparkSession with the orderlymq data source registered."""
    from connector.spark import register

    register(spark)
    return spark


@pytest.fixture
def conn(broker):
    """A raw connection to the test broker."""
    with BrokerConnection(broker.address, retry_timeout=5) as connection:
        yield connection


@pytest.fixture
def restartable(tmp_path):
    """A broker subprocess (default lease) that a test can kill -9 and start again on its port, and
    a connection to it that retries while it restarts."""
    proc = broker_process(tmp_path / "broker").start()
    conn = BrokerConnection(proc.address, retry_timeout=30)
    yield proc, conn
    conn.close()
    proc.kill9()
