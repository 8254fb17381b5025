"""Queue allocation strategies for clustering consumers: pure functions, no I/O.

Every member of a group computes its share from the same inputs (all queues, all live client ids),
so the shares are disjoint and cover every queue without any coordination beyond the member list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["ALLOCATORS", "AllocateStrategy", "allocate_averagely", "allocate_by_circle"]

Q = TypeVar("Q")
AllocateStrategy = Callable[[Sequence[Q], Sequence[str], str], list[Q]]


def allocate_averagely(queues: Sequence[Q], client_ids: Sequence[str], client_id: str) -> list[Q]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous ranges of the sorted queues.

    With ``q`` queues and ``c`` clients, the first ``q % c`` clients (in sorted id order) get
    ``q // c + 1`` queues and the others ``q // c``; with more clients than queues, the extra
    clients get none. A client not in ``client_ids`` gets none.
    """
    all_queues = sorted(queues)
    clients = sorted(set(client_ids))
    if client_id not in clients or not all_queues:
        return []
    index = clients.index(client_id)
    n, c = len(all_queues), len(clients)
    mod = n % c
    if n <= c:
        size = 1
    elif mod > 0 and index < mod:
        size = n // c + 1
    else:
        size = n // c
    start = index * size if mod > 0 and index < mod else index * size + mod
    count = min(size, n - start)
    return [all_queues[(start + i) % n] for i in range(max(0, count))]


def allocate_by_circle(queues: Sequence[Q], client_ids: Sequence[str], client_id: str) -> list[Q]:
    """RocketMQ's AllocateMessageQueueAveragelyByCircle: queue ``i`` goes to client ``i % c``."""
    all_queues = sorted(queues)
    clients = sorted(set(client_ids))
    if client_id not in clients:
        return []
    index = clients.index(client_id)
    return [q for i, q in enumerate(all_queues) if i % len(clients) == index]


ALLOCATORS: dict[str, AllocateStrategy] = {"averagely": allocate_averagely, "circle": allocate_by_circle}
