"""The console under TLS and access control: HTTPS, a login the broker checks, and no exposure
off loopback without both."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request

import pytest

from broker.wire.errors import InvalidOptionError
from broker.wire.tls import TlsOptions
from connector.cli import main
from connector.client.admin import Admin
from connector.console import ConsoleServer
from tests.security.conftest import SECRETS, credentials
from tests.support import wait_until


def _get(url: str, context: ssl.SSLContext | None, user: str | None = None, secret: str | None = None):
    headers = {}
    if user is not None:
        token = base64.b64encode(f"{user}:{secret or SECRETS[user]}".encode()).decode()
        headers["Authorization"] = f"Basic {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=context, timeout=10) as answer:
            return answer.status, answer.read().decode(), answer.headers
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode(), refused.headers


def test_console_over_https_lets_in_only_admins_of_the_broker(broker_factory, pki, acl_file, monkeypatch):
    ca, server, _ = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file, acl_file=str(acl_file.path))
    tls = TlsOptions(ca_file=ca.ca_file)
    with Admin(broker.address, tls=tls, credentials=credentials("admin")) as admin:
        admin.create_topic("orders-console", 2)
    for name, value in credentials("admin").environment().items():  # the console's own reads
        monkeypatch.setenv(name, value)
    with ConsoleServer(broker.address, port=0, interval=0.25, tls=tls, login=True, https_cert_file=server.cert_file,
                       https_key_file=server.key_file) as console:
        url = console.url + "api/state"
        assert url.startswith("https://")
        trusting = ssl.create_default_context(cafile=ca.ca_file)

        code, body, headers = _get(url, trusting)
        assert code == 401 and "access key" in body and headers["WWW-Authenticate"].startswith("Basic")
        code, body, _ = _get(url, trusting, "reader", "wrong-secret")
        assert code == 401 and "wrong secret key for access key 'reader'" in body and "wrong-secret" not in body
        code, body, _ = _get(url, trusting, "reader")
        assert code == 403 and "reader" in body and "admin" in body
        snapshot = wait_until(lambda: json.loads(_get(url, trusting, "admin")[1])["snapshot"])
        assert [t["name"] for t in snapshot["topics"]] == ["orders-console"]
        assert _get(console.url, trusting, "admin")[0] == 200  # the page itself, from the remembered login

        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP to the HTTPS port
            urllib.request.urlopen(url.replace("https:", "http:"), timeout=10).read()
        with pytest.raises(urllib.error.URLError):  # a visitor that does not trust the certificate
            urllib.request.urlopen(url, context=ssl.create_default_context(), timeout=10).read()


def test_console_refuses_to_listen_off_loopback_without_login_and_https(broker, pki):
    _, server, _ = pki
    with pytest.raises(InvalidOptionError, match=r"without --login and --https-cert-file/--https-key-file"):
        ConsoleServer(broker.address, host="0.0.0.0", port=0)
    with pytest.raises(InvalidOptionError, match=r"without --https-cert-file/--https-key-file"):
        ConsoleServer(broker.address, host="0.0.0.0", port=0, login=True)
    with pytest.raises(InvalidOptionError, match="both a certificate and a key"):
        ConsoleServer(broker.address, port=0, https_cert_file=server.cert_file)
    ConsoleServer(broker.address, host="0.0.0.0", port=0, allow_insecure_remote=True).close()
    ConsoleServer(broker.address, host="0.0.0.0", port=0, login=True, https_cert_file=server.cert_file,
                  https_key_file=server.key_file).close()


def test_console_command_off_loopback_is_a_one_line_error(broker, capsys):
    assert main(["--brokers", broker.address, "console", "--host", "0.0.0.0", "--port", "0"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--allow-insecure-remote" in err
