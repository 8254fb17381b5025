"""``ConsumePool`` runs what it is given, survives what its calls raise, and ends cleanly."""

from __future__ import annotations

import threading

import pytest

from connector.client.consume_pool import ConsumePool


def test_one_thread_runs_calls_in_submission_order():
    pool = ConsumePool(1, "test-pool")
    seen = []
    for n in range(200):
        pool.submit(seen.append, n)
    pool.shutdown(wait=True)
    assert seen == list(range(200))


def test_shutdown_runs_what_was_submitted_then_refuses_more():
    pool = ConsumePool(3, "test-pool")
    release = threading.Event()
    done = []
    for _ in range(3):
        pool.submit(release.wait, 10)
    for n in range(50):
        pool.submit(done.append, n)
    closer = threading.Thread(target=pool.shutdown)
    closer.start()
    release.set()
    closer.join(10)
    assert not closer.is_alive() and sorted(done) == list(range(50))
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(done.append, 99)


def test_a_failing_call_is_logged_and_its_thread_goes_on(caplog):
    pool = ConsumePool(1, "test-pool")
    seen = []
    pool.submit(lambda: 1 / 0)
    pool.submit(seen.append, "after")
    pool.shutdown(wait=True)
    assert seen == ["after"]
    assert "a consume call failed" in caplog.text and "ZeroDivisionError" in caplog.text


def test_a_call_may_shut_its_own_pool_down():
    pool = ConsumePool(2, "test-pool")
    ended = threading.Event()

    def stop_from_inside():
        pool.shutdown(wait=True)  # joins the other thread, not its own
        ended.set()

    pool.submit(stop_from_inside)
    assert ended.wait(10)
    pool.shutdown(wait=True)
