"""TLS and credentials options of the Spark connector and the lock warden, without Spark."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from broker.wire.errors import InvalidOptionError
from connector.spark.lock_warden import Warden
from connector.spark.options import SinkOptions, SourceOptions
from connector.spark.security import ConnectionSecurity

BASE = {"brokers": "127.0.0.1:9876", "topic": "orders"}


def test_security_options_build_the_connection(pki):
    ca, _, client = pki
    options = SinkOptions.from_options({**BASE, "tls.caFile": ca.ca_file, "tls.certFile": client.cert_file,
                                        "tls.keyFile": client.key_file, "auth.accessKey": "writer",
                                        "auth.secretKey": "writer-secret-002"})
    conn = options.connect()  # the process's shared connection: never closed by its users
    assert conn.tls.ca_file == ca.ca_file and conn.tls.cert_file == client.cert_file
    assert conn.credentials.access_key == "writer"
    assert "writer-secret-002" not in repr(options)


def test_a_missing_tls_file_names_the_option_and_the_path(tmp_path):
    missing = str(tmp_path / "nowhere" / "ca.pem")
    with pytest.raises(InvalidOptionError, match=f"option 'tls.caFile' names '{missing}', which is not a readable"):
        SourceOptions.from_options({**BASE, "tls.caFile": missing}, streaming=False)
    with pytest.raises(InvalidOptionError, match="'tls.certFile' and 'tls.keyFile' go together"):
        SinkOptions.from_options({**BASE, "tls.certFile": __file__})


def test_credentials_need_both_halves_and_default_to_the_environment(monkeypatch):
    with pytest.raises(InvalidOptionError, match="option 'auth.secretKey' is missing"):
        SinkOptions.from_options({**BASE, "auth.accessKey": "writer"})
    monkeypatch.setenv("ORDERLYMQ_ACCESS_KEY", "reader")
    monkeypatch.setenv("ORDERLYMQ_SECRET_KEY", "reader-secret-003")
    options = SourceOptions.from_options(BASE, streaming=False)
    assert options.security.credentials.access_key == "reader"


def _environ_once_exec_is_done(proc: Path, timeout_s: float = 10.0) -> dict[bytes, bytes]:
    """The process's environment. Right after its ``execve``, ``/proc/PID/environ`` reads empty: the
    kernel has the new program's name before it has laid out the new stack with the environment."""
    give_up = time.monotonic() + timeout_s
    while True:
        raw = (proc / "environ").read_bytes()
        if raw or time.monotonic() > give_up:
            return dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        time.sleep(0.01)


def test_the_warden_gets_credentials_by_environment_never_on_its_command_line(pki):
    ca, _, _ = pki
    from broker.wire.credentials import Credentials
    from broker.wire.tls import TlsOptions

    security = ConnectionSecurity(TlsOptions(ca_file=ca.ca_file), Credentials("reader", "reader-secret-003"))
    warden = Warden("127.0.0.1:9", "g", "client-1", security)
    try:
        proc = Path(f"/proc/{warden.pid}")
        environ = _environ_once_exec_is_done(proc)
        assert b"reader-secret-003" not in (proc / "cmdline").read_bytes()
        assert environ.get(b"ORDERLYMQ_SECRET_KEY") == b"reader-secret-003", (
            f"warden {warden.pid}: {len(environ)} variables, /proc stat {(proc / 'stat').read_text()[:80]!r}")
        assert environ[b"ORDERLYMQ_TLS_CA_FILE"] == ca.ca_file.encode()
    finally:
        warden.dismiss()
        os.waitpid(warden.pid, 0)
