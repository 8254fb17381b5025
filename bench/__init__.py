"""Benchmarks: every figure is printed next to its ceiling measured in the same run
(``spark_jobs/bench.py`` runs them and writes ``bench-results.json``)."""
