"""``connector.spark.worker_gc``: a worker's first task collects its garbage, then freezes the rest.

Run in a fresh interpreter each: freezing is for the life of a process, not the test runner's.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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
