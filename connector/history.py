"""A history of what producers sent and consumers received, and the one strict checker of it.

Every test, the demo and the benchmarks judge delivery with this module (users may too, on their
own pipelines). Deliveries are judged in the order they were emitted, never sorted first.

Every message carries its sharding key and a per-key sequence number 0, 1, 2, ... in send order.
A ``History`` records each send (acknowledged or not: a send whose outcome is unknown, such as
one cut off by a broker crash, may or may not have been stored) and each delivery, in the order
consumers saw them. ``check`` then judges the whole history, per key:

- **lost**: an acknowledged send never delivered;
- **duplicated**: a delivery of a (key, seq) delivered before (at-least-once consumers redeliver
  what they had not committed when they crashed or lost their queue);
- **out of order**: a delivery that breaks the key's order, either *late* (a sequence number
  delivered for the first time after a greater one of its key) or a *skipping replay* (a
  redelivery run that jumps over a message it had delivered before, so the consumer sees a
  later message right after an earlier one twice over);
- **unexpected**: a delivery of something never sent (corruption, or a message of another run).

A gap in a key's sequence is fine where the missing sends were never acknowledged (they were
never stored); a gap at an acknowledged send counts once, as lost. A redelivery may restart at
any message delivered before (a replay from the committed offset): that is a duplicate, not a
reordering, as long as the replay then follows the key's order.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

__all__ = ["Delivery", "History", "Send", "Verdict", "check", "check_keyed"]

_EXAMPLES = 10


@dataclass(frozen=True)
class Send:
    """One message sent: its key, its sequence number within the key, whether it was acknowledged."""

    key: str
    seq: int
    acked: bool


@dataclass(frozen=True)
class Delivery:
    """One message handed to a consumer (``consumer``, ``queue_id``, ``offset`` only explain examples)."""

    key: str
    seq: int
    consumer: str = ""
    queue_id: int = -1
    offset: int = -1

    def where(self) -> str:
        by = f" by {self.consumer}" if self.consumer else ""
        at = f" at {self.queue_id}@{self.offset}" if self.queue_id >= 0 else ""
        return f"{by}{at}"


@dataclass
class Verdict:
    """What ``check`` found: the history's sizes and the four counts, with a few examples."""

    sends: int
    acked: int
    deliveries: int
    distinct_delivered: int
    keys: int
    lost: int
    duplicated: int
    out_of_order: int
    unexpected: int
    examples: list[str] = field(default_factory=list)
    lost_messages: list[tuple[str, int]] = field(default_factory=list)

    @property
    def unacked(self) -> int:
        return self.sends - self.acked

    @property
    def ok(self) -> bool:
        """No loss, no duplicate, nothing out of order, nothing unexpected."""
        return not (self.lost or self.duplicated or self.out_of_order or self.unexpected)

    def counts(self) -> dict[str, int]:
        return {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "out_of_order": self.out_of_order,
            "unexpected": self.unexpected,
        }

    def as_dict(self) -> dict:
        out = asdict(self)
        out["unacked"] = self.unacked
        out["lost_messages"] = [list(m) for m in self.lost_messages[:_EXAMPLES]]
        return out

    def line(self) -> str:
        """The history's sizes and the checker's counts on one line."""
        return (
            f"sends={self.sends} (acked {self.acked}, unacked {self.unacked}) deliveries={self.deliveries} "
            f"(distinct {self.distinct_delivered}, keys {self.keys}) lost={self.lost} "
            f"duplicated={self.duplicated} out_of_order={self.out_of_order} unexpected={self.unexpected}"
        )

    def __str__(self) -> str:
        return self.line() + "".join(f"\n  {e}" for e in self.examples)


class History:
    """A thread-safe record of sends and deliveries, in the order they happened."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sends: list[Send] = []
        self._deliveries: list[Delivery] = []

    def sent(self, key: str, seq: int, acked: bool) -> None:
        with self._lock:
            self._sends.append(Send(str(key), int(seq), bool(acked)))

    def delivered(self, key: str, seq: int, consumer: str = "", queue_id: int = -1, offset: int = -1) -> None:
        with self._lock:
            self._deliveries.append(Delivery(str(key), int(seq), consumer, queue_id, offset))

    def extend_deliveries(self, deliveries: Iterable[Delivery]) -> None:
        with self._lock:
            self._deliveries.extend(deliveries)

    @property
    def sends(self) -> list[Send]:
        with self._lock:
            return list(self._sends)

    @property
    def deliveries(self) -> list[Delivery]:
        with self._lock:
            return list(self._deliveries)

    def acked(self) -> set[tuple[str, int]]:
        with self._lock:
            return {(s.key, s.seq) for s in self._sends if s.acked}

    def delivered_all_acked(self) -> bool:
        """Whether every acknowledged send has been delivered at least once (a liveness probe)."""
        with self._lock:
            acked = {(s.key, s.seq) for s in self._sends if s.acked}
            if len(self._deliveries) < len(acked):
                return False
            return acked <= {(d.key, d.seq) for d in self._deliveries}

    def check(self) -> Verdict:
        return check(self.sends, self.deliveries)

    def dump(self, path) -> None:
        """Write the history as JSON (to inspect a failed run)."""
        with self._lock:
            data = {"sends": [asdict(s) for s in self._sends], "deliveries": [asdict(d) for d in self._deliveries]}
        with open(path, "w") as f:
            json.dump(data, f)


def check(sends: Iterable[Send], deliveries: Iterable[Delivery]) -> Verdict:
    """Judge a history (see the module docstring); ``deliveries`` in the order consumers saw them."""
    sends = list(sends)
    deliveries = list(deliveries)
    sent: dict[tuple[str, int], bool] = {}
    for s in sends:
        sent[(s.key, s.seq)] = sent.get((s.key, s.seq), False) or s.acked
    by_key: dict[str, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_key[d.key].append(d)
    examples: list[str] = []

    def example(text: str) -> None:
        if len(examples) < _EXAMPLES:
            examples.append(text)

    duplicated = out_of_order = unexpected = 0
    for key, runs in by_key.items():
        dup, ooo, unx = _check_key(key, runs, sent, example)
        duplicated, out_of_order, unexpected = duplicated + dup, out_of_order + ooo, unexpected + unx
    delivered = {(d.key, d.seq) for d in deliveries}
    lost_messages = sorted(m for m, acked in sent.items() if acked and m not in delivered)
    for key, seq in lost_messages[:3]:
        example(f"key {key!r}: seq {seq} was acknowledged but never delivered")
    return Verdict(
        sends=len(sends),
        acked=sum(sent.values()),
        deliveries=len(deliveries),
        distinct_delivered=len(delivered),
        keys=len({s.key for s in sends} | set(by_key)),
        lost=len(lost_messages),
        duplicated=duplicated,
        out_of_order=out_of_order,
        unexpected=unexpected,
        examples=examples,
        lost_messages=lost_messages,
    )


def check_keyed(expected: Mapping[str, int], delivered: Iterable[tuple[str, int]]) -> Verdict:
    """Judge deliveries of ``(key, seq)`` in emission order against ``expected[key]`` acknowledged
    sends numbered ``0 .. expected[key] - 1``: the common case of a test that sent every message."""
    sends = [Send(str(key), seq, True) for key, count in expected.items() for seq in range(count)]
    return check(sends, [Delivery(str(key), int(seq)) for key, seq in delivered])


def _check_key(key: str, deliveries: list[Delivery], sent: dict[tuple[str, int], bool], example) -> tuple[int, ...]:
    """Duplicates, out-of-order and unexpected deliveries of one key."""
    existing = sorted({d.seq for d in deliveries})  # the key's messages known to be stored

    def successor(seq: int) -> int | None:
        i = bisect.bisect_right(existing, seq)
        return existing[i] if i < len(existing) else None

    duplicated = out_of_order = unexpected = 0
    seen: set[int] = set()
    last: int | None = None  # the previous delivery in the key's current run
    highest = -1
    for d in deliveries:
        if (key, d.seq) not in sent:
            unexpected += 1
            example(f"key {key!r}: seq {d.seq} delivered{d.where()} but never sent")
        if d.seq in seen:
            duplicated += 1
            if last is not None and d.seq > last and d.seq != successor(last):
                out_of_order += 1
                example(f"key {key!r}: redelivery of seq {d.seq}{d.where()} right after {last}, skipping "
                        f"{successor(last)}")
            last = d.seq
        elif d.seq < highest:
            out_of_order += 1
            seen.add(d.seq)
            example(f"key {key!r}: seq {d.seq} delivered{d.where()} after {highest}")
        else:
            if last is not None and last < highest:
                out_of_order += 1
                example(f"key {key!r}: seq {d.seq} delivered{d.where()} right after {last}, before the replay "
                        f"reached {highest}")
            seen.add(d.seq)
            highest = last = d.seq
    return duplicated, out_of_order, unexpected
