"""Power cuts under load: keyed producers send to a broker whose data dir is on the lazy file system
(``tests/faults/lazyfs.py``); again and again the power is cut (the broker is killed with SIGKILL
while every change not fsynced is dropped), the machine "reboots" and the broker restarts on what
survived. After each restart the whole log is read back and judged with ``connector.history``
against everything sent before the cut.
"""

from __future__ import annotations

import contextlib
import threading
import time
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from broker.launcher import BrokerProcess
from broker.wire.errors import OrderlyMQError
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.history import History, Send, Verdict, check
from tests.faults.brokers import broker_process
from tests.faults.lazymount import LazyMount
from tests.faults.workload import body, stored_deliveries
from tests.support import wait_until

__all__ = ["CutResult", "PowerRun", "Sender", "broker_on", "power_loss_run"]

TOPIC, QUEUES = "payments", 4


class Sender(threading.Thread):
    """Sends ``key:seq`` for its keys in turn, at most ``window`` unacknowledged (1: each send is
    acknowledged before the next), at most ``rate`` a second, until stopped; every outcome goes to
    the history, and the sends not yet settled are known (``unsettled``)."""

    def __init__(self, address: str, keys: list[str], history: History, *, window: int, rate: float) -> None:
        super().__init__(name=f"sender-{keys[0]}", daemon=True)
        self.address, self.keys, self.history = address, keys, history
        self.window, self.rate = window, rate
        self.stop = threading.Event()
        self.mutex = threading.Lock()
        self.acked = 0
        self.ack_times: list[float] = []  # wall clock of each acknowledgement, in order
        self.failures: list[str] = []
        self._unsettled: dict[tuple[str, int], None] = {}

    def run(self) -> None:
        pending: deque[tuple[str, int, Future]] = deque()
        seqs = dict.fromkeys(self.keys, 0)
        started, sent = time.monotonic(), 0
        with Producer(self.address, retry_timeout=60.0) as producer:
            while not self.stop.is_set():
                key = self.keys[sent % len(self.keys)]
                seq, seqs[key] = seqs[key], seqs[key] + 1
                with self.mutex:
                    self._unsettled[(key, seq)] = None
                pending.append((key, seq, producer.send_async(TOPIC, body(key, seq), key=key)))
                sent += 1
                while len(pending) >= self.window:
                    self._settle(*pending.popleft())
                ahead = sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self.stop.wait(ahead)
            while pending:
                self._settle(*pending.popleft())

    def _settle(self, key: str, seq: int, future: Future) -> None:
        try:
            future.result(timeout=180)
            acked = True
        except (OrderlyMQError, TimeoutError) as exc:
            acked = False
            if len(self.failures) < 5:
                self.failures.append(f"{key}:{seq}: {exc}")
        with self.mutex:
            self.history.sent(key, seq, acked=acked)
            del self._unsettled[(key, seq)]
            if acked:
                self.acked += 1
                self.ack_times.append(time.time())

    def unsettled(self) -> list[Send]:
        """Sends issued and not yet settled (call with ``mutex`` held): stored or not, unknown."""
        return [Send(key, seq, False) for key, seq in self._unsettled]


@dataclass
class CutResult:
    """One power cut: the log after it judged against what was sent before it."""

    verdict: Verdict
    new_lost: int  # acknowledged messages first missing after this cut
    acks_in_flush_window: int  # acknowledged within one flush interval before the cut
    dropped: dict  # what the file system forgot (dirty files, pages, directories)
    remount_s: float
    restart_s: float  # broker start until it serves (recovery of its logs and state)

    def figures(self) -> dict:
        return dict(lost=self.verdict.lost, new_lost=self.new_lost, duplicated=self.verdict.duplicated,
                    out_of_order=self.verdict.out_of_order, unexpected=self.verdict.unexpected,
                    acked=self.verdict.acked, window_acks=self.acks_in_flush_window,
                    dirty_pages=self.dropped.get("dirty_pages", 0), dirty_dirs=self.dropped.get("dirty_dirs", 0),
                    remount_s=round(self.remount_s, 3), restart_s=round(self.restart_s, 3))


@dataclass
class PowerRun:
    cuts: list[CutResult] = field(default_factory=list)
    final: Verdict | None = None
    send_failures: list[str] = field(default_factory=list)
    fs_stats: dict = field(default_factory=dict)


def _snapshot(history: History, senders: list[Sender]) -> list[Send]:
    """Every send so far, settled (acknowledged or not) or not yet settled, taken atomically."""
    with contextlib.ExitStack() as stack:
        for s in senders:
            stack.enter_context(s.mutex)
        return history.sends + [u for s in senders for u in s.unsettled()]


def _last_issued(sends: list[Send]) -> dict[str, int]:
    last: dict[str, int] = {}
    for s in sends:
        last[s.key] = max(last.get(s.key, -1), s.seq)
    return last


def _judge(sends: list[Send], address: str, issued: dict[str, int] | None = None) -> Verdict:
    """The stored log against ``sends``. With ``issued`` (a key's last sequence number sent before
    a cut), only what was sent before the cut is judged: a key's sequence numbers grow in send
    order, so later sends are those above it."""
    if issued is not None:
        sends = [s for s in sends if s.seq <= issued.get(s.key, -1)]
    last = _last_issued(sends)
    with BrokerConnection(address, retry_timeout=30) as conn:
        stored = stored_deliveries(conn, TOPIC)
    return check(sends, [d for d in stored if d.seq <= last.get(d.key, -1)])


def _restart(proc: BrokerProcess, attempts: int = 10) -> None:
    """Start the broker again on its port. A client retrying against the closed port on loopback
    can briefly hold that very port (a TCP self-connect), so a refused bind is tried again."""
    for attempt in range(attempts):
        try:
            proc.start()
            return
        except RuntimeError as exc:
            if "in use" not in str(exc) or attempt == attempts - 1:
                raise
            time.sleep(0.5)


def broker_on(fs: LazyMount, root: Path, wrapper: Sequence[str] = (), **settings) -> BrokerProcess:
    """A broker with ``settings`` started on a data dir of the lazy mount ``fs`` (its config and
    log stay outside the mount), under ``wrapper`` (``prlimit``). The data dir is made durable
    first, as a provisioned one is."""
    data = fs.mountpoint / "data"
    data.mkdir()
    fs.fsync_dir(fs.mountpoint)
    config_args = broker_process(root / "config" / "data", **settings).args
    return BrokerProcess(data, *config_args, log_path=root / "broker.log", wrapper=wrapper).start()


def power_loss_run(root: Path, *, cuts: int, acks_per_cut: int, producers: int, keys_per_producer: int,
                   rate: float, **settings) -> PowerRun:
    """Run ``cuts`` power cuts under load against a broker with ``settings``; see the module docstring."""
    fs = LazyMount(root / "lazy").mount()
    history, senders, run = History(), [], PowerRun()
    proc: BrokerProcess | None = None
    interval = settings.get("flush_interval_ms", 0) / 1000 if settings.get("flush") == "async" else 0.0
    try:
        proc = broker_on(fs, root, **settings)
        with Admin(proc.address) as admin:
            admin.create_topic(TOPIC, QUEUES)
        # Half the producers wait for each acknowledgement, half pipeline up to 32 sends.
        senders = [Sender(proc.address, [f"p{p}-k{k}" for k in range(keys_per_producer)], history,
                          window=1 if p % 2 == 0 else 32, rate=rate) for p in range(producers)]
        for s in senders:
            s.start()
        lost: set = set()
        for _ in range(cuts):
            target = sum(s.acked for s in senders) + acks_per_cut
            if not wait_until(lambda t=target: sum(s.acked for s in senders) >= t, timeout=300):
                raise TimeoutError(f"producers did not reach {target} acknowledgements: {senders[0].failures}")
            kill_time = time.time()
            dropped = fs.power_cut(proc.pid)
            proc.kill9()  # reaps it
            issued = _last_issued(_snapshot(history, senders))
            started = time.monotonic()
            fs.mount()
            mounted = time.monotonic()
            _restart(proc)
            restarted = time.monotonic()
            # Outcomes known by now count: an acknowledgement sent just before the cut may reach
            # its producer after it.
            verdict = _judge(_snapshot(history, senders), proc.address, issued)
            acks = sorted(t for s in senders for t in s.ack_times)
            run.cuts.append(CutResult(
                verdict, len(set(verdict.lost_messages) - lost),
                bisect_right(acks, kill_time) - bisect_left(acks, kill_time - interval) if interval else 0,
                dropped, mounted - started, restarted - mounted))
            lost |= set(verdict.lost_messages)
        for s in senders:
            s.stop.set()
        for s in senders:
            s.join(timeout=240)
        run.final = _judge(history.sends, proc.address)
        run.send_failures = [f for s in senders for f in s.failures]
        run.fs_stats = fs.stats()
    finally:
        for s in senders:
            s.stop.set()
        if proc is not None:
            proc.kill9()
        fs.unmount()
    return run
