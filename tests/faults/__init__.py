"""Fault scenarios: the broker, the client and the Spark connector under failure, each run
ending with the history checker (``tests.faults.history``).

1. broker ``kill -9`` and restart in a loop, ``flush = "sync"`` (``test_broker_crash_loop``)
2. the same with ``flush = "async"`` (``test_broker_crash_loop``)
3. a lock holder frozen with SIGSTOP past its lease while another takes its queues
   (``test_stale_lock_holder``, the consumer process is ``locked_consumer.py``)
4. a Spark streaming pipeline through a failed task, a killed executor and a killed and restarted
   driver on a standalone cluster (``test_spark_pipeline``, the job is ``spark_pipeline.py``)
5. segments damaged while the broker is down (``test_disk_damage``)
6. bad requests at volume to every RPC beside good traffic (``test_bad_input``)

Sizes live in ``fault_profile.py``: short runs by default (CI), long ones with
``ORDERLYMQ_FAULTS=long`` (``make faults``). Each scenario prints a one-line summary, writes it to
``fault-summary.json`` in its tmp dir and appends it to ``fault-summaries.jsonl`` in the run's
base tmp dir; the lines are repeated at the end of the pytest output.
"""
