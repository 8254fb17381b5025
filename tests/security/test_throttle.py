"""Failed-authentication throttling: wrong secrets for a key from a host pause its checks there,
for a time that doubles; verified credentials, other hosts and other keys are not slowed down."""

from __future__ import annotations

import grpc
import pytest

from broker.security.acl import AclDocument, Rule, save_acl
from broker.security.guard import AccessGuard
from broker.security.hashing import hash_secret
from broker.security.throttle import FIRST_PAUSE_S, FREE_FAILURES, MAX_PAUSE_S, peer_host
from broker.wire.credentials import Credentials
from broker.wire.errors import UnauthenticatedError
from connector.client.connection import BrokerConnection, pb
from tests.security.conftest import SECRETS, credentials
from tests.support import wait_until

ATTACKER, OTHER = "10.0.0.66", "10.0.0.7"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def guard(tmp_path):
    path = tmp_path / "acl.toml"
    save_acl(path, AclDocument({"alice": hash_secret("alice-secret"), "bob": hash_secret("bob-secret")},
                               (Rule("*", "allow", ("subscribe",), ("topic:a",)),)))
    clock = FakeClock()
    return AccessGuard(str(path), clock=clock), clock


def _wrong(guard: AccessGuard, host: str = ATTACKER) -> str:
    with pytest.raises(UnauthenticatedError) as refused:
        guard.authenticate(Credentials("alice", "guess").metadata(), host)
    return str(refused.value)


def test_wrong_secrets_pause_the_key_from_that_host_for_doubling_times(guard):
    guard, clock = guard
    right = Credentials("alice", "alice-secret").metadata()
    before = Credentials("bob", "bob-secret").metadata()
    assert guard.authenticate(before, ATTACKER) == "bob"  # verified before the guessing run
    for _ in range(FREE_FAILURES):
        assert "wrong secret key for access key 'alice'" in _wrong(guard)
    paused = _wrong(guard)
    assert f"too many wrong secret keys for access key 'alice' from {ATTACKER}" in paused
    assert f"not checked for another {FIRST_PAUSE_S:.1f}s" in paused
    with pytest.raises(UnauthenticatedError, match="too many wrong secret keys"):
        guard.authenticate(right, ATTACKER)  # even the right one: it is not checked while paused
    assert guard.authenticate(right, OTHER) == "alice"  # another host is not slowed down
    assert guard.authenticate(before, ATTACKER) == "bob"  # nor verified credentials, nor other keys

    clock.now += FIRST_PAUSE_S
    assert "wrong secret key" in _wrong(guard)
    assert f"for another {2 * FIRST_PAUSE_S:.1f}s" in _wrong(guard)  # the pause doubles
    for _ in range(20):
        clock.now += MAX_PAUSE_S
        _wrong(guard)
    assert f"for another {MAX_PAUSE_S:.1f}s" in _wrong(guard)  # up to its maximum
    clock.now += MAX_PAUSE_S
    assert guard.authenticate(right, ATTACKER) == "alice"  # a right secret clears the count
    assert "wrong secret key" in _wrong(guard)


def test_unknown_access_keys_from_a_host_are_paused_together(guard):
    guard, clock = guard
    for n in range(FREE_FAILURES):
        with pytest.raises(UnauthenticatedError, match=f"unknown access key 'guess-{n}'"):
            guard.authenticate(Credentials(f"guess-{n}", "x").metadata(), ATTACKER)
    with pytest.raises(UnauthenticatedError, match=f"too many unknown access keys from {ATTACKER} lately"):
        guard.authenticate(Credentials("another-guess", "x").metadata(), ATTACKER)
    assert guard.authenticate(Credentials("alice", "alice-secret").metadata(), ATTACKER) == "alice"  # known keys pass
    with pytest.raises(UnauthenticatedError, match="unknown access key 'another-guess'"):
        guard.authenticate(Credentials("another-guess", "x").metadata(), OTHER)  # other hosts are not paused
    clock.now += FIRST_PAUSE_S
    with pytest.raises(UnauthenticatedError, match="unknown access key 'another-guess'"):
        guard.authenticate(Credentials("another-guess", "x").metadata(), ATTACKER)


@pytest.mark.parametrize(("peer", "host"), [("ipv4:127.0.0.1:53211", "127.0.0.1"), ("ipv6:%5B::1%5D:40000", "[::1]"),
                                            ("unix:/tmp/sock", "unix:/tmp/sock")])
def test_peer_host_drops_the_port(peer, host):
    assert peer_host(peer) == host


def test_a_broker_throttles_guessing_and_keeps_serving(secure_broker):
    address = secure_broker.address
    with BrokerConnection(address, timeout=10, retry_timeout=0, credentials=credentials("reader")) as reader:
        assert reader.call("Health", pb.HealthRequest()).status == "SERVING"
        answers = []
        with grpc.insecure_channel(address) as channel:
            health = pb.DESCRIPTOR.services_by_name["OrderlyMQ"].methods_by_name["Health"]
            call = channel.unary_unary(f"/{health.containing_service.full_name}/Health")
            for attempt in range(50):
                try:
                    call(b"", timeout=10, metadata=Credentials("writer", f"guess-{attempt}").metadata())
                    answers.append("ANSWERED")
                except grpc.RpcError as err:
                    answers.append(err.details())
                if "too many wrong secret keys" in answers[-1]:
                    break
        assert "ANSWERED" not in answers
        assert "too many wrong secret keys for access key 'writer' from 127.0.0.1" in answers[-1], answers
        assert sum("wrong secret key for access key 'writer'" in a for a in answers) >= FREE_FAILURES
        assert all(SECRETS["writer"] not in a for a in answers)
        # The reader, verified before, is served all along; the writer's right secret once the pause ends.
        assert reader.call("Health", pb.HealthRequest()).status == "SERVING"

    def writer_served() -> bool:
        try:
            with BrokerConnection(address, timeout=10, retry_timeout=0, credentials=credentials("writer")) as conn:
                return conn.call("Health", pb.HealthRequest(), retry=False).status == "SERVING"
        except UnauthenticatedError:
            return False

    assert wait_until(writer_served, timeout=60, interval=0.5)
