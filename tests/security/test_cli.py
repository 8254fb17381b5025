"""The ``orderlymq`` command line against a broker with TLS and access control."""

from __future__ import annotations

from connector.cli import main
from tests.security.conftest import SECRETS


def test_cli_with_tls_flags_and_credentials_from_the_environment(broker_factory, pki, acl_file, capsys, monkeypatch):
    ca, server, _ = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file, acl_file=str(acl_file.path))
    base = ["--brokers", broker.address, "--tls-ca-file", ca.ca_file]
    assert main([*base, "topic", "list"]) == 1
    assert "no credentials" in capsys.readouterr().err
    monkeypatch.setenv("ORDERLYMQ_ACCESS_KEY", "admin")
    monkeypatch.setenv("ORDERLYMQ_SECRET_KEY", SECRETS["admin"])
    assert main([*base, "topic", "create", "orders-cli", "--queues", "2"]) == 0
    assert main([*base, "send", "orders-cli", "hello", "--key", "k"]) == 0
    assert main([*base, "tail", "orders-cli", "--max", "1"]) == 0
    assert "hello" in capsys.readouterr().out
    monkeypatch.setenv("ORDERLYMQ_ACCESS_KEY", "reader")
    monkeypatch.setenv("ORDERLYMQ_SECRET_KEY", SECRETS["reader"])
    assert main([*base, "topic", "delete", "orders-cli"]) == 1
    assert "user 'reader' may not admin on topic:orders-cli" in capsys.readouterr().err
    monkeypatch.setenv("ORDERLYMQ_TLS_CA_FILE", ca.ca_file)
    assert main(["--brokers", broker.address, "topic", "list"]) == 0
    assert "orders-cli" in capsys.readouterr().out
