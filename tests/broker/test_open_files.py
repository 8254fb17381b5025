"""A broker keeps its segment files within a budget of its open-file limit
(``broker.storage.open_files``): at a low limit (macOS's 256, a container's 1,024) it serves more
queues and segments than it may keep open, and still loses nothing a crash or power cut should
not lose."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

import grpc
import pytest

from broker.storage.open_files import budget_for_limit
from broker.storage.segment import SegmentClosedError
from broker.storage.store import Store
from broker.wire.errors import BrokerUnavailableError, to_status
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from connector.history import check_keyed
from tests.faults.brokers import broker_process, open_file_limit
from tests.support import send_keyed_rounds, stored_keyed

LIMIT = 128  # the broker's open-file limit: a budget of 64 segment files
PRLIMIT = open_file_limit(LIMIT)  # the broker runs under it
TOPICS, QUEUES, KEYS = 3, 64, 384  # 192 queues, each of several segments


def _open_fds(pid: int | str = "self") -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_broker_at_its_open_file_limit_serves_more_queues_than_it_may_keep_open(tmp_path):
    """192 queues of several segments each (a one-message record is about 1 KB), under a limit of
    128 open files: every keyed send is stored once and in order, each queue reads back from its
    first segment between rounds of sends, the broker still takes new connections, and it restarts
    after a kill -9 with everything. Without the budget, a send past the limit failed with EMFILE
    ("internal broker error")."""
    broker = broker_process(tmp_path / "data", wrapper=PRLIMIT, segment_bytes=4096, flush_interval_ms=50).start()
    topics = [f"t{i}" for i in range(TOPICS)]
    try:
        with Admin(broker.address) as admin:
            for topic in topics:
                admin.create_topic(topic, QUEUES)
        sent = {topic: {} for topic in topics}
        most_fds = 0
        with Producer(broker.address) as producer, BrokerConnection(broker.address) as conn:
            for rounds in (3, 3):
                for topic in topics:
                    send_keyed_rounds(lambda key, body, t=topic: producer.send(t, body, key=key), sent[topic],
                                      rounds, KEYS)
                    most_fds = max(most_fds, _open_fds(broker.pid))
                stored = {topic: stored_keyed(conn, topic, QUEUES) for topic in topics}  # from offset 0
        for topic in topics:
            verdict = check_keyed(sent[topic], stored[topic])
            assert verdict.ok and verdict.duplicated == 0, f"{topic}: {verdict}"
        assert most_fds < LIMIT
        with Admin(broker.address) as admin:  # a new connection
            assert sorted(t.name for t in admin.list_topics()) == topics
        broker.kill9()
        broker.start()  # its recovery opens every segment, within the budget too
        with BrokerConnection(broker.address) as conn:
            assert {topic: stored_keyed(conn, topic, QUEUES) for topic in topics} == stored
        assert "Too many open files" not in broker.log_text()
    finally:
        assert broker.stop() == 0


@pytest.mark.slow
def test_more_clients_than_the_broker_may_open_files_for(tmp_path):
    """160 producers connected at once to a broker that may open 128 files: the lean send port
    cannot take the connections past the limit, each such producer sends over gRPC instead, and
    every send is stored once and in order. Once they leave, the broker takes new clients."""
    broker = broker_process(tmp_path / "data", wrapper=PRLIMIT).start()
    clients: list[Producer] = []
    sent: dict[str, int] = {}
    try:
        with Admin(broker.address) as admin:
            admin.create_topic("t", 4)
        clients += [Producer(broker.address, retry_timeout=30) for _ in range(160)]
        for seq in range(2):
            for i, producer in enumerate(clients):
                producer.send("t", f"c{i}:{seq}", key=f"c{i}")
                sent[f"c{i}"] = seq + 1
        fds_at_most = _open_fds(broker.pid)
        for producer in clients:
            producer.close()
        with Producer(broker.address, retry_timeout=30) as producer:
            producer.send("t", "c0:2", key="c0")
            sent["c0"] = 3
        with BrokerConnection(broker.address) as conn:
            verdict = check_keyed(sent, stored_keyed(conn, "t", 4))
    finally:
        for producer in clients:
            producer.close()
        assert broker.stop() == 0
    assert fds_at_most >= LIMIT - 4  # the port's connections took (nearly) every file left
    assert verdict.ok and verdict.duplicated == 0, str(verdict)


def _open_queues(store: Store) -> set[int]:
    """The queues of topic ``t`` whose segment files this process has open."""
    links = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed since
            links.add(os.readlink(f"/proc/self/fd/{fd}"))
    return {int(Path(link).parent.name) for link in links if link.startswith(str(store.data_dir / "topics" / "t"))}


def test_room_is_made_from_fsynced_then_unused_files_and_others_are_fsynced_to_close(tmp_path):
    """Past the budget (4 here), files close down to nine tenths of it: fsynced ones first, then
    ones not used since room was last made, after an fsync. A closed file reopens at its next use."""
    store = Store(tmp_path, sync=False, open_files_budget=4)
    store.create_topic("t", 5, False)
    queues = [store.queue("t", q) for q in range(5)]
    sent = {q: 0 for q in range(5)}

    def append(*ids: int) -> None:
        for q in ids:
            queues[q].append(f"{q}:{sent[q]}".encode(), 1)
            sent[q] += 1

    append(0, 1, 2, 3)
    store.flush()
    append(1, 4)  # room for 3: the fsynced 0 and 2 close, the unfsynced 1 stays
    assert _open_queues(store) == {1, 3, 4}
    append(3, 0, 2)  # all unfsynced: 1 and 4, unused since, are fsynced and closed
    assert _open_queues(store) == {0, 2, 3}
    assert all(queues[q].segments[-1].synced_size == queues[q].segments[-1].size for q in (1, 4))
    assert store.open_files.closed_for_room == 4
    stored = {q: [body.decode() for _, body in queues[q].segments[-1].records_from(0)] for q in range(5)}
    assert stored == {q: [f"{q}:{i}" for i in range(n)] for q, n in sent.items()}
    store.close()


def test_a_closed_segment_keeps_its_file_for_the_reads_already_on_it(tmp_path):
    """Retention deletes a segment while a read is on it: that read goes on in the file it began
    on, which is closed when it ends; a read that begins after the delete is refused (the queue
    then reads its segments as they are now)."""
    store = Store(tmp_path, sync=False, open_files_budget=1, segment_bytes=300)
    store.create_topic("t", 1, False)
    queue = store.queue("t", 0)
    for _ in range(4):
        queue.append(b"m" * 100, 1)  # two a segment
    store.flush()
    old = queue.segments[0]
    reader = old.records_from(0)
    assert next(reader)[0].base_offset == 0
    fds = _open_fds()
    old.delete()
    assert [header.base_offset for header, _ in reader] == [1]
    assert _open_fds() == fds - 1
    with pytest.raises(SegmentClosedError):
        next(old.records_from(0))
    store.close()


def test_the_budget_leaves_half_the_limit_to_connections():
    assert budget_for_limit(256) == 128
    assert budget_for_limit(20) == 16


def test_out_of_files_is_an_unavailable_broker_that_says_what_to_raise():
    code, message, kind = to_status(OSError(errno.EMFILE, "Too many open files"))
    assert code == grpc.StatusCode.UNAVAILABLE and kind == BrokerUnavailableError.__name__
    assert re.search(r"all \d+ files it may open in use \(RLIMIT_NOFILE\): raise its limit \(ulimit -n", message)
