"""The ACL model, its file and its CLI, without a broker."""

from __future__ import annotations

import stat

import pytest

from broker.__main__ import main as broker_main
from broker.proto import orderlymq_pb2 as pb
from broker.security.acl import AclDocument, Rule, load_acl, save_acl
from broker.security.guard import AccessGuard
from broker.security.hashing import hash_secret, verify_secret
from broker.security.rights import RPC_RIGHTS
from broker.wire.credentials import Credentials
from broker.wire.errors import InvalidOptionError, PermissionDeniedError


def test_globs_and_deny_beats_allow():
    acl = AclDocument({}, (
        Rule("alice", "allow", ("publish", "subscribe"), ("topic:orders-*",)),
        Rule("*", "allow", ("subscribe",), ("topic:public.?",)),
        Rule("alice", "deny", ("publish",), ("topic:orders-secret",)),
    ))
    assert acl.allows("alice", "publish", "topic:orders-eu")
    assert not acl.allows("alice", "publish", "topic:orders-secret")
    assert acl.allows("alice", "subscribe", "topic:orders-secret")
    assert acl.allows("bob", "subscribe", "topic:public.a") and not acl.allows("bob", "subscribe", "topic:public.ab")
    assert not acl.allows("bob", "publish", "topic:public.a")  # deny by default
    assert not acl.allows("alice", "publish", "topic:Orders-eu")  # case-sensitive
    assert acl.may_ever("alice", "publish") and not acl.may_ever("bob", "publish")


def test_every_rpc_has_its_rights():
    methods = {m.name for service in ("OrderlyMQ", "Replication") for m in pb.DESCRIPTOR.services_by_name[service].methods}
    assert methods == set(RPC_RIGHTS)


def test_replicate_is_a_right_on_the_broker_alone_and_implied_by_no_other():
    acl = AclDocument({}, (Rule("admin", "allow", ("admin", "publish", "subscribe"), ("topic:*", "group:*", "broker")),
                           Rule("replicator", "allow", ("replicate",), ("broker",))))
    assert acl.allows("replicator", "replicate", "broker")
    assert not acl.allows("admin", "replicate", "broker")
    assert not acl.allows("replicator", "subscribe", "topic:orders")
    with pytest.raises(InvalidOptionError, match="the replicate action applies to the resource 'broker' only"):
        Rule("replicator", "allow", ("replicate",), ("topic:*",))


def test_secrets_are_stored_as_salted_hashes():
    first, second = hash_secret("s3cret"), hash_secret("s3cret")
    assert first != second and "s3cret" not in first
    assert verify_secret("s3cret", first) and not verify_secret("s3cret!", first)
    assert not verify_secret("s3cret", "plain-text") and not verify_secret("s3cret", "scrypt$x$y$z$a$b")


def test_file_round_trip_is_private_and_rejects_bad_rules(tmp_path):
    path = tmp_path / "acl.toml"
    acl = AclDocument({'we"ird': hash_secret("x")}, (Rule("*", "deny", ("admin",), ("broker", "group:a*")),))
    save_acl(path, acl)
    assert load_acl(path) == acl
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text('[[rules]]\nuser = "a"\nactions = ["publish"]\nresources = ["queue:x"]\n')
    with pytest.raises(InvalidOptionError, match=r"acl.toml: rule 1: resource 'queue:x' must be topic:"):
        load_acl(path)
    with pytest.raises(InvalidOptionError, match="does not exist"):
        load_acl(tmp_path / "missing.toml")


def test_guard_remembers_a_verified_secret_and_denies_with_names(tmp_path):
    path = tmp_path / "acl.toml"
    save_acl(path, AclDocument({"alice": hash_secret("alice-secret")},
                               (Rule("alice", "allow", ("subscribe",), ("topic:a",)),)))
    guard = AccessGuard(str(path))
    metadata = Credentials("alice", "alice-secret").metadata()
    assert guard.recognise(metadata) is None  # not verified yet: needs a scrypt
    assert guard.authenticate(metadata) == "alice"
    assert guard.recognise(metadata) == "alice"  # now a lookup
    with pytest.raises(PermissionDeniedError, match="user 'alice' may not subscribe on group:g"):
        guard.authorize("alice", "CommitOffset", pb.CommitOffsetRequest(group="g", topic="a"))
    guard.authorize("alice", "DescribeTopic", pb.DescribeTopicRequest(topic="a"))


def test_credentials_never_show_the_secret():
    creds = Credentials("alice", "top-secret-value")
    assert "top-secret-value" not in repr(creds)
    with pytest.raises(InvalidOptionError, match="printable ASCII"):
        Credentials("al ice", "x")
    assert Credentials.from_environment({}) is None
    with pytest.raises(InvalidOptionError, match="ORDERLYMQ_SECRET_KEY is not set"):
        Credentials.from_environment({"ORDERLYMQ_ACCESS_KEY": "alice"})


def test_acl_cli_manages_users_and_rules(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "acl.toml")
    assert broker_main(["acl", "--file", path, "user", "add", "alice"]) == 0
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    assert verify_secret(secret, load_acl(path).users["alice"])
    assert secret not in (tmp_path / "acl.toml").read_text()
    assert broker_main(["acl", "--file", path, "allow", "alice", "publish,subscribe", "topic:o-*", "group:g"]) == 0
    assert broker_main(["acl", "--file", path, "deny", "*", "admin", "broker"]) == 0
    assert broker_main(["acl", "--file", path, "list"]) == 0
    listing = capsys.readouterr().out
    assert "1. allow alice publish,subscribe on topic:o-* group:g" in listing and "2. deny * admin on broker" in listing
    assert broker_main(["acl", "--file", path, "revoke", "2"]) == 0
    assert len(load_acl(path).rules) == 1
    assert broker_main(["acl", "--file", path, "allow", "alice", "fly", "topic:x"]) == 1
    assert "rule actions must be among" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("bob-chosen-secret\n"))
    assert broker_main(["acl", "--file", path, "user", "add", "bob", "--secret-stdin"]) == 0
    assert verify_secret("bob-chosen-secret", load_acl(path).users["bob"])
    assert broker_main(["acl", "--file", path, "user", "remove", "alice"]) == 0
    assert load_acl(path).rules == () and list(load_acl(path).users) == ["bob"]
