"""The broker as a subprocess, killed with SIGKILL: acknowledged messages survive exactly once
and in order; damaged bytes on disk are cut precisely and the rest is served."""

from __future__ import annotations

import threading
from collections import defaultdict

from broker.wire.errors import OrderlyMQError
from connector.client.connection import BrokerConnection, pb
from tests.support import BrokerProcess, pull_all, send_rows, wait_until


def test_kill9_during_sync_sends_loses_nothing_acknowledged(tmp_path):
    proc = BrokerProcess(tmp_path / "data", "--flush", "sync").start()
    conn = BrokerConnection(proc.address, retry_timeout=1)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic="crash", queue_count=2))
    acked: dict[str, list[int]] = defaultdict(list)
    stop = threading.Event()

    def produce(p: int) -> None:
        key, seq = f"k{p}", 0
        while not stop.is_set():
            try:
                send_rows(conn, "crash", p % 2, [{"key": key, "body": f"{key}:{seq}"}])
            except OrderlyMQError:
                return  # the broker died: this send's fate is unknown, stop here
            acked[key].append(seq)
            seq += 1

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    assert wait_until(lambda: sum(len(seqs) for seqs in acked.values()) >= 200, 60)  # traffic flows
    proc.kill9()
    stop.set()
    for t in threads:
        t.join()
    conn.close()

    proc.start()
    conn = BrokerConnection(proc.address, retry_timeout=5)
    stored: dict[str, list[int]] = defaultdict(list)
    for q in range(2):
        table = pull_all(conn, "crash", q)
        assert table.column("queue_offset").to_pylist() == list(range(table.num_rows))
        for body in table.column("body").to_pylist():
            key, seq = body.decode().split(":")
            stored[key].append(int(seq))
    assert sum(map(len, acked.values())) > 0
    for key, seqs in acked.items():
        # Everything acknowledged is there, once, in order; at most the one unacknowledged
        # in-flight send of each producer may also have made it.
        assert stored[key][: len(seqs)] == seqs
        assert stored[key] == list(range(len(stored[key]))) and len(stored[key]) <= len(seqs) + 1
    conn.close()
    proc.stop()


def test_damaged_tail_is_cut_and_reported_and_the_rest_served(tmp_path):
    data = tmp_path / "data"
    proc = BrokerProcess(data).start()
    conn = BrokerConnection(proc.address, retry_timeout=1)
    conn.call("CreateTopic", pb.CreateTopicRequest(topic="disk", queue_count=1))
    for i in range(20):
        send_rows(conn, "disk", 0, [{"body": f"m{i}"}])
    conn.close()
    assert proc.stop() == 0, "SIGTERM shuts down cleanly"
    segment = next((data / "topics" / "disk" / "0").glob("*.log"))
    raw = bytearray(segment.read_bytes())
    raw[-5] ^= 0xFF  # bit-flip inside the last record
    segment.write_bytes(bytes(raw))

    proc.start()
    conn = BrokerConnection(proc.address, retry_timeout=5)
    table = pull_all(conn, "disk", 0)
    assert table.column("body").to_pylist() == [f"m{i}".encode() for i in range(19)]
    assert "checksum mismatch" in proc.log_text()
    assert send_rows(conn, "disk", 0, [{"body": b"after"}]).base_offset == 19
    conn.close()
    proc.stop()
