"""Broker benchmarks over loopback gRPC, each against its transport ceiling in the same run.

The broker runs as its own process (``BrokerProcess``), as does the ceiling server, so client
and server do not share a GIL. Payloads are encoded once up front: the figures measure the
transport and the broker, not the benchmark's own batch building.
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from bench.ceiling import CeilingProcess, ceiling_channel, push_callable
from bench.report import Row, cpu_seconds, in_turn, medians, percentile, round_ratios
from bench.scratch_broker import ScratchBroker
from broker.launcher import BrokerProcess
from broker.storage.page_cache import AUTO, window_bytes
from broker.wire import codec
from broker.wire.send_request import encode_send_request
from connector.client.connection import BrokerConnection, pb

BODY_BYTES = 100


def make_table(rows: int, body_bytes: int = BODY_BYTES, keys: int = 1000) -> pa.Table:
    body = b"x" * body_bytes
    return pa.table({
        "key": pa.array([f"key-{i % keys}" for i in range(rows)], pa.string()),
        "body": pa.array([body] * rows, pa.binary()),
    })


def make_batch(rows: int, body_bytes: int = BODY_BYTES, keys: int = 1000) -> bytes:
    return codec.encode(codec.normalize(make_table(rows, body_bytes, keys)))


def _timed_threads(work, threads: int, seconds: float) -> tuple[int, float]:
    """Run ``work(stop_event) -> count`` on ``threads`` threads for ``seconds``; (total, elapsed)."""
    stop = threading.Event()
    counts = [0] * threads

    def run(i):
        counts[i] = work(stop, i)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    return sum(counts), time.perf_counter() - t0


def ingest(workdir: Path, seconds: float, flush: str, rows_per_batch: int = 10_000, queues: int = 8,
           threads: int = 2, body_bytes: int = BODY_BYTES, sustained: bool = False) -> float:
    """Batched produce: msgs/s into the broker.

    Like the ceiling (``ingest_ceiling``), it sends bytes built beforehand: one request per queue,
    through ``BrokerConnection`` as the client sends. Encoding a fresh 1.4 MB request per call would
    add the client's copy, about 1 ms of CPU each (its page faults, measured), which the ceiling
    does not pay.

    ``sustained`` times a broker that has written more than its page-cache window first
    (``_fill_page_cache_window``), as one in service has; otherwise a broker just started."""
    payload = make_batch(rows_per_batch, body_bytes)
    requests = [encode_send_request("bench", queue, payload) for queue in range(queues)]
    os.sync()  # each run starts with no earlier run's writes still to go to disk
    with ScratchBroker(workdir / f"ingest-{flush}-{queues}-{body_bytes}-{threads}-{uuid.uuid4().hex[:6]}", "--flush",
                       flush, "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="bench", queue_count=queues))

        def send(q: int) -> None:
            conn.call("Send", requests[q % queues])

        if sustained:
            _fill_page_cache_window(send, len(payload))
        rate = _batches_rate(send, rows_per_batch, threads, seconds)
        conn.close()
    return rate


def _fill_page_cache_window(send: Callable[[int], object], batch_bytes: int) -> None:
    """Untimed, ``send`` batches of ``batch_bytes`` until the broker wrote its page-cache window
    and a quarter more (``broker.storage.page_cache``; nothing where it keeps none). Until then each
    append takes memory the machine has not used since it gave it back to its host, which costs
    several times a reused page (README, "Page cache"); after it, appends reuse what the drops free,
    as in a broker that has been running."""
    window = window_bytes(AUTO)  # the benchmark's brokers run on this machine with the default
    for q in range(-(-(window + window // 4) // batch_bytes)):
        send(q)


def ingest_ceiling(workdir: Path, seconds: float, rows_per_batch: int = 10_000, threads: int = 2) -> float:
    """``ingest``'s batches through the bare transport (a gRPC server that drops them): msgs/s."""
    payload = make_batch(rows_per_batch)
    os.sync()
    with CeilingProcess(workdir) as ceiling:
        channel = ceiling_channel(ceiling.address)
        push = push_callable(channel)
        rate = _batches_rate(lambda q: push(payload), rows_per_batch, threads, seconds)
        channel.close()
    return rate


def _batches_rate(send: Callable[[int], object], rows_per_batch: int, threads: int, seconds: float) -> float:
    """Msgs/s of ``threads`` threads calling ``send(q)`` for ``seconds``, each call a batch of
    ``rows_per_batch``; thread ``i`` counts ``q`` from ``i`` in steps of ``threads``."""

    def work(stop, i):
        n, q = 0, i
        while not stop.is_set():
            send(q)
            n += rows_per_batch
            q += threads
        return n

    total, elapsed = _timed_threads(work, threads, seconds)
    return total / elapsed


def disk_write(workdir: Path, seconds: float, rows_per_batch: int = 10_000, queues: int = 8) -> float:
    """The messages per second the disk takes as the broker writes them: the same batches, one
    ``pwritev`` each, round robin over ``queues`` files, with nothing else. Past the page cache's
    dirty limit (10% of memory by default) the kernel makes a writer wait for the disk."""
    payload, files = make_batch(rows_per_batch), []
    os.sync()
    try:
        for queue in range(queues):
            files.append(os.open(workdir / f"disk-write-{queue}", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
        written, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            os.pwritev(files[written % queues], [payload], written // queues * len(payload))
            written += 1
        return written * rows_per_batch / (time.perf_counter() - started)
    finally:
        for fd in files:
            os.close(fd)
        for queue in range(queues):
            (workdir / f"disk-write-{queue}").unlink(missing_ok=True)


def producer_ingest(workdir: Path, seconds: float, rows_per_batch: int = 10_000, queues: int = 8,
                    threads: int = 2, *, dicts: bool = False) -> float:
    """Batched produce as a user does it: ``Producer.send_batch`` of one prebuilt keyed table
    (default limits), or with ``dicts`` of message dicts whose keys do not repeat within a call,
    from ``threads`` threads; msgs/s. The client routes every row and encodes each queue's share,
    so this measures the client as much as the broker. Checked: each queue holds exactly the rows
    acknowledged, and a call's rows of one key got increasing offsets."""
    from connector.client import Producer

    table = make_table(rows_per_batch)
    keys = table.column("key").to_pylist()
    messages = table
    if dicts:
        keys = [f"order-{n}" for n in range(rows_per_batch)]
        bodies = table.column("body").to_pylist()
        messages = [{"key": key, "body": body} for key, body in zip(keys, bodies, strict=True)]
    with ScratchBroker(workdir / ("producer-ingest-dicts" if dicts else "producer-ingest"), "--flush", "async",
                       "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="bench", queue_count=queues))
        with Producer(broker.address) as producer:
            last: list[list] = [[] for _ in range(threads)]

            def work(stop, i):
                n = 0
                while not stop.is_set():
                    last[i] = producer.send_batch("bench", messages)
                    n += rows_per_batch
                return n

            total, elapsed = _timed_threads(work, threads, seconds)
        stored = sum(conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic="bench", queue_id=q)).max_offset
                     for q in range(queues))
        conn.close()
    if stored != total:
        raise AssertionError(f"Producer.send_batch: {total} messages acknowledged, {stored} stored")
    for results in last:
        _check_key_offsets(keys, results)
    return total / elapsed


def _check_key_offsets(keys: list, results: list) -> None:
    """One call's results: each key in one queue, at increasing offsets in input order."""
    seen: dict = {}
    for key, result in zip(keys, results, strict=True):
        queue, offset = seen.get(key, (result.queue_id, -1))
        if result.queue_id != queue or result.queue_offset <= offset:
            raise AssertionError(f"Producer.send_batch: key {key!r} out of order or split across queues")
        seen[key] = (queue, result.queue_offset)


def sync_sends(workdir: Path, seconds: float, flush: str = "sync") -> tuple[float, float]:
    """Strict send-and-wait of one-message batches from one thread: (sends/s, ceiling calls/s)."""
    payload = make_batch(1)
    with ScratchBroker(workdir / f"sync-{flush}", "--flush", flush, "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="bench", queue_count=1))
        request = pb.SendRequest(topic="bench", queue_id=0, batch=payload)
        stub = conn.stub
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            stub.Send(request)
            n += 1
        ours = n / (time.perf_counter() - t0)
        conn.close()
    with CeilingProcess(workdir) as ceiling:
        channel = ceiling_channel(ceiling.address)
        push = push_callable(channel)
        raw = request.SerializeToString()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            push(raw)
            n += 1
        ceiling_rate = n / (time.perf_counter() - t0)
        channel.close()
    return ours, ceiling_rate


def _drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def backlog_pull(workdir: Path, messages: int, queues: int = 8) -> dict:
    """Write a backlog, then pull it all from disk (page cache dropped where allowed).

    Returns pull msgs/s, the ceiling (the same bytes pushed through the bare transport), and the
    broker's RSS sampled while writing and while reading.
    """
    rows = 10_000
    payload = make_batch(rows)
    rss_write, rss_read = [], []
    with ScratchBroker(workdir / "backlog", "--flush", "async", "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="backlog", queue_count=queues))
        for i in range(messages // rows):
            conn.call("Send", pb.SendRequest(topic="backlog", queue_id=i % queues, batch=payload))
            if i % 50 == 0:
                rss_write.append(_rss_mb(broker.pid))
        cold = _drop_page_cache()
        pulled, pulled_bytes = 0, 0
        t0 = time.perf_counter()
        stub = conn.stub
        for q in range(queues):
            offset = 0
            while True:
                resp = stub.Pull(pb.PullRequest(topic="backlog", queue_id=q, offset=offset, max_messages=100_000))
                pulled += sum(pa.ipc.open_stream(b).read_all().num_rows for b in resp.batches)
                pulled_bytes += sum(len(b) for b in resp.batches)
                offset = resp.next_offset
                if len(rss_read) < 1000:
                    rss_read.append(_rss_mb(broker.pid))
                if offset >= resp.max_offset:
                    break
        elapsed = time.perf_counter() - t0
        conn.close()
    assert pulled == messages // rows * rows, f"pulled {pulled} of {messages}"
    # Ceiling: the same response bytes through the bare transport (server -> client direction
    # approximated by client -> server pushes of equal size).
    with CeilingProcess(workdir) as ceiling:
        channel = ceiling_channel(ceiling.address)
        push = push_callable(channel)
        chunk = payload * 10
        t1, sent = time.perf_counter(), 0
        while sent < pulled_bytes:
            push(chunk)
            sent += len(chunk)
        ceiling_rate = pulled / (time.perf_counter() - t1)
        channel.close()
    return {
        "pull_rate": pulled / elapsed,
        "ceiling": ceiling_rate,
        "cold_cache": cold,
        "rss_write_mb": (min(rss_write, default=0), max(rss_write, default=0)),
        "rss_read_mb": (min(rss_read, default=0), max(rss_read, default=0)),
    }


def _one_message_records(address: str, topic: str, messages: int, queues: int) -> None:
    """Store ``messages`` one-message records (what ``Producer.send`` stores), pipelined on the
    send port so that writing a large backlog takes seconds, not minutes."""
    from broker.wire.frames import LENGTH, hello
    from broker.wire.one_message import encode_one

    with BrokerConnection(address) as conn:
        port = conn.call("Health", pb.HealthRequest()).send_port
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(hello())
        sock.recv(len(hello()))
        window = 500
        for start in range(0, messages, window):
            frames = []
            for i in range(start, min(start + window, messages)):
                request = pb.SendRequest(topic=topic, queue_id=i % queues, batch=encode_one(
                    {"key": f"key-{i % 1000}", "body": b"%08d" % i + b"x" * (BODY_BYTES - 8)})).SerializeToString()
                frames.append(LENGTH.pack(len(request)) + request)
            sock.sendall(b"".join(frames))
            answered, pending = 0, b""
            while answered < len(frames):
                pending += sock.recv(1 << 20)
                while len(pending) >= LENGTH.size and len(pending) >= LENGTH.size + LENGTH.unpack_from(pending)[0]:
                    size = LENGTH.unpack_from(pending)[0]
                    if pb.SendResponse.FromString(pending[LENGTH.size:LENGTH.size + size]).error_code:
                        raise AssertionError(f"a send failed: {pending[LENGTH.size:LENGTH.size + size]!r}")
                    pending = pending[LENGTH.size + size:]
                    answered += 1


def _pull_all(address: str, topic: str, queues: int) -> tuple[int, float]:
    """Every message of the topic pulled queue by queue, offsets checked contiguous: (count, msg/s)."""
    pulled = 0
    with BrokerConnection(address) as conn:
        stub = conn.stub
        t0 = time.perf_counter()
        for q in range(queues):
            offset = 0
            while True:
                resp = stub.Pull(pb.PullRequest(topic=topic, queue_id=q, offset=offset, max_messages=100_000))
                for b in resp.batches:
                    table = pa.ipc.open_stream(b).read_all()
                    if table.num_rows and table.column("queue_offset")[0].as_py() != offset:
                        raise AssertionError(f"queue {q}: a pull from {offset} started elsewhere")
                    offset += table.num_rows
                    pulled += table.num_rows
                if offset >= resp.max_offset:
                    break
        return pulled, pulled / (time.perf_counter() - t0)


def small_records_pull(workdir: Path, messages: int, queues: int = 8, segment_mib: int = 4) -> dict:
    """A backlog of one-message records pulled as written, then after compaction merged it (same
    data directory, broker restarted with compaction on); page cache warm both times."""
    data = workdir / "small-records"
    config = workdir / "small-records.toml"
    config.write_text(f"[broker]\nsegment_bytes = {segment_mib << 20}\ncompact_interval_ms = 0\n")
    with BrokerProcess(data, "--config", str(config), "--flush", "async", "--log-level", "WARNING") as broker:
        BrokerConnection(broker.address).call("CreateTopic", pb.CreateTopicRequest(topic="small", queue_count=queues))
        _one_message_records(broker.address, "small", messages, queues)
        count, as_written = _pull_all(broker.address, "small", queues)
    config.write_text(f"[broker]\nsegment_bytes = {segment_mib << 20}\ncompact_interval_ms = 200\n")
    segments = sorted((data / "topics" / "small").glob("*/*.log"))
    with ScratchBroker(data, "--config", str(config), "--flush", "async", "--log-level", "WARNING") as broker:
        t0 = time.perf_counter()
        while not _merged(data / "topics" / "small") and time.perf_counter() - t0 < 300:
            time.sleep(0.2)
        merge_s = time.perf_counter() - t0
        again, merged = _pull_all(broker.address, "small", queues)
    if count != messages or again != messages:
        raise AssertionError(f"pulled {count} then {again} of {messages} messages")
    return {"as_written": as_written, "merged": merged, "merge_s": merge_s, "segments": len(segments)}


def _merged(topic_dir: Path) -> bool:
    """Every segment of every queue merged: its first record holds more than the one message
    each record was written with (the last one too: compaction closes an idle active segment)."""
    from broker.storage.record import HEADER, parse_header

    for log in topic_dir.glob("*/*.log"):
        with open(log, "rb") as f:
            header = parse_header(f.read(HEADER.size))
        if header is None or header.count == 1:
            return False
    return True


def long_poll_latency(workdir: Path, samples: int, clients: bool = False) -> tuple[float, float]:
    """Send -> receipt latency of a consumer long-polling the tail: (p50 ms, p99 ms). ``clients``:
    ``Producer.send`` and ``PullConsumer.pull(wait_ms=...)`` (the lean port), else bare gRPC calls.
    Checks that the messages came in the order sent."""
    from connector.client import Producer, PullConsumer

    with ScratchBroker(workdir / f"latency-{clients}", "--log-level", "WARNING") as broker, \
            Producer(broker.address) as producer, PullConsumer(broker.address) as pull_consumer:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="lat", queue_count=1))
        latencies: list[float] = []
        sent_at: list[float] = []
        received: list[int] = []

        def pull(offset: int) -> tuple[list[bytes], int]:
            if clients:
                result = pull_consumer.pull("lat", 0, offset, 32, wait_ms=2000)
                return [m.body for m in result], result.next_offset
            resp = conn.call("Pull", pb.PullRequest(topic="lat", queue_id=0, offset=offset, wait_ms=2000))
            return codec.decode_many(resp.batches).column("body").to_pylist(), resp.next_offset

        def consume():
            offset = 0
            while offset < samples:
                bodies, offset = pull(offset)
                now = time.perf_counter()
                for body in bodies:
                    received.append(int(body))
                    latencies.append((now - sent_at[int(body)]) * 1000)

        consumer = threading.Thread(target=consume)
        consumer.start()
        for i in range(samples):
            body = str(i).zfill(BODY_BYTES)
            # A bare send's batch is made before the clock starts; Producer.send makes its own.
            batch = None if clients else codec.encode(codec.messages_to_batch([{"body": body}]))
            sent_at.append(time.perf_counter())
            if batch is None:
                producer.send("lat", body, queue_id=0)
            else:
                conn.call("Send", pb.SendRequest(topic="lat", queue_id=0, batch=batch))
            time.sleep(0.005)
        consumer.join(timeout=30)
        conn.close()
    if received != list(range(samples)):
        raise AssertionError(f"long-poll delivery: {len(received)} of {samples} messages came, or out of order")
    return percentile(latencies, 50), percentile(latencies, 99)


def trickle_delivery(workdir: Path, samples: int, interval_s: float, orderly: bool, queues: int = 8
                     ) -> tuple[float, float]:
    """Send -> listener latency of a consumer caught up on its queues, a message every
    ``interval_s`` (16 keys, one synchronous send each): (p50 ms, p99 ms). Checks that every
    message was consumed, each key's in order for an ``OrderlyConsumer``."""
    from connector.client import (
        ConcurrentConsumer,
        ConsumeConcurrentlyStatus,
        ConsumeOrderlyStatus,
        OrderlyConsumer,
        Producer,
    )

    what = "orderly trickle" if orderly else "concurrent trickle"
    with ScratchBroker(workdir / what.replace(" ", "-"), "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="trickle", queue_count=queues))
        conn.close()
        sent_at: dict[int, float] = {}
        latencies: list[float] = []
        seen: dict[str, list[int]] = {}
        done = threading.Event()
        consumed = ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        def listener(batch, context):
            now = time.perf_counter()
            for message in batch:
                seq = int(message.body)
                latencies.append((now - sent_at[seq]) * 1000)
                seen.setdefault(message.key, []).append(seq)
            if len(latencies) >= samples:
                done.set()
            return consumed

        consumer = (OrderlyConsumer if orderly else ConcurrentConsumer)(broker.address, "bench", listener)
        consumer.subscribe("trickle")
        consumer.start()
        try:
            time.sleep(2)  # the consumer took its queues and caught up
            with Producer(broker.address) as producer:
                for seq in range(samples):
                    sent_at[seq] = time.perf_counter()
                    producer.send("trickle", b"%d" % seq, key=f"key-{seq % 16}")
                    time.sleep(interval_s)
            done.wait(60)
        finally:
            consumer.shutdown()
    _check_numbered(seen, samples, what, ordered=orderly)
    return percentile(latencies, 50), percentile(latencies, 99)


def pipelined_sends(workdir: Path, messages: int, queues: int = 8, callbacks: bool = False) -> float:
    """Per-message ``send_async`` with acks (pipelined, coalesced, idempotent), then check that
    every queue holds each key's messages complete and in order. Returns acked msgs/s. The acks
    are read from the futures, all kept until the end, or with ``callbacks`` counted by a
    callback per send (RocketMQ's ``SendCallback``), which keeps nothing."""
    from connector.client import Producer

    keys = 1000
    acked = collections.Counter()

    def count(future) -> None:
        acked[future.exception() is None] += 1

    name = f"pipelined{'-callbacks' if callbacks else ''}-{uuid.uuid4().hex[:6]}"
    with ScratchBroker(workdir / name, "--flush", "async", "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="pipe", queue_count=queues))
        body = b"x" * (BODY_BYTES - 8)
        with Producer(broker.address) as producer:
            t0 = time.perf_counter()
            if callbacks:
                for i in range(messages):
                    producer.send_async("pipe", body + str(i).zfill(8).encode(), key=f"key-{i % keys}", callback=count)
                producer.flush()
            else:
                futures = [producer.send_async("pipe", body + str(i).zfill(8).encode(), key=f"key-{i % keys}")
                           for i in range(messages)]
                producer.flush()
                for f in futures:
                    acked[f.exception() is None] += 1
            rate = messages / (time.perf_counter() - t0)
        if acked[True] != messages:
            raise AssertionError(f"pipelined sends: {acked[True]} of {messages} acknowledged, {acked[False]} failed")
        stored = _stored_sequences(conn, "pipe", queues)
        conn.close()
    _check_numbered(stored, messages, "pipelined sends")
    return rate


def orderly_consume(workdir: Path, messages: int, queues: int = 8) -> float:
    """An ``OrderlyConsumer`` (defaults: 4 consume threads, one message per listener call) reading a
    backlog of ``messages`` numbered messages over 1,000 keys, from start until the last; checks
    that every key's messages came once each, in order. Returns msgs/s."""
    return _consume_backlog(workdir, messages, queues, orderly=True)


def concurrent_consume(workdir: Path, messages: int, queues: int = 8) -> float:
    """``orderly_consume`` with a ``ConcurrentConsumer`` (defaults: 4 consume threads, one message
    per listener call): every message once, in no particular order. Returns msgs/s."""
    return _consume_backlog(workdir, messages, queues, orderly=False)


def _consume_backlog(workdir: Path, messages: int, queues: int, orderly: bool) -> float:
    from connector.client import (
        ConcurrentConsumer,
        ConsumeConcurrentlyStatus,
        ConsumeOrderlyStatus,
        OrderlyConsumer,
    )

    what = "orderly consume" if orderly else "concurrent consume"
    with ScratchBroker(workdir / what.replace(" ", "-"), "--flush", "async", "--log-level", "WARNING") as broker:
        _numbered_backlog(broker.address, "consume", queues, messages)
        seen: dict[str, list[int]] = {}
        done = threading.Event()
        count = itertools.count(1)
        consumed = ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        def listener(batch, context):
            for message in batch:
                seen.setdefault(message.key, []).append(int(message.body[-8:]))
                if next(count) == messages:
                    done.set()
            return consumed

        consumer = (OrderlyConsumer if orderly else ConcurrentConsumer)(broker.address, "bench", listener,
                                                                         consume_from="earliest")
        consumer.subscribe("consume")
        t0 = time.perf_counter()
        consumer.start()
        finished = done.wait(300)
        rate = messages / (time.perf_counter() - t0)
        consumer.shutdown()
    if not finished:
        raise AssertionError(f"{what}: {sum(map(len, seen.values()))} of {messages} messages in 300 s")
    _check_numbered(seen, messages, what, ordered=orderly)
    return rate


def pull_consumer_poll(workdir: Path, messages: int, queues: int = 8) -> tuple[float, float]:
    """``PullConsumer.poll()`` (32 messages a call, its default) reading a backlog stored by
    ``send_batch`` (records of about 10,000 / ``queues`` messages) from start to end; checks that
    every key's messages came once each, in order. Returns (msgs/s, broker CPU µs per message)."""
    import psutil

    from connector.client import PullConsumer

    with ScratchBroker(workdir / "poll", "--log-level", "WARNING") as broker:
        _numbered_backlog(broker.address, "poll", queues, messages)
        seen: dict[str, list[int]] = {}
        server = psutil.Process(broker.pid)
        with PullConsumer(broker.address, group="bench") as consumer:
            consumer.assign("poll")
            cpu_before, t0 = cpu_seconds(server), time.perf_counter()
            while batch := consumer.poll():
                for message in batch:
                    seen.setdefault(message.key, []).append(int(message.body[-8:]))
            seconds, cpu = time.perf_counter() - t0, cpu_seconds(server) - cpu_before
    _check_numbered(seen, messages, "PullConsumer.poll")
    return messages / seconds, cpu / messages * 1e6


def _numbered_backlog(address: str, topic: str, queues: int, messages: int) -> None:
    """``topic`` of ``queues`` queues holding ``messages`` messages numbered in their bodies' last 8
    bytes, over 1,000 keys, stored by ``send_batch`` 10,000 at a time."""
    from connector.client import Producer

    conn = BrokerConnection(address)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=queues))
    conn.close()
    body = b"x" * (BODY_BYTES - 8)
    with Producer(address) as producer:
        for start in range(0, messages, 10_000):
            producer.send_batch(topic, [{"key": f"key-{n % 1000}", "body": body + b"%08d" % n}
                                        for n in range(start, min(start + 10_000, messages))])


def _stored_sequences(conn: BrokerConnection, topic: str, queues: int) -> dict[str, list[int]]:
    """Every key's sequence numbers (a body's last 8 bytes) in the order the queues hold them."""
    stored: dict[str, list[int]] = {}
    for q in range(queues):
        offset = 0
        while True:
            resp = conn.call("Pull", pb.PullRequest(topic=topic, queue_id=q, offset=offset, max_messages=100_000))
            table = codec.decode_many(resp.batches)
            for key, body in zip(table.column("key").to_pylist(), table.column("body").to_pylist(), strict=True):
                stored.setdefault(key, []).append(int(body[-8:]))
            offset = resp.next_offset
            if offset >= resp.max_offset:
                break
    return stored


def _check_numbered(stored: dict[str, list[int]], sent: int, what: str, ordered: bool = True) -> None:
    """Messages numbered 0..sent-1 across keys: every number stored once, each key's in order (``ordered``)."""
    if sorted(s for seqs in stored.values() for s in seqs) != list(range(sent)):
        raise AssertionError(f"{what}: messages lost or duplicated")
    if ordered and any(seqs != sorted(seqs) for seqs in stored.values()):
        raise AssertionError(f"{what}: a key's messages are out of order")


def _numbered(template: bytes, seq: int) -> bytes:
    """``template`` (one message whose body ends in ``SEQ#####``) with that field set to ``seq``.
    Arrow stores binary bodies verbatim, so patching the digits keeps a valid batch and costs the
    sending thread nothing that the broker does not also see."""
    return template.replace(b"SEQ#####", b"%08d" % seq)


def concurrent_sync_sends(workdir: Path, seconds: float, threads: int = 8, flush: str = "async") -> float:
    """``threads`` senders, each sending one message at a time and waiting for its ack, each on its
    own key and queue (the way RocketMQ's benchmark drives ordered sync sends). Checks that every
    key's messages are all stored, in order. Returns sends/s."""
    with ScratchBroker(workdir / f"sync-threads-{flush}", "--flush", flush, "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="ordered", queue_count=threads))
        stub = conn.stub

        def work(stop: threading.Event, i: int) -> int:
            template = codec.encode(codec.messages_to_batch([{"key": f"key-{i}", "body": b"x" * 92 + b"SEQ#####"}]))
            seq = 0
            while not stop.is_set():
                stub.Send(pb.SendRequest(topic="ordered", queue_id=i, batch=_numbered(template, seq)))
                seq += 1
            return seq

        total, elapsed = _timed_threads(work, threads, seconds)
        stored = _stored_sequences(conn, "ordered", threads)
        conn.close()
    for key, seqs in stored.items():
        if seqs != list(range(len(seqs))):
            raise AssertionError(f"{key}: stored sequence is not 0..{len(seqs) - 1} in order")
    if sum(map(len, stored.values())) != total:
        raise AssertionError(f"{sum(map(len, stored.values()))} of {total} acknowledged sends stored")
    return total / elapsed


def producer_sync_sends(workdir: Path, seconds: float, threads: int = 1) -> float:
    """``Producer.send`` (the client API: route, encode, wait for the ack) one message at a time on
    each of ``threads`` threads of one producer, each thread on keys of its own. Checks that every
    message is stored once and each key's in order. Returns sends/s."""
    from connector.client import Producer

    with ScratchBroker(workdir / f"producer-sync-{threads}", "--flush", "async", "--log-level", "WARNING") as broker:
        conn = BrokerConnection(broker.address)
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="sync", queue_count=8))
        body = b"x" * (BODY_BYTES - 8)
        numbers = itertools.count()  # one numbering for all threads: a key's numbers still rise
        with Producer(broker.address) as producer:

            def work(stop: threading.Event, thread: int) -> int:
                sent = 0
                while not stop.is_set():
                    n = next(numbers)
                    producer.send("sync", body + b"%08d" % n, key=f"key-{thread}-{n % 100}")
                    sent += 1
                return sent

            total, elapsed = _timed_threads(work, threads, seconds)
        stored = _stored_sequences(conn, "sync", 8)
        conn.close()
    _check_numbered(stored, total, "Producer.send")
    return total / elapsed


def many_clients(workdir: Path, quick: bool) -> list[Row]:
    """A normal producer/consumer pair and ``Health`` beside a crowd of idle clients (open send
    streams and long polls, ``bench.crowd``): their latencies, after the crowd's liveness and the
    pair's order and completeness are checked."""
    from bench.crowd import run_crowd

    crowd = 1_000 if quick else 4_000
    with ScratchBroker(workdir / "many-clients", "--log-level", "WARNING") as broker:
        figures = run_crowd(broker.address, streams=crowd, polls=crowd, pair_messages=1_000 if quick else 10_000)
    summary = figures.summary()
    if not (figures.stood and figures.verdict.ok and not (figures.crowd_errors or figures.pair_errors
                                                          or figures.health_errors)):
        raise AssertionError(f"many clients: {figures.line()}")
    extra = {k: v for k, v in summary.items() if not k.endswith("_ms")}
    what = f"beside {crowd:,} idle streams + {crowd:,} long polls"
    return [Row(f"Producer.send latency {p} {what}", summary[f"send_{p}_ms"], "ms", message_bytes=16, queues=8,
                extra=extra) for p in ("p50", "p99")] + [
            Row(f"Health latency {p} {what}", summary[f"health_{p}_ms"], "ms") for p in ("p50", "p99")]


def scaling(workdir: Path, quick: bool) -> list[Row]:
    """Batched ingest as producer threads, queue count and body size vary (~1 MB batches)."""
    combos = [(t, q, b) for t in (1, 4) for q in (1, 8, 64) for b in (100, 1024, 16384)]
    if quick:
        combos = [(1, 8, 100), (4, 8, 100), (1, 64, 100), (1, 8, 16384)]
    out = []
    for threads, queues, body in combos:
        rows = max(64, 1_000_000 // body)
        rate = ingest(workdir, 0.5 if quick else 3.0, "async", rows_per_batch=rows, queues=queues, threads=threads,
                      body_bytes=body)
        out.append(Row(f"scaling: ingest, {threads} producer thread(s)", rate, "msg/s", message_bytes=body,
                       queues=queues, extra={"MB_per_s": rate * body / 1e6, "rows_per_batch": rows}))
    return out


def run(workdir: Path, quick: bool) -> list[Row]:
    seconds = 1.0 if quick else 8.0
    rows: list[Row] = []
    # Rounds in turn, medians: one run of each moved the ratio by half (0.41-0.74) on this machine.
    measured = [in_turn([lambda: ingest(workdir, seconds, "async", sustained=True),
                         lambda: ingest_ceiling(workdir, seconds),
                         lambda: ingest(workdir, seconds, "async")], r)
                for r in range(1 if quick else 3)]
    ours, ceiling, started = medians(measured)
    disk = disk_write(workdir, seconds)
    rows.append(Row("broker ingest, batched (async flush), sustained (its page-cache window written first)", ours,
                    "msg/s", ceiling, "bare gRPC unary", BODY_BYTES, 8,
                    ">= 1,000,000 msg/s and >= 0.5 of ceiling",
                    {"MB_per_s": ours * BODY_BYTES / 1e6, "of_disk_write": ours / disk,
                     **round_ratios(measured, 0, 1)}))
    rows.append(Row("broker ingest, batched (async flush), a broker just started", started, "msg/s", ceiling,
                    "bare gRPC unary", BODY_BYTES, 8, extra={"of_disk_write": started / disk,
                                                             **round_ratios(measured, 2, 1)}))
    rows.append(Row("disk write of the same batches into new files, nothing else (the bound of a broker just started)",
                    disk, "msg/s", message_bytes=BODY_BYTES, queues=8))
    rows.append(Row("batched produce via Producer.send_batch, 10,000-row keyed table (async flush; the client "
                    "routes each row)", producer_ingest(workdir, seconds), "msg/s", ceiling, "bare gRPC unary",
                    BODY_BYTES, 8))
    rows.append(Row("batched produce via Producer.send_batch, 10,000 message dicts, keys that do not repeat within a "
                    "call (async flush)", producer_ingest(workdir, seconds, dicts=True), "msg/s", ceiling,
                    "bare gRPC unary", BODY_BYTES, 8))
    ours = ingest(workdir, seconds, "sync")
    rows.append(Row("broker ingest, batched (sync flush)", ours, "msg/s", ceiling, "bare gRPC unary", BODY_BYTES, 8,
                    extra={"MB_per_s": ours * BODY_BYTES / 1e6}))
    ours, ceiling = sync_sends(workdir, seconds, "sync")
    rows.append(Row("ordered sync send-and-wait (sync flush)", ours, "msg/s", ceiling, "empty-handler round trip",
                    BODY_BYTES, 1, ">= 2,000/s; >= 0.8 of ceiling"))
    ours, _ = sync_sends(workdir, seconds, "async")
    rows.append(Row("ordered sync send-and-wait (async flush)", ours, "msg/s", ceiling, "empty-handler round trip",
                    BODY_BYTES, 1, ">= 2,000/s"))
    rows.append(Row("ordered sync send-and-wait via Producer.send", producer_sync_sends(workdir, seconds), "msg/s",
                    ceiling, "empty-handler round trip", BODY_BYTES, 8))
    rows.append(Row("ordered sync sends via Producer.send, 8 threads, order verified",
                    producer_sync_sends(workdir, seconds, 8), "msg/s", message_bytes=BODY_BYTES, queues=8))
    for flush in ("async", "sync"):
        rows.append(Row(f"ordered sync sends, 8 senders, order verified ({flush} flush)",
                        concurrent_sync_sends(workdir, seconds, 8, flush), "msg/s", message_bytes=BODY_BYTES,
                        queues=8, goal=">= 2,000/s"))
    # Medians of runs in turn: one run of each moved by a third from hour to hour (80,000-134,000).
    sends = 30_000 if quick else 500_000
    variants = [lambda: pipelined_sends(workdir, sends), lambda: pipelined_sends(workdir, sends, callbacks=True)]
    measured = [in_turn(variants, r) for r in range(1 if quick else 3)]
    for figure, (rate, what) in enumerate(zip(medians(measured), ("", ", a callback per send"), strict=True)):
        rows.append(Row(f"pipelined acked sends{what}, order verified", rate, "msg/s", message_bytes=BODY_BYTES,
                        queues=8, goal=">= 100,000 msg/s", extra={"runs": [round(each[figure]) for each in measured]}))
    rows.append(Row("OrderlyConsumer of a backlog, one message per listener call, order verified",
                    orderly_consume(workdir, 30_000 if quick else 200_000), "msg/s", message_bytes=BODY_BYTES,
                    queues=8))
    rows.append(Row("ConcurrentConsumer of a backlog, one message per listener call, each once",
                    concurrent_consume(workdir, 30_000 if quick else 200_000), "msg/s", message_bytes=BODY_BYTES,
                    queues=8))
    rate, broker_us = pull_consumer_poll(workdir, 30_000 if quick else 200_000)
    rows.append(Row("PullConsumer.poll() (32 a call) of a backlog stored by send_batch, order verified", rate,
                    "msg/s", message_bytes=BODY_BYTES, queues=8, extra={"broker CPU µs per message": round(broker_us, 1)}))
    backlog = backlog_pull(workdir, 500_000 if quick else 10_000_000)
    rows.append(Row("pull backlog from disk" + (" (page cache dropped)" if backlog["cold_cache"] else ""),
                    backlog["pull_rate"], "msg/s", backlog["ceiling"], "bare gRPC of same bytes", BODY_BYTES, 8,
                    ">= 2,000,000 msg/s",
                    {"rss_write_mb": backlog["rss_write_mb"], "rss_read_mb": backlog["rss_read_mb"]}))
    small = small_records_pull(workdir, 200_000 if quick else 1_000_000)
    rows.append(Row("pull backlog of one-message records, merged by compaction (4 MiB segments)", small["merged"],
                    "msg/s", small["as_written"], "the same backlog as written", BODY_BYTES, 8, ">= 1,000,000 msg/s",
                    {"merge_s": small["merge_s"], "segments": small["segments"]}))
    for clients, how in ((False, "bare gRPC Send -> Pull(wait_ms)"), (True, "Producer.send -> PullConsumer.pull(wait_ms)")):
        p50, p99 = long_poll_latency(workdir, 100 if quick else 500, clients)
        for name, ms in (("p50", p50), ("p99", p99)):
            rows.append(Row(f"long-poll delivery latency {name}, {how}, order verified", ms, "ms",
                            message_bytes=BODY_BYTES, queues=1))
    for orderly in (True, False):
        p50, p99 = trickle_delivery(workdir, 20 if quick else 100, 0.3, orderly)
        kind = "OrderlyConsumer" if orderly else "ConcurrentConsumer"
        for name, ms in (("p50", p50), ("p99", p99)):
            rows.append(Row(f"{kind} delivery latency {name}, a message every 300 ms", ms, "ms",
                            message_bytes=3, queues=8))
    rows += many_clients(workdir, quick)
    rows += scaling(workdir, quick)
    return rows
