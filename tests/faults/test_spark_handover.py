"""Scenario 8: hand-over between two streaming queries of one consumer group, q1 -> q2 -> q1 ->
..., each with its own checkpoint, under keyed producers. Each query is stopped while data flows
(often with a batch in flight) and the other one takes over at once (the stopped query released
its locks). A query restarted from its older checkpoint must not read again what the other one
read: by default it fails naming the other client; with ``groupOffsetConflict=group`` it goes on
from the group's offsets. The output topic must hold every acknowledged message once, in order;
after every stop the group's offsets must sit exactly after what the stopped query made visible."""

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

SOURCE, SINK, GROUP, QUEUES = "orders", "orders-billed", "billing", 4
HANDOVERS = max(3, PROFILE.broker_cycles // 2)
pytestmark = pytest.mark.spark



def start(spark, address, checkpoint, **options):
    return copy_query(spark, address, SOURCE, SINK, GROUP, checkpoint, trigger={"processingTime": "200 milliseconds"},
                      maxMessagesPerTrigger=PROFILE.spark_max_per_trigger, lockTimeoutMs=10000, **options)


@pytest.mark.slow
def test_handover_between_two_queries_of_a_group_neither_loses_nor_duplicates(spark, broker_proc, fault_report,
                                                                              tmp_path):
    proc = broker_proc(flush="sync")
    history = History()
    producers = keyed_producers(proc.address, SOURCE, SINK, QUEUES, history)
    conn = BrokerConnection(proc.address, retry_timeout=60)
    checkpoints = [tmp_path / "q1", tmp_path / "q2"]
    handover_s: list[float] = []
    stop_lags: list[int] = []
    conflict = None
    try:
        for producer in producers:
            producer.start()
        stopped_at = None
        for turn in range(HANDOVERS + 1):
            checkpoint = checkpoints[turn % 2]
            options = {"startingOffsets": "earliest"} if turn == 0 else {}
            if turn == 2:  # q1 again, from its older checkpoint: the default refuses, naming q2
                refused = start(spark, proc.address, checkpoint)
                with pytest.raises(Exception, match="groupOffsetConflict"):
                    refused.awaitTermination(120)
                lines = str(refused.exception()).splitlines()
                conflict = next((line[:400] for line in lines if "moved the group's offsets" in line), lines[0])
            if turn >= 2:
                options["groupOffsetConflict"] = "group"
            before = visible(conn, SINK)
            query = start(spark, proc.address, checkpoint, **options)
            try:
                assert wait_until(lambda: visible(conn, SINK) > before or query.exception(), 120)  # noqa: B023
                if stopped_at is not None:
                    handover_s.append(round(time.monotonic() - stopped_at, 2))
                target = before + 3 * PROFILE.spark_max_per_trigger
                assert wait_until(lambda: visible(conn, SINK) >= target or query.exception(), 300)  # noqa: B023
            finally:
                query.stop()
            stopped_at = time.monotonic()
            assert query.exception() is None, str(query.exception())[:3000]
            stop_lags.append(visible(conn, SINK) - sum(committed(conn, GROUP, SOURCE).values()))
        for producer in producers:
            producer.stop.set()
        for producer in producers:
            producer.join()
        last = start(spark, proc.address, checkpoints[(HANDOVERS + 1) % 2], groupOffsetConflict="group")
        try:
            caught_up = wait_until(lambda: all_acked_copied(conn, SINK, history) or last.exception(), 300, interval=1.0)
        finally:
            last.stop()
        assert last.exception() is None, str(last.exception())[:3000]
    finally:
        for producer in producers:
            producer.stop.set()
    output = check(history.sends, stored_deliveries(conn, SINK))
    conn.close()
    fault_report("8 Spark hand-over q1 -> q2 -> q1 within one consumer group", {"output": output},
                 handovers=HANDOVERS, handover_s=handover_s, max_handover_s=max(handover_s, default=None),
                 group_lag_after_stop=stop_lags, conflict=conflict)
    assert conflict is not None and "moved the group's offsets" in conflict
    assert caught_up and output.ok, str(output)
    assert stop_lags == [0] * len(stop_lags), "the group's offsets sit exactly after what became visible"
