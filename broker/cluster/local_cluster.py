"""``orderlymq-cluster up``: a local cluster for development and demos, in one command.

A ZooKeeper server and ``--groups`` broker groups of ``--brokers-per-group`` brokers each, on
loopback, data under ``--dir`` (kept between runs; ``--fresh`` starts empty). Group ``k``
(``broker-a``, ``broker-b``, ...) listens on ``base_port + 10 k + id``, like ``conf/cluster/``.
It prints the bootstrap address once every group has a master, and stops everything cleanly on
Ctrl-C (or SIGTERM). Needs ZooKeeper installed (``make zookeeper``).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import grpc

from broker.cluster.zookeeper import ZooKeeperServer, zookeeper_installed
from broker.launcher import BrokerProcess
from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc

__all__ = ["LocalCluster", "main"]

# Settings of every broker: sync replication acknowledged while the master alone is left
# (a local cluster prefers staying available to refusing sends when a slave is down).
_SETTINGS = {"flush": "async", "replication": "sync", "min_sync_replicas": 1, "zk_session_timeout_ms": 4000,
             "replica_lag_timeout_ms": 3000}


def _toml_value(value) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


class LocalCluster:
    """ZooKeeper and ``groups`` x ``size`` broker processes under ``directory``.

    ``base_port`` 0 picks free ports; ``zookeeper`` shares a running server (then left running by
    ``down``); ``settings`` override the brokers' (``BrokerConfig`` names, e.g. ``cluster_name``).
    """

    def __init__(self, directory: Path, *, groups: int = 3, size: int = 2, base_port: int = 10910,
                 zookeeper_port: int = 2181, zookeeper: ZooKeeperServer | None = None,
                 settings: dict | None = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.owns_zookeeper = zookeeper is None
        self.zookeeper = zookeeper or ZooKeeperServer(self.directory / "zookeeper", zookeeper_port)
        self.settings = _SETTINGS | (settings or {})
        self.groups: dict[str, list[BrokerProcess]] = {}
        for k in range(groups):
            name = f"broker-{chr(ord('a') + k)}"
            self.groups[name] = [self._broker(name, i, base_port and base_port + 10 * k + i) for i in range(size)]

    def _broker(self, group: str, broker_id: int, port: int) -> BrokerProcess:
        settings = self.settings | {"zookeeper": self.zookeeper.connect_string, "broker_name": group,
                                    "broker_id": broker_id, "metrics_port": -1}
        config = self.directory / f"{group}-{broker_id}.toml"
        config.write_text("[broker]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in sorted(settings.items())))
        return BrokerProcess(self.directory / f"{group}-{broker_id}", "--config", str(config), port=port)

    @property
    def brokers(self) -> list[BrokerProcess]:
        return [b for members in self.groups.values() for b in members]

    @property
    def bootstrap(self) -> str:
        """One broker of each group: what clients are given (any broker would do)."""
        return ",".join(members[0].address for members in self.groups.values())

    def up(self) -> LocalCluster:
        if self.owns_zookeeper:
            self.zookeeper.start()
        for broker in self.brokers:
            broker.start()
        for name in self.groups:
            self._wait_for_master(name)
        return self

    def _wait_for_master(self, group: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for broker in self.groups[group]:
                with grpc.insecure_channel(broker.address) as channel:
                    try:
                        health = pb_grpc.OrderlyMQStub(channel).Health(pb.HealthRequest(), timeout=1.0)
                    except grpc.RpcError:
                        continue
                if health.role == "MASTER":
                    return broker.address
            time.sleep(0.1)
        raise TimeoutError(f"group {group} elected no master within {timeout:.0f}s; see the logs in {self.directory}")

    def __enter__(self) -> LocalCluster:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc: object) -> None:
        self.down()

    def down(self) -> None:
        for broker in self.brokers:
            broker.stop(timeout=15)
        if self.owns_zookeeper:
            self.zookeeper.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orderlymq-cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up = commands.add_parser("up", help="start ZooKeeper and the broker groups; Ctrl-C stops them")
    up.add_argument("--groups", type=int, default=3, help="broker groups (default %(default)s)")
    up.add_argument("--brokers-per-group", type=int, default=2, help="brokers of each group (default %(default)s)")
    up.add_argument("--dir", type=Path, default=Path("data/local-cluster"), help="data (default %(default)s)")
    up.add_argument("--fresh", action="store_true", help="delete --dir first: start with no topic")
    up.add_argument("--base-port", type=int, default=10910, help="group k's broker i: base + 10 k + i")
    up.add_argument("--zookeeper-port", type=int, default=2181, help="ZooKeeper's client port (0: a free one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.groups <= 26 or not 1 <= args.brokers_per_group <= 9:
        print("orderlymq-cluster: error: --groups must be 1-26 and --brokers-per-group 1-9", file=sys.stderr)
        return 1
    if not zookeeper_installed():
        print("orderlymq-cluster: error: ZooKeeper is not installed: run `make zookeeper`", file=sys.stderr)
        return 1
    if args.fresh:
        shutil.rmtree(args.dir, ignore_errors=True)
    cluster = LocalCluster(args.dir, groups=args.groups, size=args.brokers_per_group, base_port=args.base_port,
                           zookeeper_port=args.zookeeper_port)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):  # SIGINT too: a shell may start it with SIGINT ignored
        signal.signal(signum, lambda *_: stop.set())
    try:
        cluster.up()  # a Ctrl-C meanwhile stops the cluster once it is up
        print(f"ZooKeeper at {cluster.zookeeper.connect_string}; data and logs in {args.dir}")
        for name, members in cluster.groups.items():
            print(f"  {name}: " + ", ".join(b.address for b in members))
        print(f"bootstrap: {cluster.bootstrap}")
        print(f"  e.g. orderlymq --brokers {cluster.bootstrap} cluster status   (Ctrl-C stops the cluster)",
              flush=True)
        while not stop.wait(0.5):
            pass
    except (OSError, RuntimeError, TimeoutError) as exc:
        print(f"orderlymq-cluster: error: {exc}", file=sys.stderr)
        cluster.down()
        return 1
    print("stopping the cluster ...", flush=True)
    cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
