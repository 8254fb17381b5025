"""A streaming query upgraded in place. The pipeline of scenario 4 (orderlymq -> UDF -> orderlymq,
exactly once) runs under the connector of the first release (``tests.support.FIRST_RELEASE``,
run from this repository's history) against this broker, as brokers are upgraded first. Its driver
is killed -9 right after a batch became visible, then the query restarts from its checkpoint under
this connector. What the older connector left must carry over: source offsets without the group and
brokers this version writes in them, and sink commit plans without broker groups. The output must
hold every input message once, each key in order, and the source group's offsets reach the end."""

from __future__ import annotations

import pytest

from connector.client.connection import BrokerConnection
from connector.history import History
from tests.faults.fault_profile import PROFILE
from tests.faults.test_spark_pipeline import (
    await_output,
    batch_in_flight,
    create_topics,
    kill_group,
    local_job_args,
    produce,
    restart_and_judge,
    run_job,
    sink_plans,
)
from tests.jobs.cluster import spark_env
from tests.support import FIRST_RELEASE, older_code

pytestmark = pytest.mark.spark

# What the first release's pipeline job needs of its own tree: the job, its session, the connector
# (and the broker modules it imports) and the module by which Spark finds format("orderlymq").
OLDER_TREE = ("broker", "connector", "pyspark_orderlymq", "spark_jobs", "tests/__init__.py",
              "tests/faults/__init__.py", "tests/faults/spark_pipeline.py")


@pytest.mark.slow
def test_a_query_of_the_first_release_goes_on_under_this_connector(broker, fault_report, tmp_path):
    address = broker.address
    conn = BrokerConnection(address)
    create_topics(address)
    history, seqs = History(), {}
    first = PROFILE.spark_messages * 2 // 3
    produce(address, history, seqs, first)
    older = older_code(tmp_path, FIRST_RELEASE, *OLDER_TREE)
    older_env = {**spark_env(tmp_path), "PYTHONPATH": str(older)}  # the job's tasks import the older connector too
    args = local_job_args(address, tmp_path)
    driver = run_job(older / "tests" / "faults" / "spark_pipeline.py", older_env, tmp_path / "older.log", *args,
                     "--trigger", "interval")
    try:
        at_first_output = await_output(conn, driver, tmp_path / "older.log", 0)
        # Poll fast: the driver dies right after a batch became visible, likely before Spark
        # recorded it as done, so this connector replays a batch the older one committed.
        at_kill = await_output(conn, driver, tmp_path / "older.log", at_first_output, interval=0.01)
    finally:
        kill_group(driver)
    in_flight = batch_in_flight(tmp_path / "checkpoint")
    planned = sink_plans(conn)
    output, source_committed, ends = restart_and_judge(address, conn, history, seqs, first, args, tmp_path)
    conn.close()
    fault_report("Spark pipeline of the first release, driver kill -9, restarted under this connector",
                 {"output": output}, output_at_driver_kill=at_kill, batch_in_flight_at_driver_kill=in_flight,
                 its_commit_plan_recorded=in_flight in planned, source_committed=sum(source_committed.values()))
    assert output.ok, str(output)
    assert source_committed == ends
