"""The orderlymq demo: ordered events in, ordered notifications out, checked per key.

1. starts the embedded broker (data under ./demo-data, fresh each run unless --keep-data),
   or uses --brokers;
2. a producer emits bank-account balance changes and orders (created -> paid -> shipped),
   interleaved across thousands of accounts, keyed by account;
3. a Structured Streaming query reads ``format("orderlymq")``, derives one notification per
   event and writes them with ``writeStream.format("orderlymq")`` keyed by account (exactly once);
4. a checker consumes the notifications and verifies, per account, that every one arrived in
   order and exactly once; a summary table ends the run (exit code 1 if anything is off).

Runs with ``python spark_jobs/demo.py`` and with ``spark-submit spark_jobs/demo.py``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.report import percentile  # noqa: E402
from connector.history import Verdict, check_keyed  # noqa: E402
from spark_jobs.session import spark_session  # noqa: E402

console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="orderlymq demo pipeline", prog="demo.py")
    p.add_argument("--messages", type=int, default=100_000, help="events to produce (default 100000)")
    p.add_argument("--duration", type=float, default=0,
                   help="produce for this many seconds instead of a fixed count (at --rate events/s)")
    p.add_argument("--rate", type=int, default=5_000, help="events per second with --duration")
    p.add_argument("--accounts", type=int, default=5_000, help="distinct accounts (sharding keys)")
    p.add_argument("--queues", type=int, default=8, help="MessageQueues per topic")
    p.add_argument("--brokers", help="use this broker (host:port) instead of starting the embedded one")
    p.add_argument("--data-dir", type=Path, default=Path("demo-data"), help="embedded broker data and checkpoints")
    p.add_argument("--keep-data", action="store_true", help="reuse --data-dir instead of starting fresh")
    p.add_argument("--trigger", default="1 second", help="micro-batch trigger interval")
    p.add_argument("--max-per-trigger", type=int, default=20_000, help="maxMessagesPerTrigger of the source")
    p.add_argument("--timeout", type=float, default=600, help="give up waiting for the output after this long")
    p.add_argument("--master", help="Spark master when not run by spark-submit (default local[2])")
    p.add_argument("--quick", action="store_true", help="a small run: 3000 events over 300 accounts")
    p.add_argument("--summary-json", type=Path, help="also write the summary here")
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.accounts = 3_000, 300
    for name in ("messages", "accounts", "queues", "rate", "max_per_trigger"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


class Broker:
    """The embedded broker (a child process) or an external one."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.process = None
        if args.brokers:
            self.address = args.brokers
            return
        from broker.launcher import BrokerProcess

        data = args.data_dir / "broker"
        data.mkdir(parents=True, exist_ok=True)
        self.process = BrokerProcess(data, "--flush", "async", log_path=args.data_dir / "broker.log").start()
        self.address = self.process.address

    def stop(self) -> None:
        if self.process:
            self.process.stop()


def produce(address: str, topic: str, args: argparse.Namespace, produced: Counter, progress, task,
            stop: threading.Event) -> None:
    from connector.client import Producer
    from spark_jobs.workload import generate

    total = args.messages if not args.duration else int(args.duration * args.rate)
    chunk = max(1, min(5_000, args.rate // 4)) if args.duration else 5_000
    with Producer(address) as producer:
        started = time.monotonic()
        for i, messages in enumerate(generate(total, args.accounts, chunk=chunk)):
            if stop.is_set():
                break
            producer.send_batch(topic, messages)
            produced.update(m["key"] for m in messages)
            progress.advance(task, len(messages))
            if args.duration:  # pace to --rate
                ahead = (i + 1) * chunk / args.rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)


def check_output(address: str, topic: str, queues: int, delivered: list[tuple[str, int]],
                 latencies: list[tuple[int, int]], progress, task, stop: threading.Event) -> None:
    """Read every queue of the output topic as it fills, recording (account, seq) in emission order."""
    from connector.client import PullConsumer

    offsets = [0] * queues
    with PullConsumer(address) as consumer:
        while not stop.is_set():
            got = 0
            for q in range(queues):
                result = consumer.pull(topic, q, offsets[q], max_messages=5_000, wait_ms=0)
                for m in result:
                    note = json.loads(m.body)
                    delivered.append((note["account"], note["seq"]))
                    latencies.append((note["event_born"], m.store_timestamp - note["event_born"]))
                got += len(result.messages)
                offsets[q] = result.next_offset
            progress.advance(task, got)
            if not got:
                stop.wait(0.2)


def start_query(spark, address: str, events_topic: str, out_topic: str, args, checkpoint: Path):
    from spark_jobs.workload import notifications

    events = (spark.readStream.format("orderlymq")
              .option("brokers", address).option("topic", events_topic)
              .option("consumerGroup", "demo-notifier").option("startingOffsets", "earliest")
              .option("maxMessagesPerTrigger", str(args.max_per_trigger)).load())
    return (notifications(events).writeStream.format("orderlymq")
            .option("brokers", address).option("topic", out_topic)
            .option("shardingKey", "account").option("tagColumn", "tag").option("bodyColumn", "body")
            .option("checkpointLocation", str(checkpoint))
            .queryName("demo-notifications")
            .trigger(processingTime=args.trigger).start())


def first_batch_end_ms(progress_log: list[dict]) -> float:
    """When the first micro-batch with data finished (ms since the epoch): events born after it
    did not wait for Spark's Python workers to start."""
    from datetime import datetime

    for p in progress_log:
        if p.get("numInputRows"):
            started = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
            return started + p["durationMs"].get("triggerExecution", 0)
    return float("inf")


def settled_progress(query, events: int, timeout: float = 30.0) -> list[dict]:
    """The query's progress reports once they account for every event: the output can be read
    before Spark reports the batch that wrote it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        progress_log = query.recentProgress
        if sum(p.get("numInputRows", 0) for p in progress_log) >= events:
            return progress_log
        time.sleep(0.2)
    return query.recentProgress


def latency_text(values: list[float]) -> str:
    return f"{percentile(values, 50):.0f} / {percentile(values, 99):.0f}" if values else "n/a (none after warm-up)"


def summary(report: Verdict, args, elapsed: float, latencies: list[tuple[int, int]],
            batch_ms: list[float], batches: int, warm_from_ms: float) -> dict:
    return {
        "messages produced": report.sends,
        "notifications checked": report.deliveries,
        "keys (accounts)": report.keys,
        "queues": args.queues,
        "out-of-order": report.out_of_order,
        "duplicates": report.duplicated,
        "lost": report.lost,
        "unexpected": report.unexpected,
        "micro-batches": batches,
        "end-to-end throughput (msg/s)": round(report.deliveries / elapsed, 1) if elapsed else 0,
        "batch latency p50 / p99 (ms)": f"{percentile(batch_ms, 50):.0f} / {percentile(batch_ms, 99):.0f}",
        "event -> notification p50 / p99 (ms)": latency_text([lat for _, lat in latencies]),
        "  ... for events after the first batch": latency_text([lat for born, lat in latencies if born > warm_from_ms]),
    }


def print_summary(rows: dict, report: Verdict) -> None:
    table = Table(title="orderlymq demo: ordered notifications, checked per account")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in rows.items():
        style = "red" if name in ("out-of-order", "duplicates", "lost", "unexpected") and value else None
        table.add_row(name, f"{value:,}" if isinstance(value, int) else str(value), style=style)
    console.print(table)
    for example in report.examples:
        console.print(f"[red]  {example}")
    console.print("[green]every notification arrived in order and exactly once" if report.ok
                  else "[red]ORDER OR DELIVERY CHECK FAILED")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.keep_data and not args.brokers:
        shutil.rmtree(args.data_dir, ignore_errors=True)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    run = uuid.uuid4().hex[:6]
    events_topic, out_topic = f"demo.events.{run}", f"demo.notifications.{run}"
    with console.status("starting the broker and Spark ..."):
        broker = Broker(args)
        from connector.client import Admin

        with Admin(broker.address) as admin:
            admin.create_topic(events_topic, args.queues)
            admin.create_topic(out_topic, args.queues)
        spark = spark_session("orderlymq-demo", args.master)
    console.print(f"broker {broker.address}; topics {events_topic} -> {out_topic} ({args.queues} queues each)")
    produced: Counter = Counter()
    delivered: list[tuple[str, int]] = []  # appended by the checking thread, in emission order
    latencies: list[tuple[int, int]] = []
    stop = threading.Event()
    query = None
    total = args.messages if not args.duration else int(args.duration * args.rate)
    try:
        query = start_query(spark, broker.address, events_topic, out_topic, args, args.data_dir / f"checkpoint-{run}")
        started = time.monotonic()
        with Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            produce_task = progress.add_task("producing events", total=total)
            check_task = progress.add_task("notifications checked", total=total)
            producer = threading.Thread(target=produce, daemon=True, args=(
                broker.address, events_topic, args, produced, progress, produce_task, stop))
            consumer = threading.Thread(target=check_output, daemon=True, args=(
                broker.address, out_topic, args.queues, delivered, latencies, progress, check_task, stop))
            producer.start()
            consumer.start()
            deadline = started + args.timeout
            while time.monotonic() < deadline:
                if query.exception() is not None:
                    raise RuntimeError(f"the streaming query failed: {query.exception()}")
                if not producer.is_alive() and len(delivered) >= sum(produced.values()):
                    break
                time.sleep(0.25)
            elapsed = time.monotonic() - started
            stop.set()
            producer.join(timeout=10)
            consumer.join(timeout=10)
        progress_log = settled_progress(query, sum(produced.values()))
        batch_ms = [p["durationMs"].get("triggerExecution", 0) for p in progress_log if p.get("numInputRows")]
        report = check_keyed(produced, delivered)
        rows = summary(report, args, elapsed, latencies, batch_ms, len(batch_ms),
                       first_batch_end_ms(progress_log))
        print_summary(rows, report)
        if args.summary_json:
            args.summary_json.write_text(json.dumps(rows | {"ok": report.ok}, indent=2))
        return 0 if report.ok else 1
    finally:
        stop.set()
        if query is not None:
            query.stop()
        spark.stop()
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
