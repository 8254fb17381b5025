"""Break 8 in long form: keyed producers and an orderly consumer group on a broker whose data dir
is a small tmpfs, filled by a ballast file and freed again, cycle after cycle, with a ``kill -9``
restart every other cycle.

While the disk is full, sends are refused with ``DiskFullError`` (and nothing else goes wrong:
no internal error, no half-written record); consumers go on or retry. At the end every
acknowledged message was delivered in per-key order, and no refused send was ever stored or
delivered (``connector.history`` judges both the consumers' deliveries and the stored log).
"""

from __future__ import annotations

import time

from broker.launcher import BrokerProcess
from broker.wire.errors import DiskFullError
from connector.client import Admin
from connector.client.connection import BrokerConnection
from connector.history import History, check
from tests.faults.fault_profile import PROFILE
from tests.faults.workload import KeyedProducer, shutdown_all, start_orderly_group, stored_deliveries
from tests.support import wait_until
from tests.tmpfs import Ballast, mounted_tmpfs, open_fds

TOPIC, GROUP = "orders", "disk-full-group"
TMPFS_KIB = 64 * 1024  # room for the long run's traffic; the ballast takes the rest


class RecordingProducer(KeyedProducer):
    """A ``KeyedProducer`` that also remembers which sends the broker refused for a full disk."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.refused: set[tuple[str, int]] = set()
        self.other_errors: list[str] = []
        self.acked = 0

    def _settle(self, key, seq, future) -> None:
        try:
            future.result(timeout=self.retry_timeout * 3)
        except DiskFullError:
            self.refused.add((key, seq))
            self.history.sent(key, seq, acked=False)
            return
        except Exception as exc:  # noqa: BLE001 - recorded, judged below
            self.other_errors.append(f"{key}:{seq}: {type(exc).__name__}: {exc}")
            self.history.sent(key, seq, acked=False)
            return
        self.acked += 1
        self.history.sent(key, seq, acked=True)


def sync_broker(data_dir, tmp_path) -> BrokerProcess:
    """A sync-flush broker on ``data_dir`` whose config and log live outside the filled disk."""
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\nflush = "sync"\nsegment_bytes = 262144\n')
    return BrokerProcess(data_dir, "--config", str(config), log_path=tmp_path / "broker.log")


def test_producers_and_consumers_ride_out_a_disk_filled_and_freed_again(tmp_path, fault_report):
    with mounted_tmpfs(tmp_path / "disk", TMPFS_KIB) as disk:
        proc = sync_broker(disk / "data", tmp_path).start()
        try:
            run_cycles(proc, disk, tmp_path, fault_report)
        finally:
            proc.kill9()


def run_cycles(proc: BrokerProcess, disk, tmp_path, fault_report) -> None:
    with Admin(proc.address) as admin:
        admin.create_topic(TOPIC, 4)
    history = History()
    consumers = start_orderly_group(proc.address, TOPIC, GROUP, PROFILE.consumers, history)
    producers = [RecordingProducer(proc.address, TOPIC, [f"p{p}-k{k}" for k in range(PROFILE.keys_per_producer)],
                                   history, rate=PROFILE.send_rate, window=8, retry_timeout=30.0)
                 for p in range(PROFILE.producers)]
    ballast = Ballast(disk)
    recoveries, restarts, fds = [], 0, []

    def acked() -> int:
        return sum(p.acked for p in producers)

    def refused() -> int:
        return sum(len(p.refused) for p in producers)

    try:
        for p in producers:
            p.start()
        for cycle in range(PROFILE.disk_full_cycles):
            start = acked()
            assert wait_until(lambda start=start: acked() >= start + 100, timeout=120), "traffic stalled"
            before = refused()
            ballast.fill()
            assert wait_until(lambda before=before: refused() >= before + 10, timeout=120), "no send was refused"
            ballast.free()
            freed_at, start = time.monotonic(), acked()
            if cycle % 2:
                proc.kill9()
                proc.start()
                restarts += 1
            assert wait_until(lambda start=start: acked() > start, timeout=120), "sends did not resume"
            recoveries.append(time.monotonic() - freed_at)
            fds.append(open_fds(proc.pid, disk))
    finally:
        for p in producers:
            p.stop.set()
        for p in producers:
            p.join()
    delivered = wait_until(history.delivered_all_acked, timeout=180)
    shutdown_all(consumers)
    verdict = history.check()
    refused_sends = set().union(*(p.refused for p in producers))
    delivered_refused = refused_sends & {(d.key, d.seq) for d in history.deliveries}
    with BrokerConnection(proc.address, retry_timeout=30) as conn:
        log = stored_deliveries(conn, TOPIC)
    log_verdict = check(history.sends, log)
    stored_refused = refused_sends & {(d.key, d.seq) for d in log}
    other_errors = [e for p in producers for e in p.other_errors]
    segment_files = len(list((disk / "data" / "topics").glob("*/*/*.log")))
    state_files = len([p for p in (disk / "data").glob("*.db*")])
    internal = proc.log_text().count("internal broker error") + proc.log_text().count("Traceback")
    fault_report("8 disk full", {"consumers": verdict, "stored log": log_verdict}, cycles=PROFILE.disk_full_cycles,
                 restarts=restarts, refused_sends=len(refused_sends), refused_but_delivered=len(delivered_refused),
                 refused_but_stored=len(stored_refused), other_send_errors=len(other_errors),
                 broker_internal_errors=internal, recovery_s_max=round(max(recoveries), 2),
                 recovery_s_mean=round(sum(recoveries) / len(recoveries), 2), data_dir_fds=fds,
                 segment_files=segment_files)
    assert delivered, f"not every acknowledged message was delivered: {verdict}"
    assert verdict.lost == 0 and verdict.out_of_order == 0 and verdict.unexpected == 0, str(verdict)
    assert log_verdict.ok, str(log_verdict)
    assert not delivered_refused and not stored_refused, "a send refused for a full disk was stored"
    assert not other_errors, other_errors[:5]
    assert internal == 0, proc.log_text()[-3000:]
    # Open files: segments, the SQLite state files, the transaction journal and the data dir's lock, nothing left over.
    assert fds[-1] <= segment_files + state_files + 2, "the broker holds more files than its data dir has"
