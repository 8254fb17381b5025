"""``orderlymq cluster status`` on a real group: every broker as it sees itself, the master's
sync-state set and its slaves' lag, and a broker that does not answer."""

from __future__ import annotations

from connector.cli import main
from connector.client import Admin, Producer
from tests.support import wait_until

TOPIC = "orders"


def test_cluster_status_shows_roles_sync_state_set_and_lag(broker_group, capsys):
    group = broker_group(2)
    master, slave = group.brokers
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, 2)
    with Producer(group.addresses) as producer:
        for i in range(20):
            producer.send(TOPIC, b"x", key=f"k{i}")
    # The slave's next fetch reports what it applied: then the master counts it 0 behind.
    assert wait_until(lambda: group.health(master).replicas and group.health(master).replicas[0].behind_messages == 0)
    capsys.readouterr()
    unreachable = "127.0.0.1:1"
    assert main(["--brokers", f"{group.addresses},{unreachable}", "--timeout", "1", "cluster", "status"]) == 0
    out = capsys.readouterr().out
    assert f"{master.address}" in out and "MASTER" in out and "SLAVE" in out
    assert "sync-state set [0, 1]" in out
    assert f"{unreachable}" in out and "unreachable" in out
    slave_row = next(line for line in out.splitlines() if line.strip().startswith("│ 1 "))
    assert "yes" in slave_row and " 0 " in slave_row, slave_row
