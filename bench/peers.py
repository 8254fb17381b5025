"""Peers in the same run: orderlymq next to Redis Streams and NATS JetStream on the same workloads.

Each system runs as a server process on loopback, driven from this process by its usual Python
client, on three workloads with 100-byte bodies over 8 streams (orderlymq: 8 queues of a topic;
Redis: 8 stream keys; NATS: 8 subjects of one stream), a message's stream chosen by its key:

- **batched produce**: messages sent in batches of 10,000 (a Redis pipeline, 1,000 JetStream
  publishes in flight, ``Producer.send_batch``), each acknowledged;
- **synchronous send**: one thread sends one message and waits for its acknowledgement, again
  and again (the ordered-message pattern: one synchronous send per event);
- **ordered consume**: every message of the batched run read back, stream by stream.

What was consumed is judged with ``connector.history`` (per key: nothing lost, duplicated or out
of order), so no figure counts a broken run. Durability is set alike where the systems allow:
orderlymq ``flush = "async"``, Redis ``appendfsync everysec``, JetStream's default (fsync in the
background). A peer whose server is not installed (``pip install 'orderlymq[bench]'``) is left out
with a note.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.report import Row
from connector.history import check_keyed

__all__ = ["run"]

BODY_BYTES = 100
STREAMS = 8
BATCH = 10_000
KEYS = 1000


@dataclass(frozen=True)
class Sizes:
    messages: int  # batched produce, then consumed back
    sync_seconds: float


def _message(i: int) -> tuple[str, int, bytes]:
    """Message ``i``: its key, its sequence number within the key, and a body of BODY_BYTES."""
    key, seq = f"key-{i % KEYS}", i // KEYS
    return key, seq, f"{key}:{seq}:".encode().ljust(BODY_BYTES, b"x")


def _stream_of(key: str) -> int:
    return int(key.rsplit("-", 1)[1]) % STREAMS


def _parsed(body: bytes) -> tuple[str, int]:
    key, seq, _ = body.split(b":", 2)
    return key.decode(), int(seq)


def _expected(messages: int) -> dict[str, int]:
    counts: dict[str, int] = {}
    for i in range(messages):
        key = f"key-{i % KEYS}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _per_stream(messages: int) -> list[int]:
    counts = [0] * STREAMS
    for i in range(messages):
        counts[_stream_of(_message(i)[0])] += 1
    return counts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"no server on port {port} after {timeout:.0f}s")


@contextmanager
def _server(cmd: list[str], port: int, log: Path) -> Iterator[None]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _timed(fn: Callable[[], int]) -> float:
    """``fn`` returns how many operations it did; operations per second."""
    t0 = time.perf_counter()
    count = fn()
    return count / (time.perf_counter() - t0)


def _consumed_ok(what: str, expected: dict[str, int], delivered: list[tuple[str, int]]) -> None:
    verdict = check_keyed(expected, delivered)
    if not verdict.ok:
        raise AssertionError(f"{what}: {verdict}")


# -- orderlymq -----------------------------------------------------------------------------------


def _orderlymq(workdir: Path, sizes: Sizes) -> dict[str, float]:
    from broker.launcher import BrokerProcess
    from connector.client import Admin, Producer, PullConsumer

    with BrokerProcess(workdir / "peer-orderlymq", "--flush", "async", "--log-level", "WARNING") as broker:
        Admin(broker.address).create_topic("bench", STREAMS)
        with Producer(broker.address) as producer:

            def batched() -> int:
                for start in range(0, sizes.messages, BATCH):
                    chunk = map(_message, range(start, min(start + BATCH, sizes.messages)))
                    producer.send_batch("bench", [{"key": key, "body": body} for key, _, body in chunk])
                return sizes.messages

            produce_rate = _timed(batched)

            def consume() -> int:
                delivered = []
                with PullConsumer(broker.address) as consumer:
                    for q in range(STREAMS):
                        offset = 0
                        while True:
                            result = consumer.pull("bench", q, offset, max_messages=100_000, wait_ms=0)
                            delivered += [_parsed(m.body) for m in result.messages]
                            offset = result.next_offset
                            if not result.messages:
                                break
                _consumed_ok("orderlymq consume", _expected(sizes.messages), delivered)
                return len(delivered)

            consume_rate = _timed(consume)
            sync_rate = _sync_loop(sizes.sync_seconds, lambda key, body: producer.send("sync", body, key=key),
                                   setup=lambda: Admin(broker.address).create_topic("sync", STREAMS))
    return {"batched produce": produce_rate, "synchronous send": sync_rate, "ordered consume": consume_rate}


def _sync_loop(seconds: float, send: Callable[[str, bytes], object], setup: Callable[[], object]) -> float:
    """One thread: send, wait for the ack, repeat, for ``seconds``; sends per second."""
    setup()
    send(*_message(0)[::2])  # warm the path before timing it
    count, t0 = 0, time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        key, _, body = _message(count)
        send(key, body)
        count += 1
    return count / (time.perf_counter() - t0)


# -- Redis Streams -------------------------------------------------------------------------------


def _redis_binary() -> str | None:
    found = shutil.which("redis-server") or str(Path(sys.executable).parent / "redis-server")
    return found if Path(found).exists() else None


def _redis(workdir: Path, sizes: Sizes) -> dict[str, float]:
    import redis

    port, data = _free_port(), workdir / "peer-redis"
    data.mkdir(parents=True, exist_ok=True)
    cmd = [_redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
           "--appendonly", "yes", "--appendfsync", "everysec"]
    with _server(cmd, port, workdir / "redis.log"):
        client = redis.Redis(host="127.0.0.1", port=port)

        def batched() -> int:
            for start in range(0, sizes.messages, BATCH):
                pipe = client.pipeline(transaction=False)
                for key, _, body in map(_message, range(start, min(start + BATCH, sizes.messages))):
                    pipe.xadd(f"bench-{_stream_of(key)}", {"k": key, "b": body})
                pipe.execute()
            return sizes.messages

        def consume() -> int:
            delivered = []
            for stream in range(STREAMS):
                last = "-"
                while True:
                    entries = client.xrange(f"bench-{stream}", min=last, count=BATCH)
                    if last != "-":
                        entries = entries[1:]  # XRANGE's start is inclusive
                    if not entries:
                        break
                    delivered += [_parsed(fields[b"b"]) for _, fields in entries]
                    last = entries[-1][0]
            _consumed_ok("Redis consume", _expected(sizes.messages), delivered)
            return len(delivered)

        rates = {"batched produce": _timed(batched), "ordered consume": _timed(consume)}
        rates["synchronous send"] = _sync_loop(
            sizes.sync_seconds, lambda key, body: client.xadd(f"sync-{_stream_of(key)}", {"k": key, "b": body}),
            setup=lambda: None)
        client.close()
    return rates


# -- NATS JetStream ------------------------------------------------------------------------------


def _nats_binary() -> str | None:
    found = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    return found if Path(found).exists() else None


def _nats(workdir: Path, sizes: Sizes) -> dict[str, float]:
    port, data = _free_port(), workdir / "peer-nats"
    cmd = [_nats_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(data)]
    with _server(cmd, port, workdir / "nats.log"):
        return asyncio.run(_nats_workloads(port, sizes))


async def _nats_workloads(port: int, sizes: Sizes) -> dict[str, float]:
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="bench", subjects=["bench.*"])
    await js.add_stream(name="sync", subjects=["sync.*"])

    async def batched() -> None:
        window = 1000
        for start in range(0, sizes.messages, window):
            await asyncio.gather(*[
                js.publish(f"bench.{_stream_of(key)}", body)
                for key, _, body in map(_message, range(start, min(start + window, sizes.messages)))
            ])

    async def consume() -> int:
        delivered = []
        per_stream = _per_stream(sizes.messages)
        no_acks = ConsumerConfig(ack_policy=AckPolicy.NONE)  # read in order, like a pull by offset
        for stream in range(STREAMS):
            sub = await js.pull_subscribe(f"bench.{stream}", durable=f"reader-{stream}", config=no_acks)
            read = 0
            while read < per_stream[stream]:  # stop at the known count: a fetch past the end waits
                msgs = await sub.fetch(min(BATCH, per_stream[stream] - read), timeout=10)
                delivered += [_parsed(m.data) for m in msgs]
                read += len(msgs)
        _consumed_ok("NATS consume", _expected(sizes.messages), delivered)
        return len(delivered)

    async def sync_sends() -> float:
        await js.publish("sync.0", b"warm-up")
        count, t0 = 0, time.perf_counter()
        deadline = t0 + sizes.sync_seconds
        while time.perf_counter() < deadline:
            key, _, body = _message(count)
            await js.publish(f"sync.{_stream_of(key)}", body)
            count += 1
        return count / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    await batched()
    produce_rate = sizes.messages / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    consumed = await consume()
    consume_rate = consumed / (time.perf_counter() - t0)
    sync_rate = await sync_sends()
    await nc.close()
    return {"batched produce": produce_rate, "synchronous send": sync_rate, "ordered consume": consume_rate}


# -- the table -----------------------------------------------------------------------------------

_PEERS = {"Redis Streams": (_redis_binary, _redis), "NATS JetStream": (_nats_binary, _nats)}


def run(workdir: Path, quick: bool) -> list[Row]:
    """Each workload: orderlymq's figure against each installed peer's (ratio = ours / theirs)."""
    sizes = Sizes(messages=100_000, sync_seconds=2.0) if quick else Sizes(messages=1_000_000, sync_seconds=10.0)
    ours = _orderlymq(workdir, sizes)
    rows = []
    for peer, (binary, measure) in _PEERS.items():
        if binary() is None:
            print(f"  {peer}: not installed (pip install 'orderlymq[bench]'); left out", flush=True)
            continue
        theirs = measure(workdir, sizes)
        rows += [Row(f"peers: {name}, orderlymq vs {peer}", ours[name], "msg/s", theirs[name], peer, BODY_BYTES,
                     STREAMS) for name in ours]
    return rows or [Row(f"peers: {name}, orderlymq alone", rate, "msg/s", message_bytes=BODY_BYTES, queues=STREAMS)
                    for name, rate in ours.items()]
