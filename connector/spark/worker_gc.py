"""Spare a Spark Python worker's cycle collector the objects it keeps for life.

A Python worker that Spark reuses holds hundreds of thousands of objects it made once (pyspark,
pyarrow, grpc and our modules, their classes and functions), and every full collection of
Python's cycle collector walks all of them. In the two workers of a source reading 4 M rows,
that walk (``perf``: ``gc_collect_main`` and its visitors) was about a third of their CPU. The
first task of a worker therefore collects once and freezes what is left (``gc.freeze``):
collections after it walk only what later tasks make. Measured the same way, the collector's
share of those workers fell to about a sixth.

PySpark's daemon runs a full collection after every call a reused worker serves, and two workers
of the driver serve the sink once per micro-batch (making its writer for the tasks, then for the
commit): they freeze on their first call too. In a streaming query of a few rows per micro-batch
those two workers had used 37 and 59 ms of CPU per micro-batch, then 3 and 22.
"""

from __future__ import annotations

import gc
import threading

__all__ = ["freeze_worker_objects"]

_done = threading.Event()
_lock = threading.Lock()


def freeze_worker_objects() -> None:
    """Once per process: collect the garbage there is, then freeze every object left."""
    if _done.is_set():
        return
    with _lock:
        if not _done.is_set():
            gc.collect()  # freezing garbage would keep it for the life of the worker
            gc.freeze()
            _done.set()
