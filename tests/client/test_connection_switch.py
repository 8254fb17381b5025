"""A call racing a switch of the connection's broker (a route naming another master): the call
must go to a broker, never fail because the channel it picked was closed under it."""

from __future__ import annotations

import threading

from connector.client import Admin, Producer
from connector.client.arrivals import ArrivalWait
from connector.client.connection import BrokerConnection, pb


def test_calls_survive_the_channel_switching_under_them(broker_factory):
    first, second = broker_factory(), broker_factory()
    failures: list[BaseException] = []
    stop = threading.Event()
    with BrokerConnection(f"{first.address},{second.address}", timeout=10, retry_timeout=10) as conn:

        def call_all_along() -> None:
            while not stop.is_set():
                try:
                    conn.call("Health", pb.HealthRequest())
                except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                    failures.append(exc)
                    return

        callers = [threading.Thread(target=call_all_along) for _ in range(4)]
        for caller in callers:
            caller.start()
        for i in range(400):
            conn.follow((first, second)[i % 2].address)
        stop.set()
        for caller in callers:
            caller.join()
    assert failures == []


def test_waits_for_messages_survive_the_channel_switching_under_them(broker_factory):
    """A wait whose channel a route closed may end early (None: the consumer pauses and pulls),
    never raise: a consumer's pull thread died of gRPC's "Channel closed" that way."""
    first, second = broker_factory(), broker_factory()
    for broker in (first, second):
        with Admin(broker.address) as admin:
            admin.create_topic("orders", 1)
        with Producer(broker.address) as producer:
            producer.send("orders", b"there already", key="k")
    failures: list[BaseException] = []
    ready_seen = []
    stop = threading.Event()
    with BrokerConnection(f"{first.address},{second.address}", timeout=10, retry_timeout=10) as conn:

        def wait_all_along() -> None:
            arrivals = ArrivalWait()
            while not stop.is_set():
                try:
                    ready = arrivals.wait([(conn, 0, [("orders", 0, 0)])], 5.0)
                except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
                    failures.append(exc)
                    return
                ready_seen.append(ready)

        waiters = [threading.Thread(target=wait_all_along) for _ in range(4)]
        for waiter in waiters:
            waiter.start()
        for i in range(400):
            conn.follow((first, second)[i % 2].address)
        stop.set()
        for waiter in waiters:
            waiter.join()
    assert failures == []
    assert True in ready_seen and set(ready_seen) <= {True, None}
