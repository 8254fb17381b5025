"""A real broker (subprocess, gRPC) whose data dir is a small tmpfs filled by a ballast file.

On a full disk every change fails with RESOURCE_EXHAUSTED ``DiskFullError`` naming the data dir,
and changes nothing: a refused send is never served, a refused topic create leaves no topic and no
open file, a refused delete leaves the topic whole. Once space is back everything works again,
and after a restart every acknowledged message is still there, in order.
"""

from __future__ import annotations

import grpc
import pytest

from broker.launcher import BrokerProcess
from broker.wire.errors import DiskFullError, TopicNotFoundError
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection, pb
from connector.history import Delivery, History, check
from tests.faults.workload import body, parse_body
from tests.support import pull_all, send_rows
from tests.tmpfs import Ballast, mounted_tmpfs, open_fds

TOPIC = "orders"


@pytest.fixture
def disk(tmp_path):
    """A 2 MiB tmpfs, unmounted at the end."""
    with mounted_tmpfs(tmp_path / "disk", 2048) as path:
        yield path


@pytest.fixture
def broker_on(disk, tmp_path):
    """A sync-flush broker subprocess on the tmpfs (its log lives outside it); killed at the end."""
    proc = BrokerProcess(disk / "data", "--flush", "sync", log_path=tmp_path / "broker.log").start()
    yield proc
    proc.kill9()


def raw_send(conn: BrokerConnection, key: str, seq: int, queue_id: int = 0) -> grpc.StatusCode:
    """Send one message; its status code (the error is kept for the caller to inspect)."""
    try:
        send_rows(conn, TOPIC, queue_id, [{"key": key, "body": body(key, seq)}])
        return grpc.StatusCode.OK
    except DiskFullError:
        return grpc.StatusCode.RESOURCE_EXHAUSTED


def stored(conn: BrokerConnection, queue_id: int = 0) -> list[Delivery]:
    table = pull_all(conn, TOPIC, queue_id)
    return [Delivery(*parse_body(raw), consumer="log", queue_id=queue_id, offset=offset)
            for raw, offset in zip(table.column("body").to_pylist(), table.column("queue_offset").to_pylist(),
                                   strict=True)]


def test_sends_on_a_full_disk_fail_clearly_store_nothing_and_resume(broker_on, disk):
    history, refused = History(), set()
    with Admin(broker_on.address) as admin:
        admin.create_topic(TOPIC, 2)
    conn = BrokerConnection(broker_on.address, retry_timeout=10)
    seq = 0
    for seq in range(20):
        history.sent("k", seq, acked=raw_send(conn, "k", seq) == grpc.StatusCode.OK)
    lock = pb.LockBatchRequest(group="g", client_id="c", topic=TOPIC, queue_ids=[0])
    epoch = conn.call("LockBatch", lock).locked[0].epoch
    ballast = Ballast(disk)
    ballast.fill()
    while len(refused) < 5:  # what fits in the last partly used page is stored, then every send fails
        seq += 1
        ok = raw_send(conn, "k", seq) == grpc.StatusCode.OK
        history.sent("k", seq, acked=ok)
        if not ok:
            refused.add(("k", seq))
    with pytest.raises(DiskFullError) as info, Producer(broker_on.address, retry_timeout=10) as producer:
        producer.send(TOPIC, b"x", key="k", queue_id=1)
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"disk full: could not store 1 message(s) in queue {TOPIC}/1" in str(info.value)
    assert str(disk / "data") in str(info.value) and "Free space" in str(info.value)

    # Reads and lock renewals go on, commits go on or fail clearly; nothing refused is served.
    while_full = stored(conn)
    assert check(history.sends, while_full).ok and not refused & {(d.key, d.seq) for d in while_full}
    committed = conn.call("GetOffset", pb.GetOffsetRequest(group="g", topic=TOPIC, queue_id=0)).offset
    try:
        conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=TOPIC, queue_id=0, offset=5,
                                                         client_id="c", epoch=epoch))
        committed = 5
    except DiskFullError:
        pass
    assert conn.call("LockBatch", lock).locked[0].epoch == epoch

    ballast.free()
    seq += 1
    assert raw_send(conn, "k", seq) == grpc.StatusCode.OK
    history.sent("k", seq, acked=True)
    broker_on.kill9()
    broker_on.start()
    conn.close()
    with BrokerConnection(broker_on.address, retry_timeout=10) as conn:
        deliveries = stored(conn)
        assert conn.call("GetOffset", pb.GetOffsetRequest(group="g", topic=TOPIC, queue_id=0)).offset == committed
    for d in deliveries:
        history.delivered(d.key, d.seq, d.consumer, d.queue_id, d.offset)
    verdict = history.check()
    assert verdict.ok and verdict.lost == 0, str(verdict)
    assert [d.offset for d in deliveries] == list(range(len(deliveries)))
    assert not refused & {(d.key, d.seq) for d in deliveries}, "a refused send was stored"


def test_a_topic_created_on_a_full_disk_leaves_nothing_behind(broker_on, disk):
    with Admin(broker_on.address) as admin:
        admin.create_topic(TOPIC, 1)
        before = open_fds(broker_on.pid)
        ballast = Ballast(disk)
        ballast.fill()
        for _ in range(3):
            with pytest.raises(DiskFullError, match=f"could not create topic 'big' with 1000 queues.*{disk}"):
                admin.create_topic("big", 1000)
        assert open_fds(broker_on.pid) == before, "a failed create left files open"
        with pytest.raises(TopicNotFoundError):
            admin.describe_topic("big")
        assert [t.name for t in admin.list_topics()] == [TOPIC]
        with BrokerConnection(broker_on.address, retry_timeout=10) as conn, pytest.raises(TopicNotFoundError):
            send_rows(conn, "big", 0, [{"key": "k", "body": b"never stored"}])
        with pytest.raises(DiskFullError, match="could not grow topic 'orders' from 1 to 8 queues"):
            admin.grow_topic(TOPIC, 8)
        assert admin.describe_topic(TOPIC).queue_count == 1
    ballast.free()
    broker_on.kill9()
    broker_on.start()
    with Admin(broker_on.address) as admin:
        assert [(t.name, t.queue_count) for t in admin.list_topics()] == [(TOPIC, 1)]
        assert admin.create_topic("big", 1000).queue_count == 1000  # the name is free and nothing stale is in it
        assert [q.max_offset for q in admin.topic_status("big")] == [0] * 1000


def test_a_delete_on_a_full_disk_leaves_the_topic_whole(broker_on, disk):
    with Admin(broker_on.address) as admin, BrokerConnection(broker_on.address, retry_timeout=10) as conn:
        admin.create_topic(TOPIC, 1)
        for seq in range(10):
            assert raw_send(conn, "k", seq) == grpc.StatusCode.OK
        ballast = Ballast(disk)
        ballast.fill()
        with pytest.raises(DiskFullError, match=f"could not delete topic 'orders'.*{disk}"):
            admin.delete_topic(TOPIC)
        assert admin.describe_topic(TOPIC).queue_count == 1
        assert [d.seq for d in stored(conn)] == list(range(10))
        ballast.free()
    broker_on.kill9()
    broker_on.start()
    with Admin(broker_on.address) as admin, BrokerConnection(broker_on.address, retry_timeout=10) as conn:
        assert [d.seq for d in stored(conn)] == list(range(10))
        admin.delete_topic(TOPIC)
    broker_on.kill9()
    broker_on.start()
    with Admin(broker_on.address) as admin:
        assert admin.list_topics() == []


def test_a_transaction_staged_across_a_full_disk_commits_exactly_what_was_acknowledged(broker_on, disk):
    with Admin(broker_on.address) as admin, BrokerConnection(broker_on.address, retry_timeout=10) as conn:
        admin.create_topic(TOPIC, 1)
        conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="txn-1"))
        history, refused = History(), set()

        def stage(seq: int) -> bool:
            try:
                send_rows(conn, TOPIC, 0, [{"key": "k", "body": body("k", seq)}], txn_id="txn-1")
            except DiskFullError:
                refused.add(("k", seq))
                history.sent("k", seq, acked=False)
                return False
            history.sent("k", seq, acked=True)
            return True

        assert stage(0)
        ballast = Ballast(disk)
        ballast.fill()
        seq = 0
        while len(refused) < 3:
            seq += 1
            stage(seq)
        ballast.free()
        for after in range(seq + 1, seq + 4):
            assert stage(after)
        conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="txn-1"))
        deliveries = stored(conn)
    verdict = check(history.sends, deliveries)
    assert verdict.ok and verdict.lost == 0 and verdict.duplicated == 0, str(verdict)
    assert not refused & {(d.key, d.seq) for d in deliveries}


def test_a_big_commit_cut_by_a_full_disk_completes_once_space_is_back(tmp_path):
    """A commit of megabytes over four queues (appended side by side) on a disk without room for
    all of them fails clearly; with space back, committing again appends what was not appended,
    and every queue holds its staged sends once, in order, also after a restart."""
    history, pad = History(), {"pad": "x" * 20_000, "more": "y" * 20_000}
    with mounted_tmpfs(tmp_path / "disk", 6144) as disk:
        proc = BrokerProcess(disk / "data", "--flush", "sync", log_path=tmp_path / "broker.log").start()
        try:
            with Admin(proc.address) as admin, BrokerConnection(proc.address, retry_timeout=10) as conn:
                admin.create_topic(TOPIC, 4)
                conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="big"))
                for seq in range(40):  # 1.6 MB
                    key = f"k{seq % 4}"
                    send_rows(conn, TOPIC, seq % 4, [{"key": key, "body": body(key, seq), "properties": pad}],
                              txn_id="big")
                    history.sent(key, seq, acked=True)
                ballast = Ballast(disk)
                ballast.fill(leave_bytes=900_000)
                with pytest.raises(DiskFullError, match=f"disk full.*{disk}"):
                    conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="big"))
                ballast.free()
                assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="big")).count == 40
            for restarted in (False, True):
                if restarted:
                    proc.kill9()
                    proc.start()
                with BrokerConnection(proc.address, retry_timeout=10) as conn:
                    deliveries = [d for queue in range(4) for d in stored(conn, queue)]
                verdict = check(history.sends, deliveries)
                assert verdict.ok and verdict.lost == 0 and verdict.duplicated == 0, str(verdict)
                assert all(d.key == f"k{d.queue_id}" for d in deliveries)
        finally:
            proc.kill9()


def test_a_full_disk_takes_back_the_staged_files_kept_for_reuse(disk, tmp_path):
    """A finished transaction's staged file, kept to be written over, is the first thing a full
    disk takes back: the send refused says so, and sending again stores it, in order."""
    config = tmp_path / "broker.toml"
    config.write_text('[broker]\nflush = "sync"\ntxn_stage_pool_bytes = 262_144\n')
    proc = BrokerProcess(disk / "data", "--config", str(config), log_path=tmp_path / "broker.log").start()
    try:
        with Admin(proc.address) as admin, BrokerConnection(proc.address, retry_timeout=10) as conn:
            admin.create_topic(TOPIC, 1)
            history, seq = History(), 0
            conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="kept"))
            pad = {f"pad{i}": "x" * 30_000 for i in range(5)}  # a 150 KB staged file
            send_rows(conn, TOPIC, 0, [{"key": "k", "body": body("k", seq), "properties": pad}], txn_id="kept")
            conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="kept"))
            history.sent("k", seq, acked=True)
            assert len(list((disk / "data" / "txns" / "staged").glob("free-*"))) == 1
            Ballast(disk).fill()
            while True:  # what fits in the segment's last partly used page is stored
                seq += 1
                try:
                    send_rows(conn, TOPIC, 0, [{"key": "k", "body": body("k", seq)}])
                except DiskFullError as exc:
                    assert "deleted" in str(exc) and "kept for reuse: retrying may succeed" in str(exc), str(exc)
                    break
                history.sent("k", seq, acked=True)
            assert list((disk / "data" / "txns" / "staged").glob("free-*")) == []
            send_rows(conn, TOPIC, 0, [{"key": "k", "body": body("k", seq)}])  # the same send again
            history.sent("k", seq, acked=True)
            verdict = check(history.sends, stored(conn))
        assert verdict.ok and verdict.lost == 0 and verdict.duplicated == 0, str(verdict)
    finally:
        proc.kill9()
