"""What TLS and access control cost a broker group: the security suite's workloads against the
master of a group of two (``replication = "sync"``, ``min_sync_replicas = 2``: every send is
acknowledged once the slave has it), plaintext against mutual TLS + ACL on every link, the
slave's replication stream included. Beside the rate, the CPU per message of the master, of the
slave and of the client. Run by ``python spark_jobs/bench.py --only security`` (needs ZooKeeper:
``make zookeeper``).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from bench.report import Row, cpu_seconds
from broker.cluster.zookeeper import ZooKeeperServer, zookeeper_installed
from broker.launcher import BrokerProcess
from broker.security.acl import AclDocument, Rule, save_acl
from broker.security.hashing import hash_secret
from broker.wire.credentials import Credentials
from broker.wire.tls import TlsOptions
from connector.client.connection import BrokerConnection, pb

__all__ = ["MODES", "run"]

MODES = ("group plaintext", "group mutual TLS + ACL")
_USERS = {"bench": "bench-secret-0001", "replicator": "replicator-secret-01"}


def _security(workdir: Path) -> tuple[dict[str, dict], TlsOptions, Credentials]:
    """Each mode's broker settings, and the client's TLS and credentials for the secure one."""
    from tests.security.pki import CertificateAuthority  # needs `cryptography` (the test extra)

    ca = CertificateAuthority(workdir)
    broker, client = ca.issue("group-broker", client=True), ca.issue("bench-client", server=False)
    acl = workdir / "group-acl.toml"
    save_acl(acl, AclDocument({user: hash_secret(secret) for user, secret in _USERS.items()}, (
        Rule("bench", "allow", ("admin", "publish", "subscribe"), ("topic:*",)),
        Rule("replicator", "allow", ("replicate",), ("broker",)))))
    secret = workdir / "replicator.secret"
    secret.write_text(_USERS["replicator"])
    secure = {"tls_cert_file": broker.cert_file, "tls_key_file": broker.key_file, "tls_client_ca_file": ca.ca_file,
              "replication_tls_ca_file": ca.ca_file, "acl_file": str(acl), "replication_access_key": "replicator",
              "replication_secret_file": str(secret)}
    tls = TlsOptions(ca_file=ca.ca_file, cert_file=client.cert_file, key_file=client.key_file)
    return {MODES[0]: {}, MODES[1]: secure}, tls, Credentials("bench", _USERS["bench"])


def _start_group(directory: Path, zookeeper: str, cluster: str, settings: dict) -> list[BrokerProcess]:
    brokers = []
    for broker_id in range(2):
        config = directory / f"broker-{broker_id}.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        values = {"zookeeper": zookeeper, "cluster_name": cluster, "broker_id": broker_id, "replication": "sync",
                  "min_sync_replicas": 2, "flush": "async", "log_level": "WARNING", **settings}
        config.write_text("[broker]\n" + "".join(
            f"{name} = {value if isinstance(value, int) else repr(str(value))}\n" for name, value in values.items()))
        brokers.append(BrokerProcess(directory / f"broker-{broker_id}", "--config", str(config)).start())
    return brokers


def _in_sync(conn: BrokerConnection, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = conn.call("Health", pb.HealthRequest())
        if health.role == "MASTER" and len(health.sync_set) == 2:
            return
        time.sleep(0.1)
    raise TimeoutError("the slave did not join the sync-state set")


def _measured(brokers: list[BrokerProcess], run) -> dict[str, float]:
    procs = [psutil.Process(b.pid) for b in brokers]
    before = [cpu_seconds(p) for p in procs]
    client_before = time.process_time()
    messages, seconds = run()
    cpu = [cpu_seconds(p) - b for p, b in zip(procs, before, strict=True)]
    return {"rate": messages / seconds, "master_cpu_us": cpu[0] / messages * 1e6,
            "slave_cpu_us": cpu[1] / messages * 1e6,
            "client_cpu_us": (time.process_time() - client_before) / messages * 1e6}


def run(workdir: Path, quick: bool, workloads) -> list[Row]:
    """``workloads``: (name, measure(conn, seconds) -> (messages, seconds)) of the security suite.
    Best of ``rounds`` per mode and workload, modes alternating which leads a round."""
    if not zookeeper_installed():
        print("security: replication figures skipped (ZooKeeper not installed: make zookeeper)", flush=True)
        return []
    seconds, rounds = (2.0, 1) if quick else (4.0, 3)
    settings, tls, credentials = _security(workdir)
    best: dict[tuple[str, str], dict[str, float]] = {}
    with ZooKeeperServer(workdir / "zookeeper") as zookeeper:
        for round_ in range(rounds):
            for mode in MODES[round_ % 2:] + MODES[:round_ % 2]:
                secure = bool(settings[mode])
                brokers = _start_group(workdir / f"group-{round_}-{mode.split()[1]}", zookeeper.connect_string,
                                       f"bench-{round_}-{mode.split()[1]}", settings[mode])
                try:
                    with BrokerConnection(brokers[0].address, tls=tls if secure else None,
                                          credentials=credentials if secure else None) as conn:
                        _in_sync(conn)
                        for workload, measure in workloads:
                            measure(conn, 0.5)  # warm up
                            figure = _measured(brokers, lambda: measure(conn, seconds))  # noqa: B023 - called at once
                            if (workload, mode) not in best or figure["rate"] > best[(workload, mode)]["rate"]:
                                best[(workload, mode)] = figure
                finally:
                    for broker in brokers:
                        broker.stop()
    return _rows(best, seconds, rounds, [name for name, _ in workloads])


def _rows(best: dict, seconds: float, rounds: int, workloads: list[str]) -> list[Row]:
    rows = []
    for workload in workloads:
        plain = best[(workload, MODES[0])]
        for mode in MODES:
            got = best[(workload, mode)]
            ratios = {f"{part}_ratio": got[part] / plain[part] for part in ("master_cpu_us", "slave_cpu_us", "client_cpu_us")}
            rows.append(Row(
                f"security: replicated {workload}, {mode}", got["rate"], "msg/s" if "batched" in workload else "sends/s",
                ceiling=plain["rate"], ceiling_name="group plaintext", message_bytes=100,
                queues=8 if "batched" in workload else 1,
                goal=f"CPU/msg master {got['master_cpu_us']:.2f} us (x{ratios['master_cpu_us_ratio']:.2f}), slave "
                     f"{got['slave_cpu_us']:.2f} us (x{ratios['slave_cpu_us_ratio']:.2f}), client "
                     f"{got['client_cpu_us']:.2f} us (x{ratios['client_cpu_us_ratio']:.2f})",
                extra={"mode": mode, "seconds": seconds, "rounds": rounds, **got, **ratios}))
    return rows
