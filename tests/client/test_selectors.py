"""Queue selectors: validation of their answers, and the producer's routing equals queue_for_key."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.wire.routing import queue_for_key
from connector.client import (
    Admin,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    SelectByHash,
    SelectByModulo,
    SelectRoundRobin,
)
from connector.client.selectors import resolve_selector, select_queue
from connector.errors import BadBatchError, InvalidOptionError, InvalidRequestError, QueueOutOfRangeError

QUEUES = [MessageQueue("t", i) for i in range(8)]


def msg(key=None) -> Message:
    return Message(topic="t", body=b"x", key=key)


def test_hash_selector_is_the_routing_function():
    for key in (0, 7, -3, 10**12, "order-42", "ключ", b"\x00\x01", ""):
        assert select_queue(SelectByHash(), QUEUES, msg(key), None) == queue_for_key(key, 8)


def test_hash_selector_falls_back_to_arg_and_refuses_no_key():
    assert select_queue(SelectByHash(), QUEUES, msg(), "abc") == queue_for_key("abc", 8)
    with pytest.raises(InvalidRequestError, match="needs a sharding key"):
        select_queue(SelectByHash(), QUEUES, msg(), None)


def test_modulo_selector_is_order_id_mod_queue_count():
    assert select_queue(SelectByModulo(), QUEUES, msg(), 13) == 5
    assert select_queue(SelectByModulo(), QUEUES, msg(), -1) == 7
    assert select_queue(SelectByModulo(), QUEUES, msg(21), None) == 5
    with pytest.raises(InvalidRequestError, match="integer arg"):
        select_queue(SelectByModulo(), QUEUES, msg("a"), None)


def test_round_robin_cycles_through_all_queues():
    rr = SelectRoundRobin()
    picked = [select_queue(rr, QUEUES, msg(), None) for _ in range(16)]
    assert sorted(picked) == sorted(list(range(8)) * 2)
    assert all((b - a) % 8 == 1 for a, b in zip(picked, picked[1:], strict=False))


@pytest.mark.parametrize(
    "answer, error",
    [
        (8, "queues 0..7"),
        (-1, "queues 0..7"),
        (MessageQueue("other", 0), "another topic"),
        ("1", "must return a MessageQueue or a queue id"),
        (True, "must return a MessageQueue or a queue id"),
    ],
)
def test_bad_selector_answers_raise_queue_out_of_range(answer, error):
    with pytest.raises(QueueOutOfRangeError, match=error):
        select_queue(lambda queues, message, arg: answer, QUEUES, msg("k"), None)


def test_selector_names_and_types_are_checked():
    assert isinstance(resolve_selector("modulo"), SelectByModulo)
    with pytest.raises(InvalidOptionError, match="unknown selector 'nope'"):
        resolve_selector("nope")
    with pytest.raises(InvalidOptionError, match="must be a name or a callable"):
        resolve_selector(42)


@pytest.fixture(scope="module")
def routed(shared_broker):
    """A producer and an 8-queue topic on the module's broker."""
    topic = f"route-{uuid.uuid4().hex[:8]}"
    with Admin(shared_broker.address) as admin:
        admin.create_topic(topic, 8)
    with Producer(shared_broker.address, retry_timeout=5.0) as producer:
        yield producer, topic


keys = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=40),
    st.text(max_size=20).map(lambda s: s.encode("utf-8")),
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=keys)
def test_producer_stores_every_key_in_the_queue_of_queue_for_key(routed, key):
    producer, topic = routed
    expected = queue_for_key(key, 8)
    assert producer.select_queue(topic, key) == expected
    result = producer.send(topic, b"payload", key=key)
    assert result.queue_id == expected
    stored = producer_pull_one(producer, topic, result.queue_id, result.queue_offset)
    assert stored.key == (key.decode() if isinstance(key, bytes) else str(key))


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.binary(max_size=30))
def test_any_binary_key_routes_by_its_raw_bytes(routed, key):
    producer, topic = routed
    assert producer.select_queue(topic, key) == queue_for_key(key, 8)
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        # The key column is a string: such a key cannot be stored, and says so.
        with pytest.raises(BadBatchError, match="not valid UTF-8"):
            producer.send(topic, b"payload", key=key)
    else:
        assert producer.send(topic, b"payload", key=key).queue_id == queue_for_key(key, 8)


def test_send_batch_routes_each_row_like_send(routed):
    producer, topic = routed
    rows = [{"body": f"{i}", "key": k} for i, k in enumerate([1, "a", b"b", 2**40, "ü", -5] * 3)]
    results = producer.send_batch(topic, rows)
    assert [r.queue_id for r in results] == [queue_for_key(r["key"], 8) for r in rows]


table_keys = st.one_of(
    st.lists(st.text(max_size=8), min_size=1, max_size=40).map(pa.array),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=40).map(
        lambda v: pa.array(v, pa.int64())),
    st.lists(st.sampled_from([b"a", b"b\x00", b"", "ключ".encode()]), min_size=1, max_size=40).map(
        lambda v: pa.array(v, pa.binary())),
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(keys=table_keys)
def test_send_batch_of_a_table_routes_each_row_like_send_and_keeps_its_order(routed, keys):
    """A table's key column is routed at once: every row lands where ``queue_for_key`` says, and
    each queue holds its rows complete and in input order."""
    producer, topic = routed
    bodies = [f"{i}".encode() for i in range(len(keys))]
    results = producer.send_batch(topic, pa.table({"key": keys, "body": bodies}))
    check_stored_where_routed_in_order(producer, topic, results, keys.to_pylist(), bodies)


def test_send_batch_of_dicts_with_text_keys_routes_them_as_a_column_like_send(routed):
    """Dicts whose keys are all text (str, or bytes holding UTF-8) are routed as one column, here
    of keys that seldom repeat (each row hashed): every row lands where ``queue_for_key`` says,
    each queue holds its rows complete and in input order."""
    producer, topic = routed
    keys = [f"order-{i % 1500}".encode() if i % 7 == 0 else f"order-{i % 1500}" for i in range(3000)]
    bodies = [f"{i}".encode() for i in range(len(keys))]
    results = producer.send_batch(topic, [{"key": k, "body": b} for k, b in zip(keys, bodies, strict=True)])
    check_stored_where_routed_in_order(producer, topic, results, keys, bodies)


def check_stored_where_routed_in_order(producer: Producer, topic: str, results, keys: list,
                                       bodies: list[bytes]) -> None:
    """Every message where ``queue_for_key`` routes its key, each queue's complete and in input order."""
    expected = [queue_for_key(k, 8) for k in keys]
    assert [r.queue_id for r in results] == expected
    with PullConsumer(producer.connection.address) as consumer:
        for queue_id in set(expected):
            offsets = [r.queue_offset for r in results if r.queue_id == queue_id]
            stored = consumer.pull(topic, queue_id, offsets[0], len(offsets))
            assert [m.queue_offset for m in stored] == offsets
            assert [m.body for m in stored] == [b for b, q in zip(bodies, expected, strict=True) if q == queue_id]


def producer_pull_one(producer: Producer, topic: str, queue_id: int, offset: int) -> Message:
    with PullConsumer(producer.connection.address) as consumer:
        return consumer.pull(topic, queue_id, offset, 1)[0]


def test_a_message_without_a_key_needs_a_selector_or_a_queue(routed):
    producer, topic = routed
    with pytest.raises(InvalidRequestError, match=r"no sharding key.*pass key=.*selector='round_robin'.*queue_id="):
        producer.send(topic, b"no key")
    with pytest.raises(InvalidRequestError, match="no sharding key"):
        producer.select_queue(topic)
    assert producer.send(topic, b"no key", queue_id=5).queue_id == 5
    assert 0 <= producer.send(topic, b"no key", selector="random").queue_id < 8


def test_the_named_round_robin_keeps_its_position_per_topic_for_the_producers_life(routed, shared_broker):
    producer, topic = routed
    other = f"route-{uuid.uuid4().hex[:8]}"
    with Admin(shared_broker.address) as admin:
        admin.create_topic(other, 3)
    picked, elsewhere = [], []
    for _ in range(12):
        picked.append(producer.send(topic, b"rr", selector="round_robin").queue_id)
        elsewhere.append(producer.send(other, b"rr", selector="round_robin").queue_id)
    assert all((b - a) % 8 == 1 for a, b in zip(picked, picked[1:], strict=False)), picked
    assert all((b - a) % 3 == 1 for a, b in zip(elsewhere, elsewhere[1:], strict=False)), elsewhere
