"""The group's control plane in ZooKeeper (through kazoo): membership, mastership, sync-state set.

Nodes of group ``G`` in cluster ``C``, under ``/orderlymq/C/groups/G``::

    members/<broker_id>   ephemeral: {"address"}          one per live broker of the group
    master                ephemeral: {"broker_id", "address"}  held by the master's session
    state                 persistent: {"epoch", "master", "master_address", "sync_set", "group_id"}

Consensus is ZooKeeper's: exactly one session can create ``master`` (the election), and ``state``
changes only by a versioned write (compare-and-set) made by the broker whose session holds
``master``, so a master cut off from ZooKeeper cannot change it any more. The group epoch grows
by one with every new master; only members of the sync-state set may campaign, so a new master
holds every acknowledged send. ``group_id``, drawn when the group is founded (its first election),
tells this group's state from that of another ZooKeeper's group of the same name, or its absence
from a ZooKeeper that lost its data (``ClusterNode`` takes no role from either).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.connection import ConnectionHandler
from kazoo.protocol.serialization import Connect

from broker.cluster import lease_clock

__all__ = ["GroupControl", "GroupState"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupState:
    """The persistent state of a group; ``version`` is ZooKeeper's, for compare-and-set; ``group_id``
    is "" in a state written by an older version (the next election draws one)."""

    epoch: int
    master: int
    master_address: str
    sync_set: frozenset[int]
    version: int = -1
    group_id: str = ""

    def encoded(self) -> bytes:
        return json.dumps({"epoch": self.epoch, "master": self.master, "master_address": self.master_address,
                           "sync_set": sorted(self.sync_set), "group_id": self.group_id}).encode()

    @classmethod
    def decoded(cls, raw: bytes, version: int) -> GroupState:
        doc = json.loads(raw)
        return cls(int(doc["epoch"]), int(doc["master"]), str(doc["master_address"]),
                   frozenset(int(b) for b in doc["sync_set"]), version, str(doc.get("group_id", "")))


class _NegotiationRecorder(ConnectionHandler):
    """kazoo's connection, keeping the session timeout the server granted: a server clamps the one
    asked for to its ``minSessionTimeout``..``maxSessionTimeout``, and kazoo keeps it to itself."""

    granted_ms: int | None = None

    def _invoke(self, timeout, request, xid=None):
        result = super()._invoke(timeout, request, xid)
        if isinstance(request, Connect) and result[0].time_out > 0:
            self.granted_ms = result[0].time_out
        return result


class GroupControl:
    """One broker's view of its group in ZooKeeper; ``on_change`` is called (on kazoo's thread,
    so it must only schedule work) whenever anything of the group or the session changes."""

    def __init__(self, hosts: str, cluster: str, group: str, broker_id: int, *, session_timeout_s: float,
                 on_change: Callable[[], None], client_options: dict | None = None) -> None:
        self.broker_id = broker_id
        self.root = f"/orderlymq/{cluster}/groups/{group}"
        self.on_change = on_change
        self.requested_timeout_s = session_timeout_s
        # Reconnect attempts at most a quarter of a session apart: after an outage, the session
        # (which a restarted ZooKeeper keeps for a session timeout from its start) is taken back.
        # client_options: TLS and digest user (broker.cluster.zk_security)
        self.client = KazooClient(hosts=hosts, timeout=session_timeout_s, connection_retry=dict(
            max_tries=-1, delay=0.05, backoff=2, max_delay=min(1.0, session_timeout_s / 4)), **(client_options or {}))
        built = self.client._connection  # KazooClient builds its own; ours also keeps the granted timeout
        self.client._connection = _NegotiationRecorder(self.client, built.retry_sleeper, logger=built.logger,
                                                       sasl_options=built.sasl_options)
        self.address = ""
        self.heard_at = 0.0  # when the last request ZooKeeper answered was sent (lease_clock)
        self._heartbeat_sent: float | None = None
        self._session_lost = threading.Event()
        self.client.add_listener(self._on_session)

    # -- session -------------------------------------------------------------------------------

    def start(self, address: str, timeout_s: float = 30.0) -> None:
        self.address = address
        self.client.start(timeout=timeout_s)
        self._warn_if_not_granted()
        self.client.ensure_path(f"{self.root}/members")
        self.register()
        self.client.DataWatch(f"{self.root}/state", lambda *_: self.on_change())
        self.client.DataWatch(f"{self.root}/master", lambda *_: self.on_change())
        self.client.ChildrenWatch(f"{self.root}/members", lambda *_: self.on_change())

    @property
    def session_timeout_s(self) -> float:
        """The session timeout leases count on: the one asked for, or the server's when it granted
        less (a master counting on more would serve on after its session expired)."""
        granted = self.client._connection.granted_ms
        return self.requested_timeout_s if granted is None else min(self.requested_timeout_s, granted / 1000)

    def _warn_if_not_granted(self) -> None:
        granted = self.client._connection.granted_ms
        if granted is not None and granted != round(self.requested_timeout_s * 1000):
            log.warning("ZooKeeper granted a session timeout of %d ms, not the %d ms of zk_session_timeout_ms "
                        "(the server keeps sessions within its minSessionTimeout..maxSessionTimeout); the broker "
                        "counts on %.0f ms: set zk_session_timeout_ms within the server's range",
                        granted, round(self.requested_timeout_s * 1000), self.session_timeout_s * 1000)

    @property
    def connected(self) -> bool:
        return self.client.state == KazooState.CONNECTED

    def session_alive_until(self, fraction: float) -> float:
        """Before this moment (``lease_clock.now()``) ZooKeeper cannot have expired this broker's
        session, counting only ``fraction`` of the session timeout: it expires a session a session
        timeout after it last heard from it, and it heard from it after ``heard_at``, when a
        request it answered was sent. 0 once the session was lost, until ``renew_if_lost``."""
        if self._session_lost.is_set():
            return 0.0
        return self.heard_at + fraction * self.session_timeout_s

    def heartbeat(self) -> None:
        """Ask ZooKeeper something small (answered asynchronously) to renew ``heard_at``; at most
        one question out at a time, one an eighth of a session after the last."""
        now = lease_clock.now()
        sent = self._heartbeat_sent
        if not self.connected or (sent is not None and now - sent < self.session_timeout_s) or (
                now - self.heard_at < self.session_timeout_s / 8):
            return
        self._heartbeat_sent = now

        def answered(result) -> None:
            if self._heartbeat_sent == now:
                self._heartbeat_sent = None
            if result.successful():
                self._heard(now)

        self.client.exists_async(self.root).rawlink(answered)

    def _heard(self, sent: float) -> None:
        self.heard_at = max(self.heard_at, sent)

    def _on_session(self, state: str) -> None:
        if state == KazooState.LOST:
            self._session_lost.set()  # our ephemeral nodes are gone: register again once connected
        log.info("ZooKeeper session %s", state)
        self.on_change()

    @property
    def session_lost(self) -> bool:
        """Whether ZooKeeper expired this broker's session and it did not register again since."""
        return self._session_lost.is_set()

    def renew_if_lost(self) -> None:
        """Register again after a lost session, once connected with a new one. From then on the
        new session's heartbeats count for ``session_alive_until``: a master steps down first."""
        if not self._session_lost.is_set() or not self.connected:
            return
        self.register()
        self._session_lost.clear()  # only once registered: a failed registration is tried again

    def register(self) -> None:
        path = f"{self.root}/members/{self.broker_id}"
        data = json.dumps({"address": self.address}).encode()
        try:
            self.client.create(path, data, ephemeral=True)
        except NodeExistsError:  # left by this broker's previous process, whose session is ending
            self.client.delete(path)
            self.client.create(path, data, ephemeral=True)

    def stop(self) -> None:
        try:
            self.client.stop()
        finally:
            self.client.close()

    # -- reading -------------------------------------------------------------------------------

    def state(self) -> GroupState | None:
        sent = lease_clock.now()
        try:
            raw, stat = self.client.get(f"{self.root}/state")
        except NoNodeError:
            self._heard(sent)
            return None
        self._heard(sent)
        return GroupState.decoded(raw, stat.version)

    def master_holder(self) -> int | None:
        """The broker id whose session holds ``master``, None when no one does."""
        try:
            raw, _ = self.client.get(f"{self.root}/master")
        except NoNodeError:
            return None
        return int(json.loads(raw)["broker_id"])

    def members(self) -> dict[int, str]:
        out = {}
        for child in self.client.get_children(f"{self.root}/members"):
            try:
                raw, _ = self.client.get(f"{self.root}/members/{child}")
            except NoNodeError:
                continue
            out[int(child)] = json.loads(raw)["address"]
        return out

    # -- changing ------------------------------------------------------------------------------

    def campaign(self) -> GroupState | None:
        """Try to become master; the new state (next epoch, a sync-state set of this broker
        alone) on success, None when another broker holds the role or this one is not eligible."""
        state = self.state()
        if state is not None and self.broker_id not in state.sync_set:
            return None  # it may lack acknowledged sends: only the sync-state set may take over
        path = f"{self.root}/master"
        try:
            self.client.create(path, json.dumps({"broker_id": self.broker_id, "address": self.address}).encode(),
                               ephemeral=True)
        except NodeExistsError:
            return None
        new = GroupState((state.epoch if state else 0) + 1, self.broker_id, self.address,
                         frozenset({self.broker_id}), group_id=state.group_id if state and state.group_id
                         else uuid.uuid4().hex)
        try:
            if state is None:
                self.client.create(f"{self.root}/state", new.encoded())
                return self.state()
            stat = self.client.set(f"{self.root}/state", new.encoded(), version=state.version)
        except (BadVersionError, NodeExistsError):
            self.client.delete(path)  # the state moved under us: give the role back and look again
            return None
        return replace(new, version=stat.version)

    def resign_master(self) -> None:
        """Delete ``master`` when it names this broker although it does not act as master: left by
        its previous process (a restart within the session timeout), or a term it stepped down
        from while its session survived. The next election then runs at once."""
        try:
            raw, stat = self.client.get(f"{self.root}/master")
            if int(json.loads(raw)["broker_id"]) == self.broker_id:
                self.client.delete(f"{self.root}/master", version=stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def change_sync_set(self, expected: GroupState, sync_set: frozenset[int]) -> GroupState | None:
        """Write a new sync-state set if ``state`` is still ``expected`` (this broker's term);
        None when it is not any more: this broker must stop acting as master."""
        if expected.master != self.broker_id:
            return None
        new = replace(expected, sync_set=sync_set)
        try:
            stat = self.client.set(f"{self.root}/state", new.encoded(), version=expected.version)
        except (BadVersionError, NoNodeError):
            return None
        return replace(new, version=stat.version)
