"""Test helpers shared by the suites: raw RPC helpers (the broker subprocess is broker.launcher)."""

from __future__ import annotations

import pyarrow as pa

from broker.launcher import BrokerProcess  # noqa: F401 - re-exported for tests
from broker.wire import codec
from connector.client.connection import BrokerConnection, pb


class FakeClock:
    """An injectable millisecond clock that moves only when a test sets ``now``."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def send_rows(conn: BrokerConnection, topic: str, queue_id: int, rows: list[dict], **fields) -> pb.SendResponse:
    """Send message dicts as one batch with a raw Send RPC."""
    batch = codec.encode(codec.messages_to_batch(rows))
    return conn.call("Send", pb.SendRequest(topic=topic, queue_id=queue_id, batch=batch, **fields))


def pull_all(conn: BrokerConnection, topic: str, queue_id: int, offset: int = 0, **fields):
    """Every message of a queue from ``offset`` as a pyarrow Table (raw Pull RPCs)."""
    tables = []
    while True:
        resp = conn.call("Pull", pb.PullRequest(topic=topic, queue_id=queue_id, offset=offset, **fields))
        if resp.batches:
            tables.append(codec.decode_many(resp.batches))
        offset = resp.next_offset
        if offset >= resp.max_offset:
            return pa.concat_tables(tables) if tables else codec.empty_stored_table()
