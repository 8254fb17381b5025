"""Run a standalone ZooKeeper server as a child process, for tests and local development.

It runs Debian's ZooKeeper (package ``zookeeper``: ``make zookeeper`` installs it) the way its
own scripts do, ``java -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar QuorumPeerMain
<zoo.cfg>``, with its own config and data dir, on a loopback port (a free one unless given).
``ZooKeeperServer(dir).start()`` returns once it answers; ``stop()`` ends it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from broker.launcher import free_port

__all__ = ["ZOOKEEPER_JAR", "ZooKeeperServer", "ZooKeeperTls", "zookeeper_installed"]

ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
_CONF_DIR = Path("/etc/zookeeper/conf")  # its log4j.properties
_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
# Netty parts the TLS port needs that Debian's zookeeper.jar does not list in its class path.
_NETTY_TLS_JARS = (Path("/usr/share/java/netty-codec.jar"), Path("/usr/share/java/netty-resolver.jar"))
_TICK_MS = 500  # sessions may then be as short as 2 ticks: failovers within seconds


def zookeeper_installed() -> bool:
    return ZOOKEEPER_JAR.exists() and shutil.which("java") is not None


@dataclass(frozen=True)
class ZooKeeperTls:
    """TLS of a test ZooKeeper's secure port: its certificate and key in one PEM file, the CA of
    client certificates, and whether clients must present one."""

    keystore_pem: str
    trust_ca_file: str
    need_client_auth: bool = False

    def settings(self, port: int) -> list[str]:
        return [f"secureClientPort={port}", "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                f"ssl.keyStore.location={self.keystore_pem}", "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={self.trust_ca_file}", "ssl.trustStore.type=PEM",
                f"ssl.clientAuth={'need' if self.need_client_auth else 'none'}"]


class ZooKeeperServer:
    """One standalone ZooKeeper server under ``directory`` (config, data, log); with ``tls`` it
    also serves TLS on ``secure_port`` (``secure_connect_string``). It grants sessions of
    ``2 * tickTime``..``max_session_timeout_ms``."""

    def __init__(self, directory: str | Path, port: int = 0, tls: ZooKeeperTls | None = None,
                 max_session_timeout_ms: int = 60_000) -> None:
        self.directory = Path(directory)
        self.max_session_timeout_ms = max_session_timeout_ms
        self.port = port or free_port()
        self.tls = tls
        self.secure_port = free_port() if tls else 0
        self.proc: subprocess.Popen | None = None

    @property
    def connect_string(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def secure_connect_string(self) -> str:
        return f"127.0.0.1:{self.secure_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "zookeeper.log"

    def _write_config(self) -> Path:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.directory / "zoo.cfg"
        config.write_text("\n".join([
            f"tickTime={_TICK_MS}",
            f"dataDir={data}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            f"minSessionTimeout={2 * _TICK_MS}",
            f"maxSessionTimeout={self.max_session_timeout_ms}",
            "4lw.commands.whitelist=conf",
            *(self.tls.settings(self.secure_port) if self.tls else []),
        ]) + "\n")
        return config

    def start(self, timeout: float = 60.0) -> ZooKeeperServer:
        if not zookeeper_installed():
            raise RuntimeError(f"ZooKeeper is not installed ({ZOOKEEPER_JAR} or java missing): run `make zookeeper`")
        config = self._write_config()
        classpath = ":".join(map(str, [_CONF_DIR, ZOOKEEPER_JAR, *(_NETTY_TLS_JARS if self.tls else ())]))
        cmd = ["java", "-Xmx256m", f"-Dzookeeper.log.dir={self.directory}", "-cp", classpath, _MAIN, str(config)]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with code {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"ZooKeeper did not answer on port {self.port} within {timeout:.0f}s")
            time.sleep(0.1)
        return self

    def _answers(self) -> bool:
        """Whether this server answers on its port: its ``conf`` names its own data dir (not another
        server's, which took the port while this one was stopped)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"conf")
                answer = b"".join(iter(lambda: s.recv(4096), b""))
        except OSError:
            return False
        return f"dataDir={self.directory / 'data'}".encode() in answer

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self) -> ZooKeeperServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
