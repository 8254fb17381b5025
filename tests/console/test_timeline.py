"""The console's series: messages/s in per topic from max-offset growth, and lag per group."""

from __future__ import annotations

import pytest

from connector.console.timeline import Timeline


def snapshot(t_s: float, offsets: dict[str, int], lags: dict[str, int]) -> dict:
    return {
        "time_ms": int(t_s * 1000),
        "topics": [{"name": name, "max_offset_sum": total} for name, total in offsets.items()],
        "groups": [{"name": name, "lag": lag} for name, lag in lags.items()],
    }


def test_rates_are_offset_growth_per_second_and_lags_are_copied():
    timeline = Timeline()
    timeline.add(snapshot(10.0, {"orders": 100}, {"billing": 40}))
    timeline.add(snapshot(12.0, {"orders": 160, "new": 5}, {"billing": 10}))
    first, second = timeline.points()
    assert first == {"t": 10.0, "rates": {}, "lags": {"billing": 40}}
    assert second["rates"] == {"orders": pytest.approx(30.0), "new": 0.0}  # a new topic starts at 0
    assert second["lags"] == {"billing": 10}


def test_a_recreated_topic_never_shows_a_negative_rate_and_old_points_fall_off():
    timeline = Timeline(max_points=2)
    for t, total in ((1, 500), (2, 3), (3, 9)):
        timeline.add(snapshot(t, {"orders": total}, {}))
    assert [p["rates"]["orders"] for p in timeline.points()] == [0.0, pytest.approx(6.0)]
