"""One look at a broker, as plain JSON-ready data: what the console page shows at a refresh.

Built only from ``Admin`` calls (the wire API), so it works against any broker it can reach. Lag
follows ``Admin.consumer_progress``: messages stored after the group's committed offset, or every
stored message of a queue the group never committed.
"""

from __future__ import annotations

import time
from typing import Any

from connector.client.admin import Admin, GroupState, QueueStatus

__all__ = ["take_snapshot"]


def take_snapshot(admin: Admin, address: str) -> dict[str, Any]:
    """Health, topics with queue offsets, groups with lag per queue and locks, open transactions."""
    started = time.perf_counter()
    health = admin.health()
    rtt_ms = (time.perf_counter() - started) * 1000
    now_ms = int(time.time() * 1000)
    queues = {topic.name: admin.topic_status(topic.name) for topic in admin.list_topics()}
    return {
        "time_ms": now_ms,
        "broker": {**health, "address": address, "rtt_ms": round(rtt_ms, 2)},
        "topics": [_topic(name, statuses) for name, statuses in queues.items()],
        "groups": [_group(group, queues) for group in admin.groups()],
        "transactions": [
            {
                "txn_id": t.txn_id,
                "state": t.state,
                "idle_s": max(0.0, (now_ms - t.last_activity_ms) / 1000),
                "expires_in_s": max(0.0, (t.expires_at_ms - now_ms) / 1000) if t.expires_at_ms else None,
                "staged_bytes": t.staged_bytes,
            }
            for t in admin.open_transactions()
        ],
    }


def _topic(name: str, statuses: list[QueueStatus]) -> dict[str, Any]:
    return {
        "name": name,
        "queues": [{"queue_id": s.queue_id, "min_offset": s.min_offset, "max_offset": s.max_offset} for s in statuses],
        "max_offset_sum": sum(s.max_offset for s in statuses),  # grows by the messages stored: throughput
        "messages": sum(s.count for s in statuses),
    }


def _group(group: GroupState, queues: dict[str, list[QueueStatus]]) -> dict[str, Any]:
    committed = {(o.topic, o.queue_id): o for o in group.offsets}
    holders = {(h.topic, h.queue_id): h for h in group.locks}
    # Every queue of a topic the group works on: a queue it never committed lags by all it stores.
    topics = sorted({topic for topic, _ in (*committed, *holders) if topic in queues})
    rows = []
    for topic in topics:
        for status in queues[topic]:
            key = (topic, status.queue_id)
            offset = committed[key].offset if key in committed else -1
            start = offset if offset >= 0 else status.min_offset
            holder = holders.get(key)
            rows.append({
                "topic": topic,
                "queue_id": status.queue_id,
                "max_offset": status.max_offset,
                "committed": offset,
                "committed_by": committed[key].committed_by if key in committed else "",
                "lag": max(0, status.max_offset - start),
                "holder": holder.client_id if holder else "",
            })
    return {
        "name": group.name,
        "consumers": list(group.consumers),
        "queues": rows,
        "lag": sum(r["lag"] for r in rows),
        "locks": [
            {
                "topic": h.topic,
                "queue_id": h.queue_id,
                "client_id": h.client_id,
                "epoch": h.epoch,
                "lease_left_s": max(0.0, h.lease_left_ms / 1000),
            }
            for h in group.locks
        ],
    }
