"""What a consumer group's RocketMQ consumers hold of one queue: the pop model over our offsets.

RocketMQ 5 consumers receive messages, which stay invisible to the group for a while, and ack
them one by one; an unacked message becomes visible again and is delivered again. We keep that
per (group, topic, queue) in memory, on top of the group's committed offset: everything below
``committed`` is acked, ``next_offset`` is the first offset never delivered, and in between each
offset is in flight or acked. The committed offset moves when the acked offsets above it are
contiguous, so a restart (which forgets this state) delivers again only what was not acked.

Every group is FIFO, as in orderlymq: a queue delivers nothing new while any of its messages is
in flight and invisible, so a message (of a key, and of the queue) reaches a consumer only after
the previous one was acked or its invisibility ran out; redeliveries go out first, in offset order.

Not thread-safe on its own: the caller holds ``lock`` around each use. Times are ms, given by the
caller, so lease and invisibility rules are tested without waiting.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

__all__ = ["InFlight", "QueueDeliveries"]


@dataclass
class InFlight:
    attempt: int  # 1 for the first delivery
    client_id: str
    visible_at_ms: int
    auto_renew: bool  # a push consumer's: kept invisible while its client heartbeats


@dataclass
class QueueDeliveries:
    committed: int
    epoch: int  # the lock epoch this state was built under; receipts of another are refused
    stored: int = -1  # the committed offset as the offset store has it (-1: never committed)
    held_epoch: int = 0  # the lock epoch held now: a lapsed lock taken back keeps this state
    next_offset: int = -1
    in_flight: dict[int, InFlight] = field(default_factory=dict)
    acked: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.next_offset = max(self.next_offset, self.committed)
        self.held_epoch = self.held_epoch or self.epoch

    def blocked(self, now_ms: int) -> bool:
        """FIFO: the queue waits while a delivered message is still invisible (unacked)."""
        return any(f.visible_at_ms > now_ms for f in self.in_flight.values())

    def due(self, now_ms: int) -> list[int]:
        """Offsets delivered before whose invisibility ran out, in offset order."""
        return sorted(o for o, f in self.in_flight.items() if f.visible_at_ms <= now_ms)

    def deliver(self, offset: int, client_id: str, visible_at_ms: int, auto_renew: bool) -> int:
        """Hand ``offset`` to ``client_id`` until ``visible_at_ms``; returns the delivery attempt."""
        earlier = self.in_flight.get(offset)
        attempt = earlier.attempt + 1 if earlier else 1
        self.in_flight[offset] = InFlight(attempt, client_id, visible_at_ms, auto_renew)
        self.next_offset = max(self.next_offset, offset + 1)
        return attempt

    def skip(self, offset: int) -> None:
        """An offset the group's filter leaves out: done without delivery."""
        self.in_flight.pop(offset, None)
        self.next_offset = max(self.next_offset, offset + 1)
        self._mark_acked(offset)

    def jump(self, offset: int) -> None:
        """Retention removed everything below ``offset``: forget it, as if it had been acked."""
        for earlier in [o for o in self.in_flight if o < offset]:
            del self.in_flight[earlier]
        self.acked = {o for o in self.acked if o >= offset}
        self.committed = max(self.committed, offset)
        self.next_offset = max(self.next_offset, offset)
        self._advance()

    def holds(self, offset: int, attempt: int) -> bool:
        current = self.in_flight.get(offset)
        return current is not None and current.attempt == attempt

    def ack(self, offset: int, attempt: int) -> bool:
        """Ack one delivery; False when it is not the current delivery of an in-flight offset."""
        if not self.holds(offset, attempt):
            return False
        del self.in_flight[offset]
        self._mark_acked(offset)
        return True

    def change_invisible(self, offset: int, attempt: int, visible_at_ms: int) -> bool:
        if not self.holds(offset, attempt):
            return False
        self.in_flight[offset].visible_at_ms = visible_at_ms
        self.in_flight[offset].auto_renew = False
        return True

    def renew(self, client_id: str, visible_at_ms: int) -> None:
        """Keep a live push consumer's auto-renewed messages invisible."""
        for f in self.in_flight.values():
            if f.auto_renew and f.client_id == client_id:
                f.visible_at_ms = max(f.visible_at_ms, visible_at_ms)

    def release(self, client_id: str, now_ms: int) -> int:
        """A client left: its messages are visible again now. Returns how many."""
        released = 0
        for f in self.in_flight.values():
            if f.client_id == client_id and f.visible_at_ms > now_ms:
                f.visible_at_ms = now_ms
                released += 1
        return released

    def _mark_acked(self, offset: int) -> None:
        if offset >= self.committed:
            self.acked.add(offset)
        self._advance()

    def _advance(self) -> None:
        while self.committed in self.acked:
            self.acked.discard(self.committed)
            self.committed += 1
