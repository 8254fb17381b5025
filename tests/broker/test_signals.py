"""Signals a broker process gets from its surroundings: SIGHUP (a closed terminal, a service manager's
reload) leaves it serving with everything stored; SIGTERM stops it cleanly (tests/broker/test_crash.py)."""

from __future__ import annotations

import os
import signal

from broker.launcher import BrokerProcess
from connector.client.connection import BrokerConnection, pb
from tests.support import pull_all, send_rows, wait_until


def test_sighup_changes_nothing(tmp_path):
    broker = BrokerProcess(tmp_path / "data").start()
    try:
        with BrokerConnection(broker.address, retry_timeout=5) as conn:
            conn.call("CreateTopic", pb.CreateTopicRequest(topic="hup", queue_count=1))
            send_rows(conn, "hup", 0, [{"key": "k", "body": b"before"}])
            os.kill(broker.pid, signal.SIGHUP)
            assert wait_until(lambda: "SIGHUP: nothing to reload" in broker.log_text())
            send_rows(conn, "hup", 0, [{"key": "k", "body": b"after"}])
            assert pull_all(conn, "hup", 0).column("body").to_pylist() == [b"before", b"after"]
        assert broker.proc.poll() is None
    finally:
        assert broker.stop() == 0
