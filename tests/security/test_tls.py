"""TLS and mutual TLS on the client port, with a CA made in the test; the config's refusals."""

from __future__ import annotations

import base64
import http.client
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.wire.errors import BrokerUnavailableError, InvalidOptionError
from broker.wire.tls import TlsOptions
from connector.client.admin import Admin
from connector.client.connection import BrokerConnection, pb
from connector.client.producer import Producer
from tests.security.conftest import SECRETS, credentials
from tests.security.pki import CertificateAuthority
from tests.support import wait_until


def _health(address: str, tls: TlsOptions | None, **kwargs) -> str:
    with BrokerConnection(address, timeout=5, retry_timeout=1, tls=tls, **kwargs) as conn:
        return conn.call("Health", pb.HealthRequest()).status


def test_tls_broker_serves_a_client_that_trusts_its_ca(broker_factory, pki, topic_name):
    ca, server, _ = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file)
    tls = TlsOptions(ca_file=ca.ca_file)
    assert _health(broker.address, tls) == "SERVING"
    with Admin(broker.address, tls=tls) as admin:
        admin.create_topic(topic_name, 2)
    with Producer(broker.address, tls=tls) as producer:  # SendStream over TLS
        assert [producer.send(topic_name, f"m{i}", key="k").queue_offset for i in range(5)] == list(range(5))


def test_tls_broker_refuses_plaintext_and_an_unknown_ca(broker_factory, pki, tmp_path):
    ca, server, _ = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file)
    with pytest.raises(BrokerUnavailableError):
        _health(broker.address, None)
    other = CertificateAuthority(tmp_path, "another CA")
    with pytest.raises(BrokerUnavailableError):
        _health(broker.address, TlsOptions(ca_file=other.ca_file))


def test_mutual_tls_requires_a_client_certificate_from_the_ca(broker_factory, pki, tmp_path):
    ca, server, client = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file,
                            tls_client_ca_file=ca.ca_file)
    with pytest.raises(BrokerUnavailableError):
        _health(broker.address, TlsOptions(ca_file=ca.ca_file))
    stranger = CertificateAuthority(tmp_path, "stranger CA").issue("stranger", server=False)
    with pytest.raises(BrokerUnavailableError):
        _health(broker.address, TlsOptions(ca_file=ca.ca_file, cert_file=stranger.cert_file,
                                           key_file=stranger.key_file))
    good = TlsOptions(ca_file=ca.ca_file, cert_file=client.cert_file, key_file=client.key_file)
    assert _health(broker.address, good) == "SERVING"


def test_tls_and_access_control_together(broker_factory, pki, acl_file):
    ca, server, _ = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file,
                            acl_file=str(acl_file.path))
    assert _health(broker.address, TlsOptions(ca_file=ca.ca_file), credentials=credentials("reader")) == "SERVING"


def test_missing_tls_files_name_the_setting(broker_factory, tmp_path):
    with pytest.raises(InvalidOptionError, match="tls_cert_file: cannot read .*nope.crt"):
        broker_factory(tls_cert_file=str(tmp_path / "nope.crt"), tls_key_file=str(tmp_path / "nope.key"))
    with pytest.raises(InvalidOptionError, match="ca_file: cannot read .*missing-ca.pem"):
        _health("127.0.0.1:1", TlsOptions(ca_file=str(tmp_path / "missing-ca.pem")))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "broker.example.com"])
def test_a_remote_host_needs_acl_and_tls_or_an_explicit_allowance(host):
    with pytest.raises(InvalidOptionError, match="acl_file and tls_cert_file are not set.*allow_insecure_remote"):
        BrokerConfig(host=host)
    with pytest.raises(InvalidOptionError, match="tls_cert_file is not set"):
        BrokerConfig(host=host, acl_file="acl.toml")
    assert BrokerConfig(host=host, allow_insecure_remote=True).allow_insecure_remote
    assert BrokerConfig(host=host, acl_file="acl.toml", tls_cert_file="c", tls_key_file="k").tls


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_hosts_need_nothing(host):
    assert BrokerConfig(host=host).host == host


def test_tls_settings_go_together():
    with pytest.raises(InvalidOptionError, match="tls_cert_file and tls_key_file go together"):
        BrokerConfig(tls_cert_file="c")
    with pytest.raises(InvalidOptionError, match="tls_client_ca_file .* needs tls_cert_file"):
        BrokerConfig(tls_client_ca_file="ca")
    with pytest.raises(InvalidOptionError, match="give both cert_file and key_file"):
        TlsOptions(cert_file="c")


def test_a_broker_group_settings_of_its_replication_links():
    group = {"zookeeper": "127.0.0.1:2181"}
    with pytest.raises(InvalidOptionError, match="a broker group with acl_file needs replication_access_key and "
                                                 "replication_secret_file.*acl allow <user> replicate broker"):
        BrokerConfig(**group, acl_file="acl.toml")
    with pytest.raises(InvalidOptionError, match="replication_access_key and replication_secret_file go together"):
        BrokerConfig(**group, acl_file="acl.toml", replication_access_key="replicator")
    with pytest.raises(InvalidOptionError, match="replication_tls_ca_file is for replication over TLS: it needs "
                                                 "tls_cert_file"):
        BrokerConfig(**group, replication_tls_ca_file="ca.pem")
    with pytest.raises(InvalidOptionError, match="replication_tls_cert_file and replication_tls_key_file go together"):
        BrokerConfig(**group, tls_cert_file="c", tls_key_file="k", replication_tls_cert_file="rc")
    with pytest.raises(InvalidOptionError, match="zookeeper_tls_cert_file and zookeeper_tls_key_file go together"):
        BrokerConfig(**group, zookeeper_tls_ca_file="ca.pem", zookeeper_tls_cert_file="zc")
    with pytest.raises(InvalidOptionError, match="zookeeper_tls_cert_file is for TLS to ZooKeeper: it needs "
                                                 "zookeeper_tls_ca_file"):
        BrokerConfig(**group, zookeeper_tls_cert_file="zc", zookeeper_tls_key_file="zk")
    secure = BrokerConfig(**group, tls_cert_file="c", tls_key_file="k", acl_file="acl.toml",
                          replication_access_key="replicator", replication_secret_file="replicator.secret")
    assert secure.clustered and secure.tls


@pytest.mark.parametrize("example", ["broker-secure.toml", "cluster/broker-a-0-secure.toml"])
def test_secure_example_configs_are_valid(example):
    config = BrokerConfig.from_toml(Path(__file__).parents[2] / "conf" / example)
    assert config.tls and config.acl_file and config.tls_client_ca_file


def _serves(address: str, tls: TlsOptions) -> bool:
    try:
        return _health(address, tls) == "SERVING"
    except BrokerUnavailableError:
        return False


def test_renewed_certificate_files_apply_without_restart(broker_factory, tmp_path, caplog):
    old_ca, new_ca = CertificateAuthority(tmp_path, "old CA"), CertificateAuthority(tmp_path, "new CA")
    old, new = old_ca.issue("broker"), new_ca.issue("broker-renewed")
    cert, key = tmp_path / "serving.crt", tmp_path / "serving.key"
    cert.write_bytes(Path(old.cert_file).read_bytes())
    key.write_bytes(Path(old.key_file).read_bytes())
    broker = broker_factory(tls_cert_file=str(cert), tls_key_file=str(key), metrics_port=0)
    trusts_old, trusts_new = TlsOptions(ca_file=old_ca.ca_file), TlsOptions(ca_file=new_ca.ca_file)
    assert _serves(broker.address, trusts_old) and not _serves(broker.address, trusts_new)

    # Half a renewal (the new certificate, the old key): refused, the current certificate stays.
    Path(f"{cert}.tmp").write_bytes(Path(new.cert_file).read_bytes())
    Path(f"{cert}.tmp").replace(cert)
    assert wait_until(lambda: _serves(broker.address, trusts_old) and "keeping the current TLS certificate" in
                      caplog.text), caplog.text
    assert "not a matching PEM certificate and key" in caplog.text
    # The other half: new connections get the renewed certificate, without a restart.
    Path(f"{key}.tmp").write_bytes(Path(new.key_file).read_bytes())
    Path(f"{key}.tmp").replace(key)
    assert wait_until(lambda: _serves(broker.address, trusts_new)), caplog.text
    assert not _serves(broker.address, trusts_old)
    metrics = f"https://127.0.0.1:{broker.metrics_port}/metrics"  # the metrics endpoint follows too
    assert wait_until(lambda: _scrapes(metrics, ssl.create_default_context(cafile=new_ca.ca_file))), caplog.text
    assert not _scrapes(metrics, ssl.create_default_context(cafile=old_ca.ca_file))


def _scrapes(url: str, context: ssl.SSLContext | None, headers: dict | None = None) -> bool:
    try:
        request = urllib.request.Request(url, headers=headers or {})
        return b"orderlymq_" in urllib.request.urlopen(request, context=context, timeout=10).read()
    except (ssl.SSLError, urllib.error.URLError, ConnectionError, http.client.HTTPException):
        return False


def test_metrics_are_served_over_mutual_tls_with_the_broker_certificate(broker_factory, pki):
    ca, server, client = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file,
                            tls_client_ca_file=ca.ca_file, metrics_port=0)
    url = f"https://127.0.0.1:{broker.metrics_port}/metrics"
    scraper = ssl.create_default_context(cafile=ca.ca_file)
    scraper.load_cert_chain(client.cert_file, client.key_file)
    assert b"orderlymq_" in urllib.request.urlopen(url, context=scraper, timeout=10).read()
    for refused in (ssl.create_default_context(cafile=ca.ca_file), None):  # no client certificate; plain HTTP
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            target = url if refused is not None else url.replace("https:", "http:")
            urllib.request.urlopen(target, context=refused, timeout=10).read()


def test_console_reads_a_tls_and_acl_broker(broker_factory, pki, acl_file):
    ca, server, _ = pki
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file, acl_file=str(acl_file.path))
    with Admin(broker.address, tls=TlsOptions(ca_file=ca.ca_file), credentials=credentials("admin")) as admin:
        admin.create_topic("orders-console", 2)
    environment = {**os.environ, **credentials("admin").environment()}
    process = subprocess.Popen([sys.executable, "-m", "connector.cli", "--brokers", broker.address, "--tls-ca-file",
                                ca.ca_file, "console", "--port", "0"], stdout=subprocess.PIPE, text=True, env=environment)
    try:
        url = process.stdout.readline().split(" at ", 1)[1].split(" ", 1)[0]
        snapshot = wait_until(lambda: json.loads(urllib.request.urlopen(url + "api/state", timeout=10).read())["snapshot"])
        assert [t["name"] for t in snapshot["topics"]] == ["orders-console"]
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_metrics_need_an_admin_of_the_broker_under_access_control(broker_factory, acl_file):
    broker = broker_factory(acl_file=str(acl_file.path), metrics_port=0)
    url = f"http://127.0.0.1:{broker.metrics_port}/metrics"

    def status(user: str | None, secret: str | None = None) -> tuple[int, str]:
        headers = {}
        if user is not None:
            token = base64.b64encode(f"{user}:{secret or SECRETS[user]}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as refused:
            return refused.code, refused.read().decode()

    code, body = status(None)
    assert code == 401 and "no credentials" in body
    code, body = status("reader", "wrong-secret")
    assert code == 401 and "wrong secret key for access key 'reader'" in body and "wrong-secret" not in body
    code, body = status("reader")
    assert code == 403 and "user 'reader' may not read the metrics: it needs admin on broker" in body
    code, body = status("admin")
    assert code == 200 and "orderlymq_rpc_duration_seconds" in body
