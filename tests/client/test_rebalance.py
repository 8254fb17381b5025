"""Allocation strategies: pure functions, checked against RocketMQ's examples and by property."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from connector.client import MessageQueue, allocate_averagely, allocate_by_circle


def queues(n: int) -> list[MessageQueue]:
    return [MessageQueue("t", i) for i in range(n)]


def ids(shares: list[list[MessageQueue]]) -> list[list[int]]:
    return [[q.queue_id for q in share] for share in shares]


def test_averagely_gives_contiguous_ranges_larger_first():
    clients = ["c1", "c2", "c3"]
    shares = [allocate_averagely(queues(8), clients, c) for c in clients]
    assert ids(shares) == [[0, 1, 2], [3, 4, 5], [6, 7]]


def test_averagely_sorts_client_ids_and_queues():
    clients = ["b", "a"]
    shuffled = [MessageQueue("t", i) for i in (3, 0, 2, 1)]
    assert ids([allocate_averagely(shuffled, clients, "a"), allocate_averagely(shuffled, clients, "b")]) == [
        [0, 1],
        [2, 3],
    ]


def test_more_clients_than_queues_leaves_extra_clients_idle():
    clients = ["c1", "c2", "c3", "c4"]
    assert ids([allocate_averagely(queues(2), clients, c) for c in clients]) == [[0], [1], [], []]


def test_unknown_client_gets_nothing():
    assert allocate_averagely(queues(4), ["c1"], "c2") == []
    assert allocate_by_circle(queues(4), ["c1"], "c2") == []


def test_circle_deals_queues_in_turn():
    clients = ["c1", "c2", "c3"]
    assert ids([allocate_by_circle(queues(8), clients, c) for c in clients]) == [[0, 3, 6], [1, 4, 7], [2, 5]]


@given(
    n=st.integers(min_value=0, max_value=64),
    clients=st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=12, unique=True),
)
def test_every_queue_goes_to_exactly_one_client(n, clients):
    for strategy in (allocate_averagely, allocate_by_circle):
        shares = [strategy(queues(n), clients, c) for c in clients]
        flat = [q for share in shares for q in share]
        assert sorted(flat) == queues(n)
        sizes = [len(s) for s in shares]
        assert max(sizes) - min(sizes) <= 1
