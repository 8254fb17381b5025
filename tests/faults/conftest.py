"""Fixtures of the fault scenarios: the summary recorder and broker subprocesses with settings."""

from __future__ import annotations

import pytest

from tests.faults.brokers import broker_process
from tests.faults.report import SUMMARIES, summarize


@pytest.fixture
def fault_report(tmp_path, tmp_path_factory):
    """``fault_report(scenario, {label: verdict}, **figures)`` prints and stores a scenario's summary."""

    def report(scenario: str, histories: dict, **figures) -> dict:
        return summarize(scenario, histories, figures, tmp_path, tmp_path_factory.getbasetemp())

    return report


@pytest.fixture
def broker_proc(tmp_path):
    """``broker_proc(**settings)`` starts a broker subprocess on a fresh data dir; all are stopped at the end."""
    started = []

    def start(name: str = "broker", **settings):
        proc = broker_process(tmp_path / name, **settings).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill9()


@pytest.fixture
def zookeeper(tmp_path):
    """A ZooKeeper server of this test alone (Debian's package: `make zookeeper`), on a free port."""
    from broker.cluster.zookeeper import ZooKeeperServer, zookeeper_installed

    if not zookeeper_installed():
        pytest.fail("ZooKeeper is not installed: run `make zookeeper` (make test does)")
    server = ZooKeeperServer(tmp_path / "zookeeper").start()
    yield server
    server.stop()


@pytest.fixture
def broker_group(tmp_path, zookeeper):
    """``broker_group(size, **settings)`` starts a replicated broker group; all are killed at the end."""
    from tests.faults.cluster_group import BrokerGroup

    groups = []

    def start(size: int = 2, **settings) -> BrokerGroup:
        group = BrokerGroup(tmp_path / f"group-{len(groups)}", zookeeper.connect_string, size, **settings)
        groups.append(group)
        return group.start()

    yield start
    for group in groups:
        group.kill_all()


@pytest.fixture
def broker_cluster(tmp_path, zookeeper):
    """``broker_cluster(groups, size, **settings)`` starts groups broker-a, broker-b, ... of ``size``
    brokers each in one cluster; returns the ``BrokerGroup`` list; all are killed at the end."""
    from tests.faults.cluster_group import BrokerGroup

    started = []

    def start(groups: int = 3, size: int = 2, settings_of_groups: list[dict[int, dict]] | None = None,
              **settings) -> list[BrokerGroup]:
        """``settings_of_groups[i]``: the ``settings_of`` of group ``i`` (``BrokerGroup``)."""
        for i in range(groups):
            group = BrokerGroup(tmp_path / f"cluster-{i}", zookeeper.connect_string, size,
                                name=f"broker-{chr(ord('a') + i)}",
                                settings_of=(settings_of_groups or [{}] * groups)[i], **settings)
            started.append(group)
            group.start()
        return started

    yield start
    for group in started:
        group.kill_all()


@pytest.fixture
def tcp_proxy():
    """``tcp_proxy(target=None, port=0)`` starts a ``TcpProxy`` (one link a test cuts); all are closed at the end."""
    from tests.faults.tcp_proxy import TcpProxy

    proxies: list = []

    def start(target: str | None = None, port: int = 0):
        proxies.append(TcpProxy(target, port))
        return proxies[-1]

    yield start
    for proxy in proxies:
        proxy.close()


def pytest_terminal_summary(terminalreporter):
    if SUMMARIES:
        terminalreporter.section("fault scenarios")
        for line in SUMMARIES:
            terminalreporter.write_line(line)
