"""Spark benchmarks: the ``orderlymq`` source and sink against the ceilings of Spark's Python data
source path (``benchmem``, the same Arrow schema and batch sizes from memory; ``benchdiscard``, a
Python Arrow writer that drops its input) and ``noop``, measured in turn (full run: medians of 5
rounds); the ordered pipeline ``orderlymq`` -> ``orderlymq`` exactly once against at least once;
end-to-end latency with the phases of its micro-batches; the CPU a sink task spends per
row, and the broker's CPU and commit time per sink run; the broker-side cost of one micro-batch's
control calls."""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from bench.broker import BODY_BYTES, make_batch, make_table
from bench.memsource import DiscardSink, MemSource
from bench.report import Row, cpu_seconds, in_turn, medians, percentile, round_ratios
from bench.scratch_broker import ScratchBroker
from broker.launcher import free_port
from broker.wire import codec
from broker.wire.routing import queue_ids
from connector.client.connection import BrokerConnection, pb
from spark_jobs.session import spark_session

QUEUES = 8
PULL_BATCH_ROWS = 10_000  # records of 10,000 rows: what a pull returns per stored batch here


def _prefill(conn: BrokerConnection, topic: str, rows: int) -> None:
    payload = make_batch(PULL_BATCH_ROWS)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=QUEUES))
    for i in range(rows // PULL_BATCH_ROWS):
        conn.call("Send", pb.SendRequest(topic=topic, queue_id=i % QUEUES, batch=payload))


def _run_available_now(df, checkpoint: Path, sink: str = "noop", **options) -> float:
    writer = df.writeStream.format(sink).option("checkpointLocation", str(checkpoint))
    for k, v in options.items():
        writer = writer.option(k, v)
    t0 = time.perf_counter()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception():
        raise RuntimeError(f"benchmark query failed: {query.exception()}")
    return time.perf_counter() - t0


def _source(spark, address: str, topic: str, group: str):
    return (spark.readStream.format("orderlymq").option("brokers", address).option("topic", topic)
            .option("consumerGroup", group).option("startingOffsets", "earliest").load())


def _mem(spark, rows: int):
    return (spark.readStream.format("benchmem").option("partitions", str(QUEUES))
            .option("rows", str(rows // QUEUES)).option("batchRows", str(PULL_BATCH_ROWS)).load())


def source_vs_ceiling(spark, workdir: Path, address: str, topic: str, rows: int,
                      rounds: int = 1) -> list[tuple[float, float]]:
    """Rows/s of the source and of ``benchmem``, per round."""
    def ours() -> float:
        return rows / _run_available_now(_source(spark, address, topic, f"bench-{uuid.uuid4().hex[:6]}"),
                                         workdir / f"ck-{uuid.uuid4().hex}")

    def ceiling() -> float:
        return rows / _run_available_now(_mem(spark, rows), workdir / f"ck-{uuid.uuid4().hex}")

    return [in_turn([ours, ceiling], r) for r in range(rounds)]


_GUARANTEES = {"true": "exactly once", "false": "at least once"}  # the sink's exactlyOnce option, named


class BrokerCost:
    """What a broker process spent on each run of a workload: CPU seconds, and seconds answering
    ``CommitTxn`` (its metrics), per run, keyed by the workload's name."""

    def __init__(self, broker: ScratchBroker, metrics_port: int) -> None:
        self._process = psutil.Process(broker.pid)
        self._metrics_port = metrics_port
        self.runs: dict[str, list[tuple[float, float]]] = {}

    def measured(self, name: str, run: Callable[[], float]) -> Callable[[], float]:
        def measure() -> float:
            cpu, commits = cpu_seconds(self._process), self._commit_seconds()
            figure = run()
            self.runs.setdefault(name, []).append((cpu_seconds(self._process) - cpu, self._commit_seconds() - commits))
            return figure
        return measure

    def medians(self, name: str) -> dict[str, float]:
        cpu, commits = medians(self.runs[name])
        return {"broker CPU s per run, median": round(cpu, 3), "broker CommitTxn s per run, median": round(commits, 3)}

    def _commit_seconds(self) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self._metrics_port}/metrics", timeout=10).read().decode()
        return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
                   if sample.name == "orderlymq_rpc_duration_seconds_sum"
                   and sample.labels.get("method") == "CommitTxn")


def sink_vs_ceiling(spark, workdir: Path, address: str, rows: int, rounds: int = 1,
                    cost: BrokerCost | None = None) -> list[tuple[float, float, float, float]]:
    """Rows/s of the sink exactly once and at least once, of ``noop`` and of the discarding Python
    writer, per round; what the broker spent on the sink's runs goes into ``cost``."""
    conn = BrokerConnection(address)

    def ours(exactly_once: str) -> Callable[[], float]:
        def run() -> float:
            topic = f"bench-sink-{exactly_once}-{uuid.uuid4().hex[:6]}"
            conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=QUEUES))
            return rows / _run_available_now(_mem(spark, rows).select("key", "body"), workdir / f"ck-{uuid.uuid4().hex}",
                                             "orderlymq", brokers=address, topic=topic, shardingKey="key",
                                             exactlyOnce=exactly_once)
        return run if cost is None else cost.measured(_GUARANTEES[exactly_once], run)

    def ceiling(sink: str) -> Callable[[], float]:
        return lambda: rows / _run_available_now(_mem(spark, rows).select("key", "body"),
                                                 workdir / f"ck-{uuid.uuid4().hex}", sink)

    try:
        return [in_turn([ours("true"), ours("false"), ceiling("noop"), ceiling("benchdiscard")], r)
                for r in range(rounds)]
    finally:
        conn.close()


def _prefill_keyed(conn: BrokerConnection, topic: str, rows: int) -> int:
    """``topic`` of ``QUEUES`` queues holding about ``rows`` rows, each in the queue its key routes
    to (as a keyed producer stores them); the rows stored."""
    table = make_table(PULL_BATCH_ROWS)
    routed = queue_ids(table.column("key"), QUEUES)
    payloads = [(queue_id, codec.encode(codec.normalize(table.filter(pa.array(routed == queue_id)))),
                 int((routed == queue_id).sum())) for queue_id in range(QUEUES)]
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=QUEUES))
    stored = 0
    while stored < rows:
        for queue_id, payload, count in payloads:
            conn.call("Send", pb.SendRequest(topic=topic, queue_id=queue_id, batch=payload))
            stored += count
    return stored


def copy_pipeline(spark, workdir: Path, address: str, topic: str, rows: int,
                  rounds: int = 1) -> list[tuple[float, float]]:
    """Rows/s of the ordered pipeline, ``orderlymq`` -> ``orderlymq`` by key into a topic as large
    (each task writes only the queue it reads), exactly once and at least once, per round."""
    conn = BrokerConnection(address)

    def copy(exactly_once: str) -> Callable[[], float]:
        def run() -> float:
            target = f"bench-copy-{exactly_once}-{uuid.uuid4().hex[:6]}"
            conn.call("CreateTopic", pb.CreateTopicRequest(topic=target, queue_count=QUEUES))
            source = _source(spark, address, topic, f"bench-copy-{uuid.uuid4().hex[:6]}").select("key", "body")
            return rows / _run_available_now(source, workdir / f"ck-{uuid.uuid4().hex}", "orderlymq", brokers=address,
                                             topic=target, shardingKey="key", exactlyOnce=exactly_once)
        return run

    try:
        return [in_turn([copy("true"), copy("false")], r) for r in range(rounds)]
    finally:
        conn.close()


def end_to_end_latency(spark, workdir: Path, address: str, samples: int, warmup: int
                       ) -> tuple[float, float, dict[str, float]]:
    """Produce -> row visible to a consumer of the sink's output topic (processingTime 0); p50, p99
    and where a micro-batch that carried rows spent its time (Spark's ``durationMs``, medians).

    The first ``warmup`` messages, sent the same way, are left out: a query's first micro-batches
    run while the JVM still compiles their code. Here successive runs of this query in one session
    went p50 212 -> 155 -> 146 -> 143 ms, so one run with a tenth left out measured the warm-up."""
    conn = BrokerConnection(address)
    src, dst = f"lat-in-{uuid.uuid4().hex[:6]}", f"lat-out-{uuid.uuid4().hex[:6]}"
    for t in (src, dst):
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=t, queue_count=1))
    query = (_source(spark, address, src, "bench-latency").select("key", "body").writeStream.format("orderlymq")
             .option("brokers", address).option("topic", dst).option("shardingKey", "key")
             .option("checkpointLocation", str(workdir / f"ck-{uuid.uuid4().hex}"))
             .trigger(processingTime="0 seconds").start())
    latencies: list[float] = []
    sent: dict[int, float] = {}
    done = threading.Event()

    def consume():
        offset = 0
        while offset < warmup + samples and not done.is_set():
            resp = conn.call("Pull", pb.PullRequest(topic=dst, queue_id=0, offset=offset, wait_ms=1000))
            now = time.perf_counter()
            for body in codec.decode_many(resp.batches).column("body").to_pylist():
                if int(body) >= warmup:
                    latencies.append((now - sent[int(body)]) * 1000)
            offset = resp.next_offset

    consumer = threading.Thread(target=consume)
    consumer.start()
    time.sleep(3)  # let the query start its first (empty) batches
    for i in range(warmup + samples):
        sent[i] = time.perf_counter()
        batch = codec.encode(codec.messages_to_batch([{"key": "k", "body": str(i)}]))
        conn.call("Send", pb.SendRequest(topic=src, queue_id=0, batch=batch))
        time.sleep(0.05)
    consumer.join(timeout=60)
    done.set()
    phases = _phases(query.recentProgress)
    query.stop()
    conn.close()
    if len(latencies) < samples:
        raise AssertionError(f"end-to-end latency: {len(latencies)} of {samples} measured messages came out")
    return percentile(latencies, 50), percentile(latencies, 99), phases


def _phases(progress: list[dict]) -> dict[str, float]:
    """Median ``durationMs`` of each phase over the micro-batches that read rows (ms)."""
    busy = [p["durationMs"] for p in progress if p.get("numInputRows")]
    names = sorted({name for durations in busy for name in durations})
    return {name: percentile([d.get(name, 0) for d in busy], 50) for name in names}


def micro_batch_floor(spark, workdir: Path, seconds: float = 10.0) -> dict[str, float]:
    """Spark's own micro-batch, with nothing of ours in it: ``benchmem`` yielding one row per
    micro-batch into ``benchdiscard``, back to back (processingTime 0), as the latency query runs.
    Median ``durationMs`` of each phase (ms), the first fifth (warm-up) left out."""
    df = (spark.readStream.format("benchmem").option("partitions", "1").option("rows", "1")
          .option("batchRows", "1").option("advancing", "true").load().select("key", "body"))
    query = (df.writeStream.format("benchdiscard").option("checkpointLocation", str(workdir / f"ck-{uuid.uuid4().hex}"))
             .trigger(processingTime="0 seconds").start())
    time.sleep(seconds)
    progress = query.recentProgress
    query.stop()
    return _phases(progress[len(progress) // 5:])


def sink_task_cpu_ns(address: str, rows: int, rounds: int, *, distinct_keys: bool = False) -> dict[str, float]:
    """The CPU one sink task spends per row it writes (ns, median of ``rounds``), at least once and
    exactly once: the writer's own work, which bounds a task's rate where the broker runs on other
    machines. Run in this process on Spark's input batches of 10,000 rows (100-byte bodies, 1,000
    keys, or keys that never repeat, as an order's events a few micro-batches apart), the broker
    apart; its commit (the driver's) is left out."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from connector.spark import OrderlyMQDataSource

    schema = StructType([StructField("key", StringType()), StructField("body", BinaryType())])
    batches = _task_batches(rows, distinct_keys)
    conn = BrokerConnection(address)
    figures = {}
    for exactly_once in ("false", "true"):
        costs = []
        for _ in range(rounds):
            topic = f"task-cpu-{uuid.uuid4().hex[:6]}"
            conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=QUEUES))
            source = OrderlyMQDataSource({"brokers": address, "topic": topic, "shardingKey": "key",
                                          "exactlyOnce": exactly_once})
            writer = source.streamWriter(schema, False)
            started = time.process_time()
            message = writer.write(iter(batches))
            costs.append((time.process_time() - started) / message.rows * 1e9)
            writer.commit([message], 0)
        figures[_GUARANTEES[exactly_once]] = statistics.median(costs)
    conn.close()
    return figures


def _task_batches(rows: int, distinct_keys: bool) -> list[pa.RecordBatch]:
    batch = make_table(PULL_BATCH_ROWS).to_batches()[0]
    if not distinct_keys:
        return [batch] * (rows // PULL_BATCH_ROWS)
    return [batch.set_column(0, "key", pa.array([f"order-{n}" for n in range(first, first + PULL_BATCH_ROWS)]))
            for first in range(0, rows - PULL_BATCH_ROWS + 1, PULL_BATCH_ROWS)]


def control_cost_ms(address: str, repeats: int = 30) -> dict[str, float]:
    """Broker round trips one micro-batch makes besides data: lock renewal of every queue, an
    offset commit per queue, and a transaction begin + commit per sink task."""
    conn = BrokerConnection(address)
    topic = f"ctl-{uuid.uuid4().hex[:6]}"
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=QUEUES))
    batch = make_batch(1)
    for q in range(QUEUES):
        conn.call("Send", pb.SendRequest(topic=topic, queue_id=q, batch=batch))
    queues = list(range(QUEUES))
    timings = {"lock renewal": [], "offset commits": [], "transaction commits": []}
    epochs = {}
    for r in range(repeats):
        t0 = time.perf_counter()
        resp = conn.call("LockBatch", pb.LockBatchRequest(group="g", client_id="c", topic=topic, queue_ids=queues))
        epochs = {lk.queue_id: lk.epoch for lk in resp.locked}
        t1 = time.perf_counter()
        for q in queues:
            conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=topic, queue_id=q, offset=1,
                                                             client_id="c", epoch=epochs[q]))
        t2 = time.perf_counter()
        for task in range(QUEUES):
            txn = f"bench-{r}-{task}"
            conn.call("BeginTxn", pb.BeginTxnRequest(txn_id=txn))
            conn.call("Send", pb.SendRequest(topic=topic, queue_id=task, batch=batch, txn_id=txn))
            conn.call("CommitTxn", pb.CommitTxnRequest(txn_id=txn))
        t3 = time.perf_counter()
        timings["lock renewal"].append((t1 - t0) * 1000)
        timings["offset commits"].append((t2 - t1) * 1000)
        timings["transaction commits"].append((t3 - t2) * 1000)
    conn.close()
    return {name: percentile(values, 50) for name, values in timings.items()}


def run(workdir: Path, quick: bool) -> list[Row]:
    rows_total = 200_000 if quick else 4_000_000
    rounds = 1 if quick else 5  # a figure and its ceiling measured in turn, medians: rounds spread widely here
    out: list[Row] = []
    metrics_port = free_port()
    with ScratchBroker(workdir / "spark-bench", "--log-level", "WARNING",
                       "--metrics-port", str(metrics_port)) as broker:
        conn = BrokerConnection(broker.address)
        _prefill(conn, "bench-src", rows_total)
        # An uncounted round of each comparison warms the Python workers of every path. A full run's is
        # full-size: here the run after the first one of that size through the broker and the
        # connector's workers was 19-25% faster (their memory grown to its working size), the ceilings' 3-5%.
        warm_topic, warm_rows = ("bench-warm", 20_000) if quick else ("bench-src", rows_total)
        if quick:
            _prefill(conn, warm_topic, warm_rows)
        conn.close()
        spark = spark_session("orderlymq-bench")
        spark.dataSource.register(MemSource)
        spark.dataSource.register(DiscardSink)
        try:
            source_vs_ceiling(spark, workdir, broker.address, warm_topic, warm_rows)
            sink_vs_ceiling(spark, workdir, broker.address, warm_rows)
            measured = source_vs_ceiling(spark, workdir, broker.address, "bench-src", rows_total, rounds)
            ours, ceiling = medians(measured)
            out.append(Row("spark source: orderlymq -> noop (AvailableNow)", ours, "rows/s", ceiling,
                           "benchmem -> noop", BODY_BYTES, QUEUES, ">= 0.8 of ceiling", round_ratios(measured, 0, 1)))
            cost = BrokerCost(broker, metrics_port)
            measured = sink_vs_ceiling(spark, workdir, broker.address, rows_total, rounds, cost)
            eo, alo, noop, discard = medians(measured)
            out.append(Row("spark sink: benchmem -> orderlymq (exactly once)", eo, "rows/s", discard,
                           "benchmem -> Python discard writer", BODY_BYTES, QUEUES, ">= 0.8 of ceiling",
                           round_ratios(measured, 0, 3) | cost.medians("exactly once")))
            out.append(Row("spark sink: benchmem -> orderlymq (at least once)", alo, "rows/s", discard,
                           "benchmem -> Python discard writer", BODY_BYTES, QUEUES,
                           extra=round_ratios(measured, 1, 3) | cost.medians("at least once")))
            print("spark sink, the broker per run (median):", "; ".join(
                f"{name}: {cpu:.2f} CPU s, CommitTxn {commits:.2f} s" for name in _GUARANTEES.values()
                for cpu, commits in [medians(cost.runs[name])]))
            out.append(Row("spark sink ceiling: benchmem -> Python discard writer", discard, "rows/s", noop,
                           "benchmem -> noop (JVM only)", BODY_BYTES, QUEUES, extra=round_ratios(measured, 3, 2)))
            conn = BrokerConnection(broker.address)
            keyed = _prefill_keyed(conn, "bench-keyed", rows_total)  # written now: its rows are still cached
            conn.close()
            copy_pipeline(spark, workdir, broker.address, "bench-keyed", keyed)
            measured = copy_pipeline(spark, workdir, broker.address, "bench-keyed", keyed, min(rounds, 3))
            eo, alo = medians(measured)
            out.append(Row("spark pipeline: orderlymq -> orderlymq by key (exactly once)", eo, "rows/s", alo,
                           "the same, at least once", BODY_BYTES, QUEUES, extra=round_ratios(measured, 0, 1)))
            p50, p99, phases = end_to_end_latency(spark, workdir, broker.address, *((25, 10) if quick else (200, 300)))
            out.append(Row("end-to-end latency p50 (produce -> sink output)", p50, "ms", goal="<= 150 ms",
                           message_bytes=BODY_BYTES, queues=1, extra={"micro-batch phases, median ms": phases}))
            print("end-to-end latency, micro-batch phases (median ms):",
                  ", ".join(f"{name} {ms:.0f}" for name, ms in phases.items()))
            out.append(Row("end-to-end latency p99 (produce -> sink output)", p99, "ms", goal="<= 500 ms",
                           message_bytes=BODY_BYTES, queues=1))
            floor = micro_batch_floor(spark, workdir, 8 if quick else 10)
            out.append(Row("Spark's own micro-batch: benchmem (1 row) -> Python discard writer, back to back",
                           floor.get("triggerExecution", 0), "ms", message_bytes=BODY_BYTES, queues=1,
                           extra={"micro-batch phases, median ms": floor}))
            print("Spark's own micro-batch, phases (median ms):",
                  ", ".join(f"{name} {ms:.0f}" for name, ms in floor.items()))
            for distinct_keys in (False, True):
                figures = sink_task_cpu_ns(broker.address, 200_000 if quick else 1_000_000, 3,
                                           distinct_keys=distinct_keys)
                for guarantee, ns in figures.items():
                    keys = ", keys that never repeat" if distinct_keys else ""
                    out.append(Row(f"spark sink task: CPU per row written ({guarantee}{keys})", ns, "ns",
                                   message_bytes=BODY_BYTES, queues=QUEUES))
            for name, ms in control_cost_ms(broker.address).items():
                out.append(Row(f"per micro-batch: {name} ({QUEUES} queues)", ms, "ms", queues=QUEUES))
        finally:
            spark.stop()
    return out
