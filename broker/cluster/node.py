"""A broker's role in its group: master, slave or electing, and every change between them.

One thread (``orderlymq-cluster``) makes every decision, woken by any change ZooKeeper reports
(and reading it every ``_REREAD_S`` anyway), so roles never change concurrently:

- a master checks that ZooKeeper still names it master of its epoch, else it steps down at once
  (its waiting sends fail as not-master, none is acknowledged), and keeps the sync-state set right;
  it does not step down when it merely lost its ZooKeeper connection (see "leases" below);
- a slave follows the master ZooKeeper names, at its epoch;
- with no master, a member of the sync-state set campaigns; the winner records where its epoch
  starts, raises the lock epoch floor to ``epoch << 32`` (every queue lock it grants fences
  every holder of an earlier master) and only then serves;
- a broker that served in a group takes no role from a ZooKeeper that holds no state of it, or the
  state of another group of the same name (``_holds_our_group``): its data was lost, or it is another
  ensemble.

A broker that is not master refuses every request but ``Health`` and the topic calls with
``NotMasterError`` naming the master (``gate.MasterGate``). Topics are the cluster's, in ZooKeeper
(``topics.TopicRegistry``): any broker creates, describes or deletes them, and a master keeps its
group's part of them locally (``topic_keeper.TopicKeeper``).

Leases: a master that lost its ZooKeeper connection cannot tell "ZooKeeper is down" (nobody can
be elected, it should serve on) from "I am cut off" (another master is elected once its session
expired). It serves while either lease holds, so it never serves beside another master:

- its session lease: ZooKeeper expires a session only a session timeout after it last heard from
  it, and only then may another broker create ``master``; it heard from it after a request it
  answered was sent (``GroupControl.heard_at``, renewed by a heartbeat). Counted for
  ``_LEASE_FRACTION`` of the timeout (clock rates, the time a request takes once admitted).
- its slaves' promises: a slave does not campaign within ``promise`` (half a session) of receiving
  an answer from its master (``follower.CampaignPromise``), and only members of the sync-state
  set may campaign; the set in ZooKeeper is never wider than the master's own (``admit``) and
  cannot change while the master cannot write it. So while every other member of its set
  acknowledged an answer sent less than ``_LEASE_FRACTION`` of a promise ago, no other master can
  exist: during a ZooKeeper outage the slaves go on fetching and the group serves on, however
  long it lasts. A set of the master alone binds no one and needs no promise: no one else may
  campaign. A kill -9 does not delay a failover by the promise, which ends before the session
  does (a session expires at least two thirds of its timeout after the broker's last ping); a
  clean stop releases it (the stopped master refuses the slaves' next fetch).

Past both the master *holds*: its role stays (``HOLDING`` in ``Health``) but it refuses requests,
until ZooKeeper answers again (a standalone ZooKeeper restarted with its data dir keeps the
sessions, so nothing changes) or reports the session lost (it steps down for good).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

from kazoo.exceptions import ConnectionLoss, OperationTimeoutError, SessionExpiredError

from broker.cluster import lease_clock
from broker.cluster.control import GroupControl, GroupState
from broker.cluster.epochs import EpochHistory, keyed
from broker.cluster.follower import CampaignPromise, ReplicaFetcher
from broker.cluster.link import ReplicationLink
from broker.cluster.replication import FetchStream, ReplicaSource
from broker.cluster.topic_keeper import TopicKeeper
from broker.cluster.topics import TopicRegistry
from broker.cluster.zk_security import zookeeper_client_options
from broker.proto import orderlymq_pb2 as pb
from broker.service import BrokerService
from broker.wire.errors import BrokerUnavailableError, NotMasterError

__all__ = ["ClusterNode", "Role"]

log = logging.getLogger(__name__)

_TICK_S = 0.1  # how often a master reviews its sync-state set
_REREAD_S = 1.0  # how often the group's state is read from ZooKeeper without a watch firing
_LEASE_FRACTION = 0.8  # of a session timeout, of a promise: what a master counts on
_ZOOKEEPER_LOST = (ConnectionLoss, OperationTimeoutError, SessionExpiredError)  # a call cut off, not refused


class Role:
    MASTER = "MASTER"
    HOLDING = "HOLDING"  # reported only: a master whose leases ran out (see the module docstring)
    SLAVE = "SLAVE"
    ELECTING = "ELECTING"


class ClusterNode:
    """The cluster side of one broker: ZooKeeper control, replication, role changes."""

    def __init__(self, service: BrokerService, link: ReplicationLink | None = None,
                 zookeeper_options: dict | None = None) -> None:
        config = service.config
        self.link = link or ReplicationLink.from_config(config)  # how this broker dials a master
        self.service = service
        self.config = config
        self.broker_id = config.broker_id
        self.role = Role.ELECTING
        self.epoch = 0
        self.master_address = ""
        self.history = EpochHistory(service.store.data_dir / "cluster-epochs.json")
        self.source = ReplicaSource(service, self.history, self.broker_id, self.not_master)
        self.control = GroupControl(config.zookeeper, config.cluster_name, config.broker_name, self.broker_id,
                                    session_timeout_s=config.zk_session_timeout_ms / 1000, on_change=self._wake_up,
                                    client_options=zookeeper_options if zookeeper_options is not None
                                    else zookeeper_client_options(config))
        self.registry = TopicRegistry(self.control.client, config.cluster_name)
        self.topics = TopicKeeper(service, self.registry, config.broker_name)
        self.promise = CampaignPromise(config.zk_session_timeout_ms / 2000)
        self._topic_reads: dict = {}  # the last answer of each topic read (``_topic_read``)
        self._fetcher: ReplicaFetcher | None = None
        self._state: GroupState | None = None
        self._refusal: str | None = None  # why ZooKeeper's group is not this broker's, as last logged
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orderlymq-cluster", daemon=True)

    # -- what the service asks -----------------------------------------------------------------

    def not_master(self) -> NotMasterError:
        if self.role == Role.MASTER and not self.serving():
            return NotMasterError(
                f"broker {self.broker_id} of group {self.config.broker_name} is master but cannot confirm it: "
                f"ZooKeeper has not answered for a while and its slaves stopped fetching; it serves again once "
                f"either answers (clients retry by themselves)", self.master_address)
        where = f"the master is {self.master_address}" if self.master_address else "no master is elected yet"
        return NotMasterError(
            f"broker {self.broker_id} of group {self.config.broker_name} is {self.role.lower()}, not master: "
            f"{where}; send to the master (clients do so by themselves)", self.master_address)

    def fetch_stream(self) -> FetchStream:
        """A slave's stream of fetches on the lean port (``broker.replica_port``)."""
        return FetchStream(self.source)

    def describe(self, health: pb.HealthResponse) -> None:
        """Fill the group part of a ``Health`` answer (``orderlymq cluster status`` shows it)."""
        health.role = Role.HOLDING if self.role == Role.MASTER and not self.serving() else self.role
        health.master_address, health.group_epoch = self.master_address, self.epoch
        health.broker_id = self.broker_id
        if self.role == Role.MASTER:
            health.sync_set.extend(sorted(self.source.sync_set))
            health.replicas.extend(self.source.replica_status())

    def require_master(self) -> None:
        if self.role != Role.MASTER or not self.serving():
            raise self.not_master()

    def serving(self) -> bool:
        """Whether this master may serve now: one of its leases holds (module docstring)."""
        now = lease_clock.now()
        return now < self.control.session_alive_until(_LEASE_FRACTION) or (
            now < self.source.promised_until(_LEASE_FRACTION * self.promise.length_s))

    def stored(self, topic: str, queue_id: int, end: int) -> None:
        """After an append: let slaves fetch it; with sync replication, return once replicated."""
        self.source.changed()
        if self.config.replication == "sync":
            self.source.wait_replicated(topic, queue_id, end)

    def replicated(self, topic: str, queue_id: int, end: int) -> asyncio.Future | None:
        """``stored`` on the event loop: what to await for the slaves to hold it (None: nothing)."""
        self.source.changed()
        if self.config.replication == "sync":
            return self.source.replicated(topic, queue_id, end)
        return None

    def changed(self, offsets: bool = False) -> None:
        self.source.changed(offsets)

    @contextlib.contextmanager
    def txn_changes(self, wait: bool = True) -> Iterator[Callable[[pb.TxnChange], None]]:
        """Around a change of the transaction table: yields the function that records it; with
        sync replication and ``wait``, returns once the slaves applied it (waiting outside the
        hold, which a table copy for a slave needs)."""
        self.require_master()
        recorded: list[int] = []
        with self.source.txn_log.recording():
            yield lambda change: recorded.append(self.source.txn_log.append(change))
        if recorded:
            self.source.changed()
            if wait and self.config.replication == "sync":
                self.source.wait_txn_replicated(recorded[-1])

    # -- topics: the cluster's, any broker answers -----------------------------------------------

    def create_topic(self, topic: str, count: int, if_not_exists: bool) -> pb.TopicRoute:
        with self._zookeeper(f"create topic {topic}"):
            return self.registry.route(topic, self.registry.create(topic, count, if_not_exists))

    def grow_topic(self, topic: str, count: int) -> pb.TopicRoute:
        with self._zookeeper(f"grow topic {topic}"):
            return self.registry.route(topic, self.registry.grow(topic, count))

    def describe_topic(self, topic: str) -> pb.TopicRoute:
        return self._topic_read(topic, lambda: self.registry.route(topic, self.registry.require(topic)))

    def list_topics(self) -> list[pb.TopicRoute]:
        def read() -> list[pb.TopicRoute]:
            addresses: dict = {}
            return [self.registry.route(t, layout, addresses) for t, layout in sorted(self.registry.current().items())]

        return self._topic_read("", read)

    def delete_topic(self, topic: str) -> None:
        with self._zookeeper(f"delete topic {topic}"):
            self.registry.delete(topic)

    def _topic_read(self, key: str, read: Callable):
        """A topic read from ZooKeeper; while it is unreachable, the last answer of this broker
        (routes cannot change then: no group can elect a master without ZooKeeper), so clients
        refreshing a route do not wait for ZooKeeper (a kazoo call waits for it to come back)."""
        if self.control.connected:
            with contextlib.suppress(*_ZOOKEEPER_LOST):  # lost during the read: as when it is unreachable
                answer = read()
                self._topic_reads[key] = answer
                return answer
        if key in self._topic_reads:
            return self._topic_reads[key]
        raise self._unreachable(f"read topic {key}" if key else "list topics")

    @contextlib.contextmanager
    def _zookeeper(self, what: str) -> Iterator[None]:
        """Around a change or read in ZooKeeper: unreachable, or lost during the call, it is
        ``BrokerUnavailableError``, which clients retry (not an internal error)."""
        if not self.control.connected:
            raise self._unreachable(what)
        try:
            yield
        except _ZOOKEEPER_LOST as exc:
            raise self._unreachable(what) from exc

    def _unreachable(self, what: str) -> BrokerUnavailableError:
        return BrokerUnavailableError(f"cannot {what} now: broker {self.broker_id} of group "
                                      f"{self.config.broker_name} cannot reach ZooKeeper; retry later")

    def describe_cluster(self) -> pb.DescribeClusterResponse:
        answer = pb.DescribeClusterResponse(cluster_name=self.config.cluster_name)
        with self._zookeeper("describe the cluster"):
            for group in self.registry.groups():
                master, addresses = self.registry.group_addresses(group)
                if addresses:
                    answer.groups.add(broker_name=group, master_address=master, addresses=addresses)
        return answer

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self, address: str) -> None:
        self.address = self.config.advertised_address or address
        self.control.start(self.address)
        self.registry.start(self._wake_up)
        self._thread.start()
        log.info("broker %d of group %s joined cluster %s through ZooKeeper %s", self.broker_id,
                 self.config.broker_name, self.config.cluster_name, self.config.zookeeper)

    def stop(self) -> None:
        """Leave the group (a clean shutdown does so first, before it stops serving): a master steps
        down, so its slaves' next fetch is refused and releases their promises, and closing the
        session deletes ``master`` at once: a slave is elected now, not a session timeout later."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.role == Role.MASTER:
            self._step_down("it is shutting down")
        self._stop_following()
        self.source.close()
        self.control.stop()

    def _wake_up(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        last_read = 0.0
        while not self._stopped.is_set():
            woken = self._wake.wait(_TICK_S)
            self._wake.clear()
            try:
                self.control.heartbeat()
                # ZooKeeper is read when it reported a change (its watches), every tick while electing
                # (a promise may run out) and every _REREAD_S anyway; in between a master only checks
                # its sync-state set, which needs no read.
                if woken or self.role == Role.ELECTING or time.monotonic() - last_read >= _REREAD_S:
                    last_read = time.monotonic()
                    self._decide()
                elif self.role == Role.MASTER:
                    self._keep_sync_set(self._state)
            except Exception:  # noqa: BLE001 - a ZooKeeper hiccup must not end the decisions
                log.exception("cluster decision failed; retrying")

    # -- decisions -----------------------------------------------------------------------------

    def _decide(self) -> None:
        if not self.control.connected:
            return  # a master serves on while a lease holds, a slave goes on copying its master
        # Read once: a loss noticed after this read is renewed in the next round, after stepping down.
        lost = self.control.session_lost
        if lost and self.role == Role.MASTER:
            # Before the session is renewed: a heartbeat of the new one would make the session lease
            # hold again, and this broker serve beside the master elected meanwhile.
            self._step_down("its ZooKeeper session expired")
        state = self.control.state()
        if not self._holds_our_group(state):
            if self.role == Role.MASTER:
                self._step_down("ZooKeeper does not hold its group (logged above)")
            return  # a slave goes on copying its master; none campaigns, registers or follows there
        if lost:
            self.control.renew_if_lost()
        holder = self.control.master_holder()
        if self.role == Role.MASTER:
            self._check_term(state, holder)
            if self.role == Role.MASTER:
                self.topics.keep()
            return
        if holder == self.broker_id:  # held by a dead process of this broker, or a term it stepped down from
            self.control.resign_master()
            return
        if holder is None:
            self._stop_following()
            self.role, self.master_address = Role.ELECTING, ""
            won = self.control.campaign() if self._may_campaign(state) else None
            if won is not None:
                self._promote(won)
        elif state is not None and state.master == holder and holder != self.broker_id:
            self._follow(state)
            self.topics.note()

    def _holds_our_group(self, state: GroupState | None) -> bool:
        """Whether ZooKeeper holds the group this broker served in: a broker that served in one
        never founds another (nor follows one of another identity), which would begin again at
        epoch 1 and delete every topic missing from the new registry. No state at all: ZooKeeper
        lost its data, or ``zookeeper`` names another ensemble."""
        known = self.history.group_id
        if state is None:
            ours, found = self.history.epoch == 0, "no state"
        else:  # a state or a history from before group ids: as before (the next election draws one)
            ours, found = not known or not state.group_id or state.group_id == known, f"group id {state.group_id}"
        if not ours and self._refusal != found:
            log.error("ZooKeeper %s holds %s for group %s, which this broker served in up to epoch %d (group id %s): "
                      "ZooKeeper lost its data, or `zookeeper` names another ensemble. This broker takes no role "
                      "from it: restore ZooKeeper's data or name the ensemble that holds the group (docs/cluster.md, "
                      "\"ZooKeeper lost its data\")", self.config.zookeeper, found, self.config.broker_name,
                      self.history.epoch, known or "not recorded")
        self._refusal = None if ours else found
        return ours

    def _may_campaign(self, state: GroupState | None) -> bool:
        """A new group, or: this broker followed (or led) the current epoch, its copy caught up
        since it began to (a wiped data dir has not), and its promise to its master ran out."""
        if state is None:
            return True
        return self.history.epoch == state.epoch and self.history.caught_up and self.promise.kept

    def _check_term(self, state: GroupState | None, holder: int | None) -> None:
        if state is None or holder != self.broker_id or state.master != self.broker_id or state.epoch != self.epoch:
            self._step_down("ZooKeeper names another master" if state else "the group state is gone")
            return
        self._state = state
        if state.sync_set != self.source.sync_set:  # a write whose answer was lost, or not applied
            self.source.set_sync_set(state.sync_set)
        self._keep_sync_set(state)

    def _keep_sync_set(self, state: GroupState) -> None:
        if not self.control.connected:
            return  # the set cannot change without ZooKeeper
        wanted = self.source.sync_set_change()
        if wanted is None:
            return
        wanted = self.source.admit(wanted)  # members join here before they join in ZooKeeper
        if wanted == state.sync_set:
            return
        changed = self.control.change_sync_set(state, wanted)
        if changed is None:
            self._step_down("its term ended (the group state changed under it)")
            return
        self._state = changed
        self.source.set_sync_set(changed.sync_set)

    def _promote(self, state: GroupState) -> None:
        store = self.service.store
        ends = store.ends()
        starts = keyed(ends)
        self.history.join_group(state.group_id)
        self.history.begin_term(state.epoch, starts)
        if self.config.replication == "sync":  # readers see only what the sync-state set holds
            store.hold_back()
            for (topic, queue_id), end in ends.items():
                store.queue(topic, queue_id).make_visible(end)
        self.service.locks.raise_floor(state.epoch << 32)
        self.epoch, self._state = state.epoch, state
        self.master_address = self.address
        self.source.activate(state, starts)
        self.service.offsets_within_logs()  # the group's log now: offsets past its ends move back
        self.topics.keep(force=True)  # before serving: which queues are this group's
        self.role = Role.MASTER
        # Off this thread: with sync replication the commits wait for slaves, whom this thread admits.
        threading.Thread(target=self._finish_commits, name="orderlymq-finish-commits", daemon=True).start()
        log.warning("broker %d is now master of group %s (epoch %d)", self.broker_id, self.config.broker_name,
                    state.epoch)

    def _finish_commits(self) -> None:
        try:
            self.service.finish_interrupted_commits()
        except Exception:  # noqa: BLE001 - retried at the next promotion; the log says why
            log.exception("finishing transactions interrupted during commit failed")

    def _step_down(self, why: str) -> None:
        self.role, self.master_address = Role.ELECTING, ""
        self.source.deactivate()
        log.warning("broker %d stops being master of group %s (epoch %d): %s", self.broker_id,
                    self.config.broker_name, self.epoch, why)

    def _follow(self, state: GroupState) -> None:
        fetcher = self._fetcher
        if fetcher is not None and fetcher.epoch == state.epoch and fetcher.master_address == state.master_address:
            return
        self._stop_following()
        self.history.join_group(state.group_id)
        self.epoch, self.master_address, self.role = state.epoch, state.master_address, Role.SLAVE
        self._fetcher = ReplicaFetcher(self.service, self.history, self.broker_id, state.master_address, state.epoch,
                                       self.promise, self.link)
        self._fetcher.start()
        log.info("broker %d follows master %d at %s (group %s, epoch %d)", self.broker_id, state.master,
                 state.master_address, self.config.broker_name, state.epoch)

    def _stop_following(self) -> None:
        if self._fetcher is not None:
            self._fetcher.stop()
            self._fetcher = None
