"""What TLS and access control cost: the same workloads against plaintext, ACL (plaintext on
loopback), TLS and TLS + ACL brokers in one run, each figure with its ratio to plaintext.

Workloads: batched produce (10,000-message batches of 100 B bodies, 2 threads, 8 queues) and
sync sends (one-message batches, one thread, each waiting for its answer). ``flush = "async"``
so that fsync does not hide the per-call cost. Beside each rate, the CPU time per message of
the broker process and of the client process: on a machine shared with other work the rates
swing with the load, the CPU spent per message much less. Then the same workloads against a
broker group's master, plaintext against mutual TLS + ACL on every link, replication included
(``bench/secure_replication.py``). Run:
``python spark_jobs/bench.py --only security``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench import secure_replication
from bench.broker import _timed_threads, make_batch
from bench.report import Row, cpu_seconds
from bench.scratch_broker import ScratchBroker
from broker.launcher import BrokerProcess
from broker.security.acl import AclDocument, Rule, save_acl
from broker.security.guard import AccessGuard
from broker.security.hashing import hash_secret
from broker.wire.credentials import Credentials
from broker.wire.tls import TlsOptions
from connector.client.connection import BrokerConnection, pb

__all__ = ["run"]

_SECRET = "bench-secret-0001"
_CREDENTIALS = Credentials("bench", _SECRET)
MODES = ("plaintext", "ACL", "TLS", "TLS + ACL")


def _setup(workdir: Path) -> tuple[TlsOptions, dict[str, list[str]]]:
    """A CA, a broker certificate and an ACL file; the broker flags of each mode."""
    from tests.security.pki import CertificateAuthority  # needs `cryptography` (the test extra)

    ca = CertificateAuthority(workdir)
    server = ca.issue("broker")
    acl = workdir / "acl.toml"
    save_acl(acl, AclDocument({"bench": hash_secret(_SECRET)},
                              (Rule("bench", "allow", ("admin", "publish", "subscribe"), ("topic:*",)),)))
    tls_flags = ["--tls-cert-file", server.cert_file, "--tls-key-file", server.key_file]
    acl_flags = ["--acl-file", str(acl)]
    flags = {"plaintext": [], "ACL": acl_flags, "TLS": tls_flags, "TLS + ACL": [*tls_flags, *acl_flags]}
    return TlsOptions(ca_file=ca.ca_file), flags


@dataclass
class _Measured:
    rate: float  # messages per second
    broker_cpu_us: float  # broker CPU per message
    client_cpu_us: float  # client CPU per message


def _measured(broker: BrokerProcess, run) -> _Measured:
    """``run() -> (messages, seconds)`` with the CPU both processes spent meanwhile."""
    server = psutil.Process(broker.pid)
    server_before, client_before = cpu_seconds(server), time.process_time()
    messages, seconds = run()
    server_cpu, client_cpu = cpu_seconds(server) - server_before, time.process_time() - client_before
    return _Measured(messages / seconds, server_cpu / messages * 1e6, client_cpu / messages * 1e6)


def _connect(broker: BrokerProcess, mode: str, tls: TlsOptions) -> BrokerConnection:
    return BrokerConnection(broker.address, tls=tls if mode.startswith("TLS") else None,
                            credentials=_CREDENTIALS if mode.endswith("ACL") else None)


def _batched(conn: BrokerConnection, seconds: float, rows: int = 10_000, queues: int = 8,
             threads: int = 2) -> tuple[int, float]:
    payload = make_batch(rows)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic="batched", queue_count=queues, if_not_exists=True))

    def work(stop, i):
        n, q = 0, i
        while not stop.is_set():
            conn.call("Send", pb.SendRequest(topic="batched", queue_id=q % queues, batch=payload))
            n, q = n + rows, q + threads
        return n

    return _timed_threads(work, threads, seconds)


def _sync(conn: BrokerConnection, seconds: float) -> tuple[int, float]:
    conn.call("CreateTopic", pb.CreateTopicRequest(topic="sync", queue_count=1, if_not_exists=True))
    request = pb.SendRequest(topic="sync", queue_id=0, batch=make_batch(1))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        conn.call("Send", request)
        n += 1
    return n, time.perf_counter() - t0


def _check_cost(acl_file: Path, calls: int) -> float:
    """Microseconds of the broker's per-call check (recognise the credentials, authorize a Send)
    once the secret was verified: what access control adds to every RPC."""
    guard = AccessGuard(str(acl_file))
    metadata = _CREDENTIALS.metadata()
    request = pb.SendRequest(topic="orders", queue_id=0)
    guard.authenticate(metadata)
    t0 = time.perf_counter()
    for _ in range(calls):
        guard.authorize(guard.recognise(metadata), "Send", request)
    return (time.perf_counter() - t0) / calls * 1e6


def run(workdir: Path, quick: bool) -> list[Row]:
    """Best of ``rounds`` per mode and workload (the round with the highest rate), modes
    interleaved so drift hits them alike."""
    seconds, rounds = (2.0, 1) if quick else (4.0, 4)
    tls, flags = _setup(workdir)
    best: dict[tuple[str, str], _Measured] = {}
    for round_ in range(rounds):
        for mode in MODES[round_ % len(MODES):] + MODES[:round_ % len(MODES)]:  # each mode leads a round
            data = workdir / f"{mode.replace(' ', '').replace('+', '-')}-{round_}"
            with ScratchBroker(data, "--flush", "async", "--log-level", "WARNING", *flags[mode]) as broker:
                with _connect(broker, mode, tls) as conn:
                    for workload, measure in (("batched produce", _batched), ("sync sends", _sync)):
                        measure(conn, 0.5)  # warm up: channel, handshake, first segment files
                        figure = _measured(broker, lambda: measure(conn, seconds))  # noqa: B023 - called at once
                        if (workload, mode) not in best or figure.rate > best[(workload, mode)].rate:
                            best[(workload, mode)] = figure
    rows = [Row("security: ACL check per call, in process", _check_cost(workdir / "acl.toml", 20_000 if quick else 200_000),
                "us", goal="recognise the credentials + authorize, after the first scrypt")]
    for workload, unit in (("batched produce", "msg/s"), ("sync sends", "sends/s")):
        plain = best[(workload, "plaintext")]
        for mode in MODES:
            got = best[(workload, mode)]
            cpu = {"broker_cpu_us_per_msg": got.broker_cpu_us, "client_cpu_us_per_msg": got.client_cpu_us,
                   "broker_cpu_ratio": got.broker_cpu_us / plain.broker_cpu_us,
                   "client_cpu_ratio": got.client_cpu_us / plain.client_cpu_us}
            rows.append(Row(f"security: {workload}, {mode}", got.rate, unit, ceiling=plain.rate,
                            ceiling_name="plaintext", message_bytes=100, queues=8 if workload == "batched produce" else 1,
                            goal=f"CPU/msg broker {got.broker_cpu_us:.2f} us (x{cpu['broker_cpu_ratio']:.2f}), "
                                 f"client {got.client_cpu_us:.2f} us (x{cpu['client_cpu_ratio']:.2f})",
                            extra={"mode": mode, "seconds": seconds, "rounds": rounds, **cpu}))
    return rows + secure_replication.run(workdir, quick, (("batched produce", _batched), ("sync sends", _sync)))
