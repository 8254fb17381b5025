"""``ThreadHops``: the broker's worker threads as its event loop hands them calls (results and
exceptions back to the awaiting task, at most so many threads, reused; a call cancelled before it
started never runs; shutdown finishes what was handed over and refuses more)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker.thread_hops import ThreadHops


@pytest.fixture
def hops():
    threads = ThreadHops(3, "test-hops")
    yield threads
    threads.shutdown()


def test_results_and_exceptions_reach_the_awaiting_task_from_another_thread(hops):
    def where(x):
        if x < 0:
            raise ValueError(f"negative: {x}")
        return x * 2, threading.current_thread().name

    async def main():
        doubled, name = await hops.run(where, 21)
        with pytest.raises(ValueError, match="negative: -1"):
            await hops.run(where, -1)
        return doubled, name

    doubled, name = asyncio.run(main())
    assert doubled == 42 and name.startswith("test-hops-") and name != threading.current_thread().name


def test_at_most_so_many_threads_run_calls_and_idle_ones_are_reused(hops):
    lock, running, most = threading.Lock(), [0], [0]
    gate = threading.Event()

    def work(i):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(5)
        with lock:
            running[0] -= 1
        return i

    async def main():
        calls = [asyncio.ensure_future(hops.run(work, i)) for i in range(10)]
        await asyncio.sleep(0.2)
        gate.set()
        results = await asyncio.gather(*calls)
        for i in range(20):  # one after another: the idle threads take them, no new ones
            assert await hops.run(lambda i=i: i) == i
        return results

    assert asyncio.run(main()) == list(range(10))
    assert most[0] == 3
    assert len([t for t in threading.enumerate() if t.name.startswith("test-hops-")]) == 3


def test_a_call_cancelled_before_a_thread_took_it_never_runs():
    hops = ThreadHops(1, "test-hops-one")
    release, ran = threading.Event(), []

    async def main():
        first = asyncio.ensure_future(hops.run(release.wait, 5))
        second = asyncio.ensure_future(hops.run(ran.append, "second"))
        await asyncio.sleep(0.1)  # the only thread is busy with the first
        second.cancel()
        await asyncio.sleep(0.05)
        release.set()
        assert await first is True
        assert await hops.run(ran.append, "third") is None
        with pytest.raises(asyncio.CancelledError):
            await second

    asyncio.run(main())
    hops.shutdown()
    assert ran == ["third"]


def test_shutdown_finishes_what_was_handed_over_refuses_more_and_drops_answers_to_a_closed_loop():
    hops = ThreadHops(2, "test-hops-stop")
    release, finished = threading.Event(), []

    def slow(i):
        release.wait(5)
        finished.append(i)
        return i

    loop = asyncio.new_event_loop()
    tasks = [loop.create_task(hops.run(slow, i)) for i in range(4)]
    for task in tasks:
        task._log_destroy_pending = False  # they stay pending: their loop closes under them
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()  # the broker closes its loop before it shuts its threads down
    release.set()
    hops.shutdown(wait=True)
    assert sorted(finished) == [0, 1, 2, 3]
    assert not any(task.done() for task in tasks)

    async def after():
        await hops.run(slow, 5)

    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(after())
