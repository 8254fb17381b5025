"""The broker over gRPC on loopback: topics, ordered sends, pulls, offsets, locks, fencing,
transactions, tag filters, long polls, retention. Every message-moving test checks order and
completeness per key."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

from broker.wire import codec
from broker.wire.errors import (
    BadBatchError,
    BadTagExpressionError,
    FencedError,
    OffsetOutOfRangeError,
    QueueOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
    TransactionError,
)
from connector.client.connection import BrokerConnection, pb
from tests.support import pull_all, send_rows, wait_until


@pytest.fixture
def conn(broker):
    with BrokerConnection(broker.address, retry_timeout=2) as c:
        yield c


def create(conn, topic, queues=4):
    return conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=queues))


def test_topic_lifecycle_and_errors(conn, topic_name):
    route = create(conn, topic_name, 4)
    assert (route.queue_count, route.broker_name) == (4, "broker-a")
    with pytest.raises(TopicExistsError, match="already exists"):
        create(conn, topic_name, 4)
    assert conn.call("UpdateTopic", pb.UpdateTopicRequest(topic=topic_name, queue_count=6)).queue_count == 6
    listed = conn.call("ListTopics", pb.ListTopicsRequest()).topics
    assert [(t.topic, t.queue_count) for t in listed] == [(topic_name, 6)]
    conn.call("DeleteTopic", pb.DeleteTopicRequest(topic=topic_name))
    with pytest.raises(TopicNotFoundError, match="does not exist"):
        conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic_name))


def test_concurrent_producers_keep_order_per_queue(conn, topic_name):
    create(conn, topic_name, 3)
    producers, sends, per_send = 6, 40, 5

    def produce(p):
        for s in range(sends):
            rows = [{"key": f"p{p}", "body": f"{p}:{s * per_send + i}"} for i in range(per_send)]
            send_rows(conn, topic_name, p % 3, rows)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen = defaultdict(list)
    for q in range(3):
        table = pull_all(conn, topic_name, q, max_messages=37)
        assert table.column("queue_offset").to_pylist() == list(range(table.num_rows))
        for key, body in zip(table.column("key").to_pylist(), table.column("body").to_pylist(), strict=True):
            seen[key].append(int(body.decode().split(":")[1]))
    assert {k: v for k, v in seen.items()} == {f"p{p}": list(range(sends * per_send)) for p in range(producers)}


def test_send_returns_offsets_and_store_timestamp(conn, topic_name):
    create(conn, topic_name, 1)
    before = codec.now_ms()
    first = send_rows(conn, topic_name, 0, [{"body": b"a"}, {"body": b"b"}])
    second = send_rows(conn, topic_name, 0, [{"body": b"c"}])
    assert (first.base_offset, first.count, second.base_offset) == (0, 2, 2)
    assert before <= first.store_timestamp <= second.store_timestamp


def test_idempotent_resend_is_stored_once(conn, topic_name):
    create(conn, topic_name, 1)
    a = send_rows(conn, topic_name, 0, [{"body": b"x"}], producer_id="p", sequence=0)
    b = send_rows(conn, topic_name, 0, [{"body": b"x"}], producer_id="p", sequence=0)
    assert b.duplicate and b.base_offset == a.base_offset
    assert pull_all(conn, topic_name, 0).num_rows == 1


def test_pull_limits_offsets_and_timestamps(conn, topic_name):
    create(conn, topic_name, 1)
    for i in range(10):
        send_rows(conn, topic_name, 0, [{"body": str(i * 3 + j)} for j in range(3)])
    resp = conn.call("Pull", pb.PullRequest(topic=topic_name, queue_id=0, offset=4, max_messages=5))
    table = codec.decode_many(resp.batches)
    assert table.column("body").to_pylist() == [str(i).encode() for i in range(4, 9)]
    assert (resp.next_offset, resp.min_offset, resp.max_offset) == (9, 0, 30)
    offsets = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0, timestamp=0,
                                                               has_timestamp=True))
    assert (offsets.min_offset, offsets.max_offset, offsets.offset_for_timestamp) == (0, 30, 0)
    later = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0,
                                                             timestamp=codec.now_ms() + 60_000, has_timestamp=True))
    assert later.offset_for_timestamp == 30
    # The broker's clock as it answered: at or after every store timestamp below max_offset.
    last = codec.decode_many(conn.call("Pull", pb.PullRequest(topic=topic_name, queue_id=0, offset=29)).batches)
    stored = last.column("store_timestamp").cast(pa.int64())[0].as_py()
    assert stored <= offsets.now_ms <= codec.now_ms()
    assert offsets.boot_id == resp.boot_id != 0  # the broker's start, as its pulls name it
    with pytest.raises(OffsetOutOfRangeError, match="beyond the maximum 30"):
        conn.call("Pull", pb.PullRequest(topic=topic_name, queue_id=0, offset=31))


def test_tag_filter(conn, topic_name):
    create(conn, topic_name, 1)
    tags = ["TagA", "TagB", "TagC", None] * 5
    send_rows(conn, topic_name, 0, [{"body": str(i), "tag": t} for i, t in enumerate(tags)])
    table = pull_all(conn, topic_name, 0, tag_expression="TagA || TagC")
    assert table.column("tag").to_pylist() == ["TagA", "TagC"] * 5
    assert table.column("queue_offset").to_pylist() == [i for i, t in enumerate(tags) if t in ("TagA", "TagC")]
    assert pull_all(conn, topic_name, 0, tag_expression="*").num_rows == 20
    with pytest.raises(BadTagExpressionError, match="not a tag"):
        conn.call("Pull", pb.PullRequest(topic=topic_name, queue_id=0, tag_expression="TagA && TagB"))


def test_long_poll_wakes_on_new_data(conn, topic_name):
    create(conn, topic_name, 1)
    result = {}

    def poll():
        t0 = time.monotonic()
        resp = conn.call("Pull", pb.PullRequest(topic=topic_name, queue_id=0, offset=0, wait_ms=20_000))
        result["rows"] = codec.decode_many(resp.batches).column("body").to_pylist()
        result["waited"] = time.monotonic() - t0

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.3)
    assert t.is_alive(), "the pull must wait for data"
    send_rows(conn, topic_name, 0, [{"body": b"wake"}])
    t.join(timeout=10)
    assert result["rows"] == [b"wake"]
    assert result["waited"] < 20, "woken by the send, not by the wait bound"


def test_group_offsets(conn, topic_name):
    create(conn, topic_name, 2)
    send_rows(conn, topic_name, 1, [{"body": b"x"}] * 5)
    get = pb.GetOffsetRequest(group="g", topic=topic_name, queue_id=1)
    assert conn.call("GetOffset", get).offset == -1
    conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=topic_name, queue_id=1, offset=3))
    assert conn.call("GetOffset", get).offset == 3
    with pytest.raises(OffsetOutOfRangeError, match="only 5 messages"):
        conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=topic_name, queue_id=1, offset=9))


def lock(conn, topic, client, queues, group="g"):
    resp = conn.call("LockBatch", pb.LockBatchRequest(group=group, client_id=client, topic=topic, queue_ids=queues))
    return {lk.queue_id: lk.epoch for lk in resp.locked}


def test_lock_rules_and_fencing(broker_factory, topic_name):
    broker = broker_factory(lock_lease_ms=3000)  # seconds: no step below can outlive it by accident
    conn = BrokerConnection(broker.address, retry_timeout=2)
    create(conn, topic_name, 3)
    send_rows(conn, topic_name, 0, [{"body": b"m"}] * 3)
    held = lock(conn, topic_name, "A", [0, 1])
    assert set(held) == {0, 1}
    assert lock(conn, topic_name, "B", [0, 1, 2]) == {2: lock(conn, topic_name, "B", [2])[2]}, "only the free queue"
    assert lock(conn, topic_name, "A", [0, 1]) == held, "renewal keeps the epoch"
    unlocked = conn.call("UnlockBatch", pb.UnlockBatchRequest(group="g", client_id="B", topic=topic_name, queue_ids=[0]))
    assert list(unlocked.unlocked) == []
    holders = conn.call("QueryLocks", pb.QueryLocksRequest(group="g", topic=topic_name)).locks
    assert [(h.queue_id, h.client_id) for h in holders] == [(0, "A"), (1, "A"), (2, "B")]
    pull = pb.PullRequest(topic=topic_name, queue_id=0, offset=0, group="g", client_id="A", epoch=held[0])
    assert conn.call("Pull", pull).count == 3
    lease_end_ms = max(h.expires_at_ms for h in holders if h.client_id == "A")
    assert wait_until(lambda: time.time() * 1000 > lease_end_ms + 100, 10)  # A's lease has run out
    taken = lock(conn, topic_name, "B", [0])
    assert taken[0] > held[0], "a new holder gets a higher epoch"
    with pytest.raises(FencedError):
        conn.call("Pull", pull)
    with pytest.raises(FencedError):
        conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=topic_name, queue_id=0, offset=3,
                                                         client_id="A", epoch=held[0]))
    conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=topic_name, queue_id=0, offset=3,
                                                     client_id="B", epoch=taken[0]))
    conn.close()


def test_epochs_survive_restart_so_an_old_holder_cannot_commit(broker_factory, tmp_path, topic_name):
    data = tmp_path / "restart"
    first = broker_factory(data_dir=data)
    conn = BrokerConnection(first.address, retry_timeout=2)
    create(conn, topic_name, 1)
    send_rows(conn, topic_name, 0, [{"body": b"m"}])
    epoch = lock(conn, topic_name, "A", [0])[0]
    conn.close()
    first.stop()
    second = broker_factory(data_dir=data)
    conn = BrokerConnection(second.address, retry_timeout=2)
    with pytest.raises(FencedError):
        conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=topic_name, queue_id=0, offset=1,
                                                         client_id="A", epoch=epoch))
    assert lock(conn, topic_name, "B", [0]) == {}  # kept for its holder for one lease
    assert lock(conn, topic_name, "A", [0])[0] > epoch
    conn.close()


def test_membership(conn, topic_name):
    for client in ("c2", "c1"):
        conn.call("Heartbeat", pb.HeartbeatRequest(group="g", client_id=client, topics=[topic_name]))
    assert list(conn.call("ListConsumers", pb.ListConsumersRequest(group="g")).client_ids) == ["c1", "c2"]
    conn.call("LeaveGroup", pb.LeaveGroupRequest(group="g", client_id="c1"))
    assert list(conn.call("ListConsumers", pb.ListConsumersRequest(group="g")).client_ids) == ["c2"]


def test_transactions_visibility_order_idempotence_abort(conn, topic_name):
    create(conn, topic_name, 2)
    conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="tx1"))
    for i in range(4):
        staged = send_rows(conn, topic_name, i % 2, [{"body": str(i)}], txn_id="tx1")
        assert staged.base_offset == -1
    assert pull_all(conn, topic_name, 0).num_rows == 0, "staged data is invisible"
    done = conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="tx1"))
    assert (done.already_committed, done.count) == (False, 4)
    assert pull_all(conn, topic_name, 0).column("body").to_pylist() == [b"0", b"2"]
    assert pull_all(conn, topic_name, 1).column("body").to_pylist() == [b"1", b"3"]
    assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="tx1")).already_committed
    assert pull_all(conn, topic_name, 0).num_rows == 2, "a replayed commit adds nothing"
    conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="tx2"))
    send_rows(conn, topic_name, 0, [{"body": b"dropped"}], txn_id="tx2")
    conn.call("AbortTxn", pb.AbortTxnRequest(txn_id="tx2"))
    with pytest.raises(TransactionError, match="abort"):
        conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="tx2"))
    assert pull_all(conn, topic_name, 0).num_rows == 2


def test_a_big_commit_appends_each_queue_its_staged_sends_once_in_order(conn, topic_name):
    """A commit staging megabytes over many queues (appended side by side) beside plain sends:
    every queue holds its plain sends, then its staged ones in send order, each once; a replayed
    commit adds nothing."""
    queues, body = 6, b"x" * 20_000
    create(conn, topic_name, queues)
    conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="big"))
    expected = defaultdict(list)
    for n in range(120):  # 2.4 MB, interleaved over the queues
        queue = n * 7 % queues
        if n % 10 == 0:
            send_rows(conn, topic_name, queue, [{"key": f"plain-{n}", "body": b"plain"}])
            expected[queue].insert(sum(k.startswith("plain") for k in expected[queue]), f"plain-{n}")
        send_rows(conn, topic_name, queue, [{"key": f"q{queue}-{n}", "body": body}, {"key": f"q{queue}-{n}b", "body": b"s"}],
                  txn_id="big")
        expected[queue] += [f"q{queue}-{n}", f"q{queue}-{n}b"]
    assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="big")).count == 240
    assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="big")).already_committed
    for queue in range(queues):
        stored = pull_all(conn, topic_name, queue)
        assert stored.column("key").to_pylist() == expected[queue]
        assert stored.column("queue_offset").to_pylist() == list(range(len(expected[queue])))


def test_abandoned_transaction_aborts_after_timeout(broker_factory, topic_name):
    broker = broker_factory(txn_timeout_ms=300, flush_interval_ms=50)
    conn = BrokerConnection(broker.address, retry_timeout=2)
    create(conn, topic_name, 1)
    conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="slow"))
    send_rows(conn, topic_name, 0, [{"body": b"late"}], txn_id="slow")
    time.sleep(1.0)
    with pytest.raises(TransactionError):
        conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="slow"))
    assert pull_all(conn, topic_name, 0).num_rows == 0
    conn.close()


def test_begin_again_refreshes_and_sets_the_timeout_of_an_open_transaction(broker_factory, tmp_path, topic_name):
    """A producer keeps an open transaction alive by beginning it again, and gives one it has
    staged everything into longer to wait for its commit: also across a restart."""
    data = tmp_path / "txn-timeout"
    broker = broker_factory(data_dir=data, txn_timeout_ms=400, flush_interval_ms=50)
    conn = BrokerConnection(broker.address, retry_timeout=2)
    create(conn, topic_name, 1)
    for txn_id in ("kept", "held", "left"):
        begun = conn.call("BeginTxn", pb.BeginTxnRequest(txn_id=txn_id))
        assert (begun.state, begun.timeout_ms) == ("OPEN", 400)
        send_rows(conn, topic_name, 0, [{"key": txn_id, "body": f"{txn_id}-{i}"} for i in range(2)], txn_id=txn_id)
    held = conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="held", timeout_ms=60_000))
    assert (held.state, held.timeout_ms) == ("OPEN", 60_000)
    for _ in range(6):  # 1.2 s in all, three timeouts: "kept" is refreshed, "left" is not
        time.sleep(0.2)
        assert conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="kept")).timeout_ms == 400
    assert conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="left")).state == "ABORTED"
    conn.close()
    broker.stop()
    broker = broker_factory(data_dir=data, txn_timeout_ms=400, flush_interval_ms=50)
    conn = BrokerConnection(broker.address, retry_timeout=2)
    time.sleep(1.0)  # the restarted broker still gives "held" its 60 s
    assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="held")).count == 2
    with pytest.raises(TransactionError, match="aborted"):
        conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="kept"))  # no longer refreshed: its 400 ms passed
    assert pull_all(conn, topic_name, 0).column("body").to_pylist() == [b"held-0", b"held-1"]
    conn.close()


def test_staged_transaction_survives_restart(broker_factory, tmp_path, topic_name):
    data = tmp_path / "txn-restart"
    first = broker_factory(data_dir=data)
    conn = BrokerConnection(first.address, retry_timeout=2)
    create(conn, topic_name, 1)
    conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="t"))
    send_rows(conn, topic_name, 0, [{"body": str(i)} for i in range(3)], txn_id="t")
    conn.close()
    first.stop()
    second = broker_factory(data_dir=data)
    conn = BrokerConnection(second.address, retry_timeout=2)
    assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="t")).count == 3
    assert pull_all(conn, topic_name, 0).column("body").to_pylist() == [b"0", b"1", b"2"]
    conn.close()


def test_numbered_staged_sends_are_staged_once_across_a_restart(broker_factory, tmp_path, topic_name):
    """A staged send with a producer id is numbered in its transaction: a resend of one already
    staged (its answer lost) answers duplicate and adds nothing, before and after a restart; a
    number past the count staged (sends lost in between) is refused."""
    data = tmp_path / "txn-numbered"
    first = broker_factory(data_dir=data)
    conn = BrokerConnection(first.address, retry_timeout=2)
    create(conn, topic_name, 2)
    conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="t"))

    def stage(conn, number: int, body: str) -> pb.SendResponse:
        return send_rows(conn, topic_name, number % 2, [{"key": "k", "body": body}], txn_id="t", producer_id="t",
                         sequence=number)

    assert [stage(conn, n, f"m{n}").duplicate for n in (0, 1, 1, 0, 2)] == [False, False, True, True, False]
    with pytest.raises(TransactionError, match="3 staged send.*number 4"):
        stage(conn, 4, "m4")
    conn.close()
    first.stop()
    second = broker_factory(data_dir=data)
    conn = BrokerConnection(second.address, retry_timeout=2)
    assert [stage(conn, n, f"m{n}").duplicate for n in (2, 3, 3)] == [True, False, True]
    assert conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="t")).count == 4
    assert pull_all(conn, topic_name, 0).column("body").to_pylist() == [b"m0", b"m2"]
    assert pull_all(conn, topic_name, 1).column("body").to_pylist() == [b"m1", b"m3"]
    conn.close()


def test_retention_removes_old_segments(broker_factory, topic_name):
    broker = broker_factory(segment_bytes=4096, retention_ms=200, retention_check_interval_ms=100,
                            flush_interval_ms=50)
    conn = BrokerConnection(broker.address, retry_timeout=2)
    create(conn, topic_name, 1)
    for _ in range(30):
        send_rows(conn, topic_name, 0, [{"body": b"x" * 200}])
    deadline = time.monotonic() + 10
    while conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0)).min_offset == 0:
        assert time.monotonic() < deadline, "retention never ran"
        time.sleep(0.1)
    with pytest.raises(OffsetOutOfRangeError, match="removed by retention"):
        conn.call("Pull", pb.PullRequest(topic=topic_name, queue_id=0, offset=0))
    for _ in range(100):  # retention keeps removing segments as they age: read from the minimum it left
        low = conn.call("QueryOffsets", pb.QueryOffsetsRequest(topic=topic_name, queue_id=0)).min_offset
        try:
            rest = pull_all(conn, topic_name, 0, offset=low)
            break
        except OffsetOutOfRangeError:
            continue
    else:
        pytest.fail("retention kept moving the minimum past every read")
    assert rest.column("queue_offset").to_pylist() == list(range(low, 30))
    conn.close()


def test_bad_requests_get_precise_errors(conn, topic_name):
    create(conn, topic_name, 2)
    with pytest.raises(QueueOutOfRangeError, match="queues 0..1"):
        send_rows(conn, topic_name, 5, [{"body": b"x"}])
    with pytest.raises(TopicNotFoundError):
        send_rows(conn, "missing-topic", 0, [{"body": b"x"}])
    with pytest.raises(BadBatchError, match="malformed Arrow"):
        conn.call("Send", pb.SendRequest(topic=topic_name, queue_id=0, batch=b"not arrow"))
    with pytest.raises(BadBatchError, match="empty batch"):
        conn.call("Send", pb.SendRequest(topic=topic_name, queue_id=0, batch=b""))
    # Framing that decodes, data that does not: a string key that is not UTF-8.
    bad_keys = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, 2], np.int32)),
                                                      pa.py_buffer(b"\xff\xfe")])
    good = codec.messages_to_batch([{"key": "k", "body": b"x"}])
    forged = pa.Table.from_arrays([bad_keys, *good.columns[1:]], schema=codec.MESSAGE_SCHEMA)
    with pytest.raises(BadBatchError, match="invalid Arrow data"):
        conn.call("Send", pb.SendRequest(topic=topic_name, queue_id=0, batch=codec.encode(forged)))
