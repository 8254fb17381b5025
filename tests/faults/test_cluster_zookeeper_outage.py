"""Cluster scenario 4: ZooKeeper restarted, then stopped for longer than a session and
restarted, under sync-replicated keyed producers and an orderly consumer group; and the case a
master cannot tell from it, the master alone cut off from ZooKeeper.

A group of three (``min_sync_replicas = 2``). While ZooKeeper is down the master serves on: its
slaves keep fetching, and their promises not to campaign (docs/cluster.md, "ZooKeeper outages")
prove no other master can exist. A standalone ZooKeeper restarted with its data dir keeps the
sessions, so no master changes at all, however long it was down. Judged by the strict checker
(the log and the consumption) and by the roles and epochs the brokers reported, asked in turn
throughout (each answer timed): never one epoch's master seen serving after a later one's, never
two brokers master of one epoch.
Reported per outage: sends acknowledged while ZooKeeper was down, the longest stop of
acknowledgements around the outage, the epochs seen.

When the master alone is cut off (a TCP proxy on its ZooKeeper link), its session expires and a
slave is elected; the slaves stop fetching before they campaign, so the old master's promises
run out first and it stops serving (``HOLDING``) before the new one starts. Healed, it learns its
session was lost, steps down and follows. Same checks: no round with two masters, one master per
epoch, nothing acknowledged lost.
"""

from __future__ import annotations

import time

from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.cluster_group import RoleWatch
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import (
    KeyedProducer,
    ack_stall,
    drain,
    keyed_producers,
    shutdown_all,
    start_orderly_group,
    stored_deliveries,
)
from tests.support import wait_until

TOPIC, GROUP, QUEUES = "orders", "order-service", 4
# A restarted ZooKeeper gives each session a fresh timeout when it starts, but refuses clients for a
# moment while it starts: on a loaded machine that moment can outlast the 2 s sessions of the other
# scenarios, so the restarts run with sessions of a realistic length.
RESTART_SESSION_MS = 6_000
# (name, seconds ZooKeeper stays down): a quick restart, then a stop past the session timeout
OUTAGES = [("restart", 0.0),
           ("stopped past the session", 2 * RESTART_SESSION_MS / 1000 if PROFILE.name == "short" else 60.0)]
LATE_ACKS = 20  # acknowledged after an outage's planned length, before ZooKeeper comes back


def _acked(producers: list[KeyedProducer], start: float, end: float) -> int:
    """Sends acknowledged between ``start`` and ``end`` (wall clock)."""
    return sum(1 for p in producers for t in list(p.ack_times) if start <= t <= end)


def _traffic(group, history: History) -> tuple[list, list[KeyedProducer]]:
    """An orderly group and keyed producers on a new topic of ``group`` (producers not started)."""
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    consumers = start_orderly_group(group.addresses, TOPIC, GROUP, PROFILE.consumers, history)
    producers = keyed_producers(group.addresses, TOPIC, history)
    return consumers, producers


def _judge(group, history: History, watch: RoleWatch) -> tuple:
    """The log's and the consumption's verdicts, and each epoch's masters as seen."""
    with BrokerConnection(group.addresses) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    return log, history.check(), {e: sorted(b) for e, b in watch.masters_by_epoch().items()}


def _assert_no_split_brain_and_nothing_lost(watch: RoleWatch, masters: dict, log, consumed, caught_up: bool) -> None:
    overlaps = watch.overlapping_epochs()
    assert not overlaps, f"masters of two epochs served at once: {overlaps}; " + "; ".join(
        f"epoch {e}: certainly serving from {first:.3f} until {last:.3f}" for e, first, last in
        ((e, *watch.serving(e)) for pair in overlaps for e in pair))
    assert all(len(brokers) == 1 for brokers in masters.values()), f"an epoch had two masters: {masters}"
    assert log.ok, str(log)
    assert caught_up and consumed.lost == 0, str(consumed)
    assert consumed.out_of_order == 0 and consumed.unexpected == 0, str(consumed)


def test_zookeeper_restarts_change_no_master_and_the_data_path_goes_on(broker_group, zookeeper, fault_report):
    group = broker_group(3, zk_session_timeout_ms=RESTART_SESSION_MS)
    history = History()
    consumers, producers = _traffic(group, history)
    watch = RoleWatch(group)
    figures: dict = {}
    try:
        for producer in producers:
            producer.start()
        watch.start()
        for name, down_s in OUTAGES:
            time.sleep(PROFILE.cycle_seconds)
            master = group.wait_for_master()
            epoch = group.health(master).group_epoch
            stopped = time.time()
            zookeeper.stop()
            time.sleep(down_s)
            late = time.time()  # past a session timeout in the stop, past the route caches in the long form
            with Admin(group.addresses, timeout=5.0) as admin:  # a route refresh, answered without ZooKeeper
                described = admin.describe_topic(TOPIC).queue_count
            # ZooKeeper stays down until sends are acknowledged this late in the outage (however slow
            # the machine): a data path that stopped without it never gets them.
            acked_late = wait_until(lambda since=late: _acked(producers, since, time.time()) >= LATE_ACKS, timeout=60)
            zookeeper.start()  # same data dir and port; the fixture stops it at the end
            back = time.time()
            time.sleep(RESTART_SESSION_MS / 1000)  # sessions resumed, or expired and a new election ran
            figures[name] = dict(down_s=round(back - stopped, 1), acked_while_down=_acked(producers, stopped, back),
                                 queues_described_while_down=described,
                                 acked_late_in_the_outage=_acked(producers, late, back) if acked_late else 0,
                                 longest_ack_stall_s=round(ack_stall(producers, stopped - 1, time.time()), 2),
                                 epoch_before=epoch, epoch_after=group.health(group.wait_for_master()).group_epoch)
        time.sleep(PROFILE.cycle_seconds)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        watch.finish()
        shutdown_all(consumers)
    log, consumed, masters = _judge(group, history, watch)
    fault_report("cluster: ZooKeeper restarted and stopped past a session under load", {"log": log, "consumed": consumed},
                 **{f"{name}: {k}": v for name, f in figures.items() for k, v in f.items()},
                 masters_by_epoch=masters, role_answers=len(watch.answers),
                 send_failures=sum(len(p.failures) for p in producers))
    _assert_no_split_brain_and_nothing_lost(watch, masters, log, consumed, caught_up)
    for name, f in figures.items():
        assert f["queues_described_while_down"] == QUEUES, f
        assert f["acked_late_in_the_outage"] >= LATE_ACKS, (
            f"sends stopped being acknowledged while ZooKeeper was down ({name}): {f}")
        assert f["epoch_after"] == f["epoch_before"], f"the master changed although sessions survive ({name}): {f}"


def test_master_cut_off_from_zookeeper_stops_serving_before_another_is_elected(broker_group, zookeeper, tcp_proxy,
                                                                               fault_report):
    proxy = tcp_proxy(zookeeper.connect_string)
    group = broker_group(3, settings_of={0: {"zookeeper": proxy.address}})
    old = group.brokers[0]
    history = History()
    consumers, producers = _traffic(group, history)
    watch = RoleWatch(group)
    try:
        for producer in producers:
            producer.start()
        watch.start()
        time.sleep(PROFILE.cycle_seconds)
        assert group.wait_for_master() is old
        cut = time.time()
        proxy.cut()
        new = group.wait_for_master(exclude=old)
        elected = time.time()
        new_epoch = group.health(new).group_epoch
        time.sleep(PROFILE.cycle_seconds)
        proxy.heal()
        healed = time.monotonic()
        fenced = group.wait_for_role(old, "SLAVE")
        rejoined_s = time.monotonic() - healed
        acked_after_cut = _acked(producers, cut, elected)
        stall = ack_stall(producers, cut - 1, elected + PROFILE.cycle_seconds)
        time.sleep(PROFILE.cycle_seconds)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        watch.finish()
        shutdown_all(consumers)
    log, consumed, masters = _judge(group, history, watch)  # topic calls read ZooKeeper: through the proxy
    old_last_master = watch.serving(1)[1]
    new_first_master = watch.serving(new_epoch)[0]
    fault_report("cluster: master cut off from ZooKeeper alone", {"log": log, "consumed": consumed},
                 election_after_cut_s=round(elected - cut, 2), acked_before_election=acked_after_cut,
                 old_master_last_seen_serving_s=round(old_last_master - cut, 2),
                 new_master_first_seen_s=round(new_first_master - cut, 2), longest_ack_stall_s=round(stall, 2),
                 old_master_rejoined_as_slave_s=round(rejoined_s, 2), masters_by_epoch=masters,
                 send_failures=sum(len(p.failures) for p in producers))
    _assert_no_split_brain_and_nothing_lost(watch, masters, log, consumed, caught_up)
    assert fenced.group_epoch == new_epoch and masters[1] == [0] and masters[new_epoch] == [group.brokers.index(new)], masters
