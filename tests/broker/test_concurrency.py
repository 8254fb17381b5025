"""Idle clients must not lock anyone out: a thousand open send streams and a thousand long polls
against a real broker process, with a normal producer/consumer pair and Health beside them.

Liveness only (every call answered, none refused) and per-key order and completeness of the pair
(``connector.history``); the latencies are printed, not asserted.
"""

from __future__ import annotations

import json

import pytest

from bench.crowd import run_crowd
from broker.launcher import BrokerProcess

STREAMS = 1_000
POLLS = 1_000
PAIR_MESSAGES = 2_000


@pytest.fixture
def broker_process(tmp_path):
    with BrokerProcess(tmp_path / "data", "--log-level", "WARNING") as process:
        yield process


def test_thousand_idle_streams_and_polls_leave_the_broker_serving(broker_process):
    figures = run_crowd(broker_process.address, streams=STREAMS, polls=POLLS, pair_messages=PAIR_MESSAGES)
    print(f"\n{figures.line()}\n{json.dumps(figures.summary())}")
    assert figures.stood, f"{figures.streams_standing} of {STREAMS} streams answered: {figures.line()}; {figures.crowd_errors[:5]}"
    assert figures.health_errors == [], figures.health_errors[:5]
    assert figures.pair_errors == [], figures.pair_errors[:5]
    assert len(figures.send_ms) == PAIR_MESSAGES
    assert figures.verdict.ok and figures.verdict.acked == figures.verdict.distinct_delivered, str(figures.verdict)
    assert figures.crowd_errors == [], figures.crowd_errors[:5]
    assert figures.streams_closed == STREAMS
    assert figures.polls_answered == POLLS
