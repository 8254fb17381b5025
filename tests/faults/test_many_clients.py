"""Break 6 at scale: thousands of idle clients (open send streams, long polls, real ``Producer``
clients) stand against a broker with a deliberately small worker pool, while a normal producer /
consumer pair moves keyed traffic and ``Health`` is asked in a loop. Nothing may be refused or
stuck, the pair's history must be clean, and every idle client is served when it speaks again.
Sizes come from ``PROFILE`` (``crowd_*``); latencies are reported, never asserted."""

from __future__ import annotations

import pytest

from bench.crowd import run_crowd
from tests.faults.fault_profile import PROFILE

WORKERS = 4  # far fewer threads than idle clients: waiting must not need one


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_thousands_of_idle_clients_leave_a_small_pool_broker_serving(broker_proc, fault_report, flush):
    proc = broker_proc(flush=flush, workers=WORKERS, log_level="WARNING")
    figures = run_crowd(proc.address, streams=PROFILE.crowd_streams, polls=PROFILE.crowd_polls,
                        producers=PROFILE.crowd_producers, pair_messages=PROFILE.crowd_pair_messages)
    summary = figures.summary()
    fault_report(f"many clients (flush={flush}, workers={WORKERS})", {"pair": figures.verdict},
                 **{k: round(v, 1) if isinstance(v, float) else v for k, v in summary.items() if k != "history"})
    assert figures.stood, f"{figures.line()}; {figures.crowd_errors[:5]}"
    assert figures.health_errors == [], figures.health_errors[:5]
    assert figures.pair_errors == [], figures.pair_errors[:5]
    assert len(figures.send_ms) == PROFILE.crowd_pair_messages
    assert figures.verdict.ok and figures.verdict.acked == figures.verdict.distinct_delivered, str(figures.verdict)
    assert figures.crowd_errors == [], figures.crowd_errors[:5]
    assert figures.streams_closed == PROFILE.crowd_streams
    assert figures.polls_answered == PROFILE.crowd_polls
    assert figures.producers_sent == PROFILE.crowd_producers
    assert proc.proc.poll() is None, "the broker process exited"
