"""Raw-RPC helpers for the Spark tests: create topics, produce keyed events, read queues back,
and judge what came out with the one strict checker, ``connector.history``.

They use the wire layer only (``BrokerConnection`` + ``pb`` + ``codec``) and route with the one
routing function, so the tests check the connector against the broker and nothing else. Rows and
stored messages are judged in the order they were emitted (a topic: queue by queue in queue
order; a stream: batch by batch in the order the batch's rows came out), never sorted first.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict

from broker.wire import codec
from broker.wire.routing import queue_for_key
from connector.client.connection import BrokerConnection, pb
from connector.history import Delivery, Send, Verdict, check
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


def row_events(rows) -> list[tuple[str, int]]:
    """The ``(key, seq)`` of Spark rows with a JSON ``body``, in the order given (never sorted)."""
    return [(body["key"], body["seq"]) for body in (json.loads(r["body"]) for r in rows)]


def judge(expected, delivered) -> Verdict:
    """``connector.history.check`` of ``delivered`` ``(key, seq)`` in emission order against the
    acknowledged sends ``expected``."""
    return check([Send(key, seq, True) for key, seq in expected], [Delivery(key, seq) for key, seq in delivered])


def assert_delivered(expected, delivered) -> Verdict:
    """Every event of ``expected`` delivered once, each key in order (emission order)."""
    verdict = judge(list(expected), list(delivered))
    assert verdict.ok and verdict.deliveries == verdict.acked, str(verdict)
    return verdict


def topic_delivered(out: dict[int, list[tuple[str, int]]]) -> list[tuple[str, int]]:
    """The events of ``topic_events`` queue by queue, each queue in queue order."""
    return [event for _, events in sorted(out.items()) for event in events]


def committed(conn: BrokerConnection, group: str, topic: str) -> dict[int, int]:
    count = conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic)).queue_count
    return {
        q: conn.call("GetOffset", pb.GetOffsetRequest(group=group, topic=topic, queue_id=q)).offset
        for q in range(count)
    }


def queue_ends(conn: BrokerConnection, topic: str, queues: int) -> dict[int, int]:
    """Where each of the first ``queues`` queues of ``topic`` ends now."""
    request = pb.QueryOffsetsRequest
    return {q: conn.call("QueryOffsets", request(topic=topic, queue_id=q)).max_offset for q in range(queues)}


class Collector:
    """A foreachBatch sink keeping each batch's rows by batch id (a replayed batch replaces itself).

    ``before(batch_id)``, when given, runs before the batch is read (the DataFrame is lazy): a
    test injects its fault there, between the planning of a batch and the reading of it.
    """

    def __init__(self, before=None):
        self.batches: dict[int, list] = {}
        self._lock = threading.Lock()
        self._before = before

    def __call__(self, df, batch_id):
        if self._before is not None:
            self._before(batch_id)
        rows = df.collect()
        with self._lock:
            self.batches[batch_id] = rows

    def rows(self):
        with self._lock:
            return [row for _, rows in sorted(self.batches.items()) for row in rows]


def stream(ospark, broker, topic, group, **options):
    reader = ospark.readStream.format("orderlymq").option("brokers", broker.address).option("topic", topic)
    reader = reader.option("consumerGroup", group).option("pollTimeoutMs", "5000")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def run_available_now(df, checkpoint, collector):
    query = df.writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
    query = query.trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def route_each_batch_alone(monkeypatch) -> None:
    """Have sink tasks route each input batch as it comes instead of gathering up to 4 MiB: with a
    ``maxBatchBytes`` smaller than a batch, a test then knows the sends each of its batches makes
    before the next batch is asked for."""
    from connector.spark import writer

    monkeypatch.setattr(writer, "_ROUTE_BYTES", 1)
