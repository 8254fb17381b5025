"""Cluster scenario (a): with ``replication = "sync"``, every acknowledged send is on the slave.

A group of a master and a slave; keyed producers send through the group's addresses (the client
finds the master); the master is then killed, the slave takes over, and its store is read back
and judged against every send by the strict checker: nothing acknowledged missing, nothing
twice, every key in order. A queue lock granted by the new master carries a greater fencing epoch
than the old master's, whose holder is refused.

Replication goes over the master's lean port (``broker.replica_port``), or over gRPC where it
serves none; the scenario runs both ways.

And a slave whose replication stream goes silent (half-open: no close, no reset), over gRPC or
the lean port, drops it and dials again, catching up with what was sent meanwhile.
"""

from __future__ import annotations

import time

import grpc
import pytest

from broker.cluster.fetches import LeanFetches
from broker.launcher import free_port
from broker.wire import codec
from broker.wire.errors import FencedError, NotMasterError
from broker.wire.frames import LENGTH
from broker.wire.one_message import encode_one
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection, pb
from connector.client.pull_port import open_pull_link
from connector.history import Delivery, History, check
from connector.spark.options import SourceOptions
from connector.spark.partitions import QueuePartition, read_partition
from connector.spark.schema import arrow_schema, source_schema
from tests.broker.test_busy_loop import polled_between_synchronous_sends
from tests.faults.cluster_group import CLUSTER_BROKER, group_behind
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import body, keyed_producers, parse_body, send_all, stored_deliveries
from tests.support import port_calls, wait_until

TOPIC, GROUP, QUEUES = "orders", "order-service", 4


def _lock(conn: BrokerConnection, client_id: str) -> int:
    """Lock queue 0 for ``client_id``; its fencing epoch."""
    answer = conn.call("LockBatch", pb.LockBatchRequest(group=GROUP, client_id=client_id, topic=TOPIC, queue_ids=[0]))
    return answer.locked[0].epoch


@pytest.mark.parametrize("path", ["lean port", "gRPC"])
def test_sync_replication_puts_every_acknowledged_send_on_the_slave(broker_group, fault_report, path):
    """Over the master's lean port (``broker.replica_port``), and over gRPC where it serves none."""
    metrics = [free_port(), free_port()]
    lean = {} if path == "lean port" else {"send_port": -1}
    group = broker_group(2, settings_of={i: {"metrics_port": port, **lean} for i, port in enumerate(metrics)})
    master = group.wait_for_master()
    master_metrics = metrics[group.brokers.index(master)]
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    per_producer = 10 * PROFILE.send_rate
    producers = keyed_producers(group.addresses, TOPIC, history, rate=10 * PROFILE.send_rate, limit=per_producer)
    started = time.monotonic()
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join()
    elapsed = time.monotonic() - started
    with BrokerConnection(group.addresses) as conn:
        old_epoch = _lock(conn, "consumer-before")
    fetches_on_port = port_calls(master_metrics, "ReplicaPort")

    master.kill9()
    killed = time.monotonic()
    promoted = group.wait_for_master(exclude=master)
    failover_s = time.monotonic() - killed
    with BrokerConnection(promoted.address) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
        new_epoch = _lock(conn, "consumer-after")
        with pytest.raises(FencedError):  # the holder of the old master's lock is fenced
            conn.call("CommitOffset", pb.CommitOffsetRequest(group=GROUP, topic=TOPIC, queue_id=0, offset=1,
                                                             client_id="consumer-before", epoch=old_epoch))
    acked = sum(1 for s in history.sends if s.acked)
    fault_report(f"cluster: sync replication over the {path}, read back from the promoted slave", {"log": log},
                 sent=len(history.sends), acked=acked, sync_sends_per_s=round(acked / elapsed),
                 failover_s=round(failover_s, 2), lock_epochs=f"{old_epoch}->{new_epoch}",
                 fetches_on_lean_port=fetches_on_port)
    assert (fetches_on_port > 0) if path == "lean port" else fetches_on_port == 0
    assert acked == len(history.sends), [f for p in producers for f in p.failures]
    assert log.ok and log.lost == 0, str(log)
    assert new_epoch > old_epoch, (old_epoch, new_epoch)


def test_a_fetch_on_a_slaves_lean_port_is_refused_as_not_master(broker_group):
    """A slave (a stale master's address) answers a fetch on its lean port with ``NotMasterError``,
    as its gRPC stream would: the fetcher releases its campaign promise on it (``ReplicaFetcher.run``)."""
    group = broker_group(2)
    master = group.wait_for_master()
    slave = next(b for b in group.brokers if b is not master)
    epoch = group.health(master).group_epoch
    with BrokerConnection(slave.address) as conn:
        port = conn.call("Health", pb.HealthRequest()).send_port
    fetches = LeanFetches(slave.address.rpartition(":")[0], port)
    try:
        with pytest.raises(NotMasterError, match="not master"):
            fetches.exchange(pb.ReplicaFetch(broker_id=9, group_epoch=epoch, handshake=True))
    finally:
        fetches.close()


@pytest.mark.parametrize("path", ["gRPC", "lean port"])
def test_a_slave_whose_stream_went_silent_dials_again_and_catches_up(broker_group, tcp_proxy, fault_report, path):
    """Over gRPC (the master serves no lean port), and over the master's lean port, which it
    serves behind a link of its own (``advertised_send_port``): that link is silenced."""
    link = tcp_proxy()  # the slave's way to broker 0, which advertises it
    lean_link = tcp_proxy() if path == "lean port" else None
    metrics = free_port()
    group = group_behind(link, broker_group, lean_link, {"metrics_port": metrics}, min_sync_replicas=1)
    master, slave = group.brokers
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    failures = send_all(group.addresses, TOPIC, ["a", "b", "c"], history, 15 * PROFILE.send_rate)

    def replica():
        return next(iter(group.health(master).replicas), None)

    assert wait_until(lambda: (r := replica()) is not None and r.in_sync_set and r.behind_messages == 0)
    assert (port_calls(metrics, "ReplicaPort") > 0) == (path == "lean port")
    (lean_link or link).silence()  # the open connections now: the slave's stream alone (the producers closed theirs)
    silenced = time.monotonic()
    failures += send_all(group.addresses, TOPIC, ["d", "e", "f"], history, 60)
    behind_at_end_of_sends = replica().behind_messages
    # back in the sync-state set (only its members may take over)
    caught_up = wait_until(lambda: (r := replica()).in_sync_set and r.behind_messages == 0, timeout=60)
    recovered_s = time.monotonic() - silenced
    assert caught_up, f"the slave never caught up after its stream went silent ({replica()})"
    if path == "lean port":  # the stream dialed again is on the port too: its idle fetches are answered there
        fetches = port_calls(metrics, "ReplicaPort")
        assert wait_until(lambda: port_calls(metrics, "ReplicaPort") >= fetches + 2, timeout=10)

    master.kill9()
    promoted = group.wait_for_master(exclude=master)
    assert promoted is slave
    with BrokerConnection(promoted.address) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    fault_report(f"cluster: slave's stream over the {path} silenced, redialed", {"log": log}, sent=len(history.sends),
                 behind_when_sends_ended=behind_at_end_of_sends, caught_up_after_s=round(recovered_s, 1))
    assert behind_at_end_of_sends > 0, "the silenced stream still carried records"
    assert not failures, failures
    assert log.ok and log.lost == 0, str(log)


def _read_by_spark_tasks(addresses: list[str], ends: list[int]) -> list[Delivery]:
    """Every queue read as a Spark source task reads it (``read_partition``), outside Spark."""
    options = SourceOptions.from_options({"brokers": ",".join(addresses), "topic": TOPIC}, streaming=False)
    out = []
    for queue_id, end in enumerate(ends):
        partition = QueuePartition(topic=TOPIC, broker="group-a", queue_id=queue_id, start=0, end=end,
                                   addresses=tuple(addresses))
        for batch in read_partition(options, partition, arrow_schema(source_schema())):
            for raw, offset in zip(batch.column("body").to_pylist(), batch.column("queue_offset").to_pylist(),
                                   strict=True):
                key, seq = parse_body(raw)
                out.append(Delivery(key, seq, consumer="task", queue_id=queue_id, offset=offset))
    return out


def test_a_masters_lean_port_answers_sync_sends_once_replicated_and_the_next_master_takes_them_on(
        broker_group, fault_report):
    """Synchronous sends go over the master's lean port, are answered once a slave has them
    (min_sync_replicas=2), and after a kill -9 of the master go on over the new master's port:
    read back from the new master, nothing acknowledged is missing, nothing is there twice, every
    key is in order. Spark source tasks given a slave first read it all from the master's port;
    the slave's port refuses pulls."""
    metrics = [free_port() for _ in range(3)]
    group = broker_group(3, settings_of={i: {"metrics_port": port} for i, port in enumerate(metrics)})
    master = group.wait_for_master()
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history, sent = History(), dict.fromkeys((f"k{k}" for k in range(6)), 0)
    with Producer(group.addresses) as producer:
        def send_rounds(rounds: int) -> None:
            for _ in range(rounds):
                for key, seq in sent.items():
                    producer.send(TOPIC, body(key, seq), key=key)
                    history.sent(key, seq, acked=True)
                    sent[key] = seq + 1

        send_rounds(50)
        on_first_port = port_calls(metrics[group.brokers.index(master)], "SendPort")
        master.kill9()
        promoted = group.wait_for_master(exclude=master)
        send_rounds(50)
        on_second_port = port_calls(metrics[group.brokers.index(promoted)], "SendPort")
    with BrokerConnection(promoted.address) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
        ends = [conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=q)).max_offset
                for q in range(QUEUES)]
    slave = next(b for b in group.brokers if b not in (master, promoted))
    # The Spark source's tasks, given the slave first, pull from the master's port.
    pulls_before = port_calls(metrics[group.brokers.index(promoted)], "PullPort")
    read = check(history.sends, _read_by_spark_tasks([slave.address, promoted.address], ends))
    pulled_on_port = port_calls(metrics[group.brokers.index(promoted)], "PullPort") - pulls_before
    with BrokerConnection(slave.address) as conn:  # as gRPC's gate does, a slave's port refuses pulls
        link = open_pull_link(conn)
        link.issue(pb.PullRequest(topic=TOPIC, queue_id=0, offset=0, max_messages=10))
        with pytest.raises(NotMasterError):
            link.receive()
        link.close()
    fault_report("cluster: sync sends over the lean port, master killed", {"log": log, "read by tasks": read},
                 on_first_masters_port=on_first_port, on_second_masters_port=on_second_port,
                 pulled_on_port=pulled_on_port)
    assert log.ok and log.deliveries == 600, str(log)
    assert read.ok and read.deliveries == 600, str(read)
    assert pulled_on_port >= QUEUES - 1, "the first read's link found a slave; the others the master's port"
    assert on_first_port == 300, "every send to the first master went over its port"
    assert on_second_port >= 250, "after the hand-over, the new master's port"


def _answers_over_port(address: str, port: int, frames: list[bytes]) -> list[pb.SendResponse]:
    """The answers to ``frames``, all written at once to the lean port."""
    from tests.broker.test_send_port import Raw

    raw = Raw(address, port)
    raw.sock.sendall(b"".join(LENGTH.pack(len(f)) + f for f in frames))
    answers = [raw.answer() for _ in frames]
    raw.close()
    return answers


def _answers_over_grpc(address: str, frames: list[bytes]) -> list[pb.SendResponse]:
    """The answers to ``frames`` on one ``SendStream`` call, its requests as they are (bytes)."""
    with grpc.insecure_channel(address) as channel:
        stream = channel.stream_stream("/orderlymq.v1.OrderlyMQ/SendStream", request_serializer=None,
                                       response_deserializer=pb.SendResponse.FromString)
        return list(stream(iter(frames), timeout=60))


@pytest.mark.parametrize(("size", "path"), [(2, "lean port"), (2, "gRPC"), (1, "lean port")])
def test_a_burst_on_a_master_is_stored_as_it_comes_and_answered_once_replicated(broker_group, size, path):
    """A pipelining client's burst on the master's lean port, or on one ``SendStream``: each small
    send is stored as it arrives and answered, in request order, once the slave holds it (in a
    group of one, at once when no answer waits before it). A send run on a thread (a big batch, a
    transactional send) holds the sends behind it back until it is done, so the log keeps the
    request order, and a malformed request gets its error in its place. The master is then killed:
    the slave that takes over (in a group of one, the master restarted) holds every acknowledged
    send once, each key in order."""
    group = broker_group(size, min_sync_replicas=size)
    master = group.wait_for_master()
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    with BrokerConnection(master.address) as conn:
        port = conn.call("Health", pb.HealthRequest()).send_port
        conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="tx-burst"))
    history, frames, expected = History(), [], []
    sent = dict.fromkeys([*(f"k{q}" for q in range(QUEUES)), "staged"], 0)

    def send(i: int, key: str, count: int, **fields) -> None:
        rows = [{"key": key, "body": body(key, sent[key] + n), "born_timestamp": codec.now_ms()} for n in range(count)]
        batch = encode_one(rows[0]) if count == 1 else codec.encode(codec.messages_to_batch(rows))
        frames.append(pb.SendRequest(topic=TOPIC, queue_id=i % QUEUES, batch=batch, **fields).SerializeToString())
        if not fields:
            for n in range(count):
                history.sent(key, sent[key] + n, acked=True)
            sent[key] += count

    for i in range(400):
        key = f"k{i % QUEUES}"
        if i % 97 == 13:
            frames.append(b"\xff\xff\xff")
            expected.append("InvalidRequestError")
        elif i == 300:
            send(i, "staged", 1, txn_id="tx-burst")
            expected.append("staged")
        else:
            send(i, key, 5000 if i == 200 else 1)  # over what is stored on the loop: it runs on a thread
            expected.append(key)
    if path == "lean port":
        answers = _answers_over_port(master.address, port, frames)
    else:
        answers = _answers_over_grpc(master.address, frames)
    got = [a.error_kind if a.error_code else "staged" if a.base_offset == -1 else f"k{a.queue_id}" for a in answers]
    assert got == expected
    assert answers[200].count == 5000 and len(frames[200]) > 64 * 1024
    master.kill9()
    if size == 1:
        master.start()
    promoted = group.wait_for_master(exclude=master if size > 1 else None)
    with BrokerConnection(promoted.address) as conn:
        verdict = check(history.sends, stored_deliveries(conn, TOPIC))
    assert verdict.ok and verdict.deliveries == len(history.sends), str(verdict)


def test_a_group_of_one_answers_synchronous_sends_at_once_and_its_loop_polls(broker_factory, zookeeper, topic_name):
    """With no slave to wait for, a master answers a synchronous send as it stores it, as a
    broker outside a group does: its loop polls for the sender's next send (a poll starts only
    after a send answered at once), and two threads' keys are stored complete, once each, in order."""
    settings = CLUSTER_BROKER | dict(zookeeper=zookeeper.connect_string, broker_name="group-a", broker_id=0,
                                     min_sync_replicas=1, busy_poll_us=100_000)
    running = broker_factory(**settings)
    with BrokerConnection(running.address) as conn:  # serving comes before the election: wait for it
        assert wait_until(lambda: conn.call("Health", pb.HealthRequest()).role == "MASTER", timeout=60)
    polled_between_synchronous_sends(running, topic_name)
