"""``log_format = "json"``: every line a broker writes is one JSON object with time, level, logger,
message (and exception when there is one)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime

import pytest

from broker.config import BrokerConfig
from broker.logs import JsonFormatter
from broker.wire.errors import InvalidOptionError
from connector.client import Admin, Producer
from tests.faults.brokers import broker_process


def parse_lines(text: str) -> list[dict]:
    lines = text.splitlines()
    assert lines, "the broker wrote no log line"
    records = [json.loads(line) for line in lines]  # fails on the first line that is not JSON
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys(), record
        assert datetime.fromisoformat(record["time"]).utcoffset().total_seconds() == 0
    return records


def test_a_broker_subprocess_logs_one_json_object_per_line(tmp_path, topic_name):
    broker = broker_process(tmp_path / "data", log_format="json", log_level="DEBUG").start()
    try:
        with Admin(broker.address) as admin, Producer(broker.address) as producer:
            admin.create_topic(topic_name, 2)
            producer.send(topic_name, b"hello", key="k")
    finally:
        assert broker.stop() == 0
    records = parse_lines(broker.log_text())
    messages = [(r["level"], r["logger"], r["message"]) for r in records]
    assert any(lvl == "INFO" and msg.startswith("broker broker-a listening on") for lvl, _, msg in messages)
    assert ("INFO", "broker.storage.store", f"created topic {topic_name} with 2 queues") in messages
    assert any(msg == "signal 15: shutting down" for _, _, msg in messages)


def test_an_exception_stays_inside_its_one_line_record():
    try:
        raise ValueError('a "quoted"\nmulti-line problem')
    except ValueError:
        record = logging.getLogger("broker.test").makeRecord(
            "broker.test", logging.ERROR, __file__, 1, "failed on %s", ("queue 3",), sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert (entry["level"], entry["logger"], entry["message"]) == ("ERROR", "broker.test", "failed on queue 3")
    assert entry["exception"].startswith("Traceback") and 'ValueError: a "quoted"\nmulti-line problem' in entry["exception"]


def test_an_unknown_log_format_is_refused_by_name():
    with pytest.raises(InvalidOptionError, match="log_format must be one of text, json, got 'xml'"):
        BrokerConfig(log_format="xml")
