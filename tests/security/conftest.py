"""Fixtures of the security tests: a test CA, an ACL file with users, brokers that use them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.security.acl import AclDocument, Rule, save_acl
from broker.security.hashing import hash_secret
from broker.wire.credentials import Credentials
from tests.security.pki import CertificateAuthority

#: access key -> secret of the users every ACL fixture starts with.
SECRETS = {"admin": "admin-secret-0001", "writer": "writer-secret-002", "reader": "reader-secret-003"}
BASE_RULES = (
    Rule("admin", "allow", ("admin", "publish", "subscribe"), ("topic:*", "group:*", "broker")),
    Rule("writer", "allow", ("publish",), ("topic:orders-*",)),
    Rule("reader", "allow", ("subscribe",), ("topic:orders-*", "group:billing")),
)


def credentials(user: str) -> Credentials:
    return Credentials(user, SECRETS[user])


@dataclass
class AclFile:
    """The ACL file of a test broker; ``write`` replaces its rules (the broker re-reads it)."""

    path: Path

    def write(self, rules: tuple[Rule, ...] = BASE_RULES, users: dict[str, str] | None = None) -> None:
        hashed = {key: hash_secret(secret) for key, secret in (users or SECRETS).items()}
        save_acl(self.path, AclDocument(hashed, tuple(rules)))


@pytest.fixture(scope="session")
def pki(tmp_path_factory):
    """A CA with a broker certificate and a client certificate."""
    directory = tmp_path_factory.mktemp("pki")
    ca = CertificateAuthority(directory)
    return ca, ca.issue("broker"), ca.issue("client", server=False)


@pytest.fixture
def acl_file(tmp_path):
    acl = AclFile(tmp_path / "acl.toml")
    acl.write()
    return acl


@pytest.fixture
def secure_broker(broker_factory, acl_file):
    """A plaintext loopback broker with access control (ACL re-read every 1 s)."""
    return broker_factory(acl_file=str(acl_file.path))
