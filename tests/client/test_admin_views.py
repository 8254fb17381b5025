"""Admin's read-only views of the whole broker: every group and every open transaction."""

from __future__ import annotations

import time

from connector.client import GroupOffset, PullConsumer

from .helpers import send_keyed


def test_groups_show_offsets_members_and_locks(broker, admin, producer, topic_name):
    admin.create_topic(topic_name, 2)
    send_keyed(producer, topic_name, ["a", "b", "c"], 2)
    with PullConsumer(broker.address, group="views") as consumer:
        epoch = consumer.lock(topic_name, 0)
        consumer.commit(topic_name, 0, 2)
        admin.reset_offset("other", topic_name, 1, 1)
        groups = {g.name: g for g in admin.groups()}
    assert sorted(groups) == ["other", "views"]
    views = groups["views"]
    assert views.offsets == (GroupOffset(topic_name, 0, 2, consumer.client_id),)
    assert [(h.topic, h.queue_id, h.client_id, h.epoch) for h in views.locks] == [
        (topic_name, 0, consumer.client_id, epoch)
    ]
    assert views.locks[0].expires_at_ms > time.time() * 1000
    assert groups["other"].offsets == (GroupOffset(topic_name, 1, 1, ""),)


def test_open_transactions_are_listed_until_they_finish(admin, producer, topic_name):
    admin.create_topic(topic_name, 1)
    assert admin.open_transactions() == []
    tx = producer.transaction("views-tx").begin()
    tx.send(topic_name, b"staged", key="k")
    (shown,) = admin.open_transactions()
    assert (shown.txn_id, shown.state) == ("views-tx", "OPEN")
    assert shown.staged_bytes > 0 and shown.expires_at_ms > shown.last_activity_ms > 0
    tx.commit()
    assert admin.open_transactions() == []
