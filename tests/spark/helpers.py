"""Raw-RPC helpers for the Spark tests: create topics, produce keyed events, read queues back.

They use the wire layer only (``BrokerConnection`` + ``pb`` + ``codec``) and route with the one
routing function, so the tests check the connector against the broker and nothing else.
"""

from __future__ import annotations

import json
from collections import defaultdict

from broker.wire import codec
from broker.wire.routing import queue_for_key
from connector.client.connection import BrokerConnection, pb
from tests.support import pull_all


def create_topic(conn: BrokerConnection, topic: str, queues: int) -> None:
    conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic, queue_count=queues))


def produce(conn: BrokerConnection, topic: str, queues: int, events: list[tuple[str, int]], tag=None) -> None:
    """Send ``(key, seq)`` events, routed by key, one batch per queue in the given order.

    The body is ``{"key": ..., "seq": ...}``; ``tag`` is a string or a function of the event.
    """
    per_queue: dict[int, list[dict]] = defaultdict(list)
    for key, seq in events:
        message = {"key": key, "body": json.dumps({"key": key, "seq": seq}).encode()}
        message["tag"] = tag(key, seq) if callable(tag) else tag
        per_queue[queue_for_key(key, queues)].append(message)
    for queue_id, messages in sorted(per_queue.items()):
        batch = codec.encode(codec.messages_to_batch(messages))
        conn.call("Send", pb.SendRequest(topic=topic, queue_id=queue_id, batch=batch))


def keyed_events(keys: int, per_key: int, start: int = 0) -> list[tuple[str, int]]:
    """Events interleaved across keys: ``k0#start, k1#start, ..., k0#start+1, ...``."""
    return [(f"k{k}", s) for s in range(start, start + per_key) for k in range(keys)]


def topic_events(conn: BrokerConnection, topic: str) -> dict[int, list[tuple[str, int]]]:
    """``{queue: [(key, seq), ...]}`` of a whole topic, in queue order, decoded from the bodies."""
    count = conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic)).queue_count
    out = {}
    for queue_id in range(count):
        bodies = pull_all(conn, topic, queue_id).column("body").to_pylist()
        out[queue_id] = [(e["key"], e["seq"]) for e in map(json.loads, bodies)]
    return out


def by_key(events) -> dict[str, list[int]]:
    """``{key: [seq, ...]}`` in the order given."""
    out: dict[str, list[int]] = defaultdict(list)
    for key, seq in events:
        out[key].append(seq)
    return dict(out)


def rows_by_key(rows) -> dict[str, list[int]]:
    """Spark rows with a JSON ``body``, ordered by (queue, offset), as ``{key: [seq, ...]}``."""
    ordered = sorted(rows, key=lambda r: (r["topic"], r["queue_id"], r["queue_offset"]))
    return by_key((json.loads(r["body"])["key"], json.loads(r["body"])["seq"]) for r in ordered)


def committed(conn: BrokerConnection, group: str, topic: str) -> dict[int, int]:
    count = conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic)).queue_count
    return {
        q: conn.call("GetOffset", pb.GetOffsetRequest(group=group, topic=topic, queue_id=q)).offset
        for q in range(count)
    }

