"""Scenario 3: a consumer frozen (SIGSTOP) past its lock lease while another instance of its
group takes its queues. When it wakes up, its commit and its next pull carry a stale fencing
epoch and are refused, and it cannot lock the queues back while the new holder lives.

Two histories are checked: every *delivery* (a pulled batch, ordered by when its pull was sent)
and every *committed* batch (ordered by when its commit was sent). Deliveries may repeat what the
frozen consumer had in hand but never committed; the committed history, the effect of the group,
must be exact: nothing lost, nothing twice, every key in order.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from connector.client import Admin
from connector.client.connection import BrokerConnection, pb
from connector.history import Delivery, History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import body
from tests.spark.helpers import committed
from tests.support import send_rows, wait_until

TOPIC, GROUP, QUEUES, KEYS = "payments", "settlement", 2, 6
LEASE_MS = 3000  # seconds of lease: renewals (every third) keep a wide margin on a loaded machine
WORK_MS = 20
SCRIPT = Path(__file__).with_name("locked_consumer.py")


class ConsumerProcess:
    """``locked_consumer.py`` as a child process, and the events it wrote."""

    def __init__(self, tmp: Path, address: str, client_id: str, stop: Path) -> None:
        self.client_id = client_id
        self.events_path = tmp / f"{client_id}.events"
        queues = ",".join(str(q) for q in range(QUEUES))
        self.proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), address, TOPIC, GROUP, client_id, queues, str(self.events_path), str(stop),
             str(WORK_MS)],
            stdout=subprocess.DEVNULL, stderr=open(tmp / f"{client_id}.log", "wb"),
        )

    def events(self, *kinds: str) -> list[dict]:
        if not self.events_path.exists():
            return []
        lines = self.events_path.read_text().splitlines()
        complete = [json.loads(line) for line in lines if line.endswith("}")]
        return [dict(e, client=self.client_id) for e in complete if not kinds or e["event"] in kinds]

    def delivered(self) -> int:
        return sum(len(e["messages"]) for e in self.events("delivered"))

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)


def produce(address: str, history: History) -> None:
    """``fenced_messages`` messages over ``KEYS`` keys, key ``i`` on queue ``i % QUEUES``."""
    with BrokerConnection(address, retry_timeout=5) as conn:
        for i in range(PROFILE.fenced_messages):
            key, seq = f"acct-{i % KEYS}", i // KEYS
            send_rows(conn, TOPIC, (i % KEYS) % QUEUES, [{"key": key, "body": body(key, seq)}])
            history.sent(key, seq, acked=True)


def freeze_while_working(consumer: ConsumerProcess) -> dict[int, int]:
    """SIGSTOP the consumer well inside its work on a pulled batch (not yet committing), so that
    it wakes up holding messages it has not committed; returns its epochs then."""
    while True:
        consumer.signal(signal.SIGSTOP)
        last = consumer.events()[-1:]
        if last and last[0]["event"] == "delivered":
            work_ends = last[0]["t"] + len(last[0]["messages"]) * WORK_MS * 1_000_000
            if time.monotonic_ns() < work_ends - 2 * WORK_MS * 1_000_000:
                return {e["queue"]: e["epoch"] for e in consumer.events("locked")}
        consumer.signal(signal.SIGCONT)
        time.sleep(0.03)


def woke_refused(events: list[dict]) -> bool:
    """The consumer's commit and next pull were fenced, then it tried to lock again."""
    kinds = [e["event"] for e in events]
    return ("commit_fenced" in kinds and "pull_fenced" in kinds
            and any(k in ("lock_refused", "locked") for k in kinds[kinds.index("pull_fenced"):]))


def merged(events: list[dict]) -> list[Delivery]:
    out = []
    for e in sorted(events, key=lambda e: e["t"]):
        out += [Delivery(key, seq, consumer=e["client"], queue_id=e["queue"], offset=offset)
                for key, seq, offset in e["messages"]]
    return out


def test_a_frozen_lock_holder_is_fenced_and_the_group_consumes_exactly_once(broker_proc, fault_report, tmp_path):
    proc = broker_proc(flush="sync", lock_lease_ms=LEASE_MS)
    with Admin(proc.address) as admin:
        admin.create_topic(TOPIC, QUEUES)
    history = History()
    produce(proc.address, history)
    stop = tmp_path / "stop"
    stale = ConsumerProcess(tmp_path, proc.address, "stale", stop)
    successor = None
    try:
        assert wait_until(lambda: stale.delivered() >= PROFILE.fenced_messages // 4, timeout=60), "stale consumes"
        successor = ConsumerProcess(tmp_path, proc.address, "successor", stop)
        assert wait_until(lambda: successor.events("lock_refused"), timeout=60), "refused while the lease lives"
        frozen_epochs = freeze_while_working(stale)
        frozen_at = len(stale.events())
        assert wait_until(lambda: len(successor.events("committed")) >= 2, timeout=60), "successor takes over"
        stale.signal(signal.SIGCONT)
        assert wait_until(lambda: woke_refused(stale.events()[frozen_at:]), timeout=60), "the stale one is refused"
        with BrokerConnection(proc.address, retry_timeout=5) as conn:
            ends = {q: conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=TOPIC, queue_id=q)).max_offset
                    for q in range(QUEUES)}
            assert wait_until(lambda: committed(conn, GROUP, TOPIC) == ends, timeout=120)
            final = committed(conn, GROUP, TOPIC)
    finally:
        stop.touch()
        for consumer in filter(None, (stale, successor)):
            consumer.signal(signal.SIGCONT)
            consumer.proc.wait(timeout=30)
    everything = stale.events() + successor.events()
    deliveries = check(history.sends, merged([e for e in everything if e["event"] == "delivered"]))
    effects = check(history.sends, merged([e for e in everything if e["event"] == "committed"]))
    after_wake = stale.events()[frozen_at:]
    successor_epochs = {e["queue"]: e["epoch"] for e in successor.events("locked")}
    stale_work = [e for e in after_wake if e["event"] in ("delivered", "committed")]
    fault_report("3 stale lock holder (SIGSTOP past the lease)", {"delivered": deliveries, "committed": effects},
                 stale_commits_refused=len(stale.events("commit_fenced")),
                 stale_pulls_refused=len(stale.events("pull_fenced")),
                 stale_locks_refused=sum(e["event"] == "lock_refused" for e in after_wake),
                 stale_deliveries_after_wake=sum(e["event"] == "delivered" for e in after_wake),
                 epochs={"stale when frozen": frozen_epochs, "successor": successor_epochs})
    assert effects.ok, str(effects)
    assert deliveries.lost == deliveries.out_of_order == deliveries.unexpected == 0, str(deliveries)
    assert all(e["epoch"] > frozen_epochs[e["queue"]] for e in stale_work), "nothing consumed with a stale epoch"
    assert all(successor_epochs[q] > frozen_epochs[q] for q in successor_epochs)
    assert final == ends, "the refused commit did not move the group's offsets back"
