"""``connector.spark.worker_gc``: a worker's first task collects its garbage, then freezes the rest;
so do the driver's workers that make the sink's writer every micro-batch.

Run in a fresh interpreter each: freezing is for the life of a process, not the test runner's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from connector.client.connection import pb

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import gc
    import weakref

    from connector.spark.worker_gc import freeze_worker_objects

    gc.disable()  # no automatic collection: only the one freeze_worker_objects makes
    class Node:
        pass

    garbage = Node()
    garbage.itself = garbage  # a cycle: only the collector frees it
    gone = weakref.ref(garbage)
    del garbage
    kept = [Node() for _ in range(1000)]

    freeze_worker_objects()
    frozen = gc.get_freeze_count()
    print("collected" if gone() is None else "not collected")
    print("frozen" if frozen >= len(kept) else f"{frozen} frozen")

    later = [Node() for _ in range(1000)]
    freeze_worker_objects()  # a later task: nothing more is frozen
    print("unchanged" if gc.get_freeze_count() == frozen else f"{gc.get_freeze_count() - frozen} more frozen")
""")


def test_first_task_collects_the_garbage_then_freezes_what_is_left_and_later_tasks_freeze_nothing():
    out = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["collected", "frozen", "unchanged"]


SINK_PROGRAM = textwrap.dedent("""
    import gc
    import os

    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from connector.spark import OrderlyMQDataSource

    schema = StructType([StructField("key", StringType()), StructField("body", BinaryType())])
    source = OrderlyMQDataSource({"brokers": os.environ["BROKER"], "topic": os.environ["TOPIC"],
                                  "shardingKey": "key", "checkpointLocation": "/nonexistent"})
    print("before:", gc.get_freeze_count())
    source.streamWriter(schema, False)
    print("after:", "frozen" if gc.get_freeze_count() > 10_000 else gc.get_freeze_count())
""")


def test_the_driver_workers_that_make_the_stream_writer_freeze_too(broker, conn, topic_name):
    """PySpark makes the sink's writer every micro-batch in two reused workers of the driver (the
    write's planning, then the commit), each running a full collection after the call: their
    imported modules must be frozen as the tasks' are."""
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=2))
    env = {**os.environ, "BROKER": broker.address, "TOPIC": topic_name}
    out = subprocess.run([sys.executable, "-c", SINK_PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == ["before: 0", "after: frozen"]
