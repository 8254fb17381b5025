"""The broker's configuration: one frozen dataclass, validated on construction.

Sources, lowest precedence first: the defaults below, a TOML file (``BrokerConfig.from_toml``,
every setting under one ``[broker]`` table, see ``conf/broker.toml``), then command-line overrides
(``config.with_overrides(...)``). Every error names the setting and what it accepts.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.logs import LOG_FORMATS
from broker.staged_files import POOL_BYTES
from broker.storage.page_cache import AUTO as PAGE_CACHE_AUTO
from broker.wire.errors import InvalidOptionError
from broker.wire.https import is_loopback

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    import tomli as tomllib  # type: ignore[no-redef]

__all__ = ["BrokerConfig", "TOML_TABLE"]

TOML_TABLE = "broker"

KIB = 1024
MIB = 1024 * KIB
_INT32_MAX = 2**31 - 1  # gRPC message limits and segment positions are 32-bit
_LOG_LEVELS = ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG")
_BROKER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ADDRESS = re.compile(r"^[^\s:]+:\d{1,5}$")


@dataclass(frozen=True)
class BrokerConfig:
    """Settings of one broker process; durations are milliseconds, sizes bytes.

    Attributes
    ----------
    host, port : str, int
        gRPC listen address; port 0 picks a free port.
    data_dir : str
        Root of every file the broker writes (logs, offsets, locks, transactions).
    broker_name : str
        The name in every route (RocketMQ's ``brokerName``).
    flush : {"sync", "async"}
        ``sync`` acknowledges a send only after fsync; ``async`` fsyncs every ``flush_interval_ms``.
    flush_interval_ms : int
        Period of the background fsync in ``async`` mode.
    segment_bytes, index_interval_bytes : int
        Size at which a queue's log rolls to a new segment; bytes of log between sparse index entries.
    page_cache_bytes : int
        How much of the log written last (all queues) is left in the OS page cache once on disk;
        older log is dropped from it, and new appends reuse its memory (``broker.storage.page_cache``:
        on virtual machines that return free memory to their host, far cheaper than new pages).
        -1: 1 GiB on such a machine (a virtio balloon reporting free pages), else none; 0: none,
        the page cache is left to the kernel. Rounded up to whole chunks (``hpage_pmd_size``, 2 MiB).
        With a window, a transaction commit's appends are written 64 KiB at a time (a larger write
        takes new pages in 2 MiB folios, there the costliest).
    retention_ms, retention_bytes : int
        Delete whole segments older than this / beyond this size per queue; 0 keeps forever / unlimited.
    retention_check_interval_ms : int
        How often retention runs.
    compact_interval_ms : int
        How often closed segments are looked at for small records to merge (one-message sends
        store a record each; merged, they pull like a batch; ``broker.storage.compaction``); an
        active segment nothing was appended to for that long is closed and merged too. 0 never
        merges; a broker group never merges (its slaves copy records as they are).
    lock_lease_ms : int
        A queue lock expires this long after its last renewal.
    consumer_timeout_ms : int
        A consumer leaves its group this long after its last heartbeat.
    txn_timeout_ms : int
        Default time a transaction may stay idle before it is aborted.
    txn_stage_pool_bytes : int
        How many bytes of finished transactions' staged-data files are kept for the next ones to
        write over (``broker.staged_files``: cheaper than new files' pages); 0 deletes them.
    max_request_bytes : int
        Largest gRPC message accepted or sent.
    max_pull_messages, max_pull_bytes : int
        Pull limits used when a request asks for 0 (and upper bounds of what it may ask).
    max_wait_ms : int
        Upper bound of a long-polling pull's wait.
    keepalive_ms : int
        How often the broker checks a quiet client connection (gRPC keepalive pings; TCP
        keepalive on the send port). One that does not answer within 20 s (``keepalive_ms`` if
        shorter) is closed with its calls: a client whose host vanished, or whose connection a
        firewall dropped silently, keeps no stream and no file descriptor open for long.
    metrics_port : int
        HTTP port of the Prometheus endpoint ``/metrics`` on ``host``; -1 (the default) serves none,
        0 picks a free port.
    send_port : int
        TCP port on ``host`` of the lean protocol (``broker.send_port``): a producer's sends skip
        gRPC's per-call cost there, and the Spark source's pulls its per-megabyte copies. 0 (the
        default) picks a free port, which ``Health`` tells clients; -1 serves none. Never served
        with TLS or access control: clients then use gRPC. In a broker group only the master
        answers there.
    busy_poll_us : int
        After a synchronous send on the lean port, the event loop polls for the next request for
        up to this many microseconds instead of sleeping (``broker.busy_loop``): the sender's round
        trips skip the broker's wake-up, for a CPU while sends come back to back. Only while the
        machine has a CPU to spare and no worker thread is busy. 0 never polls; -1 (the default)
        polls 200 µs in a broker process of its own (``orderlymq-broker``) and never in one started
        inside another program (``start_broker``), whose threads a polling loop would keep from the
        GIL.
    workers : int
        Threads for the RPC work that may block (file writes and fsyncs, reads, offsets, locks,
        transactions). Waiting holds none: long-polling pulls and open send streams wait on the
        server's event loop, so any number of them leaves these threads to the others.
    log_level : str
        One of CRITICAL, ERROR, WARNING, INFO, DEBUG (any case).
    log_format : {"text", "json"}
        ``text``: one readable line per record; ``json``: one JSON object per line with ``time``,
        ``level``, ``logger``, ``message`` and ``exception`` (see ``broker.logs``).
    tls_cert_file, tls_key_file : str
        PEM certificate chain and private key: serve TLS on the client port ("" serves plaintext).
    tls_client_ca_file : str
        PEM of the CA that signs client certificates: mutual TLS, a client without one is refused.
    acl_file : str
        TOML of users and rules (``orderlymq-broker acl``): every call must authenticate and is
        checked against the rules, re-read when the file changes. "" turns access control off.
    allow_insecure_remote : bool
        Listen on a non-loopback ``host`` without TLS and ACL anyway (refused otherwise).
    zookeeper : str
        ZooKeeper connect string (``host:port[,host:port]``); empty (the default) runs a single
        broker with no cluster. Set, the broker joins the group ``broker_name`` of ``cluster_name``
        as master or slave (docs/cluster.md).
    cluster_name : str
        The cluster's name: the root of its nodes in ZooKeeper.
    broker_id : int
        This broker's id in its group, unique within it.
    advertised_address : str
        ``host:port`` other brokers and clients reach this broker at; empty: ``host`` and the bound port.
    advertised_send_port : int
        The port others reach ``send_port`` at, on the advertised host, where a proxy or NAT
        forwards it from another port; 0 (the default): ``send_port``'s own.
    replication : {"sync", "async"}
        ``sync`` acknowledges a send once every member of the group's sync-state set stored it;
        ``async`` once the master did (a failover may lose the newest acknowledged sends).
    min_sync_replicas : int
        Brokers (the master included) that must be in the sync-state set for a ``sync`` send to be
        acknowledged; below it sends wait, then fail as retryable.
    zk_session_timeout_ms : int
        ZooKeeper session timeout: a master silent this long loses its role.
    replica_lag_timeout_ms : int
        A slave not caught up with the master for this long leaves the sync-state set.
    replication_tls_ca_file : str
        In a group with TLS: PEM of the CA a slave verifies its master's certificate with ("" trusts
        the system's roots).
    replication_tls_cert_file, replication_tls_key_file : str
        In a group with mutual TLS (``tls_client_ca_file``): the certificate a slave presents to its
        master; "" presents ``tls_cert_file`` / ``tls_key_file``.
    replication_access_key, replication_secret_file : str
        In a group with ``acl_file``: the user a slave authenticates as on its master's
        ``Replicate`` stream (it needs the ``replicate`` right on ``broker``) and a file holding
        its secret key, read at every (re)connection.
    zookeeper_tls_ca_file : str
        PEM of the CA of ZooKeeper's certificate: talk to ZooKeeper over TLS ("" plaintext).
    zookeeper_tls_cert_file, zookeeper_tls_key_file : str
        The certificate the broker presents to ZooKeeper (its ``ssl.clientAuth=need``).
    zookeeper_auth_file : str
        A file holding ``user:password``: authenticate to ZooKeeper as that digest user and create
        every node for that user alone ("" leaves nodes open to every ZooKeeper client).
    """

    host: str = "127.0.0.1"
    port: int = 9876
    data_dir: str = "data"
    broker_name: str = "broker-a"
    flush: str = "async"
    flush_interval_ms: int = 200
    segment_bytes: int = 64 * MIB
    index_interval_bytes: int = 4 * KIB
    page_cache_bytes: int = PAGE_CACHE_AUTO
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = 0
    retention_check_interval_ms: int = 60_000
    compact_interval_ms: int = 10_000
    lock_lease_ms: int = 60_000
    consumer_timeout_ms: int = 30_000
    txn_timeout_ms: int = 60_000
    txn_stage_pool_bytes: int = POOL_BYTES
    max_request_bytes: int = 128 * MIB
    max_pull_messages: int = 10_000
    max_pull_bytes: int = 16 * MIB
    max_wait_ms: int = 30_000
    keepalive_ms: int = 60_000
    workers: int = 64
    metrics_port: int = -1
    send_port: int = 0
    busy_poll_us: int = -1
    log_level: str = "INFO"
    log_format: str = "text"
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    acl_file: str = ""
    allow_insecure_remote: bool = False
    zookeeper: str = ""
    cluster_name: str = "orderlymq"
    broker_id: int = 0
    advertised_address: str = ""
    advertised_send_port: int = 0
    replication: str = "sync"
    min_sync_replicas: int = 1
    zk_session_timeout_ms: int = 4_000
    replica_lag_timeout_ms: int = 3_000
    replication_tls_ca_file: str = ""
    replication_tls_cert_file: str = ""
    replication_tls_key_file: str = ""
    replication_access_key: str = ""
    replication_secret_file: str = ""
    zookeeper_tls_ca_file: str = ""
    zookeeper_tls_cert_file: str = ""
    zookeeper_tls_key_file: str = ""
    zookeeper_auth_file: str = ""

    @property
    def keepalive_timeout_ms(self) -> int:
        """How long a quiet client connection checked every ``keepalive_ms`` has to answer."""
        return min(20_000, self.keepalive_ms)

    def __post_init__(self) -> None:
        if isinstance(self.data_dir, os.PathLike):
            object.__setattr__(self, "data_dir", os.fspath(self.data_dir))
        if isinstance(self.log_level, str):
            object.__setattr__(self, "log_level", self.log_level.upper())
        for name, (low, high, unit) in _INT_RANGES.items():
            _check_int(name, getattr(self, name), low, high, unit)
        _check_text("host", self.host)
        _check_text("data_dir", self.data_dir)
        if not isinstance(self.broker_name, str) or not _BROKER_NAME.match(self.broker_name):
            raise InvalidOptionError(
                "broker_name must be 1-128 characters of letters, digits, '.', '_' or '-' starting with a letter "
                f"or digit, got {self.broker_name!r}"
            )
        if self.flush not in ("sync", "async"):
            raise InvalidOptionError(f"flush must be 'sync' or 'async', got {self.flush!r}")
        if self.log_level not in _LOG_LEVELS:
            raise InvalidOptionError(f"log_level must be one of {', '.join(_LOG_LEVELS)}, got {self.log_level!r}")
        if self.log_format not in LOG_FORMATS:
            raise InvalidOptionError(f"log_format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        _check_security(self)
        self._check_cluster()

    def _check_cluster(self) -> None:
        if not isinstance(self.zookeeper, str):
            raise InvalidOptionError(f"zookeeper must be a connect string such as '127.0.0.1:2181', got {self.zookeeper!r}")
        if not isinstance(self.cluster_name, str) or not _BROKER_NAME.match(self.cluster_name):
            raise InvalidOptionError(
                "cluster_name must be 1-128 characters of letters, digits, '.', '_' or '-' starting with a letter "
                f"or digit, got {self.cluster_name!r}"
            )
        if self.replication not in ("sync", "async"):
            raise InvalidOptionError(f"replication must be 'sync' or 'async', got {self.replication!r}")
        if self.advertised_address and not _ADDRESS.match(str(self.advertised_address)):
            raise InvalidOptionError(f"advertised_address must be host:port, got {self.advertised_address!r}")

    @property
    def clustered(self) -> bool:
        """True when the broker belongs to a replicated group (``zookeeper`` is set)."""
        return bool(self.zookeeper.strip())

    @property
    def tls(self) -> bool:
        """Whether the client port serves TLS."""
        return bool(self.tls_cert_file)

    @property
    def data_path(self) -> Path:
        """``data_dir`` as a ``Path``."""
        return Path(self.data_dir)

    @classmethod
    def field_names(cls) -> list[str]:
        """Every setting's name, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> BrokerConfig:
        """A config from ``{setting: value}``; settings left out keep their defaults.

        Raises
        ------
        InvalidOptionError
            An unknown setting (the message lists the valid ones) or a bad value.
        """
        _check_names(values)
        return cls(**dict(values))

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> BrokerConfig:
        """A config from a TOML file holding settings under one ``[broker]`` table.

        Raises
        ------
        InvalidOptionError
            The file is missing or not TOML, has anything beside ``[broker]``, or holds an
            unknown setting or a bad value; the message names the file and the key.
        """
        path = Path(path)
        try:
            with path.open("rb") as f:
                document = tomllib.load(f)
        except FileNotFoundError:
            raise InvalidOptionError(f"broker config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidOptionError(f"broker config file {path} is not valid TOML: {exc}") from None
        extra = sorted(set(document) - {TOML_TABLE})
        if extra:
            raise InvalidOptionError(
                f"{path}: unknown top-level key {extra[0]!r}; every setting goes under the [{TOML_TABLE}] table"
            )
        table = document.get(TOML_TABLE, {})
        if not isinstance(table, dict):
            raise InvalidOptionError(f"{path}: {TOML_TABLE!r} must be a table ([{TOML_TABLE}])")
        try:
            return cls.from_mapping(table)
        except InvalidOptionError as exc:
            raise InvalidOptionError(f"{path}: {exc}") from None

    def with_overrides(self, **overrides: Any) -> BrokerConfig:
        """A copy with the given settings replaced; ``None`` values are ignored (an option not given)."""
        given = {name: value for name, value in overrides.items() if value is not None}
        _check_names(given)
        return dataclasses.replace(self, **given)


# (minimum, maximum, what the number counts) for every integer setting.
_INT_RANGES: dict[str, tuple[int, int | None, str]] = {
    "port": (0, 65_535, ""),
    "flush_interval_ms": (1, None, "milliseconds"),
    "segment_bytes": (1, _INT32_MAX, "bytes"),
    "index_interval_bytes": (1, _INT32_MAX, "bytes"),
    "page_cache_bytes": (-1, None, "bytes, -1 decides by the machine, 0 leaves the page cache to the kernel"),
    "retention_ms": (0, None, "milliseconds, 0 keeps messages forever"),
    "retention_bytes": (0, None, "bytes per queue, 0 is unlimited"),
    "retention_check_interval_ms": (1, None, "milliseconds"),
    "compact_interval_ms": (0, None, "milliseconds, 0 never merges small records"),
    "lock_lease_ms": (1, None, "milliseconds"),
    "consumer_timeout_ms": (1, None, "milliseconds"),
    "txn_timeout_ms": (1, None, "milliseconds"),
    "txn_stage_pool_bytes": (0, None, "bytes, 0 keeps no finished staged-data file"),
    "max_request_bytes": (1, _INT32_MAX, "bytes"),
    "max_pull_messages": (1, _INT32_MAX, "messages"),
    "max_pull_bytes": (1, _INT32_MAX, "bytes"),
    "max_wait_ms": (0, _INT32_MAX, "milliseconds"),
    "keepalive_ms": (1_000, _INT32_MAX, "milliseconds"),
    "workers": (1, 1024, "threads"),
    "metrics_port": (-1, 65535, "-1 serves no metrics, 0 picks a free port"),
    "send_port": (-1, 65535, "-1 serves none, 0 picks a free port"),
    "advertised_send_port": (0, 65535, "0 advertises send_port itself"),
    "busy_poll_us": (-1, 1_000_000, "microseconds, 0 never polls, -1 polls 200 in a broker process of its own"),
    "broker_id": (0, 1_000_000, "unique within the group"),
    "min_sync_replicas": (1, 16, "brokers, the master included"),
    "zk_session_timeout_ms": (1_000, 600_000, "milliseconds"),
    "replica_lag_timeout_ms": (100, None, "milliseconds"),
}


def _check_int(name: str, value: Any, low: int, high: int | None, unit: str) -> None:
    # bool is an int subclass, but `port = true` is a mistake, not port 1.
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low and (high is None or value <= high)
    if ok:
        return
    allowed = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
    unit = f" ({unit})" if unit else ""
    raise InvalidOptionError(f"{name} must be {allowed}{unit}, got {value!r}")


def _check_text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidOptionError(f"{name} must be a non-empty string, got {value!r}")


def _check_security(config: BrokerConfig) -> None:
    for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file", "acl_file"):
        if not isinstance(getattr(config, name), str):
            raise InvalidOptionError(f"{name} must be a file path string, got {getattr(config, name)!r}")
    if not isinstance(config.allow_insecure_remote, bool):
        raise InvalidOptionError(f"allow_insecure_remote must be true or false, got {config.allow_insecure_remote!r}")
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise InvalidOptionError("tls_cert_file and tls_key_file go together: set both to serve TLS, or neither")
    if config.tls_client_ca_file and not config.tls_cert_file:
        raise InvalidOptionError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file too")
    if isinstance(config.zookeeper, str) and config.zookeeper.strip():
        _check_replication_link(config)
    if is_loopback(config.host) or config.allow_insecure_remote:
        return
    # Credentials travel with every call, so off loopback they need TLS as much as the data does.
    missing = [name for name, value in (("acl_file", config.acl_file), ("tls_cert_file", config.tls_cert_file))
               if not value]
    if missing:
        raise InvalidOptionError(
            f"host {config.host!r} is reachable from other machines, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: anyone reaching the port could read, write and delete "
            "topics. Set acl_file and tls_cert_file / tls_key_file (docs/security.md), or set "
            "allow_insecure_remote = true to accept that"
        )


_REPLICATION_LINK = ("replication_tls_ca_file", "replication_tls_cert_file", "replication_tls_key_file",
                     "replication_access_key", "replication_secret_file", "zookeeper_tls_ca_file",
                     "zookeeper_tls_cert_file", "zookeeper_tls_key_file", "zookeeper_auth_file")


def _check_replication_link(config: BrokerConfig) -> None:
    """A slave dials its master as a client does: with TLS when the group serves TLS, with
    credentials when it checks them (every broker of a group has the same security settings)."""
    for name in _REPLICATION_LINK:
        if not isinstance(getattr(config, name), str):
            raise InvalidOptionError(f"{name} must be a string, got {getattr(config, name)!r}")
    tls_link = [name for name in _REPLICATION_LINK[:3] if getattr(config, name)]
    if tls_link and not config.tls_cert_file:
        raise InvalidOptionError(f"{tls_link[0]} is for replication over TLS: it needs tls_cert_file and tls_key_file "
                                 "(the group's brokers serve TLS, their slaves dial it)")
    if bool(config.replication_tls_cert_file) != bool(config.replication_tls_key_file):
        raise InvalidOptionError("replication_tls_cert_file and replication_tls_key_file go together: set both, "
                                 "or neither to present tls_cert_file / tls_key_file")
    if bool(config.zookeeper_tls_cert_file) != bool(config.zookeeper_tls_key_file):
        raise InvalidOptionError("zookeeper_tls_cert_file and zookeeper_tls_key_file go together: set both, or neither")
    if config.zookeeper_tls_cert_file and not config.zookeeper_tls_ca_file:
        raise InvalidOptionError("zookeeper_tls_cert_file is for TLS to ZooKeeper: it needs zookeeper_tls_ca_file "
                                 "(the CA of ZooKeeper's certificate)")
    if bool(config.replication_access_key) != bool(config.replication_secret_file):
        raise InvalidOptionError("replication_access_key and replication_secret_file go together: the user slaves "
                                 "replicate as and the file holding its secret key")
    if config.acl_file and not config.replication_access_key:
        raise InvalidOptionError(
            "a broker group with acl_file needs replication_access_key and replication_secret_file: its master "
            "serves the Replicate stream only to a user with the replicate right (`orderlymq-broker acl allow "
            "<user> replicate broker`), and this broker dials its master as that user when it is a slave")


def _check_names(values: Mapping[str, Any]) -> None:
    valid = BrokerConfig.field_names()
    for name in values:
        if name not in valid:
            raise InvalidOptionError(f"unknown broker setting {name!r}; valid settings: {', '.join(valid)}")
