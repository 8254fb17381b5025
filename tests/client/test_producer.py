"""The producer against a real broker: routing, per-key order and completeness, pipelining,
retries across a broker restart, and precise errors."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pyarrow as pa
import pytest

from broker.wire.routing import queue_for_key
from connector.client import Admin, Producer, PullConsumer
from connector.errors import (
    BadBatchError,
    BrokerUnavailableError,
    InvalidOptionError,
    InvalidRequestError,
    OrderlyMQError,
    QueueOutOfRangeError,
    TopicNotFoundError,
)
from tests.support import BrokerProcess


def read_topic(address: str, topic: str) -> dict[int, list]:
    """Every stored message per queue id, in queue order."""
    out = {}
    with PullConsumer(address) as consumer:
        for mq in consumer.queues(topic):
            messages, offset = [], 0
            while True:
                result = consumer.pull(topic, mq.queue_id, offset, 500)
                messages.extend(result.messages)
                offset = result.next_offset
                if offset >= result.max_offset:
                    break
            out[mq.queue_id] = messages
    return out


def assert_per_key_order(stored: dict[int, list], expected: dict, queue_count: int) -> None:
    """Each key sits in one queue, its queue_for_key, with sequence numbers 0..n-1 exactly once, in order."""
    seen = defaultdict(list)
    for queue_id, messages in stored.items():
        for m in messages:
            seen[m.key].append((queue_id, int(m.body)))
    assert set(seen) == {str(k) for k in expected}
    for key, n in expected.items():
        entries = seen[str(key)]
        assert {q for q, _ in entries} == {queue_for_key(key, queue_count)}, key
        assert [s for _, s in entries] == list(range(n)), f"key {key!r} stored out of order or incompletely"


def test_send_stores_the_message_where_the_result_says(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 4)
    result = producer.send(topic_name, b"created", key="order-1", tag="TagA", properties={"source": "test"})
    assert result.queue_id == queue_for_key("order-1", 4)
    (message,) = read_topic(broker.address, topic_name)[result.queue_id]
    assert (message.body, message.key, message.tag, message.properties) == (
        b"created",
        "order-1",
        "TagA",
        {"source": "test"},
    )
    assert message.queue_offset == result.queue_offset == 0
    assert message.store_timestamp == result.store_timestamp


def test_pipelined_async_sends_keep_every_key_in_order(broker, admin, topic_name):
    admin.create_topic(topic_name, 4)
    keys = [f"order-{i}" for i in range(25)] + list(range(25))
    with Producer(broker.address, linger_ms=2, max_batch_messages=16, max_in_flight_per_queue=3) as producer:
        futures, expected = [], {}
        for seq in range(40):
            for key in keys:
                futures.append(producer.send_async(topic_name, str(seq), key=key))
                expected[key] = seq + 1
        results = [f.result(timeout=30) for f in futures]
    assert len({(r.queue_id, r.queue_offset) for r in results}) == len(futures)
    assert_per_key_order(read_topic(broker.address, topic_name), expected, 4)


def test_concurrent_sync_senders_keep_their_own_order(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)

    def worker(n: int) -> None:
        for seq in range(60):
            producer.send(topic_name, str(seq), key=f"thread-{n}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert_per_key_order(read_topic(broker.address, topic_name), {f"thread-{n}": 60 for n in range(4)}, 2)


def test_send_batch_from_table_and_dicts_keeps_input_order(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 3)
    table = pa.table(
        {"key": pa.array([i % 7 for i in range(70)], pa.int64()), "body": [str(i // 7) for i in range(70)]}
    )
    results = producer.send_batch(topic_name, table)
    assert [r.queue_id for r in results] == [queue_for_key(i % 7, 3) for i in range(70)]
    rows = [{"key": f"s{i % 5}", "body": str(i // 5), "tag": "T"} for i in range(50)]
    producer.send_batch(topic_name, rows)
    expected = {**{k: 10 for k in range(7)}, **{f"s{k}": 10 for k in range(5)}}
    assert_per_key_order(read_topic(broker.address, topic_name), expected, 3)


def test_selectors_modulo_callable_random_and_round_robin(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 4)
    assert producer.send(topic_name, b"a", selector="modulo", arg=1001).queue_id == 1001 % 4
    last = producer.send(topic_name, b"b", selector=lambda queues, message, arg: queues[-1]).queue_id
    assert last == 3
    assert producer.send(topic_name, b"c", selector=lambda queues, message, arg: arg, arg=2).queue_id == 2
    assert 0 <= producer.send(topic_name, b"d", selector="random").queue_id < 4
    assert sorted(producer.send(topic_name, b"e").queue_id for _ in range(8)) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert producer.send(topic_name, b"f", queue_id=3).queue_id == 3


def test_bad_input_raises_precise_errors(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)
    with pytest.raises(TopicNotFoundError, match="no-such-topic"):
        producer.send("no-such-topic", b"x", key="k")
    with pytest.raises(InvalidRequestError, match="needs a sharding key"):
        producer.send(topic_name, b"x", selector="hash")
    with pytest.raises(QueueOutOfRangeError, match="queues 0..1"):
        producer.send(topic_name, b"x", selector=lambda queues, message, arg: 5)
    with pytest.raises(QueueOutOfRangeError, match="out of range"):
        producer.send(topic_name, b"x", queue_id=2)
    with pytest.raises(InvalidRequestError, match="must be str, int or bytes"):
        producer.send(topic_name, b"x", key=1.5)
    with pytest.raises(BadBatchError, match="no body"):
        producer.send_batch(topic_name, [{"key": "k"}])
    with pytest.raises(InvalidOptionError, match="not host:port"):
        Producer("localhost")
    assert read_topic(broker.address, topic_name) == {0: [], 1: []}


def test_a_stale_route_is_refreshed_after_the_broker_refuses_it(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 4)
    assert producer.send(topic_name, b"a", queue_id=3).queue_id == 3
    admin.delete_topic(topic_name)
    admin.create_topic(topic_name, 2)
    with pytest.raises(QueueOutOfRangeError):
        producer.send(topic_name, b"b", queue_id=3)  # the cached route still says 4 queues: the broker refuses
    with pytest.raises(QueueOutOfRangeError, match="queues 0..1"):
        producer.send(topic_name, b"c", queue_id=3)  # refreshed: refused before sending
    assert producer.send(topic_name, b"d", key="k").queue_id == queue_for_key("k", 2)


def test_unknown_broker_address_fails_with_the_address():
    with Producer("127.0.0.1:1", retry_timeout=0.5) as producer:
        with pytest.raises(BrokerUnavailableError, match="127.0.0.1:1"):
            producer.send("t", b"x", key="k")


def test_broker_killed_mid_stream_loses_nothing_and_reorders_nothing(tmp_path, topic_name):
    broker = BrokerProcess(tmp_path / "data", "--flush", "sync").start()
    try:
        with Admin(broker.address) as admin:
            admin.create_topic(topic_name, 3)
        keys = [f"k{i}" for i in range(12)]
        with Producer(broker.address, retry_timeout=20.0, linger_ms=1, max_in_flight_per_queue=4) as producer:
            futures, expected = [], {}
            stop = threading.Event()

            def produce():
                seq = 0
                while not stop.is_set() or seq < 60:
                    for key in keys:
                        futures.append(producer.send_async(topic_name, str(seq), key=key))
                        expected[key] = seq + 1
                    seq += 1
                    time.sleep(0.002)

            thread = threading.Thread(target=produce)
            thread.start()
            time.sleep(0.3)
            broker.kill9()
            time.sleep(0.5)
            broker.start()
            time.sleep(0.3)
            stop.set()
            thread.join()
            results = [f.result(timeout=60) for f in futures]
        stored = read_topic(broker.address, topic_name)
        assert sum(len(m) for m in stored.values()) == len(results)
        assert_per_key_order(stored, expected, 3)
    finally:
        broker.stop()


def test_broker_gone_for_good_fails_every_waiting_send(broker_factory, topic_name):
    broker = broker_factory()
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, 2)
    with Producer(broker.address, retry_timeout=1.0, linger_ms=50) as producer:
        producer.send(topic_name, b"first", key="k")
        broker.stop()
        futures = [producer.send_async(topic_name, str(i), key="k") for i in range(5)]
        for f in futures:
            with pytest.raises(BrokerUnavailableError, match=broker.address):
                f.result(timeout=30)


def test_errors_form_one_tree():
    for cls in (TopicNotFoundError, InvalidRequestError, QueueOutOfRangeError, BrokerUnavailableError, BadBatchError):
        assert issubclass(cls, OrderlyMQError)
