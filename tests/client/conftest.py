"""Fixtures of the client tests (the broker fixtures live in tests/conftest.py)."""

from __future__ import annotations

import pytest

from connector.client import Admin, Producer

from .helpers import FAST_BROKER


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    """One real broker for a whole module (for hypothesis tests, which run many examples)."""
    from broker.config import BrokerConfig
    from broker.server import start_broker

    running = start_broker(BrokerConfig(port=0, data_dir=str(tmp_path_factory.mktemp("shared-broker"))))
    yield running
    running.stop()


@pytest.fixture
def fast_broker(broker_factory):
    """A broker whose lock leases and member timeouts suit ``helpers.FAST`` consumers."""
    return broker_factory(**FAST_BROKER)


@pytest.fixture
def admin(broker):
    with Admin(broker.address) as a:
        yield a


@pytest.fixture
def producer(broker):
    with Producer(broker.address, retry_timeout=5.0) as p:
        yield p
