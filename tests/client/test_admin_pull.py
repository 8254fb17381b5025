"""Admin (topics, progress, locks) and the pull consumer (pull, assign/poll, seek, commit, fencing)."""

from __future__ import annotations

import threading
import time

import pytest

from connector.client import Admin, Producer, PullConsumer
from connector.errors import (
    FencedError,
    InvalidOptionError,
    InvalidRequestError,
    LockUnavailableError,
    OffsetOutOfRangeError,
    QueueOutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
)
from connector.history import History
from tests.support import served_calls

from .helpers import send_keyed


def test_topic_lifecycle(admin, topic_name):
    info = admin.create_topic(topic_name, 3)
    assert (info.name, info.queue_count) == (topic_name, 3)
    assert admin.create_topic(topic_name, 5, if_not_exists=True).queue_count == 3
    with pytest.raises(TopicExistsError):
        admin.create_topic(topic_name, 3)
    assert topic_name in [t.name for t in admin.list_topics()]
    assert admin.grow_topic(topic_name, 4).queue_count == 4
    assert admin.describe_topic(topic_name).queue_count == 4
    admin.delete_topic(topic_name)
    with pytest.raises(TopicNotFoundError):
        admin.describe_topic(topic_name)
    with pytest.raises(InvalidRequestError):
        admin.create_topic("bad name!", 1)


def test_consumer_progress_shows_offsets_lag_and_lock_holder(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)
    for i in range(5):
        producer.send(topic_name, str(i), queue_id=0)
    for i in range(3):
        producer.send(topic_name, str(i), queue_id=1)
    with PullConsumer(broker.address, group="g", client_id="puller") as consumer:
        consumer.lock(topic_name, 0)
        consumer.commit(topic_name, 0, 2)
        progress = admin.consumer_progress("g", topic_name)
        holders = admin.lock_holders("g", topic_name)
    assert [(p.queue_id, p.broker_offset, p.consumer_offset, p.lag, p.lock_holder) for p in progress] == [
        (0, 5, 2, 3, "puller"),
        (1, 3, -1, 3, None),
    ]
    assert [(h.queue_id, h.client_id) for h in holders] == [(0, "puller")]
    assert holders[0].epoch >= 1


def test_pull_returns_messages_in_queue_order(broker, admin, producer, topic_name):
    """Over the broker's lean port, the errors too; every key in order."""
    admin.create_topic(topic_name, 1)
    send_keyed(producer, topic_name, ["a", "b"], 10)
    with PullConsumer(broker.address) as consumer:
        first = consumer.pull(topic_name, 0, 0, 7)
        rest = consumer.pull(topic_name, 0, first.next_offset, 100)
        assert (served_calls(broker, "PullPort"), served_calls(broker, "Pull")) == (2, 0)
        assert [m.queue_offset for m in [*first, *rest]] == list(range(20))
        assert [int(m.body) for m in [*first, *rest] if m.key == "a"] == list(range(10))
        assert (len(first), first.next_offset, rest.max_offset, rest.lag) == (7, 7, 20, 0)
        with pytest.raises(OffsetOutOfRangeError):
            consumer.pull(topic_name, 0, 99, 1)
        with pytest.raises(QueueOutOfRangeError):
            consumer.pull(topic_name, 5, 0, 1)
        with pytest.raises(TopicNotFoundError):
            consumer.pull("missing-topic", 0, 0, 1)


def test_pull_with_tag_filter_and_long_poll(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 1)
    for i, tag in enumerate(["TagA", "TagB", "TagC", None, "TagA"]):
        producer.send(topic_name, str(i), tag=tag, queue_id=0)
    with PullConsumer(broker.address) as consumer:
        result = consumer.pull(topic_name, 0, 0, 10, tag_expression="TagA || TagC")
        assert [int(m.body) for m in result] == [0, 2, 4]
        assert result.next_offset == 5
        empty = consumer.pull(topic_name, 0, 5, 10, wait_ms=50)
        assert (len(empty), empty.next_offset) == (0, 5)
        assert (served_calls(broker, "PullPort"), served_calls(broker, "Pull")) == (2, 0)


def test_a_long_poll_on_the_lean_port_waits_past_the_clients_timeout_and_keeps_each_keys_order(
        broker, admin, producer, topic_name):
    """Long polls of the tail, each longer than the consumer's timeout, while a producer sends
    keyed messages in bursts with pauses in between: each poll is answered over the lean port when
    a message comes (never over gRPC after the link timed out), every key complete and in order."""
    admin.create_topic(topic_name, 1)
    keys, bursts = ["a", "b", "c"], 3
    history = History()

    def send_bursts():
        for _ in range(bursts):
            time.sleep(1.5)  # past the consumer's timeout: only a wait as long as the poll's keeps the link
            for key, next_seq in send_keyed(producer, topic_name, keys, 5, start=sent).items():
                for seq in range(sent.get(key, 0), next_seq):
                    history.sent(key, seq, acked=True)
                sent[key] = next_seq

    sent: dict[str, int] = {}
    sender = threading.Thread(target=send_bursts)
    with PullConsumer(broker.address, timeout=1.0) as consumer:
        sender.start()
        offset, started = 0, time.monotonic()
        while offset < bursts * 5 * len(keys) and time.monotonic() - started < 30:
            result = consumer.pull(topic_name, 0, offset, 100, wait_ms=2000)
            for message in result:
                history.delivered(message.key, int(message.body), queue_id=0, offset=message.queue_offset)
            offset = result.next_offset
        sender.join()
        assert served_calls(broker, "Pull") == 0, "a long poll fell back to gRPC"
        assert served_calls(broker, "PullPort") >= bursts
    verdict = history.check()
    assert verdict.ok and history.delivered_all_acked(), verdict


def test_assign_poll_seek_and_commit(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)
    for i in range(6):
        producer.send(topic_name, str(i), queue_id=i % 2)
    time.sleep(0.01)  # store timestamps have millisecond resolution
    middle = int(time.time() * 1000)
    time.sleep(0.01)
    for i in range(6, 8):
        producer.send(topic_name, str(i), queue_id=i % 2)
    with PullConsumer(broker.address, group="g1") as consumer:
        consumer.assign(topic_name)
        got = []
        while batch := consumer.poll(3):
            got.extend(batch)
        assert sorted(int(m.body) for m in got) == list(range(8))
        consumer.commit()
        assert consumer.committed(topic_name, 0) == 4
        assert consumer.seek(topic_name, 0, "earliest") == 0
        assert consumer.seek(topic_name, 1, "latest") == 4
        assert consumer.seek_to_timestamp(topic_name, 0, middle) == 3
        assert [int(m.body) for m in consumer.poll(10)] == [6]
        assert consumer.position(topic_name, 0) == 4
    with PullConsumer(broker.address, group="g1") as again:
        again.assign(topic_name, [0])  # starts at the committed offset
        assert again.position(topic_name, 0) == 4
        with pytest.raises(InvalidOptionError, match="not assigned"):
            again.seek(topic_name, 1, 0)
    with PullConsumer(broker.address) as no_group:
        with pytest.raises(InvalidOptionError, match="needs a consumer group"):
            no_group.commit(topic_name, 0, 1)


def test_lock_fences_a_previous_holder(broker_factory, topic_name):
    broker = broker_factory(lock_lease_ms=2000)  # seconds: "first" cannot renew by accident
    with Admin(broker.address) as admin:
        admin.create_topic(topic_name, 1)
    with (
        PullConsumer(broker.address, group="g", client_id="first") as first,
        PullConsumer(broker.address, group="g", client_id="second") as second,
    ):
        epoch = first.lock(topic_name, 0)
        first.pull(topic_name, 0, 0, 1)
        with pytest.raises(LockUnavailableError, match="held by client 'first'"):
            second.lock(topic_name, 0)
        assert second.lock(topic_name, 0, wait=10) > epoch  # granted once the lease of "first" lapses
        with pytest.raises(FencedError):
            first.pull(topic_name, 0, 0, 1)
        with pytest.raises(FencedError):
            first.commit(topic_name, 0, 0)
        second.commit(topic_name, 0, 0)
        taken = second.epoch(topic_name, 0)
        second.unlock(topic_name, 0)
        assert first.lock(topic_name, 0) > taken


def test_a_consumer_polling_a_big_batch_a_few_at_a_time_gets_every_key_in_order(broker, admin, topic_name):
    """``Producer.send_batch`` stores records of thousands of messages; a ``PullConsumer`` polls
    them 32 at a time (mostly from memory): checked strictly, key by key."""
    admin.create_topic(topic_name, 2)
    history, sent = History(), {}
    rows = []
    for i in range(30_000):
        key = f"key-{i % 11}"
        rows.append({"key": key, "body": str(sent.get(key, 0))})
        sent[key] = sent.get(key, 0) + 1
    with Producer(broker.address) as producer:
        producer.send_batch(topic_name, rows)
    for key, count in sent.items():
        for seq in range(count):
            history.sent(key, seq, acked=True)
    with PullConsumer(broker.address, group="g") as consumer:
        consumer.assign(topic_name)
        while batch := consumer.poll(32):
            for message in batch:
                history.delivered(message.key, int(message.body), queue_id=message.queue_id,
                                  offset=message.queue_offset)
    verdict = history.check()
    assert verdict.ok and history.delivered_all_acked(), verdict


def test_a_backlog_in_one_queue_is_polled_without_pulling_the_caught_up_queues_each_time(
        broker, admin, topic_name, monkeypatch):
    """A queue found at its end is pulled again only once the others have nothing (or after
    ``EMPTY_RECHECK_S``, made long here): catching up on one queue of 8 takes one pull per poll,
    not eight. What arrives meanwhile in a caught-up queue still comes: every queue's messages
    complete and in order."""
    from connector.client import pull_consumer

    monkeypatch.setattr(pull_consumer, "EMPTY_RECHECK_S", 3600.0)
    admin.create_topic(topic_name, 8)
    got: dict[int, list[str]] = {}
    with Producer(broker.address) as producer, PullConsumer(broker.address) as consumer:
        producer.send_batch(topic_name, [{"body": str(i)} for i in range(3_200)], queue_id=5)
        consumer.assign(topic_name)
        batch = consumer.poll(32)  # queues 0-4 found empty on the way to 5
        producer.send(topic_name, "late", queue_id=2)
        before = served_calls(broker, "PullPort")
        while batch:
            for message in batch:
                got.setdefault(message.queue_id, []).append(message.body.decode())
            batch = consumer.poll(32)
        pulls = served_calls(broker, "PullPort") - before
    assert got == {5: [str(i) for i in range(3_200)], 2: ["late"]}
    assert pulls <= 3_200 // 32 - 1 + 3 * 8, pulls  # the polls of queue 5, and three passes over every queue
