"""``Producer.send`` over the broker's send port: per-key order and completeness (judged by
``connector.history`` on what the broker stored) when synchronous sends mix with pipelined ones,
and when the port goes away under them (a broker killed and restarted, a frozen broker)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from broker.launcher import BrokerProcess
from broker.wire.tls import TlsOptions
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.client.send_port import SendPortClient
from connector.errors import SendOutcomeUnknownError
from connector.history import History
from tests.faults.workload import body, stored_deliveries


def _port_sends(broker) -> float:
    return broker.service.metrics.registry.get_sample_value(
        "orderlymq_rpc_duration_seconds_count", {"method": "SendPort"}) or 0


def _freeze(pid: int) -> None:
    """SIGSTOP, and wait until the process is stopped: a send is quick enough to beat the signal."""
    os.kill(pid, signal.SIGSTOP)
    while Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "T":
        time.sleep(0.001)


def _verdict(address: str, topic: str, history: History):
    with BrokerConnection(address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic))
    return history.check()


def test_sync_sends_on_the_port_keep_each_keys_order_beside_pipelined_and_batch_sends(broker, topic_name):
    Admin(broker.address).create_topic(topic_name, 4)
    history = History()
    keys = [f"k{i}" for i in range(8)]

    def work(key: str, producer: Producer) -> None:
        for seq in range(0, 120, 3):  # per key: a synchronous send, an asynchronous one, a batch of one
            producer.send(topic_name, body(key, seq), key=key)
            future = producer.send_async(topic_name, body(key, seq + 1), key=key)
            producer.send_batch(topic_name, [{"key": key, "body": body(key, seq + 2)}])
            future.result()
            for s in range(seq, seq + 3):
                history.sent(key, s, acked=True)

    with Producer(broker.address, linger_ms=1) as producer:
        threads = [threading.Thread(target=work, args=(key, producer)) for key in keys]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert _port_sends(broker) > 0, "synchronous sends to an idle queue take the send port"
    verdict = _verdict(broker.address, topic_name, history)
    assert verdict.ok and verdict.deliveries == 8 * 120, verdict


def test_a_broker_without_the_port_gets_the_sends_over_grpc(broker_factory, topic_name):
    broker = broker_factory(send_port=-1)
    Admin(broker.address).create_topic(topic_name, 1)
    history = History()
    with Producer(broker.address) as producer:
        for seq in range(20):
            assert producer.send(topic_name, body("k", seq), key="k").queue_offset == seq
            history.sent("k", seq, acked=True)
    assert _port_sends(broker) == 0
    verdict = _verdict(broker.address, topic_name, history)
    assert verdict.ok and verdict.deliveries == 20, verdict


def test_a_tls_client_never_uses_the_plaintext_port(broker):
    with BrokerConnection(broker.address, tls=TlsOptions()) as conn:
        assert not SendPortClient(conn).ready()


def test_sync_sends_go_on_over_grpc_and_back_when_the_broker_restarts(tmp_path, topic_name):
    """The restarted broker's send port is a new one: sends cut off are resent on the stream under
    their sequence (stored once), and later ones find the new port."""
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        Admin(proc.address).create_topic(topic_name, 2)
        history = History()
        with Producer(proc.address, retry_timeout=60) as producer:
            for seq in range(300):
                if seq == 100:
                    proc.kill9()
                    proc.start()
                producer.send(topic_name, body(f"k{seq % 3}", seq // 3), key=f"k{seq % 3}")
                history.sent(f"k{seq % 3}", seq // 3, acked=True)
        verdict = _verdict(proc.address, topic_name, history)
        assert verdict.ok and verdict.deliveries == 300, verdict
    finally:
        proc.kill9()


def test_a_sync_send_cut_off_by_a_freeze_is_unknown_then_settled_once(tmp_path, topic_name):
    proc = BrokerProcess(tmp_path / "data").start()
    try:
        Admin(proc.address).create_topic(topic_name, 1)
        history = History()
        with Producer(proc.address, retry_timeout=2.0) as producer:
            producer.send(topic_name, body("k", 0), key="k")
            history.sent("k", 0, acked=True)
            _freeze(proc.pid)
            try:
                with pytest.raises(SendOutcomeUnknownError) as unknown:
                    producer.send(topic_name, body("k", 1), key="k")
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            (settled,) = producer.resolve(unknown.value, timeout=60)
            history.sent("k", 1, acked=True)
            assert settled.queue_offset == 1
            assert producer.send(topic_name, body("k", 2), key="k").queue_offset == 2
            history.sent("k", 2, acked=True)
        verdict = _verdict(proc.address, topic_name, history)
        assert verdict.ok and verdict.deliveries == 3, verdict
    finally:
        proc.kill9()
