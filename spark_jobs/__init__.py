"""Runnable Spark jobs: the demo pipeline, backfill, export and benchmarks."""
