"""Broker groups with TLS (mutual) and access control on every link, real ZooKeeper and brokers.

Slaves dial their master over TLS, verify its certificate and present their own, and open the
``Replicate`` stream as a user with the ``replicate`` right; clients follow ``NotMasterError``
and read ``orderlymq cluster status`` with their own TLS and credentials. Judged by the strict
checker: a failover under producers and an orderly group loses, duplicates and reorders nothing,
in one group and with a topic spread over two groups.
Refusals: a caller without credentials (UNAUTHENTICATED, on the slaves too), an admin of every
topic without the replicate right (PERMISSION_DENIED), a slave trusting another CA or holding a
wrong secret (never replicates, says why in its log), fuzzed credentials on ``Replicate`` (the
group keeps replicating).
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.security.acl import AclDocument, Rule, load_acl, save_acl
from broker.security.hashing import hash_secret
from broker.wire.credentials import Credentials
from broker.wire.tls import TlsOptions
from connector.cli import main as cli_main
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection, open_channel
from connector.client.routed import RoutedConnection
from connector.history import History, check
from tests.faults.brokers import broker_process
from tests.faults.cluster_group import CLUSTER_BROKER, BrokerGroup, kill_masters
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import drain, keyed_producers, shutdown_all, start_orderly_group, stored_deliveries
from tests.security.pki import CertificateAuthority
from tests.security.test_fuzz_auth import random_metadata
from tests.support import wait_until

TOPIC, GROUP, QUEUES = "orders", "order-service", 4
KILLS = 2 if PROFILE.name == "short" else 6
SECRETS = {"admin": "admin-secret-0001", "app": "app-secret-000002", "replicator": "replicator-secret-3"}


def creds(user: str) -> Credentials:
    return Credentials(user, SECRETS[user])


class SecureGroupFiles:
    """A CA, one broker certificate (127.0.0.1), a client certificate, the ACL file and the
    replication user's secret file; ``settings`` are every broker's security settings."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = CertificateAuthority(directory)
        self.broker = self.ca.issue("broker", client=True)  # also presented to the master as a slave
        client = self.ca.issue("client", server=False)
        self.client_tls = TlsOptions(ca_file=self.ca.ca_file, cert_file=client.cert_file, key_file=client.key_file)
        self.acl = directory / "acl.toml"
        save_acl(self.acl, AclDocument({user: hash_secret(secret) for user, secret in SECRETS.items()}, (
            Rule("admin", "allow", ("admin", "publish", "subscribe"), ("topic:*", "group:*", "broker")),
            Rule("app", "allow", ("publish", "subscribe"), (f"topic:{TOPIC}", f"group:{GROUP}")),
            Rule("app", "allow", ("admin", "publish"), (f"topic:%DLQ%{GROUP}",)),  # the group's dead letters
            Rule("replicator", "allow", ("replicate",), ("broker",)),
        )))
        self.secret_file = directory / "replicator.secret"
        self.secret_file.write_text(SECRETS["replicator"] + "\n")
        self.settings = dict(
            tls_cert_file=self.broker.cert_file, tls_key_file=self.broker.key_file,
            tls_client_ca_file=self.ca.ca_file, replication_tls_ca_file=self.ca.ca_file,
            acl_file=str(self.acl), replication_access_key="replicator",
            replication_secret_file=str(self.secret_file))

    def client(self, user: str) -> dict:
        """The ``tls`` and ``credentials`` keywords of a client acting as ``user``."""
        return {"tls": self.client_tls, "credentials": creds(user)}


@pytest.fixture
def secure(tmp_path) -> SecureGroupFiles:
    return SecureGroupFiles(tmp_path / "pki")


def secure_group(broker_group, secure: SecureGroupFiles, size: int):
    return broker_group(size, tls=secure.client_tls, credentials=creds("admin"), **secure.settings)


def test_tls_acl_group_fails_over_losing_nothing(broker_group, secure, fault_report, monkeypatch, capsys):
    group = secure_group(broker_group, secure, 3)
    with Admin(group.addresses, **secure.client("admin")) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    consumers = start_orderly_group(group.addresses, TOPIC, GROUP, PROFILE.consumers, history, **secure.client("app"))
    producers = keyed_producers(group.addresses, TOPIC, history, **secure.client("app"))
    try:
        for producer in producers:
            producer.start()
        failovers = kill_masters(group, producers, KILLS)  # each killed broker comes back over TLS, as the replication user
        time.sleep(PROFILE.cycle_seconds)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        shutdown_all(consumers)
    with BrokerConnection(group.addresses, **secure.client("admin")) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    consumed = history.check()
    fault_report("cluster: TLS + ACL group, master kill -9 loop, 3 brokers", {"log": log, "consumed": consumed},
                 kills=KILLS, election_s_max=round(max(f.election_s for f in failovers), 2),
                 first_ack_after_kill_s_max=round(max(f.first_ack_s or 0 for f in failovers), 2),
                 send_failures=sum(len(p.failures) for p in producers))
    assert log.ok and log.acked > 0, str(log)
    assert caught_up and consumed.lost == 0, str(consumed)
    assert consumed.out_of_order == 0 and consumed.unexpected == 0, str(consumed)

    # Every slave is back in the sync-state set over its secure link; cluster status shows it.
    master = group.wait_for_master()
    assert wait_until(lambda: len(group.health(master).sync_set) == 3, timeout=60), group.health(master)
    monkeypatch.setenv("ORDERLYMQ_ACCESS_KEY", "admin")
    monkeypatch.setenv("ORDERLYMQ_SECRET_KEY", SECRETS["admin"])
    tls_flags = ["--tls-ca-file", secure.ca.ca_file, "--tls-cert-file", secure.client_tls.cert_file,
                 "--tls-key-file", secure.client_tls.key_file]
    capsys.readouterr()
    assert cli_main(["--brokers", group.addresses, *tls_flags, "--timeout", "5", "cluster", "status"]) == 0
    out = capsys.readouterr().out
    assert "MASTER" in out and out.count("SLAVE") == 2 and "unreachable" not in out, out
    assert "sync-state set [0, 1, 2]" in out, out


def _replicate(address: str, tls: TlsOptions, metadata=None) -> grpc.RpcError:
    """Open a Replicate stream as a slave would and return how it ends."""
    with open_channel(address, tls) as channel:
        stream = pb_grpc.ReplicationStub(channel).Replicate(
            iter([pb.ReplicaFetch(broker_id=9, group_epoch=1, handshake=True)]), metadata=metadata, timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            list(stream)
    return refused.value


def test_replication_needs_the_replicate_right(broker_group, secure):
    group = secure_group(broker_group, secure, 2)
    master, slave = group.brokers
    group.wait_for_role(slave, "SLAVE")

    no_credentials = _replicate(master.address, secure.client_tls)
    assert no_credentials.code() == grpc.StatusCode.UNAUTHENTICATED, no_credentials
    assert "no credentials" in no_credentials.details()
    admin = _replicate(master.address, secure.client_tls, creds("admin").metadata())
    assert admin.code() == grpc.StatusCode.PERMISSION_DENIED, admin
    assert "user 'admin' may not replicate on broker" in admin.details()

    # The slave refuses a caller without credentials as UNAUTHENTICATED, not with the master's address.
    with open_channel(slave.address, secure.client_tls) as channel:
        with pytest.raises(grpc.RpcError) as anonymous:
            pb_grpc.OrderlyMQStub(channel).ListTopics(pb.ListTopicsRequest(), timeout=10)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED, anonymous.value
    assert master.address not in anonymous.value.details()

    # A client given only the slave follows its NotMasterError to the master, with its TLS and credentials.
    with Admin(slave.address, **secure.client("admin")) as admin_client:
        admin_client.create_topic(TOPIC, 1)
    with Producer(slave.address, **secure.client("app")) as producer:
        for i in range(10):
            producer.send(TOPIC, f"k:{i}".encode(), key="k")
    assert wait_until(lambda: [r.behind_messages for r in group.health(master).replicas] == [0])

    # Revoking the replicate right stops the slave's stream at its next fetch; granting it again resumes it.
    acl = load_acl(secure.acl)
    save_acl(secure.acl, AclDocument(acl.users, tuple(r for r in acl.rules if r.user != "replicator")))
    assert wait_until(lambda: not group.health(master).replicas[0].connected, timeout=30), group.health(master)
    save_acl(secure.acl, acl)
    assert wait_until(lambda: group.health(master).replicas[0].connected, timeout=30), group.health(master)


def test_slaves_with_a_wrong_ca_or_secret_are_refused(broker_group, zookeeper, secure, tmp_path):
    group = secure_group(broker_group, secure, 1)
    master = group.brokers[0]
    other_ca = CertificateAuthority(tmp_path / "pki", name="another CA")
    wrong_secret = tmp_path / "wrong.secret"
    wrong_secret.write_text("not-the-replicator-secret")
    slaves = {
        "CERTIFICATE_VERIFY_FAILED": secure.settings | {"replication_tls_ca_file": other_ca.ca_file},
        "wrong secret key for access key 'replicator'": secure.settings | {"replication_secret_file": str(wrong_secret)},
    }
    started = []
    for broker_id, (expected, settings) in enumerate(slaves.items(), 1):
        slave = broker_process(tmp_path / f"slave-{broker_id}", zookeeper=zookeeper.connect_string,
                               broker_name="group-a", broker_id=broker_id, **(CLUSTER_BROKER | settings))
        started.append((slave.start(), expected))
    try:
        for slave, expected in started:
            group.wait_for_role(slave, "SLAVE")
            assert wait_until(lambda s=slave, e=expected: e in s.log_path.read_text(), timeout=60), \
                slave.log_path.read_text()[-3000:]
            assert "replication from" in slave.log_path.read_text()
        replicas = group.health(master).replicas
        assert not [r for r in replicas if r.connected], replicas
        assert list(group.health(master).sync_set) == [0]
    finally:
        for slave, _ in started:
            slave.kill9()


def _fuzz_replicate(address: str, tls: TlsOptions, seed: int, calls: int, outcomes: list) -> None:
    rng = random.Random(seed)
    with open_channel(address, tls) as channel:
        replicate = channel.stream_stream("/orderlymq.v1.Replication/Replicate")
        for _ in range(calls):
            requests = [rng.randbytes(rng.randint(0, 40)) for _ in range(rng.randint(0, 3))]
            try:
                list(replicate(iter(requests), timeout=10, metadata=random_metadata(rng)))
                outcomes.append("ANSWERED")
            except grpc.RpcError as err:
                unsent = err.code() == grpc.StatusCode.INTERNAL and err.details() == "Invalid metadata"
                outcomes.append("REFUSED BY THE CLIENT LIBRARY" if unsent else err.code())
            except (ValueError, TypeError, UnicodeError):
                outcomes.append("REFUSED BY THE CLIENT LIBRARY")


def test_fuzzed_auth_metadata_on_replicate_never_crashes_the_group(broker_group, secure):
    group = secure_group(broker_group, secure, 2)
    master, slave = group.brokers
    group.wait_for_role(slave, "SLAVE")
    with Admin(group.addresses, **secure.client("admin")) as admin:
        admin.create_topic(TOPIC, 2)
    outcomes: list = []
    fuzzers = [threading.Thread(target=_fuzz_replicate, args=(address, secure.client_tls, seed, 150, outcomes))
               for seed, address in enumerate([master.address, slave.address] * 2)]
    for fuzzer in fuzzers:
        fuzzer.start()
    history = History()
    with Producer(group.addresses, **secure.client("app")) as producer:
        sent = 0
        while any(f.is_alive() for f in fuzzers) or sent < 200:
            key = f"k{sent % 8}"
            producer.send(TOPIC, f"{key}:{sent // 8}".encode(), key=key)
            history.sent(key, sent // 8, acked=True)
            sent += 1
    for fuzzer in fuzzers:
        fuzzer.join()

    assert len(outcomes) == 600 and "ANSWERED" not in outcomes, Counter(outcomes)
    reached = {o for o in outcomes if isinstance(o, grpc.StatusCode)}
    assert reached <= {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}, Counter(outcomes)
    assert group.health(master).role == "MASTER" and group.health(slave).role == "SLAVE"
    assert wait_until(lambda: [r.behind_messages for r in group.health(master).replicas] == [0])
    with BrokerConnection(group.addresses, **secure.client("admin")) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    assert log.ok and log.acked == sent, str(log)


def test_a_topic_over_two_secure_groups_survives_a_master_kill(broker_cluster, secure, fault_report):
    groups = broker_cluster(2, 2, tls=secure.client_tls, credentials=creds("admin"), **secure.settings)
    bootstrap = ",".join(g.addresses for g in groups)
    with Admin(bootstrap, **secure.client("admin")) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    consumers = start_orderly_group(bootstrap, TOPIC, GROUP, 2, history, **secure.client("app"))
    producers = keyed_producers(bootstrap, TOPIC, history, **secure.client("app"))
    try:
        for producer in producers:
            producer.start()
        time.sleep(PROFILE.cycle_seconds * 2)
        killed = groups[1].wait_for_master()
        killed.kill9()
        groups[1].wait_for_master(exclude=killed)
        killed.start()
        time.sleep(PROFILE.cycle_seconds * 2)
        caught_up = drain(producers, history)
    finally:
        for producer in producers:
            producer.stop.set()
        shutdown_all(consumers)
    with Admin(bootstrap, **secure.client("admin")) as admin:
        holders = {group.broker_name for group in admin.describe_topic(TOPIC).groups if group.queue_ids}
    with RoutedConnection(bootstrap, **secure.client("admin")) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    consumed = history.check()
    fault_report("cluster: a topic over two TLS + ACL groups, one master killed", {"log": log, "consumed": consumed})
    assert len(holders) == 2, holders
    assert log.ok and log.acked > 0, str(log)
    assert caught_up and consumed.lost == 0 and consumed.out_of_order == 0, str(consumed)


def test_a_group_reaches_zookeeper_over_mutual_tls_as_a_digest_user(secure, tmp_path):
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoAuthError

    from broker.cluster.zookeeper import ZooKeeperServer, ZooKeeperTls

    issued = secure.ca.issue("zookeeper")
    keystore = tmp_path / "zookeeper-keystore.pem"
    keystore.write_text(Path(issued.key_file).read_text() + Path(issued.cert_file).read_text())
    zookeeper = ZooKeeperServer(tmp_path / "zookeeper", tls=ZooKeeperTls(str(keystore), secure.ca.ca_file, True))
    zookeeper.start()
    auth, wrong = tmp_path / "zookeeper.auth", tmp_path / "wrong.auth"
    auth.write_text("orderlymq:zookeeper-password-1\n")
    wrong.write_text("orderlymq:not-the-password\n")
    settings = secure.settings | dict(zookeeper_tls_ca_file=secure.ca.ca_file, zookeeper_auth_file=str(auth),
                                      zookeeper_tls_cert_file=secure.broker.cert_file,
                                      zookeeper_tls_key_file=secure.broker.key_file)
    group = BrokerGroup(tmp_path / "group", zookeeper.secure_connect_string, 2, tls=secure.client_tls,
                        credentials=creds("admin"), **settings)
    anonymous = KazooClient(hosts=zookeeper.connect_string)  # the plain port, no user
    try:
        group.start()
        master, slave = group.brokers
        group.wait_for_role(slave, "SLAVE")
        with Admin(group.addresses, **secure.client("admin")) as admin:
            admin.create_topic(TOPIC, 1)
        with Producer(group.addresses, **secure.client("app")) as producer:
            for i in range(10):
                producer.send(TOPIC, f"k:{i}".encode(), key="k")
        assert wait_until(lambda: [r.behind_messages for r in group.health(master).replicas] == [0])

        anonymous.start(timeout=15)
        state = "/orderlymq/orderlymq/groups/group-a/state"
        for attempt in (lambda: anonymous.get(state), lambda: anonymous.set(state, b"{}"),
                        lambda: anonymous.delete("/orderlymq/orderlymq/groups/group-a/master")):
            with pytest.raises(NoAuthError):
                attempt()
        intruder = broker_process(tmp_path / "intruder", zookeeper=zookeeper.secure_connect_string,
                                  broker_name="group-a", broker_id=7, **(CLUSTER_BROKER | settings | {
                                      "zookeeper_auth_file": str(wrong)}))
        with pytest.raises(RuntimeError, match="cannot join broker group group-a"):
            intruder.start()
    finally:
        anonymous.stop()
        group.kill_all()
        zookeeper.stop()
