"""A crowd of idle clients beside one normal producer/consumer pair, and what each of them saw.

The crowd holds ``streams`` open ``SendStream`` calls (the stream every ``Producer`` keeps open)
and ``polls`` long-polling ``Pull`` calls on an empty topic, spread over ``channels`` connections,
all from one event loop (the crowd costs the client one thread, whatever its size). Meanwhile a
normal ``Producer`` sends keyed, numbered messages one at a time, a ``PullConsumer`` reads them, and
``Health`` is asked in a loop. Afterwards every stream sends its last request and closes, and one
message per idle queue answers every poll. ``run_crowd`` returns the figures; the callers (the
concurrency tests and the broker benchmark) judge them: liveness (every call answered, none refused)
and order (``connector.history``), never time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

import grpc

from bench.report import percentile
from broker.wire import codec
from connector.client import Producer, PullConsumer
from connector.client.connection import BrokerConnection, pb
from connector.history import History, Verdict, check

__all__ = ["CrowdFigures", "run_crowd"]

CROWD_TOPIC = "crowd"  # where the crowd's streams send
IDLE_TOPIC = "crowd-idle"  # where the crowd's polls wait: empty until the end
PAIR_TOPIC = "pair"  # the normal producer/consumer pair's topic
POLL_WAIT_MS = 30_000
LIVENESS_S = 120.0  # how long any one stage may take before the run is declared stuck


@dataclass
class CrowdFigures:
    """What a crowd run saw. Latencies are milliseconds."""

    streams: int
    polls: int
    streams_opened: int = 0  # streams whose first request was answered while the crowd stood
    streams_closed: int = 0  # streams whose every request was answered, then closed cleanly
    polls_answered: int = 0  # polls that got the message sent to their idle queue at the end
    producers: int = 0  # idle ``Producer`` clients (each holds its own send stream)
    producers_sent: int = 0  # of them, those whose one send was acknowledged
    crowd_errors: list[str] = field(default_factory=list)
    pair_errors: list[str] = field(default_factory=list)
    health_errors: list[str] = field(default_factory=list)
    send_ms: list[float] = field(default_factory=list)
    health_ms: list[float] = field(default_factory=list)
    verdict: Verdict | None = None
    stood: bool = False  # the whole crowd was in place before the pair started
    streams_standing: int = 0  # streams opened when the pair started (all of them, unless the crowd is stuck)

    def summary(self) -> dict:
        return {
            "streams": self.streams, "polls": self.polls, "stood": self.stood,
            "streams_standing": self.streams_standing,
            "streams_opened": self.streams_opened, "streams_closed": self.streams_closed,
            "polls_answered": self.polls_answered, "producers": self.producers,
            "producers_sent": self.producers_sent,
            "crowd_errors": len(self.crowd_errors), "pair_errors": len(self.pair_errors),
            "health_errors": len(self.health_errors),
            "pair_sends": len(self.send_ms), "health_calls": len(self.health_ms),
            "send_p50_ms": percentile(self.send_ms, 50), "send_p99_ms": percentile(self.send_ms, 99),
            "send_max_ms": max(self.send_ms, default=float("nan")),
            "health_p50_ms": percentile(self.health_ms, 50), "health_p99_ms": percentile(self.health_ms, 99),
            "health_max_ms": max(self.health_ms, default=float("nan")),
            "history": self.verdict.line() if self.verdict else "not checked",
        }

    def line(self) -> str:
        s = self.summary()
        return (f"crowd of {s['streams']} streams + {s['polls']} polls: {s['streams_standing']} standing when the "
                f"pair started, opened {s['streams_opened']}, closed "
                f"{s['streams_closed']}, polls answered {s['polls_answered']}, idle producers acknowledged "
                f"{s['producers_sent']}/{s['producers']}, errors crowd/pair/health "
                f"{s['crowd_errors']}/{s['pair_errors']}/{s['health_errors']}; pair sends {s['pair_sends']} "
                f"p50 {s['send_p50_ms']:.1f} ms p99 {s['send_p99_ms']:.1f} ms max {s['send_max_ms']:.1f} ms; "
                f"Health {s['health_calls']} calls p50 {s['health_p50_ms']:.1f} ms p99 {s['health_p99_ms']:.1f} ms "
                f"max {s['health_max_ms']:.1f} ms; {s['history']}")


class _Crowd:
    """The idle clients, on an event loop of their own thread."""

    def __init__(self, address: str, figures: CrowdFigures, channels: int, idle_queues: int) -> None:
        self.address = address
        self.figures = figures
        self.channels_wanted = channels
        self.idle_queues = idle_queues
        self.loop = asyncio.new_event_loop()
        self.stood = threading.Event()  # every stream opened (its first request answered)
        self.finished = threading.Event()
        self._release: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="crowd", daemon=True)
        self._batch = codec.encode(codec.messages_to_batch([{"key": "crowd", "body": b"idle"}]))

    def start(self) -> None:
        self._thread.start()

    def release(self) -> None:
        self.loop.call_soon_threadsafe(self._release.set)

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.finished.set()
            self.loop.close()

    async def _main(self) -> None:
        self._release = asyncio.Event()
        # A private subchannel pool per channel: separate connections, as separate clients have.
        channels = [grpc.aio.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(self.channels_wanted)]
        f = self.figures
        opened = [0]
        if not f.streams:
            self.stood.set()
        tasks = [asyncio.ensure_future(self._stream(channels[i % len(channels)], i, opened)) for i in range(f.streams)]
        tasks += [asyncio.ensure_future(self._poll(channels[i % len(channels)], i)) for i in range(f.polls)]
        await asyncio.gather(*tasks)
        for channel in channels:
            await channel.close()

    async def _stream(self, channel: grpc.aio.Channel, i: int, opened: list[int]) -> None:
        request = pb.SendRequest(topic=CROWD_TOPIC, queue_id=i % 8, batch=self._batch).SerializeToString()
        call = channel.stream_stream("/orderlymq.v1.OrderlyMQ/SendStream", request_serializer=None,
                                     response_deserializer=pb.SendResponse.FromString)()
        try:
            for last in (False, True):
                if last:
                    await self._release.wait()
                await call.write(request)
                answer = await call.read()
                if answer is grpc.aio.EOF or answer.error_code:
                    self.figures.crowd_errors.append(f"stream {i}: {answer}")
                    return
                if not last:
                    opened[0] += 1
                    self.figures.streams_opened = opened[0]
                    if opened[0] == self.figures.streams:
                        self.stood.set()
            await call.done_writing()
            if await call.read() is grpc.aio.EOF:
                self.figures.streams_closed += 1
        except grpc.RpcError as err:
            self.figures.crowd_errors.append(f"stream {i}: {err.code().name} {err.details()}")
        finally:
            call.cancel()

    async def _poll(self, channel: grpc.aio.Channel, i: int) -> None:
        pull = channel.unary_unary("/orderlymq.v1.OrderlyMQ/Pull", request_serializer=pb.PullRequest.SerializeToString,
                                   response_deserializer=pb.PullResponse.FromString)
        request = pb.PullRequest(topic=IDLE_TOPIC, queue_id=i % self.idle_queues, offset=0, wait_ms=POLL_WAIT_MS)
        try:
            while True:  # an empty answer after the broker's longest wait: poll again
                answer = await pull(request, timeout=POLL_WAIT_MS / 1000 + LIVENESS_S)
                if answer.count:
                    self.figures.polls_answered += 1
                    return
        except grpc.RpcError as err:
            self.figures.crowd_errors.append(f"poll {i}: {err.code().name} {err.details()}")


def _ask_health(address: str, figures: CrowdFigures, stop: threading.Event) -> None:
    with BrokerConnection(address, timeout=LIVENESS_S) as conn:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.call("Health", pb.HealthRequest(), retry=False)
                figures.health_ms.append((time.perf_counter() - t0) * 1000)
            except Exception as exc:  # noqa: BLE001 - counted and reported by the caller
                figures.health_errors.append(f"{type(exc).__name__}: {exc}")
            stop.wait(0.02)


def _consume(address: str, history: History, expected: int, stop: threading.Event, figures: CrowdFigures) -> None:
    with PullConsumer(address, timeout=LIVENESS_S) as consumer:
        seen = 0
        while seen < expected and not stop.is_set():
            try:
                if not consumer.assignment():
                    consumer.assign(PAIR_TOPIC, start="earliest")
                messages = consumer.poll(256, wait_ms=500)
            except Exception as exc:  # noqa: BLE001 - counted and reported by the caller
                figures.pair_errors.append(f"consumer: {type(exc).__name__}: {exc}")
                return
            for m in messages:
                key, seq = m.body.decode().split(":")
                history.delivered(key, int(seq), "consumer", m.queue_id, m.queue_offset)
            seen += len(messages)


def _produce(address: str, history: History, messages: int, keys: int, figures: CrowdFigures) -> None:
    with Producer(address, timeout=LIVENESS_S) as producer:
        for i in range(messages):
            key, seq = f"key-{i % keys}", i // keys
            t0 = time.perf_counter()
            try:
                producer.send(PAIR_TOPIC, f"{key}:{seq}".encode(), key=key)
            except Exception as exc:  # noqa: BLE001 - counted and reported by the caller; stop at the first
                history.sent(key, seq, acked=False)
                figures.pair_errors.append(f"producer: {type(exc).__name__}: {exc}")
                return
            figures.send_ms.append((time.perf_counter() - t0) * 1000)
            history.sent(key, seq, acked=True)


def _open_producers(address: str, count: int, figures: CrowdFigures) -> list[Producer]:
    """``count`` real ``Producer`` clients that send one message each and then stay open, idle."""
    opened = []
    for i in range(count):
        producer = Producer(address, timeout=LIVENESS_S)
        opened.append(producer)
        try:
            producer.send(CROWD_TOPIC, b"idle producer", key=f"idle-{i}")
            figures.producers_sent += 1
        except Exception as exc:  # noqa: BLE001 - counted and reported by the caller
            figures.crowd_errors.append(f"idle producer {i}: {type(exc).__name__}: {exc}")
            break
    return opened


def run_crowd(address: str, *, streams: int, polls: int, pair_messages: int, pair_keys: int = 20,
              producers: int = 0, channels: int = 100, idle_queues: int = 8) -> CrowdFigures:
    """Stand the crowd up, run the normal pair and ``Health`` beside it, then release the crowd.

    ``producers`` adds idle ``Producer`` clients to the crowd (each sends one message, then holds
    its stream open until the crowd is released).

    The topics ``crowd``, ``crowd-idle`` and ``pair`` are created here (8 queues each). Stages
    that do not finish within ``LIVENESS_S`` are reported as such (``stood`` False, counts short);
    nothing here asserts.
    """
    figures = CrowdFigures(streams=streams, polls=polls, producers=producers)
    with BrokerConnection(address, timeout=LIVENESS_S) as conn:
        for topic, queues in ((CROWD_TOPIC, 8), (IDLE_TOPIC, idle_queues), (PAIR_TOPIC, 8)):
            conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=queues, if_not_exists=True))
        crowd = _Crowd(address, figures, channels, idle_queues)
        crowd.start()
        idle_producers = _open_producers(address, producers, figures)
        figures.stood = crowd.stood.wait(LIVENESS_S) and figures.producers_sent == producers
        figures.streams_standing = figures.streams_opened
        history = History()
        stop = threading.Event()
        health = threading.Thread(target=_ask_health, args=(address, figures, stop), daemon=True)
        consumer = threading.Thread(target=_consume, args=(address, history, pair_messages, stop, figures),
                                    daemon=True)
        health.start()
        consumer.start()
        _produce(address, history, pair_messages, pair_keys, figures)
        consumer.join(LIVENESS_S)
        stop.set()
        health.join(LIVENESS_S)
        figures.verdict = check(history.sends, history.deliveries)
        crowd.release()
        for producer in idle_producers:
            producer.close(timeout=LIVENESS_S)
        wake = codec.encode(codec.messages_to_batch([{"key": "wake", "body": b"wake"}]))
        for q in range(idle_queues):
            try:
                conn.call("Send", pb.SendRequest(topic=IDLE_TOPIC, queue_id=q, batch=wake), retry=False)
            except Exception as exc:  # noqa: BLE001 - counted and reported by the caller
                figures.crowd_errors.append(f"waking idle queue {q}: {type(exc).__name__}: {exc}")
        if not crowd.join(POLL_WAIT_MS / 1000 + LIVENESS_S):
            figures.crowd_errors.append("the crowd did not finish")
    return figures
