"""``orderlymq-broker`` / ``python -m broker``: run a broker until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import ctypes
import gc
import logging
import resource
import signal
import sys
import threading
from pathlib import Path

from broker.config import BrokerConfig
from broker.logs import LOG_FORMATS, configure_logging
from broker.wire.errors import OrderlyMQError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="orderlymq-broker", description="Run an orderlymq broker.")
    parser.add_argument("--config", type=Path, help="a broker.toml (see conf/broker.toml); flags override it")
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="gRPC port (default 9876; 0 picks a free one)")
    parser.add_argument("--data-dir", help="where topics, offsets and transactions live (default ./data)")
    parser.add_argument("--flush", choices=["sync", "async"], help="sync: ack after fsync; async: fsync on an interval")
    parser.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (-1: none)")
    parser.add_argument("--send-port", type=int, help="port of the lean send protocol (0: a free one, -1: none)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once serving (for scripts)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING, ...")
    parser.add_argument("--log-format", choices=LOG_FORMATS, help="text (default) or json: one JSON object per line")
    cluster = parser.add_argument_group("cluster", "a replicated broker group (docs/cluster.md)")
    cluster.add_argument("--zookeeper", help="ZooKeeper connect string; joins a broker group when set")
    cluster.add_argument("--cluster-name", help="the cluster's name in ZooKeeper (default orderlymq)")
    cluster.add_argument("--broker-name", help="the group this broker belongs to (default broker-a)")
    cluster.add_argument("--broker-id", type=int, help="this broker's id in its group")
    cluster.add_argument("--replication", choices=["sync", "async"], help="when a send is acknowledged")
    security = parser.add_argument_group("security (docs/security.md); `orderlymq-broker acl --help` manages users")
    security.add_argument("--tls-cert-file", help="PEM certificate chain: serve TLS (with --tls-key-file)")
    security.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    security.add_argument("--tls-client-ca-file", help="PEM CA of client certificates: require mutual TLS")
    security.add_argument("--acl-file", help="users and rules (TOML): authenticate and authorize every call")
    security.add_argument("--allow-insecure-remote", action="store_true", default=None,
                          help="listen on a non-loopback --host without TLS and ACL anyway")
    security.add_argument("--replication-tls-ca-file", help="group with TLS: PEM CA a slave verifies its master with")
    security.add_argument("--replication-tls-cert-file",
                          help="group with mutual TLS: certificate a slave presents (default --tls-cert-file)")
    security.add_argument("--replication-tls-key-file", help="PEM private key of --replication-tls-cert-file")
    security.add_argument("--replication-access-key",
                          help="group with ACL: the user a slave replicates as (needs `replicate` on broker)")
    security.add_argument("--replication-secret-file", help="file holding the secret key of --replication-access-key")
    security.add_argument("--zookeeper-tls-ca-file", help="PEM CA of ZooKeeper's certificate: reach ZooKeeper over TLS")
    security.add_argument("--zookeeper-tls-cert-file", help="PEM certificate presented to ZooKeeper")
    security.add_argument("--zookeeper-tls-key-file", help="PEM private key of --zookeeper-tls-cert-file")
    security.add_argument("--zookeeper-auth-file",
                          help="file holding user:password: ZooKeeper digest user, owner of every node created")
    return parser.parse_args(argv)


def load_config(args: argparse.Namespace) -> BrokerConfig:
    config = BrokerConfig.from_toml(args.config) if args.config else BrokerConfig()
    return config.with_overrides(
        host=args.host, port=args.port, data_dir=args.data_dir, flush=args.flush, log_level=args.log_level,
        log_format=args.log_format, metrics_port=args.metrics_port, send_port=args.send_port,
        tls_cert_file=args.tls_cert_file, tls_key_file=args.tls_key_file, tls_client_ca_file=args.tls_client_ca_file,
        acl_file=args.acl_file, allow_insecure_remote=args.allow_insecure_remote,
        replication_tls_ca_file=args.replication_tls_ca_file, replication_tls_cert_file=args.replication_tls_cert_file,
        replication_tls_key_file=args.replication_tls_key_file, replication_access_key=args.replication_access_key,
        replication_secret_file=args.replication_secret_file, zookeeper_tls_ca_file=args.zookeeper_tls_ca_file,
        zookeeper_tls_cert_file=args.zookeeper_tls_cert_file, zookeeper_tls_key_file=args.zookeeper_tls_key_file,
        zookeeper_auth_file=args.zookeeper_auth_file,
        zookeeper=args.zookeeper, cluster_name=args.cluster_name, broker_name=args.broker_name,
        broker_id=args.broker_id, replication=args.replication,
    )


# glibc's mallopt parameters, and the values the broker sets (see ``_keep_freed_memory``).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 32 << 20  # the largest glibc accepts on 64-bit
_TRIM_THRESHOLD = 64 << 20


def _keep_freed_memory() -> None:
    """Keep freed memory for the next request instead of handing it back to the kernel.

    A batched send brings megabytes that are copied a few times (gRPC's buffer, the parsed
    request, the stored body) and freed. By default glibc maps each such block freshly or trims it
    off the heap once freed, so every request page-faults and zeroes its megabytes again: that
    cost more CPU than everything else a 1 MB send does. With fixed thresholds, blocks up to 32 MiB
    come from the heap and up to 64 MiB of free heap is kept per arena: memory stays bounded by
    the peak of concurrent requests. Only on glibc; elsewhere nothing changes.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


def _collect_old_garbage_rarely() -> None:
    """Run the cycle collector's full collections a tenth as often as Python does by default.

    A broker keeps objects per client (streams, long polls, connections). With thousands of clients
    a full collection walks all of them and stops the event loop meanwhile: while 4,000 send
    streams and 4,000 long polls connected, Python's default thresholds ran 8 full collections of
    13-300 ms each. With one full collection per 100 of the middle generation instead of 10, the
    same runs had one, of 8-57 ms. Young objects are collected as often as before, and a full
    collection still comes once enough objects were promoted, so cyclic garbage is freed later,
    not never.
    """
    young, middle, _old = gc.get_threshold()
    gc.set_threshold(young, middle, 100)


def _raise_open_file_limit() -> None:
    """Allow as many open files as the hard limit does: segment files (``broker.storage.open_files``
    keeps them to half the limit) and connections. An unlimited hard limit (macOS, whose soft
    limit is 256) is not a value the soft one may take: the largest the system takes is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY:
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return
    for wanted in (1 << 20, 1 << 16, 10240):  # 10240: macOS's OPEN_MAX, taken where more is refused
        if wanted <= soft:
            return
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            return
        except (ValueError, OSError):
            continue


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["acl"]:  # `orderlymq-broker acl ...`: edit the ACL file, serve nothing
        from broker.security.cli import main as acl_main

        return acl_main(argv[1:])
    args = parse_args(argv)
    try:
        config = load_config(args)
    except (OrderlyMQError, OSError) as exc:
        print(f"orderlymq-broker: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_level, config.log_format)
    _raise_open_file_limit()
    _keep_freed_memory()
    _collect_old_garbage_rarely()
    from broker.server import start_broker

    try:
        running = start_broker(config, own_process=True)
    except (OrderlyMQError, OSError) as exc:
        print(f"orderlymq-broker: {exc}", file=sys.stderr)
        return 1
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(str(running.port))
        tmp.replace(args.port_file)
    stopped = threading.Event()

    def shutdown(signum, frame):
        logging.getLogger("broker").info("signal %d: shutting down", signum)
        stopped.set()

    def nothing_to_reload(signum, frame):
        logging.getLogger("broker").info("SIGHUP: nothing to reload (the ACL file and the TLS certificate "
                                         "are reread when they change); still serving")

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    # By default SIGHUP ends a process at once: a closed terminal or a service manager's "reload"
    # would have stopped the broker without draining its calls.
    signal.signal(signal.SIGHUP, nothing_to_reload)
    lost_writes = running.service.store.lost_writes
    while not stopped.wait(0.5) and not lost_writes.happened.is_set():
        pass
    running.stop(grace=2.0)
    if lost_writes.happened.is_set():
        logging.getLogger("broker").critical("stopped: %s", lost_writes.reason)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
