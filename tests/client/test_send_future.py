"""``SendFuture`` behaves as a ``concurrent.futures.Future`` whatever touches it first."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures as cf
import gc
import threading

import pytest

from connector.client.send_future import SendFuture


def _later(fn, delay: float = 0.05) -> threading.Thread:
    thread = threading.Timer(delay, fn)
    thread.start()
    return thread


def test_an_untouched_future_resolves_and_reads_back():
    future = SendFuture()
    future.set_result(42)
    assert future.done() and future.result() == 42 and future.exception() is None
    failed = SendFuture()
    failed.set_exception(KeyError("k"))
    assert isinstance(failed.exception(), KeyError)
    with pytest.raises(KeyError):
        failed.result()


def test_a_waiter_in_another_thread_is_woken():
    future = SendFuture()
    _later(lambda: future.set_result("stored"))
    assert future.result(timeout=10) == "stored"
    failing = SendFuture()
    _later(lambda: failing.set_exception(ValueError("refused")))
    with pytest.raises(ValueError, match="refused"):
        failing.result(timeout=10)


def test_a_wait_times_out_while_pending():
    with pytest.raises(cf.TimeoutError):
        SendFuture().result(timeout=0.01)


def test_callbacks_run_once_whether_added_before_or_after():
    seen = []
    before = SendFuture()
    before.add_done_callback(lambda f: seen.append(("before", f.result())))
    before.set_result(1)
    after = SendFuture()
    after.set_result(2)
    after.add_done_callback(lambda f: seen.append(("after", f.result())))
    assert seen == [("before", 1), ("after", 2)]


def test_concurrent_futures_helpers_see_them_complete():
    futures = [SendFuture() for _ in range(20)]
    futures[0].set_result(0)  # finished before anything watches it
    _later(lambda: [f.set_result(i) for i, f in enumerate(futures) if i])
    done = {f.result() for f in cf.as_completed(futures, timeout=10)}
    assert done == set(range(20))
    pending = SendFuture()
    _later(lambda: pending.set_exception(RuntimeError("x")))
    finished, _ = cf.wait([pending], timeout=10, return_when=cf.FIRST_EXCEPTION)
    assert finished == {pending}


def test_a_future_resolves_once():
    future = SendFuture()
    future.set_result(1)
    with pytest.raises(cf.InvalidStateError):
        future.set_result(2)
    cancelled = SendFuture()
    assert cancelled.cancel() and cancelled.cancelled()
    with pytest.raises(cf.InvalidStateError):
        cancelled.set_exception(RuntimeError("late"))


def _resolve_one_by_one(futures: list[SendFuture]) -> None:
    for n, future in enumerate(futures):
        future.set_result(("built", n))


def _resolve_from_values(futures: list[SendFuture]) -> None:
    for start in range(0, len(futures), 10):
        SendFuture.set_results(futures[start:start + 10], range(start, start + 10), lambda n: ("built", n))


@pytest.mark.parametrize("resolve", [_resolve_one_by_one, _resolve_from_values])
def test_racing_waiters_and_setters_never_miss_a_result(resolve):
    """Waiters that touch the future while the sender resolves it (the lazy condition's race)."""
    def collect(futures, results):
        results.extend(f.result(timeout=10) for f in futures)

    for _ in range(200):
        futures = [SendFuture() for _ in range(50)]
        results = []
        waiter = threading.Thread(target=collect, args=(futures, results))
        waiter.start()
        resolve(futures)
        waiter.join(10)
        assert results == [("built", n) for n in range(50)]


def test_results_set_from_values_read_back_built_however_they_are_reached():
    point = collections.namedtuple("point", "x y")
    untouched, waited, called = SendFuture(), SendFuture(), SendFuture()
    seen = []
    called.add_done_callback(lambda f: seen.append(f.result()))
    _later(lambda: SendFuture.set_results([untouched, waited, called], [1, 3, 5], lambda x: point(x, x + 1)))
    assert waited.result(timeout=10) == point(3, 4) and type(waited.result()) is point
    assert untouched.result() == point(1, 2) and type(untouched.result()) is point
    assert seen == [point(5, 6)] and type(seen[0]) is point
    assert asyncio.run(_awaited(untouched)) == point(1, 2)


async def _awaited(future: SendFuture):
    return await asyncio.wrap_future(future)


def test_a_kept_future_resolved_from_a_value_holds_nothing_the_collector_tracks():
    """The point of keeping a value: a named tuple is tracked by the cyclic collector for life,
    a number never is."""
    future = SendFuture()
    SendFuture.set_results([future], [7], lambda offset: collections.namedtuple("r", "t q o s d")("t", 0, offset, 1, False))
    assert not gc.is_tracked(future._result)  # noqa: SLF001 - the point: what a kept future holds
    assert future.result().o == 7


def test_callbacks_added_while_pending_run_in_order_without_a_condition():
    """A callback per send (RocketMQ's SendCallback): kept in a plain list, run once each, in the
    order the futures resolve, each seeing its built result; a failing callback is logged."""
    futures = [SendFuture() for _ in range(5)]
    seen = []
    for future in futures:
        future.add_done_callback(lambda f: seen.append(f.result()))
    futures[2].add_done_callback(lambda f: seen.append("second of 2"))
    SendFuture.set_results(futures, range(5), lambda n: ("built", n))
    assert seen == [("built", 0), ("built", 1), ("built", 2), "second of 2", ("built", 3), ("built", 4)]
    assert all(f._lazy_condition is None for f in futures)  # noqa: SLF001 - the point: none was made
    failing = SendFuture()
    failing.add_done_callback(lambda f: 1 / 0)  # logged, and the next one still runs
    failing.add_done_callback(lambda f: seen.append("after a failed one"))
    failing.set_result(1)
    assert seen[-1] == "after a failed one"
    failed = SendFuture()
    failed.add_done_callback(lambda f: seen.append(type(f.exception())))
    failed.set_exception(KeyError("k"))
    assert seen[-1] is KeyError


def test_a_future_given_one_callback_keeps_no_list_for_it():
    """A callback per send: a list per future would be one more object per message in flight
    for the cyclic collector, which bounds a pipelining producer."""
    future, seen = SendFuture(), []
    future.add_done_callback(seen.append)
    assert future._early_callbacks == seen.append  # noqa: SLF001 - the point: kept as it is
    future.set_result(3)
    assert seen == [future]


def test_a_callback_added_before_a_waiter_made_the_condition_still_runs_once():
    future = SendFuture()
    seen = []
    future.add_done_callback(lambda f: seen.append(f.result()))
    with pytest.raises(cf.TimeoutError):
        future.result(timeout=0.01)  # makes the condition: the callback moves to Future's own list
    SendFuture.set_results([future], [7], lambda n: n * 2)
    assert seen == [14]


def test_callbacks_run_in_the_order_of_the_futures_with_or_without_a_condition():
    """RocketMQ's ``SendCallback``s of one queue come in send order, also when someone waited on
    some of the futures (which made their conditions) before they resolved."""
    futures = [SendFuture() for _ in range(6)]
    seen = []
    for future in futures:
        future.add_done_callback(lambda f: seen.append(f.result()))
    for future in futures[1::2]:
        with pytest.raises(cf.TimeoutError):
            future.result(timeout=0.001)
    SendFuture.set_results(futures, range(6), lambda n: n * 10)
    assert seen == [0, 10, 20, 30, 40, 50]


@pytest.mark.parametrize("resolve", [_resolve_one_by_one, _resolve_from_values])
def test_racing_callbacks_waiters_and_setters_run_each_callback_once(resolve):
    """Callbacks added and conditions made (by waiters) while the sender resolves the futures."""
    for _ in range(200):
        futures = [SendFuture() for _ in range(50)]
        seen = collections.Counter()

        def add_callbacks(futures, seen):
            for f in futures:
                f.add_done_callback(lambda f: seen.update([f.result()]))

        def wait_on_some(futures):  # cf.wait makes the condition of each, finished or not
            for f in futures[::3]:
                cf.wait([f], timeout=10)

        threads = [threading.Thread(target=add_callbacks, args=(futures, seen)),
                   threading.Thread(target=wait_on_some, args=(futures,))]
        for thread in threads:
            thread.start()
        resolve(futures)
        for thread in threads:
            thread.join(10)
        assert seen == collections.Counter(("built", n) for n in range(50))
