"""A running exactly-once Spark query (orderlymq -> orderlymq) while the broker's wall clock steps an
hour forward, two back and one forward again, under keyed producers, with the broker's default
lock lease and transaction timeout (a minute each). Nothing that counts time may notice: the
query keeps its queue locks and its transactions, never fails, and the output topic holds every
acknowledged message once, each key in order. The query's lock epochs never change: no lease
lapsed, so its locks were never taken again."""

from __future__ import annotations

import time

import pytest

from connector.client.connection import BrokerConnection, pb
from connector.spark.locks import MAX_RENEW_S
from tests.faults.spark_queries import CopyRun
from tests.faults.stepped_clock import HOUR_S, SteppedClock
from tests.support import wait_until

SOURCE, SINK, GROUP, QUEUES = "payments", "payments-copy", "copier", 4
STEPS_S = (HOUR_S, -2 * HOUR_S, HOUR_S)
pytestmark = pytest.mark.spark


@pytest.mark.slow
def test_exactly_once_query_rides_out_clock_steps(spark, broker_proc, fault_report, tmp_path):
    clock = SteppedClock(tmp_path / "clock-offset", SOURCE)
    proc = broker_proc(env=clock.env())
    run = CopyRun.start(spark, proc.address, SOURCE, SINK, GROUP, QUEUES, tmp_path / "checkpoint")
    epochs = epochs_after = None
    try:
        epochs = wait_until(lambda: _epochs(run.conn), 120)
        for seconds in STEPS_S:
            run.advance(120)
            clock.step(run.conn, seconds)
            run.advance(120)
            assert run.query.exception() is None, str(run.query.exception())[:3000]
        caught_up = run.catch_up()
        time.sleep(2 * MAX_RENEW_S)  # renewal rounds after the last step, each of which would see a lapse
        epochs_after = _epochs(run.conn)
    finally:
        run.stop()
    failure = run.query.exception()
    output = run.output()
    run.conn.close()
    fault_report("Spark exactly-once query through steps of the broker's wall clock", {"output": output},
                 steps_s=list(STEPS_S), epochs=epochs, epochs_after=epochs_after,
                 failed=None if failure is None else str(failure)[:300])
    assert failure is None, str(failure)[:3000]
    assert caught_up and output.ok, str(output)
    assert epochs_after == epochs


def _epochs(conn: BrokerConnection) -> dict[int, int] | None:
    """``{queue id: epoch}`` of the query's locks, once it holds every queue."""
    locks = conn.call("QueryLocks", pb.QueryLocksRequest(group=GROUP, topic=SOURCE)).locks
    return {lock.queue_id: lock.epoch for lock in locks} if len(locks) == QUEUES else None
