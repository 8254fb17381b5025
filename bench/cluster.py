"""What spreading a topic over broker groups and replicating it cost and bring, in one run.

Configurations, each a fresh cluster on one shared ZooKeeper (its own ``cluster_name``):
one topic of 12 queues on 1 group vs 3 groups of one broker each (spreading alone), and one group
of 1, 2, 3 brokers with ``replication = "sync"`` and ``min_sync_replicas`` = all of them
(replication 1, 2, 3), and replication 2 with a topic of 1,024 queues, or beside 1,000 other
topics of 4 queues (what replication costs as the group holds more queues or topics; creating
those topics one after the other is measured too). ``flush = "async"`` so that fsync does not
hide the per-message cost.

Workloads through the real client: keyed produce (``Producer.send_batch`` of 10,000 keyed 100 B
messages, 2 threads; routed to every queue, so to every group), synchronous send (one thread's
``Producer.send`` of keyed 100 B messages, each waiting for its answer: over the master's lean
port) and consume (``PullConsumer`` of every queue from the start). Beside each rate, the CPU
time per message of all broker processes and of the client: this machine has 2 cores, so 3
groups share them; the CPU per message shows what a machine per group would gain better than
the rate does. Best of the rounds by rate. Run:
``python spark_jobs/bench.py --only cluster``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pyarrow as pa

from bench.broker import _timed_threads
from bench.report import Row, cpu_seconds
from broker.cluster.local_cluster import LocalCluster
from broker.cluster.zookeeper import ZooKeeperServer
from connector.client import Admin, Producer, PullConsumer

__all__ = ["run"]

TOPIC, QUEUES, ROWS, BODY = "bench", 12, 10_000, 100
OTHER_TOPICS, OTHER_QUEUES = 1000, 4
# (name, groups, brokers per group, queues of the topic, other topics)
CONFIGS = (("1 group", 1, 1, QUEUES, 0), ("3 groups", 3, 1, QUEUES, 0), ("replication 2", 1, 2, QUEUES, 0),
           ("replication 3", 1, 3, QUEUES, 0), ("replication 2, 1,024 queues", 1, 2, 1024, 0),
           ("replication 2, 1,000 other topics", 1, 2, QUEUES, OTHER_TOPICS))


@dataclass
class _Measured:
    rate: float
    broker_cpu_us: float
    client_cpu_us: float


def _table(rows: int, keys: int = 1000) -> pa.Table:
    return pa.table({"key": pa.array([f"key-{i % keys}" for i in range(rows)], pa.string()),
                     "body": pa.array([b"x" * BODY] * rows, pa.binary())})


def _measured(cluster: LocalCluster, run) -> _Measured:
    brokers = [psutil.Process(b.pid) for b in cluster.brokers]
    before, client_before = sum(cpu_seconds(p) for p in brokers), time.process_time()
    messages, seconds = run()
    broker_cpu = sum(cpu_seconds(p) for p in brokers) - before
    client_cpu = time.process_time() - client_before
    return _Measured(messages / seconds, broker_cpu / messages * 1e6, client_cpu / messages * 1e6)


def _produce(producer: Producer, seconds: float, threads: int = 2) -> tuple[int, float]:
    table = _table(ROWS)

    def work(stop: threading.Event, _thread: int) -> int:
        sent = 0
        while not stop.is_set():
            producer.send_batch(TOPIC, table)
            sent += ROWS
        return sent

    return _timed_threads(work, threads, seconds)


def _sync_send(producer: Producer, seconds: float) -> tuple[int, float]:
    body, sent, t0 = b"x" * BODY, 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        producer.send(TOPIC, body, key=f"key-{sent % 1000}")
        sent += 1
    return sent, time.perf_counter() - t0


def _consume(consumer: PullConsumer, seconds: float) -> tuple[int, float]:
    got, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        batch = consumer.poll(5000, wait_ms=0)
        if not batch:
            break
        got += len(batch)
    return got, time.perf_counter() - t0


def _create_topics(admin: Admin, count: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    for i in range(count):
        admin.create_topic(f"other-{i}", OTHER_QUEUES)
    return count, time.perf_counter() - t0


def _one_round(workdir: Path, zookeeper: ZooKeeperServer, groups: int, size: int, queues: int, others: int,
               seconds: float) -> dict[str, _Measured]:
    settings = {"cluster_name": f"bench-{workdir.name}", "min_sync_replicas": size, "log_level": "WARNING"}
    measured = {}
    with LocalCluster(workdir, groups=groups, size=size, base_port=0, zookeeper=zookeeper,
                      settings=settings) as cluster:
        with Admin(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, queues)
            if others:
                measured["topic create"] = _measured(cluster, lambda: _create_topics(admin, others))
        with Producer(cluster.bootstrap) as producer:
            _produce(producer, 0.5)  # warm up: channels, routes, first segment files
            produced = _measured(cluster, lambda: _produce(producer, seconds))
            _sync_send(producer, 0.2)
            sent = _measured(cluster, lambda: _sync_send(producer, seconds))
        with PullConsumer(cluster.bootstrap) as consumer:
            consumer.assign(TOPIC, None, start="earliest")
            consumed = _measured(cluster, lambda: _consume(consumer, seconds))
    return {**measured, "keyed produce": produced, "sync send": sent, "consume": consumed}


def run(workdir: Path, quick: bool) -> list[Row]:
    seconds, rounds = (2.0, 1) if quick else (4.0, 3)
    best: dict[tuple[str, str], _Measured] = {}
    with ZooKeeperServer(workdir / "zookeeper") as zookeeper:
        for round_ in range(rounds):
            for name, groups, size, queues, others in CONFIGS[round_ % len(CONFIGS):] + CONFIGS[:round_ % len(CONFIGS)]:
                data = workdir / f"cluster-{name.replace(' ', '-').replace(',', '')}-{round_}"
                for workload, got in _one_round(data, zookeeper, groups, size, queues, others, seconds).items():
                    if (workload, name) not in best or got.rate > best[(workload, name)].rate:
                        best[(workload, name)] = got
                print(f"  cluster: {name}, round {round_ + 1}/{rounds} done", flush=True)
    rows = []
    for workload, baseline in (("keyed produce", "1 group"), ("sync send", "1 group"), ("consume", "1 group")):
        base = best[(workload, baseline)]
        for name, groups, size, queues, _others in CONFIGS:
            got = best[(workload, name)]
            cpu = {"broker_cpu_us_per_msg": got.broker_cpu_us, "client_cpu_us_per_msg": got.client_cpu_us,
                   "broker_cpu_ratio": got.broker_cpu_us / base.broker_cpu_us,
                   "client_cpu_ratio": got.client_cpu_us / base.client_cpu_us}
            rows.append(Row(f"cluster: {workload}, {name}", got.rate, "msg/s", ceiling=base.rate,
                            ceiling_name=baseline, message_bytes=BODY, queues=queues,
                            goal=f"CPU/msg brokers {got.broker_cpu_us:.2f} us (x{cpu['broker_cpu_ratio']:.2f}), "
                                 f"client {got.client_cpu_us:.2f} us (x{cpu['client_cpu_ratio']:.2f})",
                            extra={"groups": groups, "brokers_per_group": size, "seconds": seconds,
                                   "rounds": rounds, **cpu}))
    for name, groups, size, _queues, others in CONFIGS:
        if others:
            got = best[("topic create", name)]
            rows.append(Row(f"cluster: topic create, one after the other, {name}", got.rate, "topics/s",
                            goal=f"CPU/topic brokers {got.broker_cpu_us / 1000:.1f} ms, "
                                 f"client {got.client_cpu_us / 1000:.1f} ms",
                            extra={"groups": groups, "brokers_per_group": size, "topics": others,
                                   "queues_per_topic": OTHER_QUEUES, "rounds": rounds}))
    return rows
