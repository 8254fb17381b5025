"""Cluster scenario (c): a master paused (SIGSTOP) past its ZooKeeper session, then resumed.

Broker 0 is master, broker 1 its slave (sync replication, ``min_sync_replicas = 2``). Broker 0
advertises a TCP proxy's address, so its slave fetches through that proxy. A send reaches broker 0
(straight, not through the proxy) while the proxy is cut: broker 0 stores it but cannot have it
replicated. Broker 0 is then paused past its session; broker 1 is elected with a new group epoch
and takes the traffic. When broker 0 resumes it is fenced: the send it held is never acknowledged
(nor ever visible to readers, even before the pause: a master serves only what its sync-state set
holds), it refuses requests naming the new master, rejoins as a slave and cuts the tail its group
never had. Finally broker 1 is killed and broker 0 promoted again: its store, read back, holds
every acknowledged send once and in order, and not the cut tail.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pyarrow as pa

from broker.proto import orderlymq_pb2 as pb
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.wire import codec
from broker.wire.errors import NotMasterError, from_rpc_error
from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.cluster_group import CLUSTER_BROKER, group_behind
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import body, send_all, stored_deliveries
from tests.support import wait_until

TOPIC, QUEUES = "orders", 2


def _send_tail(address: str, outcome: dict) -> None:
    """One send straight to ``address`` (no redirection): its answer, or the error it got."""
    request = pb.SendRequest(topic=TOPIC, queue_id=0, batch=codec.encode(pa.table({"key": ["tail"],
                                                                                  "body": [body("tail", 0)]})),
                             producer_id="tail-producer", sequence=0)
    with grpc.insecure_channel(address) as channel:
        try:
            outcome["answer"] = pb_grpc.OrderlyMQStub(channel).Send(request, timeout=60)
        except grpc.RpcError as err:
            outcome["error"] = from_rpc_error(err)


def _log_bytes(broker) -> int:
    """Bytes of queue 0's log files in the broker's data dir: grows when a record is stored."""
    return sum(p.stat().st_size for p in (broker.data_dir / "topics" / TOPIC / "0").glob("*.log"))


def _max_offset(address: str, queue_id: int) -> int:
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.OrderlyMQStub(channel).QueryOffsets(pb.QueryOffsetsRequest(topic=TOPIC, queue_id=queue_id),
                                                             timeout=5)
    return answer.max_offset


def test_paused_master_is_fenced_and_its_unreplicated_tail_cut(broker_group, tcp_proxy, fault_report):
    link = tcp_proxy()  # the slave's way to broker 0: broker 0 advertises it, clients and slaves dial it
    # A long lag timeout: the slave, cut off while the tail is stored, must stay in the sync-state set.
    group = group_behind(link, broker_group, replica_lag_timeout_ms=600_000)
    old, new = group.brokers
    with Admin(group.addresses) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    failures = send_all(group.addresses, TOPIC, ["a", "b", "c"], history, 20 * PROFILE.producers)
    wait_until(lambda: group.health(new).role == "SLAVE")

    link.cut()  # nothing more reaches the slave: the tail cannot replicate
    before, stored_bytes = _max_offset(old.address, 0), _log_bytes(old)
    outcome: dict = {}
    tail = threading.Thread(target=_send_tail, args=(old.address, outcome))
    tail.start()
    assert wait_until(lambda: _log_bytes(old) > stored_bytes, timeout=10), "the tail was not stored"
    visible_before_fencing = _max_offset(old.address, 0) - before  # readers see only what the slaves have
    os.kill(old.pid, signal.SIGSTOP)
    paused = time.monotonic()
    group.wait_for_master(exclude=old)
    election_s = time.monotonic() - paused
    new_epoch = group.health(new).group_epoch
    time.sleep(CLUSTER_BROKER["zk_session_timeout_ms"] / 1000)  # the old master stays paused past it

    os.kill(old.pid, signal.SIGCONT)
    fenced = group.wait_for_role(old, "SLAVE")
    tail.join(timeout=60)
    history.sent("tail", 0, acked="answer" in outcome)
    refused: dict = {}
    _send_tail(old.address, refused)  # straight to the old master again
    refusal = refused.get("error")
    # min_sync_replicas = 2: these are acknowledged only once the old master is back in the sync-state set
    failures += send_all(group.addresses, TOPIC, ["f", "g"], history, 20)

    link.heal()
    new.kill9()
    assert group.wait_for_master() is old
    with BrokerConnection(old.address) as conn:
        stored = stored_deliveries(conn, TOPIC)
    log = check(history.sends, stored)
    fault_report("cluster: paused master fenced, tail cut", {"log": log}, election_s=round(election_s, 2),
                 tail_visible_before_fencing=visible_before_fencing,
                 tail_error=type(outcome.get("error")).__name__, old_master_epoch_after=fenced.group_epoch)
    assert "answer" not in outcome, f"the fenced master acknowledged its tail: {outcome}"
    assert visible_before_fencing == 0, "readers of the master saw a send its slave did not have"
    assert fenced.group_epoch == new_epoch and fenced.master_address == new.address
    assert isinstance(refusal, NotMasterError) and refusal.master == new.address, refusal
    assert ("tail", 0) not in {(d.key, d.seq) for d in stored}, "the unreplicated tail was not cut"
    assert not failures, failures
    assert log.ok, str(log)


def test_leases_count_on_the_session_timeout_zookeeper_granted(tmp_path, caplog):
    """A server grants at most its maxSessionTimeout: a master counting on the longer timeout it
    asked for would serve on after ZooKeeper expired its session and another was elected."""
    from broker.cluster import lease_clock
    from broker.cluster.control import GroupControl
    from broker.cluster.zookeeper import ZooKeeperServer

    server = ZooKeeperServer(tmp_path / "zookeeper", max_session_timeout_ms=2_000).start()
    control = GroupControl(server.connect_string, "leases", "g0", 0, session_timeout_s=6.0, on_change=lambda: None)
    try:
        control.start("127.0.0.1:1")
        assert control.session_timeout_s == 2.0
        asked = lease_clock.now()
        control.state()  # a request answered: the lease runs from its sending
        assert asked <= control.session_alive_until(0.8) - 1.6 <= lease_clock.now()
        assert "granted a session timeout of 2000 ms, not the 6000 ms" in caplog.text
    finally:
        control.stop()
        server.stop()
