"""``connector.spark.progress.lag_by_queue``: per-queue lag from a query's progress, checked against
the broker and the rows a real streaming query read."""

from __future__ import annotations

import json

import pytest

from connector.client import Admin
from connector.spark.progress import lag_by_queue
from tests.spark.helpers import Collector, create_topic, keyed_events, produce, run_available_now, stream


def source(end, latest, description="orderlymq"):
    return {"description": description, "startOffset": None, "endOffset": end, "latestOffset": latest}


def offset(queues: dict) -> dict:
    return {"clientId": "spark-1", "group": "g", "queues": queues}


def test_lag_is_latest_minus_end_per_queue_whatever_form_the_progress_takes():
    progress = {"sources": [
        source(json.dumps(offset({"orders": {"0": 5, "1": 9}})), offset({"orders": {"0": 12, "1": 9}})),
        source("7", "9", description="another kind of source"),
    ]}
    expected = {("orders", 0): 7, ("orders", 1): 0}
    assert lag_by_queue(progress) == expected
    assert lag_by_queue(json.dumps(progress)) == expected
    assert lag_by_queue({"sources": [source(offset({"orders": {"0": 5}}), None)]}) == {}
    assert lag_by_queue(None) == {}


@pytest.mark.spark
def test_lag_of_each_batch_matches_the_broker_and_the_rows_read(ospark, broker, conn, topic_name, tmp_path):
    create_topic(conn, topic_name, 3)
    events = keyed_events(9, 8)  # 72 messages over the three queues
    produce(conn, topic_name, 3, events)
    collector = Collector()
    df = stream(ospark, broker, topic_name, "lagging", maxMessagesPerTrigger=20)
    query = run_available_now(df, tmp_path / "ck", collector)
    with Admin(broker.address) as admin:
        stored = {(topic_name, s.queue_id): s.max_offset for s in admin.topic_status(topic_name)}
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 4  # 72 messages, at most 20 a batch
    read = 0
    for progress in batches:
        read += progress["numInputRows"]
        lag = lag_by_queue(progress)
        assert sum(lag.values()) == len(events) - read
        end = json.loads(progress["sources"][0]["endOffset"])["queues"][topic_name]
        assert lag == {ref: stored[ref] - end[str(ref[1])] for ref in stored}
    assert set(lag_by_queue(query.lastProgress).values()) == {0}
