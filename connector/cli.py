"""``orderlymq``: the administration command line (RocketMQ's ``mqadmin``, for orderlymq).

::

    orderlymq [--brokers HOST:PORT] topic create NAME --queues N
    orderlymq topic list | topic describe NAME | topic delete NAME
    orderlymq send TOPIC BODY (--key K | --queue Q | --selector NAME) [--tag T]
    orderlymq tail TOPIC [--queue Q] [--from earliest|latest] [--max N] [--follow]
    orderlymq progress GROUP TOPIC        committed offsets and lag per queue
    orderlymq locks GROUP TOPIC           current queue lock holders
    orderlymq console [--host H] [--port N]   a read-only web console (default 127.0.0.1:8080)
    orderlymq cluster status              every broker of the cluster (--brokers bootstraps): group,
                                          role, epoch, master; each master's sync-state set and lag

The broker address defaults to ``$ORDERLYMQ_BROKERS``, else ``127.0.0.1:9876``. An error prints one
line to stderr and exits with status 1. For a broker with TLS: ``--tls-ca-file`` (and
``--tls-cert-file`` / ``--tls-key-file`` for mutual TLS), or ``$ORDERLYMQ_TLS_CA_FILE`` etc.; with
access control, the credentials come from ``$ORDERLYMQ_ACCESS_KEY`` / ``$ORDERLYMQ_SECRET_KEY``
(never from an argument: other users can read command lines). See docs/security.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Sequence
from datetime import datetime

from rich.console import Console
from rich.table import Table

from broker.wire.tls import TLS_ENV, TlsOptions
from connector.client import Admin, Producer, PullConsumer
from connector.client.connection import BrokerConnection, parse_brokers, pb
from connector.errors import InvalidOptionError, OrderlyMQError

__all__ = ["DEFAULT_BROKERS", "main"]

DEFAULT_BROKERS = "127.0.0.1:9876"


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line and exit status 1, like every other error."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(1)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="orderlymq", description="Administer an orderlymq broker.")
    parser.add_argument(
        "--brokers",
        default=os.environ.get("ORDERLYMQ_BROKERS", DEFAULT_BROKERS),
        help="host:port[,host:port] (default: $ORDERLYMQ_BROKERS or %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an unreachable broker")
    for field, what in (("ca_file", "PEM CA that signs the broker's certificate: connect over TLS"),
                        ("cert_file", "PEM client certificate, for mutual TLS"),
                        ("key_file", "PEM key of --tls-cert-file"),
                        ("server_name", "name to verify the broker's certificate against")):
        parser.add_argument(f"--tls-{field.replace('_', '-')}", dest=f"tls_{field}", default=os.environ.get(TLS_ENV[field]),
                            help=f"{what} (default ${TLS_ENV[field]})")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topic = commands.add_parser("topic", help="create, grow, list, describe or delete topics")
    topic_commands = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    create = topic_commands.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--queues", type=int, required=True, help="number of MessageQueues")
    create.add_argument("--if-not-exists", action="store_true", help="succeed when it already exists")
    grow = topic_commands.add_parser("grow", help="raise a topic's queue count (stop its producers and sinks first)")
    grow.add_argument("name")
    grow.add_argument("--queues", type=int, required=True, help="the new number of MessageQueues (never fewer)")
    topic_commands.add_parser("list", help="list topics")
    describe = topic_commands.add_parser("describe", help="a topic's queues and their offsets")
    describe.add_argument("name")
    delete = topic_commands.add_parser("delete", help="delete a topic and its messages")
    delete.add_argument("name")

    send = commands.add_parser("send", help="send one message")
    send.add_argument("topic")
    send.add_argument("body")
    send.add_argument("--key", help="sharding key (routes the message by hash)")
    send.add_argument("--queue", type=int, help="queue id, for a message without a key")
    send.add_argument("--selector", choices=("round_robin", "random"), help="pick the queue of a message without a key")
    send.add_argument("--tag")

    tail = commands.add_parser("tail", help="print messages of a topic")
    tail.add_argument("topic")
    tail.add_argument("--queue", type=int, help="only this queue id")
    tail.add_argument("--from", dest="start", choices=("earliest", "latest"), default="earliest")
    tail.add_argument("--max", type=int, help="stop after this many messages")
    tail.add_argument("--follow", action="store_true", help="keep waiting for new messages (Ctrl-C stops)")

    progress = commands.add_parser("progress", help="a group's committed offsets and lag per queue")
    progress.add_argument("group")
    progress.add_argument("topic")

    locks = commands.add_parser("locks", help="current queue lock holders of a group")
    locks.add_argument("group")
    locks.add_argument("topic")

    cluster = commands.add_parser("cluster", help="broker groups (docs/cluster.md)")
    cluster.add_subparsers(dest="cluster_command", required=True, metavar="COMMAND").add_parser(
        "status", help="each broker of --brokers: group, role, epoch, master; masters' sync-state sets and lag")
    console = commands.add_parser("console", help="serve a read-only web console of the broker (Ctrl-C stops)")
    console.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s; any other "
                         "needs --login and --https-cert-file/--https-key-file, or --allow-insecure-remote)")
    console.add_argument("--port", type=int, default=8080, help="HTTP port (default %(default)s; 0: a free one)")
    console.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default %(default)s)")
    console.add_argument("--login", action="store_true", help="ask every visitor for an access key and secret key "
                         "of a broker user with admin on broker (checked by the broker)")
    console.add_argument("--https-cert-file", default="", help="serve HTTPS with this certificate (PEM)")
    console.add_argument("--https-key-file", default="", help="the key of --https-cert-file (PEM)")
    console.add_argument("--allow-insecure-remote", action="store_true",
                         help="listen off loopback without --login or HTTPS anyway")
    return parser


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value


def _ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds") if ms else ""


def _tls(args) -> dict:
    """The ``tls`` keyword of the clients from the --tls-* options (none: plaintext)."""
    values = {field: getattr(args, f"tls_{field}") for field in ("ca_file", "cert_file", "key_file", "server_name")}
    return {"tls": TlsOptions(**values) if any(values.values()) else None}


def _topic(args, console: Console) -> None:
    with Admin(args.brokers, retry_timeout=args.timeout, **_tls(args)) as admin:
        if args.topic_command == "create":
            info = admin.create_topic(args.name, args.queues, if_not_exists=args.if_not_exists)
            console.print(f"topic {info.name}: {info.queue_count} queues on {info.broker_name}", markup=False)
        elif args.topic_command == "grow":
            info = admin.grow_topic(args.name, args.queues)
            console.print(f"topic {info.name}: now {info.queue_count} queues", markup=False)
        elif args.topic_command == "list":
            table = Table("topic", "queues", "broker")
            for info in admin.list_topics():
                table.add_row(info.name, str(info.queue_count), info.broker_name)
            console.print(table)
        elif args.topic_command == "describe":
            info = admin.describe_topic(args.name)
            columns = ["queue", "min offset", "max offset", "messages"] + (["group", "master"] if info.groups else [])
            table = Table(*columns, title=f"{info.name} on {info.broker_name}")
            masters = {g.broker_name: g.master_address or "(electing)" for g in info.groups}
            for status in admin.topic_status(args.name):
                row = [str(status.queue_id), str(status.min_offset), str(status.max_offset), str(status.count)]
                group = info.group_of(status.queue_id)
                table.add_row(*row, *([group, masters.get(group, "")] if info.groups else []))
            console.print(table)
        elif args.topic_command == "delete":
            admin.delete_topic(args.name)
            console.print(f"deleted topic {args.name}", markup=False)


def _send(args, console: Console) -> None:
    with Producer(args.brokers, retry_timeout=args.timeout, **_tls(args)) as producer:
        result = producer.send(args.topic, args.body.encode("utf-8"), key=args.key, tag=args.tag,
                               selector=args.selector, queue_id=args.queue)
    console.print(f"sent to {result.topic}[{result.queue_id}] at offset {result.queue_offset}", markup=False)


def _tail(args, console: Console) -> None:
    printed = 0
    with PullConsumer(args.brokers, retry_timeout=args.timeout, **_tls(args)) as consumer:
        consumer.assign(args.topic, None if args.queue is None else [args.queue], start=args.start)
        while args.max is None or printed < args.max:
            want = 100 if args.max is None else min(100, args.max - printed)
            messages = consumer.poll(want, wait_ms=500 if args.follow else 0)
            if not messages:
                if args.follow:
                    continue
                break
            for m in messages:
                print(f"{m.queue_id}\t{m.queue_offset}\t{_text(m.key)}\t{_text(m.tag)}\t{_text(m.body)}", flush=True)
            printed += len(messages)


def _progress(args, console: Console) -> None:
    with Admin(args.brokers, retry_timeout=args.timeout, **_tls(args)) as admin:
        rows = admin.consumer_progress(args.group, args.topic)
    table = Table(
        "queue", "broker offset", "consumer offset", "lag", "lock holder", title=f"{args.group} on {args.topic}"
    )
    for row in rows:
        committed = "-" if row.consumer_offset < 0 else str(row.consumer_offset)
        table.add_row(str(row.queue_id), str(row.broker_offset), committed, str(row.lag), row.lock_holder or "")
    console.print(table)
    console.print(f"total lag: {sum(r.lag for r in rows)}", markup=False)


def _locks(args, console: Console) -> None:
    with Admin(args.brokers, retry_timeout=args.timeout, **_tls(args)) as admin:
        holders = admin.lock_holders(args.group, args.topic)
    table = Table("queue", "client id", "epoch", "expires", title=f"locks of {args.group} on {args.topic}")
    for h in holders:
        table.add_row(str(h.queue_id), h.client_id, str(h.epoch), _ms(h.expires_at_ms))
    console.print(table)
    if not holders:
        console.print("no queue is locked", markup=False)


def _console(args, console: Console) -> None:
    from connector.console import ConsoleServer  # the web console is only loaded when asked for

    if args.interval <= 0:
        raise InvalidOptionError(f"--interval must be more than 0 seconds, got {args.interval:g}")
    try:
        server = ConsoleServer(args.brokers, host=args.host, port=args.port, interval=args.interval, login=args.login,
                               https_cert_file=args.https_cert_file, https_key_file=args.https_key_file,
                               allow_insecure_remote=args.allow_insecure_remote, **_tls(args))
    except OSError as exc:
        raise InvalidOptionError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    with server:
        console.print(f"orderlymq console of {args.brokers} at {server.url} (read-only; Ctrl-C stops)", markup=False)
        threading.Event().wait()


def _cluster_addresses(args) -> list[str]:
    """--brokers, and in a cluster of several groups every broker ZooKeeper knows of (asked of
    the first broker that answers)."""
    given = parse_brokers(args.brokers)
    try:
        with Admin(args.brokers, retry_timeout=args.timeout, **_tls(args)) as admin:
            groups = admin.cluster_groups()
    except OrderlyMQError:
        return given
    return given + [a for g in groups for a in g.addresses if a not in given]


def _cluster(args, console: Console) -> None:
    """Ask every broker of --brokers, and every other broker of the cluster, itself (no redirection
    to the master): a broker that does not answer is shown as such, the others as they see themselves."""
    brokers = Table("broker", "group", "id", "role", "epoch", "master", title="brokers")
    masters = []
    for address in _cluster_addresses(args):
        try:
            with BrokerConnection(address, timeout=args.timeout, retry_timeout=0, **_tls(args)) as conn:
                health = conn.call("Health", pb.HealthRequest(), retry=False)
        except OrderlyMQError:
            brokers.add_row(address, "", "", "unreachable", "", "")
            continue
        role = health.role or "single broker"
        brokers.add_row(address, health.broker_name, str(health.broker_id) if health.role else "", role,
                        str(health.group_epoch) if health.role else "", health.master_address)
        if health.role == "MASTER":
            masters.append((address, health))
    console.print(brokers)
    for address, health in masters:
        sync_set = ", ".join(str(b) for b in health.sync_set)
        slaves = Table("slave id", "connected", "in sync-state set", "behind (messages)", "caught up",
                       title=f"group {health.broker_name}: master {health.broker_id} at {address}, "
                             f"epoch {health.group_epoch}, sync-state set [{sync_set}]")
        for replica in health.replicas:
            caught_up = "never" if replica.caught_up_ms_ago < 0 else f"{replica.caught_up_ms_ago / 1000:.1f} s ago"
            slaves.add_row(str(replica.broker_id), "yes" if replica.connected else "no",
                           "yes" if replica.in_sync_set else "no", str(replica.behind_messages), caught_up)
        console.print(slaves)


_COMMANDS = {"topic": _topic, "send": _send, "tail": _tail, "progress": _progress, "locks": _locks,
             "console": _console, "cluster": _cluster}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 error, 130 interrupted)."""
    args = _parser().parse_args(argv)
    console = Console(soft_wrap=True)
    try:
        _COMMANDS[args.command](args, console)
    except OrderlyMQError as exc:
        print(f"orderlymq: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
