"""Spark-test fixtures: the session with ``format("orderlymq")`` registered, and a broker client."""

from __future__ import annotations

import pytest

from connector.client.connection import BrokerConnection


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
