"""Clients whose connections to the broker go silent carry on over new ones, before their sends
time out.

A connection goes silent when the broker's host vanishes or a firewall starts dropping it: no
close, no reset, what is sent is lost. The broker listens on 127.0.0.2; the clients reach it
through proxies on 127.0.0.1 at the same ports, its gRPC port and its send port alike (a client
finds the send port at its broker's host). Once traffic flows, the proxies make every open
connection silent; new connections go through.

The clients: a pipelining producer (its stream over the send port), one that sends one message at
a time (over the send port, handed to gRPC when unanswered), and a pull consumer (gRPC). Each must
carry on within its 30 s retry timeout, and the strict checker must find every acknowledged
message stored once and in order.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from connector.client import Admin, Producer, PullConsumer
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import KeyedProducer, ack_stall, body, stored_deliveries
from tests.support import wait_until

TOPIC, QUEUES = "silent", 4
RETRY_TIMEOUT_S = 30.0


def _timed(call):
    started = time.monotonic()
    return call(), round(time.monotonic() - started, 1)


def test_clients_whose_connections_go_silent_carry_on_over_new_ones(broker_factory, tcp_proxy, fault_report):
    broker = broker_factory(host="127.0.0.2")
    links = [tcp_proxy(f"127.0.0.2:{port}", port=port) for port in (broker.port, broker.send_port.port)]
    address = f"127.0.0.1:{broker.port}"
    with Admin(address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    pipelining = KeyedProducer(address, TOPIC, [f"k{i}" for i in range(8)], history, rate=10 * PROFILE.send_rate,
                               retry_timeout=RETRY_TIMEOUT_S)
    with Producer(address, retry_timeout=RETRY_TIMEOUT_S) as one_by_one, \
            PullConsumer(address, retry_timeout=RETRY_TIMEOUT_S) as consumer:
        one_by_one.send(TOPIC, body("single", 0), key="single")
        history.sent("single", 0, acked=True)
        consumer.pull(TOPIC, 0, 0)
        pipelining.start()
        assert wait_until(lambda: len(pipelining.ack_times) >= 50), pipelining.failures

        for link in links:
            link.silence()
        silenced = time.time()
        with ThreadPoolExecutor(2) as pool:  # the three clients at once, each on its silent connection
            single = pool.submit(_timed, lambda: one_by_one.send(TOPIC, body("single", 1), key="single"))
            pull = pool.submit(_timed, lambda: consumer.pull(TOPIC, 0, 0, max_messages=1000))
            (_, single_s), (pulled, pull_s) = single.result(), pull.result()
        history.sent("single", 1, acked=True)
        assert wait_until(lambda: sum(t > silenced for t in list(pipelining.ack_times)) >= 50,
                          timeout=2 * RETRY_TIMEOUT_S), pipelining.failures
        pipelining.stop.set()
        pipelining.join()
        pipelining_stall_s = round(ack_stall([pipelining], silenced, time.time()), 1)

    with BrokerConnection(address) as conn:
        log = check(history.sends, stored_deliveries(conn, TOPIC))
    fault_report("client connections gone silent", {"log": log}, sent=len(history.sends),
                 pipelining_stalled_s=pipelining_stall_s, single_send_took_s=single_s, pull_took_s=pull_s)
    assert not pipelining.failures, pipelining.failures
    assert pulled.messages, "the pull after the silence found nothing"
    assert log.ok and log.lost == 0, str(log)
