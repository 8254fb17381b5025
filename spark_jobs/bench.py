"""``make bench``: broker and pipeline benchmarks, each figure next to its ceiling.

Usage: python spark_jobs/bench.py [--quick] [--out bench-results.json] [--only broker,peers,spark]
(``--only security``: plaintext vs ACL vs TLS vs TLS + ACL, bench/security.py;
``--only cluster``: one topic on 1 vs 3 broker groups, replication 1 vs 2 vs 3, bench/cluster.py)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import broker as broker_bench  # noqa: E402
from bench.report import write_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, about 2 minutes")
    parser.add_argument("--out", type=Path, default=Path("bench-results.json"))
    parser.add_argument("--only", default="broker,peers,spark",
                        help="comma-separated suites: broker, peers (Redis Streams, NATS JetStream), spark, "
                             "security (plaintext vs ACL vs TLS vs TLS + ACL; not run by default), "
                             "cluster (1 vs 3 broker groups, replication 1 vs 2 vs 3; needs ZooKeeper; not by default)")
    args = parser.parse_args(argv)
    suites = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = suites - {"broker", "peers", "spark", "security", "cluster"}
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(sorted(unknown))}; choose from broker, peers, spark, security, "
                     "cluster")
    rows = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="orderlymq-bench-") as tmp:
        workdir = Path(tmp)
        if "broker" in suites:
            print("broker benchmarks ...", flush=True)
            rows += broker_bench.run(workdir, args.quick)
        if "peers" in suites:
            from bench import peers

            print("peer benchmarks ...", flush=True)
            rows += peers.run(workdir, args.quick)
        if "spark" in suites:
            from bench import spark as spark_bench

            print("spark benchmarks ...", flush=True)
            rows += spark_bench.run(workdir, args.quick)
        if "security" in suites:
            from bench import security as security_bench

            print("security benchmarks ...", flush=True)
            rows += security_bench.run(workdir, args.quick)
        if "cluster" in suites:
            from bench import cluster as cluster_bench

            print("cluster benchmarks ...", flush=True)
            rows += cluster_bench.run(workdir, args.quick)
    write_report(rows, args.out, "quick" if args.quick else "full")
    print(f"done in {time.monotonic() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
