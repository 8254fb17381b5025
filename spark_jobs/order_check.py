"""Per-key order and exactly-once check of a consumed stream.

Every key's messages carry a sequence number 0, 1, 2, ... in produce order. ``OrderChecker``
takes consumed (key, seq) pairs in consumption order and counts, per key: in order (seq is the
next expected), duplicates (a seq seen before) and out of order (a seq ahead of the next
expected: an earlier one is missing or late). ``lost`` compares with what was produced.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

__all__ = ["OrderChecker", "OrderReport"]


@dataclass
class OrderReport:
    consumed: int
    keys: int
    in_order: int
    duplicates: int
    out_of_order: int
    lost: int
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.duplicates == 0 and self.out_of_order == 0 and self.lost == 0


class OrderChecker:
    def __init__(self) -> None:
        self.next_seq: dict[str, int] = defaultdict(int)
        self.seen: dict[str, set[int]] = defaultdict(set)
        self.consumed = self.in_order = self.duplicates = self.out_of_order = 0
        self.examples: list[str] = []

    def _example(self, text: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(text)

    def add(self, key: str, seq: int) -> None:
        self.consumed += 1
        seen = self.seen[key]
        if seq in seen:
            self.duplicates += 1
            self._example(f"key {key}: seq {seq} consumed twice")
            return
        seen.add(seq)
        expected = self.next_seq[key]
        if seq == expected:
            self.in_order += 1
            while self.next_seq[key] in seen:
                self.next_seq[key] += 1
        else:
            self.out_of_order += 1
            self._example(f"key {key}: seq {seq} arrived while {expected} was expected")

    def report(self, produced: dict[str, int]) -> OrderReport:
        """``produced`` maps each key to how many messages were produced for it."""
        lost = sum(max(0, n - len(self.seen.get(k, ()))) for k, n in produced.items())
        return OrderReport(self.consumed, len(self.seen), self.in_order, self.duplicates, self.out_of_order, lost,
                           list(self.examples))
