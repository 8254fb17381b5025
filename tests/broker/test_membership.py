"""Membership: heartbeats, expiry, unregister, generations, topic filter, threads."""

from __future__ import annotations

import threading

import pytest

from broker.membership import Membership
from broker.wire.errors import InvalidRequestError
from tests.support import FakeClock

TIMEOUT = 500


@pytest.fixture
def clock():
    return FakeClock(10_000)


@pytest.fixture
def members(clock):
    return Membership(timeout_ms=TIMEOUT, clock=clock)


def test_unknown_group(members):
    assert members.consumers("g") == []
    assert members.generation("g") == 0
    assert members.groups() == []


def test_heartbeat_joins_sorted(members):
    members.heartbeat("g", "b", ["t"])
    members.heartbeat("g", "a", ["t"])
    members.heartbeat("h", "c", ["t"])
    assert members.consumers("g") == ["a", "b"]
    assert members.consumers("h") == ["c"]
    assert members.groups() == ["g", "h"]


def test_member_expires_timeout_after_last_heartbeat(members, clock):
    members.heartbeat("g", "a", ["t"])
    clock.now += TIMEOUT - 1
    members.heartbeat("g", "a", ["t"])  # renews
    clock.now += TIMEOUT - 1
    assert members.consumers("g") == ["a"]
    clock.now += 1
    assert members.consumers("g") == []
    assert members.groups() == []


def test_generation_grows_on_join_leave_and_expiry_only(members, clock):
    members.heartbeat("g", "a")
    g1 = members.generation("g")
    members.heartbeat("g", "a")  # same member set
    assert members.generation("g") == g1
    members.heartbeat("g", "b")
    g2 = members.generation("g")
    assert g2 > g1
    members.unregister("g", "b")
    g3 = members.generation("g")
    assert g3 > g2
    members.unregister("g", "b")  # not a member: no change
    assert members.generation("g") == g3
    clock.now += TIMEOUT
    g4 = members.generation("g")
    assert g4 > g3
    assert members.generation("g") == g4
    assert members.consumers("g") == []
    members.heartbeat("g", "a")  # rejoin after the group emptied: generation keeps growing
    assert members.generation("g") > g4


def test_expired_member_heartbeating_again_is_a_change(members, clock):
    members.heartbeat("g", "a")
    before = members.generation("g")
    clock.now += TIMEOUT
    members.heartbeat("g", "a")
    assert members.consumers("g") == ["a"]
    assert members.generation("g") > before


def test_groups_are_independent(members):
    members.heartbeat("g", "a")
    before = members.generation("h")
    members.heartbeat("g", "b")
    assert members.generation("h") == before


def test_topic_filter(members):
    members.heartbeat("g", "a", ["t", "u"])
    members.heartbeat("g", "b", ["u"])
    assert members.consumers("g", topic="t") == ["a"]
    assert members.consumers("g", topic="u") == ["a", "b"]
    members.heartbeat("g", "a", ["u"])  # subscriptions follow the last heartbeat
    assert members.consumers("g", topic="t") == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "a", []), "consumer group must be a non-empty string"),
        (("g", "", []), "client id must be a non-empty string"),
        (("g", "a", [""]), "subscribed topic must be a non-empty string"),
    ],
)
def test_invalid_heartbeats(members, args, message):
    with pytest.raises(InvalidRequestError, match=message):
        members.heartbeat(*args)
    assert members.groups() == []


def test_bad_timeout():
    with pytest.raises(InvalidRequestError, match="timeout_ms"):
        Membership(timeout_ms=0)


def test_concurrent_heartbeats(members):
    def run(i: int) -> None:
        for _ in range(50):
            members.heartbeat("g", f"c{i}", ["t"])
            members.consumers("g")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert members.consumers("g") == [f"c{i}" for i in range(8)]
    assert members.generation("g") == 8


def test_lookups_of_unknown_groups_leave_nothing_behind(members):
    members.consumers("ghost")
    members.generation("ghost")
    members.unregister("ghost", "a")
    assert members._groups == {}
