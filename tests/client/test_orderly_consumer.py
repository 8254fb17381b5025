"""The orderly consumer against a real broker: per-key order while instances join, leave and die,
lock renewal and takeover, suspension, the dead-letter queue, COMMIT/ROLLBACK, broadcasting."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from connector.client import (
    Admin,
    ConsumeOrderlyStatus,
    OrderlyConsumer,
    Producer,
    PullConsumer,
    dlq_topic,
)
from connector.errors import InvalidOptionError, TopicNotFoundError
from tests.support import served_calls, wait_until

from .helpers import FAST, FAST_BROKER, OrderLog, send_keyed

SUCCESS = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
WORKER = Path(__file__).with_name("orderly_worker.py")


def start_consumer(address, topic, group, listener, client_id, **options) -> OrderlyConsumer:
    consumer = OrderlyConsumer(address, group, listener, client_id=client_id, **{**FAST, **options})
    consumer.subscribe(topic)
    consumer.start()
    return consumer


def keys_of(log: OrderLog, key: str) -> list[int]:
    return [seq for _, k, seq, _, _ in list(log.entries) if k == key]


def test_one_consumer_consumes_every_key_in_order(fast_broker, topic_name):
    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 4)
        expected = send_keyed(producer, topic_name, [f"order-{i}" for i in range(20)], 25)
        log = OrderLog()
        consumer = start_consumer(fast_broker.address, topic_name, "g", log.listener("c1"), "c1")
        try:
            assert wait_until(lambda: log.has_all(expected))
            assert log.check(expected) == 0
            assert wait_until(lambda: all(p.lag == 0 for p in admin.consumer_progress("g", topic_name)))
        finally:
            consumer.shutdown()
        assert admin.lock_holders("g", topic_name) == []  # shutdown released the queues


def test_pulls_of_every_queue_go_together_over_the_lean_port(fast_broker, topic_name):
    """A consumer's pulls of all its queues are written on the broker's lean pull port before the
    first answer is read (gRPC: one round trip per queue); every key still in order."""

    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 4)
        expected = send_keyed(producer, topic_name, [f"order-{i}" for i in range(20)], 50)
        log = OrderLog()
        grpc_pulls = served_calls(fast_broker, "Pull")
        consumer = start_consumer(fast_broker.address, topic_name, "g", log.listener("c1"), "c1", pull_batch_size=8)
        try:
            assert wait_until(lambda: log.has_all(expected))
            assert log.check(expected) == 0
        finally:
            consumer.shutdown()
    assert served_calls(fast_broker, "PullPort") >= 1000 / 8, "the pulls went over the lean port"
    assert served_calls(fast_broker, "Pull") == grpc_pulls


def test_a_backlog_in_one_queue_is_pulled_without_pulling_the_caught_up_queues_each_pass(
        fast_broker, topic_name, monkeypatch):
    """Queues a pass found at their end are pulled again only once the others have nothing (or
    after ``EMPTY_RECHECK_S``, made long here): catching up on one queue of 8 takes one pull a
    pass, not eight. A message that arrives meanwhile in a caught-up queue still comes; each key's
    messages complete and in order."""
    from connector.client import pull_consumer

    monkeypatch.setattr(pull_consumer, "EMPTY_RECHECK_S", 3600.0)  # the consumers' passes use it too
    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 8)
        producer.send_batch(topic_name, [{"key": "hot", "body": str(i)} for i in range(3_200)], queue_id=5)
        log = OrderLog()
        before = served_calls(fast_broker, "PullPort")
        consumer = start_consumer(fast_broker.address, topic_name, "g", log.listener("c1"), "c1",
                                  pull_threshold_per_queue=10_000)  # the backlog is never held back
        try:
            assert wait_until(lambda: log.count() > 0)
            producer.send(topic_name, "0", key="late", queue_id=2)
            expected = {"hot": 3_200, "late": 1}
            assert wait_until(lambda: log.has_all(expected))
            assert log.check(expected) == 0
        finally:
            consumer.shutdown()
        pulls = served_calls(fast_broker, "PullPort") - before
    assert pulls <= 3_200 // 128 + 8 * 8, pulls  # queue 5 once a pass, and a few passes over all (216 before)


def test_three_instances_join_and_leave_mid_stream(fast_broker, topic_name, record_property):
    address = fast_broker.address
    log = OrderLog()
    keys = [f"order-{i}" for i in range(24)]
    consumers: dict[str, OrderlyConsumer] = {}

    def join(name: str) -> None:
        consumers[name] = start_consumer(address, topic_name, "g", log.listener(name, delay=0.0005), name)

    with Admin(address) as admin, Producer(address) as producer:
        admin.create_topic(topic_name, 6)
        join("c1")
        seqs = send_keyed(producer, topic_name, keys, 15)
        join("c2")
        seqs = send_keyed(producer, topic_name, keys, 15, seqs)
        join("c3")
        seqs = send_keyed(producer, topic_name, keys, 15, seqs)
        live = lambda: [c for c in consumers.values() if not c._stop.is_set()]  # noqa: E731
        assert wait_until(lambda: sorted(len(c.assignment()) for c in live()) == [2, 2, 2])
        consumers["c1"].shutdown()  # leaves mid-stream
        seqs = send_keyed(producer, topic_name, keys, 15, seqs)
        join("c4")  # joins mid-stream
        # it gets queues before the next sends: else the others may consume them all first
        assert wait_until(lambda: consumers["c4"].assignment())
        seqs = send_keyed(producer, topic_name, keys, 15, seqs)
        consumers["c2"].shutdown()
        seqs = send_keyed(producer, topic_name, keys, 15, seqs)
        try:
            assert wait_until(lambda: log.has_all(seqs), timeout=40)
            duplicates = log.check(seqs)
            record_property("duplicates", duplicates)
            assert {c for c, *_ in log.entries} >= {"c1", "c2", "c3", "c4"}
            assert wait_until(lambda: all(p.lag == 0 for p in admin.consumer_progress("g", topic_name)))
        finally:
            for consumer in consumers.values():
                consumer.shutdown()


def appending_listener(path: Path, client: str):
    """A listener appending what it consumes to ``path`` as ``orderly_worker.py`` does: the log of
    consumers in this process and in workers, in the order they consumed."""
    write_lock = threading.Lock()

    def listen(messages, context):
        with write_lock, open(path, "a") as sink:
            for m in messages:
                sink.write(f"{client} {m.key} {int(m.body)} {m.queue_id} {m.queue_offset}\n")
        return SUCCESS

    return listen


def parse_consumed(path: Path) -> OrderLog:
    """The log so far: its complete lines (a consumer may be writing the next one meanwhile)."""
    log = OrderLog()
    text = path.read_text()
    for line in text[:text.rfind("\n") + 1].splitlines():
        client, key, seq, qid, offset = line.split()
        log.entries.append((client, key, int(seq), int(qid), int(offset)))
    return log


def test_lock_renewal_and_takeover_after_a_consumer_is_killed(fast_broker, topic_name, tmp_path, record_property):
    address = fast_broker.address
    out = tmp_path / "consumed.txt"
    out.touch()
    keys = [f"k{i}" for i in range(16)]
    with Admin(address) as admin, Producer(address) as producer:
        admin.create_topic(topic_name, 4)
        victim = subprocess.Popen(
            [sys.executable, str(WORKER), address, topic_name, "g", "victim", str(out)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert victim.stdout.readline().strip() == "started"
            survivor = start_consumer(address, topic_name, "g", appending_listener(out, "survivor"), "survivor")
            try:
                holders = lambda: {h.queue_id: (h.client_id, h.epoch) for h in admin.lock_holders("g", topic_name)}  # noqa: E731
                assert wait_until(lambda: sorted(c for c, _ in holders().values()) == ["survivor"] * 2 + ["victim"] * 2)
                before = holders()
                seqs = send_keyed(producer, topic_name, keys, 20)
                time.sleep(2 * FAST_BROKER["lock_lease_ms"] / 1000)  # two leases: only renewal keeps the locks
                assert holders() == before  # same holders, same epochs: renewed, never re-acquired
                seqs = send_keyed(producer, topic_name, keys, 20, seqs)
                victim.kill()  # SIGKILL: no commit, no unlock, no goodbye
                victim.wait()
                seqs = send_keyed(producer, topic_name, keys, 20, seqs)
                log = parse_consumed(out)
                assert wait_until(lambda: parse_consumed(out).has_all(seqs), timeout=30)
                after = holders()
                assert {c for c, _ in after.values()} == {"survivor"}
                for qid, (client, epoch) in before.items():
                    assert (after[qid][1] > epoch) == (client == "victim")  # fenced epochs for taken-over queues
                log = parse_consumed(out)
                duplicates = log.check(seqs)
                record_property("duplicates", duplicates)
                assert {c for c, *_ in log.entries} == {"victim", "survivor"}
            finally:
                survivor.shutdown()
        finally:
            victim.kill()
            victim.wait()


def test_suspend_blocks_only_its_queue_and_then_resumes(fast_broker, topic_name):
    attempts: Counter = Counter()
    log = OrderLog()
    seen_reconsume = []

    def listener(messages, context):
        log.record("c", messages)
        (m,) = messages
        if m.key == "a" and int(m.body) == 3:
            attempts[3] += 1
            seen_reconsume.append(m.reconsume_times)
            if attempts[3] == 1:
                raise RuntimeError("a failing listener counts as a suspend")
            if attempts[3] < 4:
                context.suspend_ms = 30
                return SUSPEND
        return SUCCESS

    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 2)
        for seq in range(10):
            producer.send(topic_name, str(seq), key="a", queue_id=0)
            producer.send(topic_name, str(seq), key="b", queue_id=1)
        consumer = start_consumer(fast_broker.address, topic_name, "g", listener, "c")
        try:
            assert wait_until(lambda: log.has_all({"a": 10, "b": 10}))
        finally:
            consumer.shutdown()
    assert keys_of(log, "a") == [0, 1, 2, 3, 3, 3, 3, 4, 5, 6, 7, 8, 9]
    assert keys_of(log, "b") == list(range(10))
    assert seen_reconsume == [0, 1, 2, 3]


def test_dead_letter_queue_after_max_reconsume_times(fast_broker, topic_name):
    log = OrderLog()

    def listener(messages, context):
        log.record("c", messages)
        return SUSPEND if messages[0].body == b"2" else SUCCESS

    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 1)
        for seq in range(5):
            producer.send(topic_name, str(seq), key="a", tag="TagA")
        consumer = start_consumer(fast_broker.address, topic_name, "g", listener, "c", max_reconsume_times=2)
        try:
            assert wait_until(lambda: 4 in keys_of(log, "a"))
            assert wait_until(lambda: admin.committed_offset("g", topic_name, 0) == 5)
        finally:
            consumer.shutdown()
        assert keys_of(log, "a") == [0, 1, 2, 2, 2, 3, 4]
        with PullConsumer(fast_broker.address) as reader:
            (dead,) = reader.pull(dlq_topic("g"), 0, 0, 10)
    assert (dead.body, dead.key, dead.tag) == (b"2", "a", "TagA")
    assert dead.properties == {
        "ORIGIN_TOPIC": topic_name,
        "ORIGIN_QUEUE_ID": "0",
        "ORIGIN_OFFSET": "2",
        "RECONSUME_TIMES": "2",
    }


def test_commit_and_rollback_without_auto_commit(fast_broker, topic_name):
    log = OrderLog()
    rolled_back = threading.Event()

    def listener(messages, context):
        log.record("manual", messages)
        seq = int(messages[0].body)
        if seq == 2:
            return ConsumeOrderlyStatus.COMMIT
        if seq == 5 and not rolled_back.is_set():
            rolled_back.set()
            return ConsumeOrderlyStatus.ROLLBACK
        if seq == 5:
            return ConsumeOrderlyStatus.COMMIT
        return SUCCESS

    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 1)
        send_keyed(producer, topic_name, ["a"], 10)
        consumer = start_consumer(fast_broker.address, topic_name, "g", listener, "manual", auto_commit=False)
        try:
            assert wait_until(lambda: 9 in keys_of(log, "a"))
        finally:
            consumer.shutdown()
        assert keys_of(log, "a") == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7, 8, 9]
        assert admin.committed_offset("g", topic_name, 0) == 6  # 6..9 succeeded but were never committed
        replay = OrderLog()
        consumer = start_consumer(fast_broker.address, topic_name, "g", replay.listener("auto"), "auto")
        try:
            assert wait_until(lambda: replay.count() >= 4)
        finally:
            consumer.shutdown()
        assert keys_of(replay, "a") == [6, 7, 8, 9]
        assert admin.committed_offset("g", topic_name, 0) == 10


def test_broadcasting_gives_every_instance_every_message_and_keeps_offsets_locally(fast_broker, topic_name, tmp_path):
    address = fast_broker.address
    logs = {"b1": OrderLog(), "b2": OrderLog()}

    def start(name: str) -> OrderlyConsumer:
        return start_consumer(
            address,
            topic_name,
            "bg",
            logs[name].listener(name),
            name,
            message_model="broadcasting",
            offset_store_dir=tmp_path / "offsets",
        )

    with Admin(address) as admin, Producer(address) as producer:
        admin.create_topic(topic_name, 3)
        seqs = send_keyed(producer, topic_name, [f"k{i}" for i in range(9)], 10)
        consumers = [start("b1"), start("b2")]
        try:
            for log in logs.values():
                assert wait_until(lambda log=log: log.has_all(seqs))
                assert log.check(seqs) == 0
        finally:
            for c in consumers:
                c.shutdown()
        assert admin.lock_holders("bg", topic_name) == []
        assert all(p.consumer_offset == -1 for p in admin.consumer_progress("bg", topic_name))
        seqs = send_keyed(producer, topic_name, [f"k{i}" for i in range(9)], 2, seqs)
        logs["b1"] = OrderLog()
        again = start("b1")
        try:
            assert wait_until(lambda: logs["b1"].count() >= 18)
        finally:
            again.shutdown()
        assert sorted(seq for _, _, seq, _, _ in logs["b1"].entries) == [10] * 9 + [11] * 9


def test_consume_from_latest_and_timestamp(fast_broker, topic_name):
    with Admin(fast_broker.address) as admin, Producer(fast_broker.address) as producer:
        admin.create_topic(topic_name, 1)
        send_keyed(producer, topic_name, ["a"], 3)
        time.sleep(0.01)  # store timestamps have millisecond resolution
        middle = int(time.time() * 1000)
        time.sleep(0.01)
        seqs = send_keyed(producer, topic_name, ["a"], 3, {"a": 3})
        from_ts, from_latest = OrderLog(), OrderLog()
        consumers = [
            start_consumer(
                fast_broker.address,
                topic_name,
                "by-ts",
                from_ts.listener("ts"),
                "ts",
                consume_from="timestamp",
                consume_timestamp=middle,
            ),
            start_consumer(
                fast_broker.address, topic_name, "by-latest", from_latest.listener("l"), "l", consume_from="latest"
            ),
        ]
        try:
            assert wait_until(lambda: from_ts.count() >= 3)
            assert wait_until(lambda: all(c.assignment() for c in consumers))
            send_keyed(producer, topic_name, ["a"], 1, seqs)
            assert wait_until(lambda: from_latest.count() >= 1 and from_ts.count() >= 4)
        finally:
            for c in consumers:
                c.shutdown()
    assert keys_of(from_ts, "a") == [3, 4, 5, 6]
    assert keys_of(from_latest, "a") == [6]


def test_start_refuses_bad_configuration(fast_broker, topic_name):
    consumer = OrderlyConsumer(fast_broker.address, "g", lambda m, c: SUCCESS)
    with pytest.raises(InvalidOptionError, match="no subscription"):
        consumer.start()
    consumer.subscribe("missing-topic")
    with pytest.raises(TopicNotFoundError, match="missing-topic"):
        consumer.start()
    with pytest.raises(InvalidOptionError, match="group"):
        OrderlyConsumer(fast_broker.address, "bad group!", lambda m, c: SUCCESS)
    with pytest.raises(InvalidOptionError, match="consume_timestamp"):
        OrderlyConsumer(fast_broker.address, "g", lambda m, c: SUCCESS, consume_from="timestamp")
    with pytest.raises(InvalidOptionError, match="message_model"):
        OrderlyConsumer(fast_broker.address, "g", lambda m, c: SUCCESS, message_model="fanout")


def test_consumer_rides_out_a_broker_restart(tmp_path, topic_name, record_property):
    from tests.support import BrokerProcess

    config = tmp_path / "broker.toml"
    config.write_text("[broker]\n" + "".join(f"{k} = {v}\n" for k, v in FAST_BROKER.items()))
    broker = BrokerProcess(tmp_path / "data", "--flush", "sync", "--config", str(config)).start()
    log = OrderLog()
    keys = [f"k{i}" for i in range(9)]
    try:
        with Admin(broker.address) as admin, Producer(broker.address, retry_timeout=20) as producer:
            admin.create_topic(topic_name, 3)
            consumer = start_consumer(broker.address, topic_name, "g", log.listener("c"), "c", retry_timeout=20)
            try:
                seqs = send_keyed(producer, topic_name, keys, 20)
                assert wait_until(lambda: log.has_all(seqs))
                broker.kill9()  # once everything sent so far was consumed
                broker.start()
                seqs = send_keyed(producer, topic_name, keys, 20, seqs)
                assert wait_until(lambda: log.has_all(seqs), timeout=40)
                record_property("duplicates", log.check(seqs))
                assert wait_until(lambda: len(consumer.assignment()) == 3)  # re-locked at new epochs
            finally:
                consumer.shutdown()
    finally:
        broker.stop()
