"""Cluster scenarios: a group's brokers reach a ZooKeeper that does not hold their group.

- ZooKeeper comes back without its data (its data dir lost), then with it. Such a ZooKeeper
  refuses the group's running brokers (they saw later transactions than it has), so they go on as
  in an outage; a broker restarted meanwhile is let in and finds no state of its group. Before
  group ids it founded a new group at epoch 1 and, as its master, deleted every topic ZooKeeper
  did not route: all its messages, then its slaves'.
- The link to ZooKeeper leads to another ensemble, one with a group of the same name (a wrong
  connect string; in a test run, another test's ZooKeeper that took a stopped one's port). There
  the brokers would have registered in, followed, and deleted the nodes of the other group.

Either way no broker takes a role from that ZooKeeper (each logs why) or changes anything of a
group there, and once it reaches its own ZooKeeper again the group elects a master and holds
every acknowledged message, in order, with sends going on.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator

from kazoo.client import KazooClient

from broker.cluster.zookeeper import ZooKeeperServer
from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, Verdict, check
from tests.faults.cluster_group import BrokerGroup
from tests.faults.workload import send_all, stored_deliveries
from tests.support import wait_until

TOPIC, QUEUES = "orders", 4
KEYS, KEYS_AFTER = [f"order-{k}" for k in range(8)], [f"order-{k}-after" for k in range(8)]
REFUSAL = "holds no state for group group-a, which this broker served in up to epoch 1"
OTHERS = "holds group id "  # another group's state, where this broker's group was


def _refusals(broker, refusal: str = REFUSAL) -> bool:
    return refusal in broker.log_text()


@contextlib.contextmanager
def _zookeeper_client(connect_string: str) -> Iterator[KazooClient]:
    client = KazooClient(hosts=connect_string)
    client.start()
    try:
        yield client
    finally:
        client.stop()
        client.close()


def _group_nodes(connect_string: str, group: str) -> dict[str, bytes]:
    """Each node under a group's path in ZooKeeper (``state``, ``members/0``...) with its data."""
    root = f"/orderlymq/orderlymq/groups/{group}"
    with _zookeeper_client(connect_string) as client:
        nodes = {name: client.get(f"{root}/{name}")[0] for name in client.get_children(root)}
        nodes.update({f"members/{m}": client.get(f"{root}/members/{m}")[0]
                      for m in client.get_children(f"{root}/members")})
    return nodes


def _raise_zxid(connect_string: str, above: int) -> None:
    """Write to ZooKeeper until its last transaction id is above ``above``: it then lets in clients
    that saw transactions up to ``above`` elsewhere (it refuses those that saw later ones)."""
    with _zookeeper_client(connect_string) as client:
        client.ensure_path("/filler")
        while client.set("/filler", b"x").mzxid <= above:
            for result in [client.set_async("/filler", b"x") for _ in range(500)]:
                result.get()


def _last_zxid(connect_string: str) -> int:
    with _zookeeper_client(connect_string) as client:
        client.ensure_path("/probe")
        return client.set("/probe", b"x").mzxid


def _with_acknowledged_sends(group) -> History:
    """A topic on ``group`` and 400 keyed sends, every one acknowledged."""
    history = History()
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    assert send_all(group.addresses, TOPIC, KEYS, history, 400) == []
    return history


def _elected_and_complete(group, history: History) -> tuple[int, Verdict]:
    """Once ``group`` elected a master again: its epoch, and the strict checker's verdict on the
    log after 200 more sends (all acknowledged)."""
    elected = group.wait_for_master(timeout=120)
    assert send_all(group.addresses, TOPIC, KEYS_AFTER, history, 200) == []
    with BrokerConnection(group.addresses) as conn:
        return group.health(elected).group_epoch, check(history.sends, stored_deliveries(conn, TOPIC))


def _roles_during(group, seconds: float) -> list[list[str]]:
    """Every broker's role, asked in turn every 0.1 s for ``seconds``."""
    asked, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        asked.append([health.role if health else "down" for health in map(group.health, group.brokers)])
        time.sleep(0.1)
    return asked


def test_a_zookeeper_that_lost_its_data_is_given_no_role_and_nothing_is_deleted(broker_group, zookeeper, tmp_path,
                                                                                fault_report):
    group = broker_group(3)
    history = _with_acknowledged_sends(group)
    master = group.wait_for_master()

    data, saved = zookeeper.directory / "data", tmp_path / "zookeeper-data-saved"
    zookeeper.stop()
    shutil.move(data, saved)
    zookeeper.start()  # an empty tree, as after losing its data dir
    master.kill9()
    master.start()  # let in with a new session, it finds no state of its group
    assert wait_until(lambda: _refusals(master), timeout=60), group.log_tails()
    roles_while_lost = _roles_during(group, 3.0)
    created = _group_nodes(zookeeper.connect_string, "group-a")
    assert not any(roles[group.brokers.index(master)] == "MASTER" for roles in roles_while_lost), roles_while_lost
    assert "state" not in created and "master" not in created, created

    zookeeper.stop()
    shutil.rmtree(data)
    shutil.move(saved, data)
    zookeeper.start()  # its data back: the group elects again
    epoch_after, log = _elected_and_complete(group, history)
    fault_report("cluster: ZooKeeper lost its data, then had it back", {"log": log},
                 roles_while_lost=sorted({tuple(roles) for roles in roles_while_lost}),
                 created_while_lost=sorted(created),
                 epoch_after=epoch_after)
    assert log.ok, str(log)


def test_brokers_led_to_another_zookeeper_take_no_role_there_and_leave_its_group_alone(broker_group, zookeeper,
                                                                                       tcp_proxy, tmp_path,
                                                                                       fault_report):
    proxy = tcp_proxy(zookeeper.connect_string)
    group = broker_group(3, settings_of={i: {"zookeeper": proxy.address} for i in range(3)})
    history = _with_acknowledged_sends(group)

    with ZooKeeperServer(tmp_path / "other-zookeeper") as other_zookeeper:
        other = BrokerGroup(tmp_path / "other", other_zookeeper.connect_string, 2).start()
        try:
            with Admin(other.addresses) as admin:
                admin.create_topic("payments", 2)  # its registry routes no "orders"
            other_master = other.wait_for_master()
            other.wait_in_sync_set(other.brokers[1])  # its state changes no more
            _raise_zxid(other_zookeeper.connect_string, _last_zxid(zookeeper.connect_string) + 1000)
            before = _group_nodes(other_zookeeper.connect_string, "group-a")
            proxy.forward_to(other_zookeeper.connect_string)
            proxy.cut()
            proxy.heal()
            assert wait_until(lambda: all(_refusals(b, OTHERS) for b in group.brokers), timeout=60), group.log_tails()
            roles_while_led_away = _roles_during(group, 3.0)
            after = _group_nodes(other_zookeeper.connect_string, "group-a")
            other_epoch = other.health(other.wait_for_master()).group_epoch
            assert other.master() is other_master and other_epoch == 1, other.log_tails()
        finally:
            other.kill_all()
    assert after == before, f"the other group's nodes changed: {before} -> {after}"
    assert not any("MASTER" in roles for roles in roles_while_led_away), roles_while_led_away

    # Its clients saw the other ensemble's later transactions, which its own refuses: restarted,
    # as after correcting a connect string, the brokers find their group again.
    proxy.forward_to(zookeeper.connect_string)
    proxy.cut()
    proxy.heal()
    for broker in group.brokers:
        broker.kill9()
        broker.start()
    epoch_after, log = _elected_and_complete(group, history)
    fault_report("cluster: brokers led to another ZooKeeper with a group of the same name", {"log": log},
                 roles_while_led_away=sorted({tuple(roles) for roles in roles_while_led_away}),
                 other_group_state=before["state"].decode(), epoch_after=epoch_after)
    assert log.ok, str(log)
