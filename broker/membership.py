"""Consumer-group membership from heartbeats, as RocketMQ's ConsumerManager.

A client is a live member of a group from its first heartbeat until ``timeout_ms`` after its last
one, or until it unregisters. Each group has a generation that grows whenever its set of live
members changes (join, leave, expiry), so a consumer that sees a new generation knows to rebalance.
Membership is memory only: after a restart clients rejoin with their next heartbeat.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.clocks import steady_ms
from broker.wire.errors import InvalidRequestError
from broker.wire.limits import MAX_CLIENT_ID_BYTES, MAX_GROUP_BYTES, MAX_TOPIC_BYTES, check_name

__all__ = ["MAX_SUBSCRIPTIONS", "Membership"]

MAX_SUBSCRIPTIONS = 1024  # topics one member may name in a heartbeat


@dataclass
class _Member:
    topics: frozenset[str]
    expires_at_ms: int


@dataclass
class _Group:
    members: dict[str, _Member]
    generation: int = 0


class Membership:
    """Live consumers per group.

    Parameters
    ----------
    timeout_ms : int
        A member expires this long after its last heartbeat (live while ``now < last + timeout_ms``).
    clock : callable returning int
        Steady milliseconds (``broker.clocks``): a step of the system clock expires nobody.
        Injected by tests.

    Notes
    -----
    Thread-safe (one mutex). Expired members are removed lazily, by the next call that looks at
    their group, so no background thread is needed and the generation still moves at the first
    observation after the expiry.
    """

    def __init__(self, timeout_ms: int = 30_000, clock: Callable[[], int] = steady_ms):
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms <= 0:
            raise InvalidRequestError(f"consumer timeout_ms must be a positive integer, got {timeout_ms!r}")
        self._timeout_ms = timeout_ms
        self._clock = clock
        self._mutex = threading.Lock()
        self._groups: dict[str, _Group] = {}

    def heartbeat(self, group: str, client_id: str, topics: Iterable[str] = ()) -> None:
        """Join ``group`` or stay in it; ``topics`` are the member's current subscriptions."""
        _check_name("consumer group", group)
        _check_name("client id", client_id)
        subscribed = frozenset(topics)
        if len(subscribed) > MAX_SUBSCRIPTIONS:
            raise InvalidRequestError(
                f"a heartbeat names {len(subscribed)} subscribed topics; the limit is {MAX_SUBSCRIPTIONS}")
        for topic in subscribed:
            _check_name("subscribed topic", topic)
        with self._mutex:
            now = self._clock()
            state = self._sweep(group, now, create=True)
            if client_id not in state.members:
                state.generation += 1
            state.members[client_id] = _Member(subscribed, now + self._timeout_ms)

    def unregister(self, group: str, client_id: str) -> None:
        """Leave ``group`` now (a clean shutdown); unknown members are ignored."""
        _check_name("consumer group", group)
        _check_name("client id", client_id)
        with self._mutex:
            state = self._sweep(group, self._clock())
            if state.members.pop(client_id, None) is not None:
                state.generation += 1

    def consumers(self, group: str, topic: str | None = None) -> list[str]:
        """Sorted client ids of the live members; only those subscribed to ``topic`` if given."""
        with self._mutex:
            members = self._sweep(group, self._clock()).members
            return sorted(cid for cid, m in members.items() if topic is None or topic in m.topics)

    def generation(self, group: str) -> int:
        """A number that grows each time the group's live member set changes; 0 for an unknown group."""
        with self._mutex:
            return self._sweep(group, self._clock()).generation

    def groups(self) -> list[str]:
        """Groups with at least one live member, sorted."""
        with self._mutex:
            now = self._clock()
            return sorted(g for g in list(self._groups) if self._sweep(g, now).members)

    def _sweep(self, group: str, now: int, create: bool = False) -> _Group:
        # A group is kept after its last member leaves so its generation never goes back; only a
        # heartbeat creates one, so lookups of unknown names leave nothing behind.
        state = self._groups.get(group)
        if state is None:
            state = _Group({})
            if create:
                self._groups[group] = state
        expired = [cid for cid, m in state.members.items() if now >= m.expires_at_ms]
        for cid in expired:
            del state.members[cid]
        if expired:
            state.generation += 1
        return state


_LIMITS = {"consumer group": MAX_GROUP_BYTES, "client id": MAX_CLIENT_ID_BYTES, "subscribed topic": MAX_TOPIC_BYTES}


def _check_name(what: str, value: object) -> None:
    check_name(what, value, _LIMITS[what])
