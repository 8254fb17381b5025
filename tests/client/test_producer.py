"""The producer against a real broker: routing, per-key order and completeness, pipelining,
retries across a broker restart, and precise errors."""

from __future__ import annotations

import gc
import threading

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
    SendOutcomeUnknownError,
    TopicNotFoundError,
)
from connector.history import Delivery, History, check_keyed
from tests.support import BrokerProcess, wait_until


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
    """Each key sits in its queue_for_key queue, and ``connector.history`` finds sequence numbers
    0..n-1 of every key stored exactly once, in order (read queue by queue in offset order)."""
    typed = {str(k): k for k in expected}
    delivered = []
    for queue_id, messages in stored.items():
        for m in messages:
            assert m.key in typed, f"unexpected key {m.key!r}"
            assert queue_id == queue_for_key(typed[m.key], queue_count), f"key {m.key!r} stored in queue {queue_id}"
            delivered.append((m.key, int(m.body)))
    verdict = check_keyed({str(k): n for k, n in expected.items()}, delivered)
    assert verdict.ok and verdict.duplicated == 0, verdict


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


def test_a_kept_async_send_future_holds_its_result_not_its_message(broker, admin, topic_name):
    """A program that keeps every future of a long run of sends must not keep every message too."""
    admin.create_topic(topic_name, 2)
    bodies = [f"body-{n}".encode() * 10 for n in range(50)]
    with Producer(broker.address, linger_ms=2, max_batch_messages=8) as producer:
        futures = [producer.send_async(topic_name, body, key=f"k{n % 5}") for n, body in enumerate(bodies)]
        producer.flush()
    stored = read_topic(broker.address, topic_name)
    for body, future in zip(bodies, futures, strict=True):
        held = gc.get_referents(future)
        held += [item for holder in held if not isinstance(holder, type) for item in gc.get_referents(holder)]
        assert not any(item is body for item in held), "a resolved future still refers to its message"
        result = future.result()
        assert stored[result.queue_id][result.queue_offset].body == body


def test_a_callback_per_async_send_runs_once_with_its_own_future(broker, admin, topic_name):
    """RocketMQ's ``SendCallback`` pattern: each callback runs once, given the future its send
    returned, after the message is stored; a queue's callbacks run in its offsets' order."""
    admin.create_topic(topic_name, 3)
    keys = [f"account-{i}" for i in range(10)]
    called: list = []
    with Producer(broker.address, linger_ms=2, max_batch_messages=16) as producer:
        futures = [producer.send_async(topic_name, str(seq), key=key, callback=called.append)
                   for seq in range(60) for key in keys]
        producer.flush()
    assert len(called) == len(futures) and {id(f) for f in called} == {id(f) for f in futures}
    offsets: dict[int, list[int]] = {}
    for future in called:
        offsets.setdefault(future.result().queue_id, []).append(future.result().queue_offset)
    assert all(seen == sorted(seen) for seen in offsets.values()), offsets
    assert_per_key_order(read_topic(broker.address, topic_name), dict.fromkeys(keys, 60), 3)


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


def test_threads_pipelining_on_shared_queues_keep_their_own_order(broker, admin, topic_name):
    """Threads calling send_async side by side (their messages meet in the sender's inbox), each
    now and then following one at once with a synchronous send of the same key, which must be
    stored after it: every key complete and in order, whichever path each message took."""
    admin.create_topic(topic_name, 3)
    threads, rounds, keys = 4, 80, 5
    expected: dict[str, int] = {}

    def worker(n: int, producer: Producer) -> None:
        futures, sent = [], {f"thread-{n}-{k}": 0 for k in range(keys)}
        for r in range(rounds):
            for key in sent:
                futures.append(producer.send_async(topic_name, str(sent[key]), key=key))
                sent[key] += 1
                if r % 4 == 3:  # right behind it, perhaps still in the inbox
                    producer.send(topic_name, str(sent[key]), key=key)
                    sent[key] += 1
        for future in futures:
            future.result(timeout=30)
        expected.update(sent)

    with Producer(broker.address, linger_ms=1, max_batch_messages=32) as producer:
        workers = [threading.Thread(target=worker, args=(n, producer)) for n in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    assert len(expected) == threads * keys
    assert_per_key_order(read_topic(broker.address, topic_name), expected, 3)


def test_a_close_racing_async_sends_leaves_no_future_unresolved(broker, admin, topic_name):
    """Threads keep calling send_async while another closes the producer: every call either raises
    or returns a future that resolves (stored) or fails (closed), and what was stored is complete
    and in order up to each key's last acknowledged message."""
    admin.create_topic(topic_name, 2)
    outcomes: dict[str, list] = {f"thread-{n}": [] for n in range(3)}
    producer = Producer(broker.address, linger_ms=1)
    started = threading.Barrier(4)

    def worker(key: str) -> None:
        started.wait()
        for seq in range(100_000):
            try:
                outcomes[key].append(producer.send_async(topic_name, str(seq), key=key))
            except OrderlyMQError:
                return

    workers = [threading.Thread(target=worker, args=(key,)) for key in outcomes]
    for t in workers:
        t.start()
    started.wait()
    assert wait_until(lambda: sum(map(len, outcomes.values())) >= 3000, interval=0.001)
    producer.close(timeout=0.1)  # while the threads go on sending
    for t in workers:
        t.join(30)
    history = History()
    for key, futures in outcomes.items():
        for seq, future in enumerate(futures):
            assert future.exception(timeout=30) is None or isinstance(future.exception(), OrderlyMQError)
            history.sent(key, seq, acked=future.exception() is None)
    history.extend_deliveries(Delivery(m.key, int(m.body)) for messages in read_topic(broker.address, topic_name).values()
                              for m in messages)
    verdict = history.check()
    assert verdict.ok and verdict.duplicated == 0, verdict


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


@pytest.mark.parametrize("max_buffered", [100_000, 500], ids=["room", "buffer-full"])
def test_send_batch_spread_over_many_queues_keeps_each_keys_order(broker, admin, topic_name, max_buffered):
    """A table spread thin over 512 queues is submitted at once (one pass for all its queues); with
    a buffer smaller than the table, its queues wait in turn for room. Per key, every row stored
    once and in order; each result says where its row is."""
    admin.create_topic(topic_name, 512)
    keys, rounds = 1500, 4
    with Producer(broker.address, max_buffered_messages=max_buffered) as producer:
        for seq in range(rounds):
            table = pa.table({"key": [f"k{i}" for i in range(keys)], "body": [str(seq)] * keys})
            results = producer.send_batch(topic_name, table)
            assert [r.queue_id for r in results] == [queue_for_key(f"k{i}", 512) for i in range(keys)]
    stored = read_topic(broker.address, topic_name)
    assert_per_key_order(stored, {f"k{i}": rounds for i in range(keys)}, 512)
    assert results[7].queue_offset == [m.queue_offset for m in stored[results[7].queue_id] if m.key == "k7"][-1]


def test_selectors_modulo_callable_random_and_round_robin(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 4)
    assert producer.send(topic_name, b"a", selector="modulo", arg=1001).queue_id == 1001 % 4
    last = producer.send(topic_name, b"b", selector=lambda queues, message, arg: queues[-1]).queue_id
    assert last == 3
    assert producer.send(topic_name, b"c", selector=lambda queues, message, arg: arg, arg=2).queue_id == 2
    assert 0 <= producer.send(topic_name, b"d", selector="random").queue_id < 4
    picked = [producer.send(topic_name, b"e", selector="round_robin").queue_id for _ in range(8)]
    assert sorted(picked) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert producer.send(topic_name, b"f", queue_id=3).queue_id == 3


def test_bad_input_raises_precise_errors(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)
    with pytest.raises(TopicNotFoundError, match="no-such-topic"):
        producer.send("no-such-topic", b"x", key="k")
    with pytest.raises(InvalidRequestError, match="needs a sharding key"):
        producer.send(topic_name, b"x", selector="hash")
    with pytest.raises(InvalidRequestError, match=r"no sharding key.*pass key=.*selector='round_robin'.*queue_id="):
        producer.send(topic_name, b"x")
    with pytest.raises(InvalidRequestError, match="no sharding key"):
        producer.send_async(topic_name, b"x")
    with pytest.raises(InvalidRequestError, match="no sharding key"):
        producer.send_batch(topic_name, [{"body": b"x", "key": "k"}, {"body": b"y"}])
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


def test_a_stale_route_is_refreshed_after_the_broker_refuses_an_async_send(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 4)
    assert producer.send_async(topic_name, b"a", queue_id=3).result().queue_id == 3
    admin.delete_topic(topic_name)
    admin.create_topic(topic_name, 2)
    with pytest.raises(QueueOutOfRangeError):
        producer.send_async(topic_name, b"b", queue_id=3).result()  # the broker refuses the stale route
    with pytest.raises(QueueOutOfRangeError, match="queues 0..1"):
        producer.send_async(topic_name, b"c", queue_id=3)  # refreshed before the future failed


def test_unknown_broker_address_fails_with_the_address():
    with Producer("127.0.0.1:1", retry_timeout=0.5) as producer:
        with pytest.raises(BrokerUnavailableError, match="127.0.0.1:1"):
            producer.send("t", b"x", key="k")


def test_broker_killed_mid_stream_loses_nothing_and_reorders_nothing(tmp_path, topic_name):
    """kill -9 once 300 sends are acknowledged, restart, stop once 300 more are: every acknowledged
    send stored once, in per-key order; a send that failed plainly is never stored."""
    broker = BrokerProcess(tmp_path / "data", "--flush", "sync").start()
    try:
        with Admin(broker.address) as admin:
            admin.create_topic(topic_name, 3)
        keys = [f"k{i}" for i in range(12)]
        history = History()
        acked = threading.Semaphore(0)
        with Producer(broker.address, retry_timeout=20.0, linger_ms=1, max_in_flight_per_queue=4) as producer:
            futures = []
            stop = threading.Event()

            def produce():
                seq = 0
                while not stop.is_set():
                    for key in keys:
                        future = producer.send_async(topic_name, f"{key}:{seq}", key=key)
                        future.add_done_callback(lambda f: f.exception() or acked.release())
                        futures.append((key, seq, future))
                    seq += 1
                    for _, _, future in futures[-len(keys):]:
                        future.exception()  # one round in flight at a time: no busy loop while the broker is down

            thread = threading.Thread(target=produce)
            thread.start()
            for _ in range(300):
                assert acked.acquire(timeout=60)
            broker.kill9()
            broker.start()
            for _ in range(300):
                assert acked.acquire(timeout=60)
            stop.set()
            thread.join()
            for key, seq, future in futures:
                history.sent(key, seq, acked=future.exception() is None)
        for messages in read_topic(broker.address, topic_name).values():
            for m in messages:
                key, _, seq = m.body.decode().rpartition(":")
                history.delivered(key, int(seq), queue_id=m.queue_id, offset=m.queue_offset)
        verdict = history.check()
        assert verdict.ok and verdict.duplicated == 0, verdict
        unknown = [f.exception() for _, _, f in futures if isinstance(f.exception(), SendOutcomeUnknownError)]
        assert verdict.deliveries <= verdict.acked + len(unknown), verdict  # a plain failure is never stored
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
