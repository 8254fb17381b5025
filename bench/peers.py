"""Peers in the same run: orderlymq next to Redis Streams and NATS JetStream on the same workloads.

Each system runs as a server process on loopback, driven from this process by its usual Python
client, on three workloads with 100-byte bodies over 8 streams (orderlymq: 8 queues of a topic;
Redis: 8 stream keys; NATS: 8 subjects of one stream), a message's stream chosen by its key:

- **batched produce**: messages sent in batches of 10,000 (a Redis pipeline, 1,000 JetStream
  publishes in flight, ``Producer.send_batch``), each acknowledged;
- **synchronous send**: one thread sends one message and waits for its acknowledgement, again
  and again (the ordered-message pattern: one synchronous send per event). The systems take turns
  (``SYNC_ROUNDS`` short runs each, all servers up), so a machine that slows down during the run
  (as shared machines do from hour to hour) slows them alike; what orderlymq stored is read back
  and judged like a consume. Each system's CPU per send is given beside it, its server's and this
  process's (the client's): a figure bought with more CPU shows it;
- **ordered consume**: every message of the batched run read back, stream by stream.

What was consumed is judged with ``connector.history`` (per key: nothing lost, duplicated or out
of order), so no figure counts a broken run. Durability is set alike where the systems allow:
orderlymq ``flush = "async"``, Redis ``appendfsync everysec``, JetStream's default (fsync in the
background). A peer whose server is not installed (``pip install 'orderlymq[bench]'``) is left out
with a note.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.report import Row, cpu_seconds
from broker.launcher import free_port
from connector.history import check_keyed

__all__ = ["run"]

BODY_BYTES = 100
STREAMS = 8
BATCH = 10_000
KEYS = 1000
SYNC_ROUNDS = 5  # turns each system takes at synchronous sends


@dataclass(frozen=True)
class Sizes:
    messages: int  # batched produce, then consumed back
    sync_seconds: float  # per system, over its SYNC_ROUNDS turns


@dataclass
class _Peer:
    """A running system: its batched and consume workloads (each returns msgs/s) and ``sync(seconds,
    first)``, which sends messages ``first``, ``first + 1``... one at a time for ``seconds`` and
    returns how many; ``check_sync(count)`` judges what those sends stored, where it is read back."""

    batched: Callable[[], float]
    consume: Callable[[], float]
    sync: Callable[[float, int], int]
    server: psutil.Process  # its server, whose CPU the synchronous sends are charged
    check_sync: Callable[[int], None] = lambda count: None


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
def _server(cmd: list[str], port: int, log: Path) -> Iterator[subprocess.Popen]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc)
        yield proc
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


@contextmanager
def _orderlymq(workdir: Path, sizes: Sizes) -> Iterator[_Peer]:
    from bench.scratch_broker import ScratchBroker
    from connector.client import Admin, Producer, PullConsumer

    with ScratchBroker(workdir / "peer-orderlymq", "--flush", "async", "--log-level", "WARNING") as broker:
        with Admin(broker.address) as admin:
            admin.create_topic("bench", STREAMS)
            admin.create_topic("sync", STREAMS)
        with Producer(broker.address) as producer:

            def batched() -> int:
                for start in range(0, sizes.messages, BATCH):
                    chunk = map(_message, range(start, min(start + BATCH, sizes.messages)))
                    producer.send_batch("bench", [{"key": key, "body": body} for key, _, body in chunk])
                return sizes.messages

            def read_back(topic: str) -> list[tuple[str, int]]:
                delivered = []
                with PullConsumer(broker.address) as consumer:
                    for q in range(STREAMS):
                        offset = 0
                        while True:
                            result = consumer.pull(topic, q, offset, max_messages=100_000, wait_ms=0)
                            delivered += [_parsed(m.body) for m in result.messages]
                            offset = result.next_offset
                            if not result.messages:
                                break
                return delivered

            def consume() -> int:
                delivered = read_back("bench")
                _consumed_ok("orderlymq consume", _expected(sizes.messages), delivered)
                return len(delivered)

            yield _Peer(lambda: _timed(batched), lambda: _timed(consume),
                        lambda seconds, first: _sync_loop(seconds, first, lambda key, body: producer.send(
                            "sync", body, key=key)),
                        psutil.Process(broker.pid),
                        lambda count: _consumed_ok("orderlymq synchronous sends", _expected(count), read_back("sync")))


def _sync_loop(seconds: float, first: int, send: Callable[[str, bytes], object]) -> int:
    """One thread: send message ``first`` and on, each waiting for its ack, for ``seconds``; how many."""
    count, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        key, _, body = _message(first + count)
        send(key, body)
        count += 1
    return count


# -- Redis Streams -------------------------------------------------------------------------------


def _redis_binary() -> str | None:
    found = shutil.which("redis-server") or str(Path(sys.executable).parent / "redis-server")
    return found if Path(found).exists() else None


@contextmanager
def _redis(workdir: Path, sizes: Sizes) -> Iterator[_Peer]:
    import redis

    port, data = free_port(), workdir / "peer-redis"
    data.mkdir(parents=True, exist_ok=True)
    cmd = [_redis_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data), "--save", "",
           "--appendonly", "yes", "--appendfsync", "everysec"]
    with _server(cmd, port, workdir / "redis.log") as server, \
            contextlib.closing(redis.Redis(host="127.0.0.1", port=port)) as client:

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

        yield _Peer(lambda: _timed(batched), lambda: _timed(consume),
                    lambda seconds, first: _sync_loop(seconds, first, lambda key, body: client.xadd(
                        f"sync-{_stream_of(key)}", {"k": key, "b": body})), psutil.Process(server.pid))


# -- NATS JetStream ------------------------------------------------------------------------------


def _nats_binary() -> str | None:
    found = shutil.which("nats-server") or str(Path(sys.executable).parent / "nats-server")
    return found if Path(found).exists() else None


@contextmanager
def _nats(workdir: Path, sizes: Sizes) -> Iterator[_Peer]:
    port, data = free_port(), workdir / "peer-nats"
    cmd = [_nats_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(data)]
    with _server(cmd, port, workdir / "nats.log") as server, asyncio.Runner() as runner:
        peer, client = runner.run(_nats_peer(port, sizes, runner, psutil.Process(server.pid)))
        try:
            yield peer
        finally:
            runner.run(client.close())


async def _nats_peer(port: int, sizes: Sizes, runner: asyncio.Runner, server: psutil.Process):
    """NATS's workloads, each run to its end by ``runner`` (its client is asyncio's), and the client."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name="bench", subjects=["bench.*"])
    await js.add_stream(name="sync", subjects=["sync.*"])

    async def batched() -> int:
        window = 1000
        for start in range(0, sizes.messages, window):
            await asyncio.gather(*[
                js.publish(f"bench.{_stream_of(key)}", body)
                for key, _, body in map(_message, range(start, min(start + window, sizes.messages)))
            ])
        return sizes.messages

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

    async def sync(seconds: float, first: int) -> int:  # _sync_loop, awaiting each publish's ack
        count, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            key, _, body = _message(first + count)
            await js.publish(f"sync.{_stream_of(key)}", body)
            count += 1
        return count

    return _Peer(lambda: _timed(lambda: runner.run(batched())), lambda: _timed(lambda: runner.run(consume())),
                 lambda seconds, first: runner.run(sync(seconds, first)), server), nc


# -- the table -----------------------------------------------------------------------------------

_PEERS = {"Redis Streams": (_redis_binary, _redis), "NATS JetStream": (_nats_binary, _nats)}


def run(workdir: Path, quick: bool) -> list[Row]:
    """Each workload: orderlymq's figure against each installed peer's (ratio = ours / theirs)."""
    sizes = Sizes(messages=100_000, sync_seconds=2.0) if quick else Sizes(messages=1_000_000, sync_seconds=10.0)
    peers = {}
    for peer, (binary, start) in _PEERS.items():
        if binary() is None:
            print(f"  {peer}: not installed (pip install 'orderlymq[bench]'); left out", flush=True)
        else:
            peers[peer] = start
    with contextlib.ExitStack() as running:
        systems = {name: running.enter_context(start(workdir, sizes))
                   for name, start in {"orderlymq": _orderlymq, **peers}.items()}
        rates = {name: {"batched produce": system.batched(), "ordered consume": system.consume()}
                 for name, system in systems.items()}
        cpu = {}  # per system: CPU µs per synchronous send, (server, client)
        for name, (sent, turns) in _sync_in_turns(systems, sizes.sync_seconds).items():
            systems[name].check_sync(sent)
            rates[name]["synchronous send"] = turns.sent / turns.seconds
            cpu[name] = turns.cpu_us_per_send()
    print("  synchronous send, CPU µs per send (server, client):",
          ", ".join(f"{name} {server} / {client}" for name, (server, client) in cpu.items()),
          flush=True)
    ours = rates.pop("orderlymq")
    rows = [Row(f"peers: {name}, orderlymq vs {peer}", ours[name], "msg/s", theirs[name], peer, BODY_BYTES, STREAMS,
                extra=_cpu_extra(cpu, peer) if name == "synchronous send" else {})
            for peer, theirs in rates.items() for name in ours]
    return rows or [Row(f"peers: {name}, orderlymq alone", rate, "msg/s", message_bytes=BODY_BYTES, queues=STREAMS)
                    for name, rate in ours.items()]


@dataclass
class _Turns:
    """What one system's timed turns at synchronous sends added up to."""

    sent: int = 0
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def cpu_us_per_send(self) -> tuple[float, float]:
        per_send = 1e6 / max(self.sent, 1)
        return round(self.server_cpu_s * per_send, 1), round(self.client_cpu_s * per_send, 1)


def _sync_in_turns(systems: dict[str, _Peer], seconds: float) -> dict[str, tuple[int, _Turns]]:
    """Each system's synchronous sends, ``SYNC_ROUNDS`` turns of ``seconds / SYNC_ROUNDS`` each, the
    systems one after the other in every round, after a short untimed run that warms each path:
    per system, the messages it sent in all, and what its turns added up to (sends, seconds, the
    CPU of its server and of this process, the client)."""
    warm = {name: system.sync(0.05, 0) for name, system in systems.items()}
    turns = {name: _Turns() for name in systems}
    for _ in range(SYNC_ROUNDS):
        for name, system in systems.items():
            took, server_before, client_before = turns[name], cpu_seconds(system.server), time.process_time()
            t0 = time.perf_counter()
            took.sent += system.sync(seconds / SYNC_ROUNDS, warm[name] + took.sent)
            took.seconds += time.perf_counter() - t0
            took.client_cpu_s += time.process_time() - client_before
            took.server_cpu_s += cpu_seconds(system.server) - server_before
    return {name: (warm[name] + turns[name].sent, turns[name]) for name in systems}


def _cpu_extra(cpu: dict[str, tuple[float, float]], peer: str) -> dict:
    """The synchronous rows' CPU per send, ours and the peer's, server and client."""
    return {"CPU µs per send (server, client)": {"orderlymq": list(cpu["orderlymq"]), peer: list(cpu[peer])}}
