"""A call racing a switch of the connection's broker (a route naming another master): the call
must go to a broker, never fail because the channel it picked was closed under it."""

from __future__ import annotations

import threading

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
