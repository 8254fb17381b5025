"""``BusyLoop``: the broker's event loop polling for a synchronous sender's next request (how long,
when not, what it counts), on a real event loop with real worker threads; and a broker whose loop
polls storing a producer's synchronous sends complete and in order."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import uvloop

from broker.busy_loop import BusyLoop, busy_poll_limit_us
from broker.metrics import BrokerMetrics
from broker.thread_hops import ThreadHops
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.history import History
from tests.faults.workload import body, stored_deliveries
from tests.support import wait_until


@pytest.fixture
def hops():
    threads = ThreadHops(2, "test-busy-loop")
    yield threads
    threads.shutdown()


def _polled_s(metrics: BrokerMetrics) -> float:
    return metrics.registry.get_sample_value("orderlymq_loop_busy_poll_seconds_total")


def _busy_loop(hops: ThreadHops, limit_us: float, spare: list[bool] | None = None) -> tuple[BusyLoop, BrokerMetrics]:
    metrics = BrokerMetrics(state=None)
    spare = [True] if spare is None else spare
    return BusyLoop(limit_us, hops, metrics, cpu_to_spare=lambda: spare[0]), metrics


async def _until_idle(busy: BusyLoop) -> float:
    """Let the loop run until the poll ends; how long that took."""
    began = time.perf_counter()
    while busy.polling:
        await asyncio.sleep(0.001)
    return time.perf_counter() - began


def test_a_poll_lasts_its_limit_after_the_last_request_and_the_loop_serves_meanwhile(hops):
    busy, metrics = _busy_loop(hops, 30_000)

    async def main():
        busy.request_seen()
        assert busy.polling
        await asyncio.sleep(0.02)  # timers fire while it polls: the loop is not blocked
        busy.request_seen()  # the next send, within the limit: the poll goes on 30 ms from here
        return await _until_idle(busy)

    lasted = uvloop.run(main())
    assert lasted >= 0.029, lasted
    assert _polled_s(metrics) >= 0.049, "counted from the first request to the end of the poll"


def test_polls_that_find_no_request_give_way_to_one_in_sixteen(hops):
    busy, _ = _busy_loop(hops, 1_000)

    async def main():
        started = []
        for _ in range(4 + 32):
            busy.request_seen()
            started.append(busy.polling)
            await _until_idle(busy)
        return started

    started = uvloop.run(main())
    assert started[:4] == [True] * 4 and started[4:].count(True) == 2, started


def test_no_poll_while_a_worker_thread_runs_a_call_and_a_call_ends_one_under_way(hops):
    busy, _ = _busy_loop(hops, 10_000_000)  # ten seconds: only the call can end it in time
    release = threading.Event()

    async def main():
        call = asyncio.ensure_future(hops.run(release.wait))
        await asyncio.sleep(0)  # handed over
        busy.request_seen()
        refused = not busy.polling
        release.set()
        await call
        busy.request_seen()
        assert busy.polling
        release.clear()
        call = asyncio.ensure_future(hops.run(release.wait))
        ended = await _until_idle(busy)
        release.set()
        await call
        return refused, ended

    refused, ended = uvloop.run(main())
    assert refused, "a thread is running a call: no poll"
    assert ended < 1.0, "a call handed over while polling ends the poll at its next turn"


def test_no_poll_without_a_cpu_to_spare_or_a_limit_and_none_beside_another_program(hops):
    spare = [False]
    busy, metrics = _busy_loop(hops, 1_000, spare)
    never, _ = _busy_loop(hops, 0)

    async def main():
        busy.request_seen()
        never.request_seen()
        assert not busy.polling and not never.polling
        spare[0] = True
        busy.request_seen()
        assert busy.polling
        spare[0] = False  # looked at every turn: the poll ends at the next
        await _until_idle(busy)

    uvloop.run(main())
    assert busy_poll_limit_us(-1, own_process=True) == 200
    assert busy_poll_limit_us(-1, own_process=False) == 0, "its polls would keep the program's threads from the GIL"
    assert busy_poll_limit_us(50, own_process=False) == 50


def test_a_broker_whose_loop_polls_stores_synchronous_sends_complete_and_in_order(broker_factory, topic_name):
    """Two threads of one producer send keys of their own, one message at a time: the loop polls
    between them (the machine taken to have a CPU to spare, whatever runs beside the test) and
    every key's messages are stored once each, in order."""
    polled_between_synchronous_sends(broker_factory(busy_poll_us=100_000), topic_name)


def polled_between_synchronous_sends(running, topic_name: str) -> None:
    """Two threads of one producer send keys of their own to ``running`` (an in-process broker
    with ``busy_poll_us`` set), one message at a time; fails unless the loop polled and every key's
    messages are stored once each, in order."""
    running.busy_loop._cpu_to_spare = lambda: True
    with Admin(running.address) as admin:
        admin.create_topic(topic_name, 4)
    history, lock = History(), threading.Lock()

    def send(keys: tuple[str, ...]) -> None:
        for seq in range(60):
            for key in keys:
                producer.send(topic_name, body(key, seq), key=key)
                with lock:
                    history.sent(key, seq, acked=True)

    with Producer(running.address) as producer:
        senders = [threading.Thread(target=send, args=(keys,)) for keys in (("a", "b"), ("c", "d"))]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join()
    wait_until(lambda: not running.busy_loop.polling, timeout=5)  # a poll is counted once it ends
    assert _polled_s(running.service.metrics) > 0
    with BrokerConnection(running.address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic_name))
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == 4 * 60, verdict
