"""A broker group of real processes for the cluster scenarios: a ZooKeeper server and brokers
(subprocesses over gRPC on loopback) that elect a master and replicate to each other."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from broker.launcher import BrokerProcess, free_port
from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.wire.credentials import Credentials
from broker.wire.tls import TlsOptions
from connector.client.connection import open_channel
from tests.faults.brokers import broker_process
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import KeyedProducer, first_ack_after
from tests.support import wait_until

__all__ = ["CLUSTER_BROKER", "BrokerGroup", "Failover", "RoleWatch", "kill_masters"]

# Short sessions and lag timeouts so failovers take seconds, and short leases like the client tests'.
CLUSTER_BROKER = dict(zk_session_timeout_ms=2_000, replica_lag_timeout_ms=1_500, lock_lease_ms=5_000,
                      consumer_timeout_ms=3_000, min_sync_replicas=2, replication="sync")


class BrokerGroup:
    """``size`` brokers of group ``name`` under ``root``, started in id order (broker 0 is the
    first master); settings are ``BrokerConfig`` names."""

    def __init__(self, root: Path, zookeeper: str, size: int, name: str = "group-a", *,
                 tls: TlsOptions | None = None, credentials: Credentials | None = None,
                 settings_of: dict[int, dict] | None = None, **settings) -> None:
        """``settings_of``: the settings in which some brokers differ from the rest (by broker id)."""
        self.name = name
        self.tls = tls  # how this harness asks the brokers for their health (secure groups)
        self.metadata = credentials.metadata() if credentials is not None else None
        self.brokers: list[BrokerProcess] = [
            broker_process(root / f"broker-{i}", **(CLUSTER_BROKER | dict(zookeeper=zookeeper, broker_name=name,
                                                                          broker_id=i) | settings
                                                    | (settings_of or {}).get(i, {})))
            for i in range(size)
        ]

    @property
    def addresses(self) -> str:
        """Every broker's address: what clients are given (they find the master themselves)."""
        return ",".join(b.address for b in self.brokers)

    def start(self) -> BrokerGroup:
        for broker in self.brokers:
            broker.start()
            if broker is self.brokers[0]:
                self.wait_for_master()
        return self

    def health(self, broker: BrokerProcess) -> pb.HealthResponse | None:
        """The broker's Health answer, None when it does not answer within a second."""
        if broker.proc is None or broker.proc.poll() is not None:
            return None
        with open_channel(broker.address, self.tls) as channel:
            try:
                return pb_grpc.OrderlyMQStub(channel).Health(pb.HealthRequest(), timeout=1.0, metadata=self.metadata)
            except grpc.RpcError:
                return None

    def master(self, exclude: BrokerProcess | None = None) -> BrokerProcess | None:
        for broker in self.brokers:
            if broker is exclude:
                continue
            health = self.health(broker)
            if health is not None and health.role == "MASTER":
                return broker
        return None

    def wait_for_master(self, exclude: BrokerProcess | None = None, timeout: float = 60.0) -> BrokerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            master = self.master(exclude)
            if master is not None:
                return master
            time.sleep(0.05)
        raise TimeoutError(f"no master elected within {timeout:.0f}s\n{self.log_tails()}")

    def sync_set(self) -> set[int]:
        """The master's sync-state set (broker ids); empty while there is no master."""
        master = self.master()
        health = self.health(master) if master is not None else None
        return set(health.sync_set) if health is not None else set()

    def wait_in_sync_set(self, broker: BrokerProcess, timeout: float = 120.0) -> float:
        """Seconds until ``broker`` is in the master's sync-state set: only then may it be elected."""
        started, broker_id = time.monotonic(), self.brokers.index(broker)
        if not wait_until(lambda: broker_id in self.sync_set(), timeout=timeout):
            raise TimeoutError(f"broker {broker_id} did not join the sync-state set {self.sync_set()} within "
                               f"{timeout:.0f}s\n{self.log_tails()}")
        return time.monotonic() - started

    def log_tails(self, lines: int = 25) -> str:
        """The last lines of every broker's log: what a failure report needs, whose files go with
        the test's temporary directory."""
        return "\n".join(f"--- {broker.log_path} (last {lines} lines)\n"
                         + "\n".join(broker.log_text().splitlines()[-lines:]) for broker in self.brokers)

    def wait_for_role(self, broker: BrokerProcess, role: str, timeout: float = 60.0) -> pb.HealthResponse:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            health = self.health(broker)
            if health is not None and health.role == role:
                return health
            time.sleep(0.05)
        raise TimeoutError(f"broker {broker.address} did not become {role} within {timeout:.0f}s\n{self.log_tails()}")

    def kill_all(self) -> None:
        for broker in self.brokers:
            broker.kill9()


class RoleWatch(threading.Thread):
    """Asks every broker of a group for its role and epoch, one after the other, until stopped:
    ``answers`` holds ``(asked, answered, broker_id, role, epoch)`` (``time.time()`` when the
    question left and when its answer was in hand; unreachable brokers left out). The broker
    decided its answer somewhere between the two, so a master was certainly serving after it was
    asked and certainly had begun by the answer: a busy machine that delays answers widens the
    window instead of faking an overlap. What split brain would look like: one epoch whose master
    was seen on two brokers, or a master of an earlier epoch asked and serving after the master of
    a later epoch had answered as master."""

    def __init__(self, group: BrokerGroup, interval_s: float = 0.03) -> None:
        super().__init__(name="role-watch", daemon=True)
        self.group, self.interval_s = group, interval_s
        self.answers: list[tuple[float, float, int, str, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for broker_id, broker in enumerate(self.group.brokers):
                asked = time.time()
                health = self.group.health(broker)
                if health is not None:
                    self.answers.append((asked, time.time(), broker_id, health.role, health.group_epoch))
                self.stop.wait(self.interval_s)

    def finish(self) -> None:
        self.stop.set()
        self.join()

    def masters_by_epoch(self) -> dict[int, set[int]]:
        """Each epoch and the brokers seen serving as its master."""
        out: dict[int, set[int]] = {}
        for _, _, broker_id, role, epoch in self.answers:
            if role == "MASTER":
                out.setdefault(epoch, set()).add(broker_id)
        return out

    def serving(self, epoch: int) -> tuple[float, float]:
        """By when the master of ``epoch`` had certainly begun serving (its first answer as master
        was in hand) and until when it certainly still served (its last such answer was asked)."""
        spans = [(asked, answered) for asked, answered, _, role, e in self.answers if role == "MASTER" and e == epoch]
        return min(answered for _, answered in spans), max(asked for asked, _ in spans)

    def overlapping_epochs(self) -> list[tuple[int, int]]:
        """Pairs of epochs whose masters certainly served at the same time."""
        spans = sorted((e, *self.serving(e)) for e in self.masters_by_epoch())
        return [(a[0], b[0]) for a, b in zip(spans, spans[1:], strict=False) if a[2] >= b[1]]


@dataclass
class Failover:
    election_s: float  # from the kill -9 until another broker answered as master
    epoch: int  # the new master's group epoch
    first_ack_s: float | None  # from the kill -9 until a send was acknowledged again


def group_behind(link, broker_group, lean_link=None, master_settings: dict | None = None, **settings) -> BrokerGroup:
    """A group of two whose master, broker 0, advertises ``link`` (a ``TcpProxy`` forwarding to
    it): its slave, and clients sent to the master, dial it through the link a test cuts. Its lean
    port, which they would dial beside the link, is served only behind ``lean_link`` (another
    ``TcpProxy``, on the same host), which it advertises. ``master_settings``: broker 0's own."""
    lean = {"send_port": -1}
    if lean_link is not None:
        lean = {"send_port": free_port(), "advertised_send_port": lean_link.port}
        lean_link.forward_to(f"127.0.0.1:{lean['send_port']}")
    group = broker_group(2, settings_of={0: {"advertised_address": link.address, **lean, **(master_settings or {})}},
                         **settings)
    link.forward_to(group.brokers[0].address)
    assert group.wait_for_master() is group.brokers[0]
    return group


def kill_masters(group: BrokerGroup, producers: list[KeyedProducer], kills: int) -> list[Failover]:
    """``kills`` times, a fault cycle apart: kill -9 the master, wait for another, start the killed
    broker again (back as a slave: it cuts what the group never had and catches up) and wait for a
    send acknowledged after the kill."""
    failovers = []
    for _ in range(kills):
        time.sleep(PROFILE.cycle_seconds)
        master = group.wait_for_master()
        master.kill9()
        killed_wall, killed = time.time(), time.monotonic()
        promoted = group.wait_for_master(exclude=master)
        election_s = time.monotonic() - killed
        epoch = group.health(promoted).group_epoch
        master.start()
        first_ack_s = wait_until(lambda at=killed_wall: first_ack_after(producers, at), timeout=60)
        failovers.append(Failover(election_s, epoch, first_ack_s))
    return failovers
