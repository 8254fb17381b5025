"""Shared fixtures: a real broker on an ephemeral loopback port, and one SparkSession per run."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

import connector  # noqa: F401 - first: gRPC's poll strategy is set before any test module imports grpc
from broker.launcher import PORT_RANGE_ENV
from spark_jobs.session import prepare_environment

prepare_environment()  # as every job: loopback, this interpreter, and conf/ as SPARK_CONF_DIR

_PORT_BLOCKS, _PORT_BLOCK = 8, 1_500  # 20000-31999: below Linux's ephemeral ports (32768-60999)


def _worker_port_range() -> str:
    """This worker's own ports (``make test`` runs workers gw0, gw1...; one without them takes the
    last block): a server a test restarts takes its port back, never taken by another worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") else _PORT_BLOCKS - 1
    first = 20_000 + index % _PORT_BLOCKS * _PORT_BLOCK
    return f"{first}-{first + _PORT_BLOCK - 1}"


# Set, not defaulted: workers inherit the environment of the process that starts them, which set it too.
os.environ[PORT_RANGE_ENV] = _worker_port_range()

# No time limit per example: a test judges behaviour, never speed, and the machine may be busy.
settings.register_profile("orderlymq", deadline=None)
settings.load_profile("orderlymq")


def pytest_collection_modifyitems(config, items):
    """The long tests (``@pytest.mark.slow``) first: handed out first to the workers of ``make test``
    (``-n``), they run beside the many short ones, not one after another at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture
def broker_factory(tmp_path):
    """Start in-process brokers with config overrides: ``broker_factory(lock_lease_ms=500)``."""
    from broker.config import BrokerConfig
    from broker.server import start_broker

    started = []

    def start(data_dir: Path | None = None, **overrides):
        config = BrokerConfig(port=0, data_dir=str(data_dir or tmp_path / f"broker-{len(started)}"), **overrides)
        running = start_broker(config)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def broker(broker_factory):
    """A fresh real broker (gRPC on 127.0.0.1, temp data dir); ``broker.address`` is host:port."""
    return broker_factory()


@pytest.fixture
def topic_name():
    """A unique topic name per test."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the whole run (starting one costs ~10 s), with conf/'s settings
    (spark-defaults.conf, log4j2.properties) and the local file system the jobs and the demo have."""
    from pyspark.sql import SparkSession

    from connector.spark.local_fs import local_fs_conf

    session = (
        SparkSession.builder.master("local[2]")
        .appName("orderlymq-tests")
        .config("spark.sql.shuffle.partitions", "4")
        .config(map=local_fs_conf())
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
