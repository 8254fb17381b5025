"""Scenario 7: a running exactly-once Spark query (orderlymq -> orderlymq) while the broker is
killed with SIGKILL and started again on its port and data dir, again and again, under keyed
producers. A restart fences every lock holder (each queue is kept for its holder for a lease);
nobody else consumes the group meanwhile, so the query must take its locks again and go on (never
fail with a FencedError), and the output topic must hold every acknowledged message once, each key
in order."""

from __future__ import annotations

import time

import pytest

from tests.faults.fault_profile import PROFILE
from tests.faults.spark_queries import CopyRun
from tests.spark.helpers import committed

SOURCE, SINK, GROUP, QUEUES = "payments", "payments-copy", "copier", 4
pytestmark = pytest.mark.spark



@pytest.mark.slow
def test_exactly_once_query_rides_out_broker_restarts(spark, broker_proc, fault_report, tmp_path):
    proc = broker_proc(flush="sync")
    run = CopyRun.start(spark, proc.address, SOURCE, SINK, GROUP, QUEUES, tmp_path / "checkpoint")
    recoveries: list[float] = []
    try:
        for _ in range(PROFILE.broker_cycles):
            run.advance(120)
            assert run.query.exception() is None
            proc.kill9()
            proc.start()
            restarted = time.monotonic()
            run.advance(180)
            recoveries.append(round(time.monotonic() - restarted, 2))
            assert run.query.exception() is None, str(run.query.exception())[:3000]
        caught_up = run.catch_up()
    finally:
        run.stop()
    failure = run.query.exception()
    output = run.output()
    source_committed = sum(committed(run.conn, GROUP, SOURCE).values())
    run.conn.close()
    fault_report("7 Spark exactly-once query through broker kill -9 restarts", {"output": output},
                 restarts=len(recoveries), recovery_s=recoveries, max_recovery_s=max(recoveries, default=None),
                 source_committed=source_committed, failed=None if failure is None else str(failure)[:300])
    assert failure is None, str(failure)[:3000]
    assert caught_up and output.ok, str(output)
