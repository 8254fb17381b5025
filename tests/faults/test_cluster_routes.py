"""Cluster scenarios: one topic's queues spread over three broker groups of two brokers each (real
ZooKeeper, real broker processes), used by route-aware clients bootstrapped from any broker.

Each run is judged by the strict checker twice: the *log* (everything stored at the end, read
queue by queue from the group holding it, against every send: nothing acknowledged missing,
nothing twice, every key in order) and the *consumption* (what the orderly group's listeners
were handed: nothing acknowledged missed, every key in order; redeliveries counted).
"""

from __future__ import annotations

import time

import grpc
import pytest
from kazoo.client import KazooClient

from broker.cluster.topics import TopicLayout, TopicRegistry
from broker.launcher import free_port
from broker.persist import read_json
from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.wire import codec
from broker.wire.errors import InvalidRequestError, TopicNotFoundError, WrongGroupError
from connector.cli import main
from connector.client import Admin, ConcurrentConsumer, ConsumeConcurrentlyStatus, Producer, PullConsumer
from connector.client.connection import BrokerConnection
from connector.client.routed import RoutedConnection
from connector.client.routes import TopicRoute
from connector.history import Delivery, History, check
from connector.spark.options import SinkOptions
from connector.spark.writer import _Sender
from tests.faults.brokers import broker_process
from tests.faults.cluster_group import CLUSTER_BROKER
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import (
    FAST_CONSUMER,
    KeyedProducer,
    body,
    drain,
    keyed_producers,
    parse_body,
    shutdown_all,
    start_orderly_group,
    stored_deliveries,
)
from tests.support import port_calls, wait_until

TOPIC, GROUP, QUEUES = "orders", "order-service", 6
GROUP_NAMES = ["broker-a", "broker-b", "broker-c"]
SECONDS = 6 if PROFILE.name == "short" else 60
KILLS = 1 if PROFILE.name == "short" else 6


def _bootstrap(groups) -> str:
    return ",".join(g.addresses for g in groups)


def _describe(address: str, topic: str) -> pb.TopicRoute:
    with grpc.insecure_channel(address) as channel:
        return pb_grpc.OrderlyMQStub(channel).DescribeTopic(pb.DescribeTopicRequest(topic=topic), timeout=10)


def _spread(route: pb.TopicRoute) -> dict[str, list[int]]:
    return {g.broker_name: list(g.queue_ids) for g in route.groups}


def _run_traffic(groups, history: History, during=None) -> tuple[list[KeyedProducer], bool]:
    """Keyed producers and an orderly group for ``SECONDS`` (``during()`` runs midway); True when
    the group was handed every acknowledged send by the end."""
    bootstrap = _bootstrap(groups)
    consumers = start_orderly_group(bootstrap, TOPIC, GROUP, 2, history)
    producers = keyed_producers(bootstrap, TOPIC, history)
    try:
        for producer in producers:
            producer.start()
        time.sleep(SECONDS / 2)
        if during is not None:
            during()
        time.sleep(SECONDS / 2)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        shutdown_all(consumers)
    return producers, bool(caught_up)


def _judge(groups, history: History, producers, caught_up: bool, fault_report, scenario: str, **figures) -> None:
    with RoutedConnection(_bootstrap(groups)) as conn:
        stored = stored_deliveries(conn, TOPIC)
    log = check(history.sends, stored)
    consumed = history.check()
    per_group = {name: sum(1 for d in stored if d.queue_id in queues)
                 for name, queues in _spread(_describe(groups[0].brokers[0].address, TOPIC)).items()}
    fault_report(scenario, {"log": log, "consumed": consumed}, stored_per_group=per_group,
                 send_failures=sum(len(p.failures) for p in producers), **figures)
    assert all(per_group[name] > 0 for name in GROUP_NAMES), f"every group must have served sends: {per_group}"
    assert log.ok, str(log)
    assert caught_up and consumed.lost == 0, str(consumed)
    assert consumed.out_of_order == 0 and consumed.unexpected == 0, str(consumed)


def test_topic_spread_over_three_groups_keeps_every_key_in_order(broker_cluster, fault_report, capsys):
    groups = broker_cluster(3, 2)
    slave = next(b for b in groups[1].brokers if b is not groups[1].master())
    with Admin(slave.address) as admin:  # any broker creates topics, a slave too
        info = admin.create_topic(TOPIC, QUEUES)
    assert info.queue_count == QUEUES
    # Every broker of every group answers the same route: queue ids spread round-robin over the groups.
    routes = [_describe(b.address, TOPIC) for g in groups for b in g.brokers]
    assert all(r == routes[0] for r in routes), routes
    spread = _spread(routes[0])
    assert sorted(spread) == GROUP_NAMES and sorted(q for qs in spread.values() for q in qs) == list(range(QUEUES))
    assert all(len(qs) == QUEUES // 3 for qs in spread.values()), spread
    masters = {g.brokers[0].address for g in groups}
    assert {r.master_address for r in routes[0].groups} == masters

    # The command line, bootstrapped from one broker: the route per queue, and every broker of every group.
    capsys.readouterr()
    assert main(["--brokers", groups[2].brokers[1].address, "topic", "describe", TOPIC]) == 0
    described = capsys.readouterr().out
    assert all(name in described for name in GROUP_NAMES) and all(m in described for m in masters), described
    assert main(["--brokers", groups[2].brokers[1].address, "cluster", "status"]) == 0
    status = capsys.readouterr().out
    assert all(b.address in status for g in groups for b in g.brokers), status
    assert all(f"group {name}: master 0" in status for name in GROUP_NAMES), status

    history = History()
    producers, caught_up = _run_traffic(groups, history)
    _judge(groups, history, producers, caught_up, fault_report, "cluster: one topic over 3 groups x 2 brokers")


def test_master_killed_in_one_group_while_the_others_keep_serving(broker_cluster, fault_report):
    """The orderly group's consumers pull over each master's lean port, and after a failover over
    the new master's."""
    metrics = _metrics_ports(3, 2)
    groups = broker_cluster(3, 2, settings_of_groups=metrics)
    with Admin(groups[0].addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    elections, epochs = [], []

    def kill_masters() -> None:
        """The master of broker-b (then, in the long form, of each group in turn) killed -9."""
        for i in range(KILLS):
            group = groups[(1 + i) % len(groups)]
            master = group.wait_for_master()
            master.kill9()
            killed = time.monotonic()
            promoted = group.wait_for_master(exclude=master)
            elections.append(round(time.monotonic() - killed, 2))
            epochs.append(group.health(promoted).group_epoch)
            master.start()  # back as a slave of the new master
            if i + 1 < KILLS:
                time.sleep(SECONDS / KILLS)

    history = History()
    producers, caught_up = _run_traffic(groups, history, during=kill_masters)
    assert all(epoch >= 2 for epoch in epochs), epochs
    pulled_on_port = _pulls_on_masters_ports(groups, metrics)
    _judge(groups, history, producers, caught_up, fault_report,
           f"cluster: 3 groups, {KILLS} master(s) killed -9 mid-run", election_s=elections,
           pulls_on_masters_ports=pulled_on_port)
    assert all(pulled_on_port.values()), f"every master, new ones too, answers pulls on its port: {pulled_on_port}"


def test_bad_inputs_and_stale_routes_get_clear_answers(broker_cluster):
    groups = broker_cluster(3, 2)
    brokers = [b for g in groups for b in g.brokers]
    for broker in brokers:  # an unknown topic, from any broker, master or slave
        with pytest.raises(grpc.RpcError) as failed:
            _describe(broker.address, "no-such-topic")
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND and "create it first" in failed.value.details()
    with Admin(brokers[-1].address) as admin:
        with pytest.raises(TopicNotFoundError):
            admin.describe_topic("no-such-topic")
        admin.create_topic(TOPIC, 3)
        with pytest.raises(TopicNotFoundError):  # a name no topic can have reads no other node
            admin.describe_topic(f"{TOPIC}/ready/broker-a")
        with pytest.raises(InvalidRequestError, match="invalid topic name"):
            admin.grow_topic(f"{TOPIC}/ready", 4)
        with pytest.raises(InvalidRequestError, match="queue count must be between"):
            admin.create_topic("too-many", 100_000)
        spread = _spread(_describe(brokers[0].address, TOPIC))
        # A queue asked of a group that does not hold it: refused, naming the group that does.
        holder_of_a = spread["broker-a"][0]
        with BrokerConnection(groups[1].brokers[0].address) as conn:
            with pytest.raises(WrongGroupError, match="held by broker group broker-a"):
                conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=holder_of_a))
        # Grown: new queue ids are appended, spread over the groups too; the old ones stay where they were.
        grown = admin.grow_topic(TOPIC, 6)
        assert grown.queue_count == 6
        after = _spread(_describe(brokers[3].address, TOPIC))
        assert all(set(spread[g]) <= set(after[g]) for g in spread) and all(len(after[g]) == 2 for g in after)

        # A client whose route is stale (as after the topic was made again while a group was down)
        # is told so by the group it asked, reads the route again and gets its answer.
        with Producer(brokers[0].address) as producer:
            truth = producer.routes.route(TOPIC)
            wrong = TopicRoute(TOPIC, tuple(q.__class__(q.topic, q.queue_id, "broker-c" if q.broker_name != "broker-c"
                                                        else "broker-a") for q in truth.queues), truth.groups)
            producer.routes._routes[TOPIC] = (time.monotonic(), wrong)  # noqa: SLF001 - the stale route
            for i in range(12):
                producer.send(TOPIC, body(f"k{i}", 0), key=f"k{i}")
            assert [q.broker_name for q in producer.routes.route(TOPIC).queues] == \
                [q.broker_name for q in truth.queues]
        assert sum(q.count for q in admin.topic_status(TOPIC)) == 12
        # So does the Spark sink's task, whose sends go over each master's lean port.
        with RoutedConnection(brokers[0].address) as conn:
            conn.routes.route(TOPIC)
            conn.routes._routes[TOPIC] = (time.monotonic(), wrong)  # noqa: SLF001 - the stale route
            options = SinkOptions.from_options({"brokers": brokers[0].address, "topic": TOPIC, "shardingKey": "key"})
            sender = _Sender(conn, options, producer_id="sink-task")
            for queue_id in range(6):
                table = codec.messages_to_batch([{"key": f"s{queue_id}", "body": body(f"s{queue_id}", 0)}])
                sender.send(TOPIC, queue_id, table, table.nbytes)
        assert sum(q.count for q in admin.topic_status(TOPIC)) == 18

        # A transaction stages sends on several groups; committed, each group makes its part visible.
        txn_history = History()
        with Producer(brokers[2].address) as producer, producer.transaction() as tx:
            for i in range(12):
                key = f"t{i % 4}"
                tx.send(TOPIC, body(key, i // 4), key=key)
                txn_history.sent(key, i // 4, acked=True)
        with RoutedConnection(brokers[0].address) as conn:
            stored = [d for d in stored_deliveries(conn, TOPIC) if d.key.startswith("t")]
        assert len({d.queue_id for d in stored}) > 1, "the transaction's keys should span several queues"
        txn_log = check(txn_history.sends, stored)
        assert txn_log.ok, str(txn_log)

        # Deleted: gone from every broker of every group.
        admin.delete_topic(TOPIC)
    for broker in brokers:
        with pytest.raises(grpc.RpcError) as failed:
            _describe(broker.address, TOPIC)
        assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    with BrokerConnection(groups[0].brokers[0].address) as conn:
        wait_until(lambda: _gone(conn, spread["broker-a"][0]), timeout=10)
        with pytest.raises(TopicNotFoundError):
            conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=spread["broker-a"][0]))


def _gone(conn: BrokerConnection, queue_id: int) -> bool:
    try:
        conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=queue_id))
    except TopicNotFoundError:
        return True
    return False


def test_a_single_broker_joins_a_cluster_with_its_topics(tmp_path, zookeeper):
    """A broker's topics from before it joined a cluster are registered as its group's, messages kept."""
    data = tmp_path / "broker"
    history = History()
    with broker_process(data) as single, Admin(single.address) as admin, Producer(single.address) as producer:
        admin.create_topic("legacy", 2)
        for i in range(20):
            producer.send("legacy", body(f"k{i % 5}", i // 5), key=f"k{i % 5}")
            history.sent(f"k{i % 5}", i // 5, acked=True)
    joined = broker_process(data, zookeeper=zookeeper.connect_string, broker_name="broker-a", broker_id=0,
                            **(CLUSTER_BROKER | {"min_sync_replicas": 1})).start()
    try:
        route = wait_until(lambda: _route_or_none(joined.address, "legacy"), timeout=30)
        assert _spread(route) == {"broker-a": [0, 1]}
        with RoutedConnection(joined.address) as conn:
            log = check(history.sends, stored_deliveries(conn, "legacy"))
        assert log.ok and log.lost == 0, str(log)
    finally:
        joined.kill9()


def _route_or_none(address: str, topic: str) -> pb.TopicRoute | None:
    try:
        return _describe(address, topic)
    except grpc.RpcError:
        return None


def test_pull_and_concurrent_consumers_across_groups(broker_cluster):
    """Three groups of one broker: a pull consumer (locks, commits) and a concurrent consumer
    group (a retry topic of its own, placed by the cluster) read every group."""
    metrics = _metrics_ports(3, 1)
    groups = broker_cluster(3, 1, settings_of_groups=metrics, min_sync_replicas=1)
    bootstrap = groups[2].addresses
    history = History()
    with Admin(bootstrap) as admin, Producer(bootstrap) as producer:
        admin.create_topic(TOPIC, QUEUES)
        for i in range(120):
            key = f"k{i % 12}"
            producer.send(TOPIC, body(key, i // 12), key=key)
            history.sent(key, i // 12, acked=True)

        with PullConsumer(bootstrap, group="puller") as puller:
            puller.assign(TOPIC, start="earliest")
            epochs = {q: puller.lock(TOPIC, q) for q in range(QUEUES)}  # each on its group's master
            pulled = []
            while batch := puller.poll(50):
                pulled += [_delivery(m) for m in batch]
            puller.commit()
            holders = admin.lock_holders("puller", TOPIC)
        assert check(history.sends, pulled).ok, str(check(history.sends, pulled))
        assert sorted(h.queue_id for h in holders) == list(range(QUEUES)) and all(e > 0 for e in epochs.values())
        assert all(p.lag == 0 for p in admin.consumer_progress("puller", TOPIC))
        by_puller = _pulls_on_masters_ports(groups, metrics)
        assert all(by_puller.values()), f"the pull consumer pulls over every group's port: {by_puller}"

        seen: set[tuple[str, int]] = set()
        retried: set[tuple[str, int]] = set()

        def listener(messages, context):
            for m in messages:
                ident = parse_body(m.body)
                if ident[1] == 3 and ident not in retried:
                    retried.add(ident)
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER  # through the group's retry topic
                seen.add(ident)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = ConcurrentConsumer(bootstrap, "concurrent", listener, client_id="c0", retry_delay_ms=50,
                                      **{k: v for k, v in FAST_CONSUMER.items() if not k.startswith(("lock", "unlock",
                                                                                                      "suspend"))})
        consumer.subscribe(TOPIC)
        consumer.start()
        try:
            assert wait_until(lambda: len(seen) == 120, timeout=60), f"{len(seen)} of 120 consumed"
        finally:
            consumer.shutdown()
        assert seen == {(f"k{i % 12}", i // 12) for i in range(120)} and len(retried) == 12
        on_port = _pulls_on_masters_ports(groups, metrics)
        assert all(on_port[name] > by_puller[name] for name in on_port), \
            f"the concurrent consumer pulls over every group's port: {by_puller} -> {on_port}"


def _metrics_ports(groups: int, size: int) -> list[dict[int, dict]]:
    """``settings_of_groups`` giving every broker a metrics port."""
    return [{broker_id: {"metrics_port": free_port()} for broker_id in range(size)} for _ in range(groups)]


def _pulls_on_masters_ports(groups, metrics: list[dict[int, dict]]) -> dict[str, float]:
    """The pulls each group's master now answered on its lean port."""
    return {group.name: port_calls(settings_of[group.brokers.index(group.wait_for_master())]["metrics_port"],
                                   "PullPort")
            for group, settings_of in zip(groups, metrics, strict=True)}


def _delivery(message) -> Delivery:
    key, seq = parse_body(message.body)
    return Delivery(key, seq, consumer="puller", queue_id=message.queue_id, offset=message.queue_offset)


def test_a_group_down_at_creation_holds_no_queue_of_that_topic(broker_cluster):
    """Topics are spread over the groups with a master at creation; one back later gets the next topics."""
    groups = broker_cluster(3, 1, min_sync_replicas=1)
    down = groups[2]
    down.kill_all()
    with Admin(groups[0].addresses) as admin:
        assert wait_until(lambda: sorted(g.broker_name for g in admin.cluster_groups()) == GROUP_NAMES[:2])
        info = admin.create_topic("while-down", 4)
        assert {g.broker_name for g in info.groups} == {"broker-a", "broker-b"}
        history = History()
        with Producer(groups[1].addresses) as producer:
            for i in range(40):
                producer.send("while-down", body(f"k{i % 8}", i // 8), key=f"k{i % 8}")
                history.sent(f"k{i % 8}", i // 8, acked=True)
        with RoutedConnection(groups[0].addresses) as conn:
            log = check(history.sends, stored_deliveries(conn, "while-down"))
        assert log.ok, str(log)
        down.brokers[0].start()
        down.wait_for_master()
        assert {g.broker_name for g in admin.create_topic("after", 6).groups} == set(GROUP_NAMES)
        assert {g.broker_name for g in admin.describe_topic("while-down").groups} == {"broker-a", "broker-b"}


def test_a_topic_read_cut_off_from_zookeeper_is_unavailable_not_internal(broker_group, zookeeper):
    """ZooKeeper stops answering in the middle of a route read: the broker answers UNAVAILABLE,
    which clients retry, not an internal error (kazoo's ConnectionLoss passed on)."""
    import os
    import signal

    from broker.wire.errors import BrokerUnavailableError

    group = broker_group(size=1, min_sync_replicas=1)
    conn = BrokerConnection(group.addresses, retry_timeout=5)
    os.kill(zookeeper.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(BrokerUnavailableError, match="cannot reach ZooKeeper"):
            conn.call("DescribeTopic", pb.DescribeTopicRequest(topic="never-read"), retry=False)
    finally:
        os.kill(zookeeper.proc.pid, signal.SIGCONT)
    conn.close()


class _CountingRegistry(TopicRegistry):
    """A broker's registry that counts the topic nodes it reads."""

    reads = 0

    def layout(self, topic: str) -> TopicLayout | None:
        self.reads += 1
        return super().layout(topic)


def test_topic_changes_cost_a_read_of_the_topic_changed_and_reach_a_promoted_slave(broker_group, zookeeper):
    """A broker reads a change of one topic from ZooKeeper alone, also among many topics; a
    topic created without announcement (its broker crashed first) is found by the next change,
    a grow left unannounced is announced by its retry, and a change by a broker of an earlier
    version (no name) has everything read. The slave, whose master sends the topic table only
    when it changed, holds every topic and queue: promoted, it serves every message, each key's
    complete and in order."""
    group = broker_group(size=2)
    zk = KazooClient(hosts=zookeeper.connect_string)
    zk.start(timeout=30)
    observer = _CountingRegistry(zk, "orderlymq")
    history = History()
    try:
        with Admin(group.addresses) as admin, Producer(group.addresses) as producer:
            for i in range(40):
                admin.create_topic(f"t{i}", 2)
            assert len(observer.current()) == 40 and observer.reads == 40  # the first call reads them all
            admin.create_topic("t40", 3)
            assert observer.current()["t40"].queue_count == 3 and observer.reads == 41

            # Created, never announced; the next change of another topic finds it.
            unannounced = TopicLayout("feed", ("group-a",) * 2)
            zk.create(f"{observer.root}/quiet", unannounced.encoded())
            admin.grow_topic("t0", 4)
            assert observer.current()["quiet"] == unannounced and observer.current()["t0"].queue_count == 4
            assert wait_until(lambda: _describe(group.addresses.split(",")[0], "quiet").queue_count == 2)

            # Grown, never announced: the retry of the grow announces it and waits for the queues.
            zk.set(f"{observer.root}/t1", TopicLayout(observer.current()["t1"].id, ("group-a",) * 5).encoded())
            assert admin.grow_topic("t1", 5).queue_count == 5
            assert observer.current()["t1"].queue_count == 5

            reads = observer.reads
            zk.set(observer.root, b"")  # a broker of an earlier version changed something
            assert len(observer.current()) == 42 and observer.reads == reads + 42

            # The slave's table follows with no record to carry it (a stream broken by records of
            # a topic the slave lacks would hide a table never sent).
            table = {**{f"t{i}": 2 for i in range(41)}, "t0": 4, "t1": 5, "t40": 3, "quiet": 2}
            slave = next(b for b in group.brokers if b is not group.master())
            assert wait_until(lambda: read_json(slave.data_dir / "topics.json", {}) == table, timeout=30)

            topics = {"t0": 4, "t1": 5, "t40": 3, "quiet": 2}
            for topic, count in topics.items():
                for seq in range(3):
                    for key in range(count * 2):
                        producer.send(topic, body(f"{topic}-k{key}", seq), key=f"{topic}-k{key}")
                        history.sent(f"{topic}-k{key}", seq, acked=True)
        old_master = group.master()
        old_master.kill9()
        group.wait_for_master(exclude=old_master)
        with RoutedConnection(group.addresses) as conn:
            stored = [d for topic in topics for d in stored_deliveries(conn, topic)]
            assert sorted(t.topic for t in conn.call("ListTopics", pb.ListTopicsRequest()).topics) == \
                sorted(["quiet", *(f"t{i}" for i in range(41))])
        log = check(history.sends, stored)
        assert log.ok, str(log)
        assert len(stored) == sum(count * 2 * 3 for count in topics.values())
    finally:
        zk.stop()
