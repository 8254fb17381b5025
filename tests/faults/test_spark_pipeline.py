"""Scenario 4: a Spark streaming pipeline (orderlymq -> UDF -> orderlymq, exactly once) on a real
standalone cluster, through three failures: a task attempt that fails once (the UDF raises), the
executor JVM killed with SIGKILL, and the driver killed with SIGKILL and started again from its
checkpoint. The output topic must hold every input message once, each key in order. The same
pipeline runs on a single broker and on two broker groups (the topics' queues spread over both,
so every micro-batch commits a transaction part on each group). Last, on local[2], a driver killed
in its first micro-batch restarts it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from broker.wire.errors import TopicNotFoundError
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection, pb
from connector.client.routed import RoutedConnection
from connector.history import History, Verdict, check
from connector.spark.transactions import SINK_LOG_TOPIC
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import body, parse_body, stored_deliveries
from tests.jobs.cluster import ROOT, SPARK_HOME, StandaloneCluster, spark_env
from tests.spark.helpers import committed, queue_ends
from tests.support import pull_all, wait_until

SOURCE, SINK, GROUP, QUEUES = "account-events", "account-notices", "notifier", 4
JOB = Path(__file__).with_name("spark_pipeline.py")
pytestmark = pytest.mark.spark


def produce(address: str, history: History, seqs: dict[str, int], count: int) -> None:
    """``count`` more messages, keys ``acct-<n>`` in turn, routed by key."""
    keys = [f"acct-{k}" for k in range(PROFILE.spark_keys)]
    rows = []
    for i in range(count):
        key = keys[i % len(keys)]
        seq = seqs.get(key, 0)
        seqs[key] = seq + 1
        rows.append({"key": key, "body": body(key, seq)})
    with Producer(address) as producer:
        producer.send_batch(SOURCE, rows)
    for row in rows:
        history.sent(*parse_body(row["body"]), acked=True)


def visible(conn: BrokerConnection, topic: str) -> int:
    """Messages visible in ``topic`` (committed sink transactions only)."""
    return sum(conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic, queue_id=q)).max_offset
               for q in range(QUEUES))


def submit(cluster: StandaloneCluster, tmp: Path, name: str, *args: str) -> subprocess.Popen:
    """spark-submit the pipeline in its own process group (so the whole driver can be killed)."""
    cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.master_url,
           "--conf", "spark.executor.memory=1g", "--conf", "spark.driver.memory=1g", str(JOB), *args]
    log = open(tmp / f"{name}.log", "wb")
    return subprocess.Popen(cmd, env=cluster.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def batch_in_flight(checkpoint: Path) -> int | None:
    """The micro-batch the checkpoint has planned (offsets log) but not recorded as done (commits log)."""
    def last(log: str) -> int:
        return max((int(f.name) for f in (checkpoint / log).glob("[0-9]*")), default=-1)

    planned = last("offsets")
    return planned if planned > last("commits") else None


def await_output(conn, driver: subprocess.Popen, log: Path, more_than: int, interval: float = 0.05) -> int:
    """Wait until the sink's topic shows more than ``more_than`` messages, the driver still running;
    how many it shows."""
    assert wait_until(lambda: visible(conn, SINK) > more_than or driver.poll() is not None, timeout=300,
                      interval=interval), f"no output past {more_than} messages"
    assert driver.poll() is None, log.read_text()[-3000:]
    return visible(conn, SINK)


def kill_group(driver: subprocess.Popen) -> None:
    """SIGKILL the driver's whole process group (its JVM too), if it still runs."""
    if driver.poll() is None:
        os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()


def run_job(job: Path, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    """The pipeline job on local[2], in its own process group (so the whole driver can be killed)."""
    with open(log, "wb") as out:  # the job writes to its own copy of the file
        return subprocess.Popen([sys.executable, str(job), *args], env=env, cwd=job.parents[2], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def create_topics(address: str) -> None:
    with Admin(address) as admin:
        for topic in (SOURCE, SINK):
            admin.create_topic(topic, QUEUES)


def local_job_args(address: str, tmp_path: Path) -> list[str]:
    """The pipeline job's arguments for a run on local[2], which does not retry a failed task: its
    fail marker exists already, so no task fails."""
    marker = tmp_path / "failed-once.json"
    marker.write_text("{}")
    return ["--brokers", address, "--source", SOURCE, "--sink", SINK, "--group", GROUP,
            "--checkpoint", str(tmp_path / "checkpoint"), "--fail-marker", str(marker),
            "--max-per-trigger", str(PROFILE.spark_max_per_trigger)]


def restart_and_judge(address: str, conn: BrokerConnection, history: History, seqs: dict[str, int], produced: int,
                      args: list[str], tmp_path: Path) -> tuple[Verdict, dict[int, int], dict[int, int]]:
    """The rest of the input, then the job restarted from its checkpoint under this connector
    (available-now); the output judged by the strict checker, the source group's offsets, and the
    source's ends."""
    produce(address, history, seqs, PROFILE.spark_messages - produced)
    restarted = run_job(JOB, spark_env(tmp_path), tmp_path / "restarted.log", *args, "--trigger", "available-now")
    assert restarted.wait(timeout=600) == 0, (tmp_path / "restarted.log").read_text()[-3000:]
    output = check(history.sends, stored_deliveries(conn, SINK))
    return output, committed(conn, GROUP, SOURCE), queue_ends(conn, SOURCE, QUEUES)


def sink_plans(conn: BrokerConnection) -> set[int]:
    """Batch ids whose commit plan the sink recorded (see connector.spark.transactions)."""
    try:
        table = pull_all(conn, SINK_LOG_TOPIC, 0)
    except TopicNotFoundError:
        return set()
    return {json.loads(raw)["batch"] for raw in table.column("body").to_pylist()}


def executor_pids(work_dir: Path) -> list[int]:
    """Executor JVMs launched by this test's worker (their working directory is under its work dir)."""
    found = subprocess.run(["pgrep", "-f", "CoarseGrainedExecutorBackend"], capture_output=True, text=True)
    pids = []
    for pid in map(int, found.stdout.split()):
        try:
            if Path(os.readlink(f"/proc/{pid}/cwd")).is_relative_to(work_dir):
                pids.append(pid)
        except OSError:
            continue
    return pids


@pytest.mark.slow
def test_pipeline_output_is_complete_ordered_and_once_through_task_executor_and_driver_failures(
        broker_proc, fault_report, tmp_path):
    proc = broker_proc(flush="sync")
    create_topics(proc.address)
    run_pipeline_through_failures(proc.address, BrokerConnection(proc.address, retry_timeout=30), fault_report,
                                  tmp_path, "4 Spark pipeline")


@pytest.mark.slow
def test_pipeline_across_two_broker_groups_through_task_executor_and_driver_failures(
        broker_cluster, fault_report, tmp_path):
    groups = broker_cluster(2, 1, flush="sync", min_sync_replicas=1)  # one broker a group: no slave to wait for
    bootstrap = ",".join(group.addresses for group in groups)
    with Admin(bootstrap) as admin:
        for topic in (SOURCE, SINK):
            admin.create_topic(topic, QUEUES)
            assert len([g for g in admin.describe_topic(topic).groups if g.queue_ids]) == 2, "queues on both groups"
    run_pipeline_through_failures(bootstrap, RoutedConnection(bootstrap, retry_timeout=30), fault_report, tmp_path,
                                  "4 Spark pipeline on two broker groups")


def run_pipeline_through_failures(address: str, conn, fault_report, tmp_path: Path, label: str) -> None:
    """Input, the pipeline through a failed task, a killed executor and a killed driver, then its
    restart from the checkpoint; the output judged by the strict checker."""
    history, seqs = History(), {}
    first = PROFILE.spark_messages * 2 // 3
    produce(address, history, seqs, first)
    marker = tmp_path / "failed-once.json"
    args = ["--brokers", address, "--source", SOURCE, "--sink", SINK, "--group", GROUP,
            "--checkpoint", str(tmp_path / "checkpoint"), "--fail-marker", str(marker),
            "--max-per-trigger", str(PROFILE.spark_max_per_trigger)]
    with StandaloneCluster(tmp_path) as cluster:
        driver = submit(cluster, tmp_path, "driver-1", *args, "--trigger", "interval")
        try:
            await_output(conn, driver, tmp_path / "driver-1.log", 0)
            assert wait_until(lambda: executor_pids(tmp_path / "work"), timeout=60), "an executor runs"
            executor = executor_pids(tmp_path / "work")[0]
            at_executor_kill = visible(conn, SINK)
            os.kill(executor, signal.SIGKILL)
            # Poll fast: the driver dies right after a batch became visible, likely before Spark
            # recorded it as done, so the restart replays a batch whose transactions are committed.
            at_driver_kill = await_output(conn, driver, tmp_path / "driver-1.log", at_executor_kill, interval=0.01)
        finally:
            kill_group(driver)
        in_flight = batch_in_flight(tmp_path / "checkpoint")
        planned = sink_plans(conn)
        produce(address, history, seqs, PROFILE.spark_messages - first)
        restarted = submit(cluster, tmp_path, "driver-2", *args, "--trigger", "available-now")
        assert restarted.wait(timeout=600) == 0, (tmp_path / "driver-2.log").read_text()[-3000:]
    output = check(history.sends, stored_deliveries(conn, SINK))
    source_committed = committed(conn, GROUP, SOURCE)
    conn.close()
    fault_report(f"{label}: task failure, executor kill -9, driver kill -9 + restart", {"output": output},
                 failed_task=json.loads(marker.read_text()) if marker.exists() else None,
                 executor_killed=executor, output_at_executor_kill=at_executor_kill,
                 output_at_driver_kill=at_driver_kill, batch_in_flight_at_driver_kill=in_flight,
                 its_commit_plan_recorded=in_flight in planned, source_committed=sum(source_committed.values()))
    assert marker.exists(), "the UDF failed one task attempt"
    assert output.ok, str(output)


@pytest.mark.slow
def test_a_driver_killed_in_its_first_batch_restarts_it_from_where_it_started(broker, fault_report, tmp_path):
    """The driver (local[2]) killed -9 while its first micro-batch runs: the checkpoint plans batch 0
    and records no commit, so Spark replays it from the source's initial offset. The restart must
    read it from where the dead run started, under that run's identity (its locks may still be
    held), then go on; the output judged by the strict checker."""
    address = broker.address
    conn = BrokerConnection(address)
    create_topics(address)
    history, seqs = History(), {}
    first = PROFILE.spark_messages // 2
    produce(address, history, seqs, first)
    hold, args = tmp_path / "holding", local_job_args(address, tmp_path)
    driver = run_job(JOB, spark_env(tmp_path), tmp_path / "first.log", *args, "--hold-marker", str(hold),
                     "--trigger", "interval")
    try:
        assert wait_until(lambda: hold.exists() or driver.poll() is not None, timeout=300), "the UDF never ran"
        assert driver.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        in_flight = batch_in_flight(tmp_path / "checkpoint")
    finally:
        kill_group(driver)
    assert in_flight == 0, "killed in the first batch"
    output, source_committed, ends = restart_and_judge(address, conn, history, seqs, first, args, tmp_path)
    conn.close()
    fault_report("Spark pipeline, driver kill -9 in its first batch + restart", {"output": output},
                 source_committed=sum(source_committed.values()))
    assert output.ok, str(output)
    assert source_committed == ends
