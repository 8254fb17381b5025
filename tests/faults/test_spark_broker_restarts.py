"""Scenario 7: a running exactly-once Spark query (orderlymq -> orderlymq) while the broker is
killed with SIGKILL and started again on its port and data dir, again and again, under keyed
producers. A restart frees every queue lock; nobody else consumes the group meanwhile, so the
query must take its locks again and go on (never fail with a FencedError), and the output topic
must hold every acknowledged message once, each key in order."""

from __future__ import annotations

import time

import pytest

from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.spark_queries import all_acked_copied, copy_query, keyed_producers, visible
from tests.faults.workload import stored_deliveries
from tests.spark.helpers import committed
from tests.support import wait_until

SOURCE, SINK, GROUP, QUEUES = "payments", "payments-copy", "copier", 4
pytestmark = pytest.mark.spark



def test_exactly_once_query_rides_out_broker_restarts(spark, broker_proc, fault_report, tmp_path):
    proc = broker_proc(flush="sync")
    history = History()
    producers = keyed_producers(proc.address, SOURCE, SINK, QUEUES, history)
    conn = BrokerConnection(proc.address, retry_timeout=60)
    query = copy_query(spark, proc.address, SOURCE, SINK, GROUP, tmp_path / "checkpoint",
                       trigger={"processingTime": "200 milliseconds"}, startingOffsets="earliest",
                       maxMessagesPerTrigger=PROFILE.spark_max_per_trigger)
    recoveries: list[float] = []
    try:
        for producer in producers:
            producer.start()
        for _ in range(PROFILE.broker_cycles):
            before = visible(conn, SINK)
            assert wait_until(lambda: visible(conn, SINK) > before or query.exception(), 120)  # noqa: B023
            assert query.exception() is None
            proc.kill9()
            proc.start()
            restarted, at_restart = time.monotonic(), visible(conn, SINK)
            assert wait_until(lambda: visible(conn, SINK) > at_restart or query.exception(), 180)  # noqa: B023
            recoveries.append(round(time.monotonic() - restarted, 2))
            assert query.exception() is None, str(query.exception())[:3000]
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join()
        caught_up = wait_until(lambda: all_acked_copied(conn, SINK, history) or query.exception(), 300, interval=1.0)
    finally:
        for producer in producers:
            producer.stop.set()
        query.stop()
    failure = query.exception()
    output = check(history.sends, stored_deliveries(conn, SINK))
    source_committed = sum(committed(conn, GROUP, SOURCE).values())
    conn.close()
    fault_report("7 Spark exactly-once query through broker kill -9 restarts", {"output": output},
                 restarts=len(recoveries), recovery_s=recoveries, max_recovery_s=max(recoveries, default=None),
                 source_committed=source_committed, failed=None if failure is None else str(failure)[:300])
    assert failure is None, str(failure)[:3000]
    assert caught_up and output.ok, str(output)
