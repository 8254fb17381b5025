"""``Traffic``: the broker's per-message metrics (messages and bytes in and out per queue, RPC
latency per method), recorded for the price of a ``deque.append`` and added up in batches.

A synchronous send records two of them. As prometheus_client counters and histograms (a lock per
value, a walk of the buckets) they cost 4.8 µs a send here, about a twentieth of its whole round
trip; as appends, a fraction of a microsecond. ``deque.append`` and ``popleft`` are atomic, so
threads record without a lock and nothing recorded is lost: whoever finds ``_BATCH`` records
waiting, and every scrape, adds them up under the lock.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["Traffic"]

_BATCH = 1024  # records waiting before the recording thread adds them up: bounds their memory


class Traffic(Collector):
    """Counts recorded by any thread, exposed at each scrape under the names of ``docs``."""

    def __init__(self, docs: dict[str, str], latency_buckets: Sequence[float]) -> None:
        self._docs = docs
        self._bounds = tuple(latency_buckets)
        self._records: deque[tuple] = deque()
        self._lock = threading.Lock()
        # added up so far: per (topic, queue id) [messages, bytes]; per method [count per bucket..., sum]
        self._in: defaultdict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        self._out: defaultdict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        self._latency: dict[str, list[float]] = {}

    def stored(self, topic: str, queue_id: int, messages: int, nbytes: int) -> None:
        self._record((self._in, (topic, queue_id), messages, nbytes))

    def served(self, topic: str, queue_id: int, messages: int, nbytes: int) -> None:
        if messages:  # an empty pull (a long poll's, mostly) makes no series
            self._record((self._out, (topic, queue_id), messages, nbytes))

    def rpc_took(self, method: str, seconds: float) -> None:
        self._record((None, method, seconds, 0))

    def _record(self, record: tuple) -> None:
        records = self._records
        records.append(record)
        if len(records) >= _BATCH:
            self._add_up()

    def _add_up(self) -> None:
        with self._lock:
            records, latency, bounds = self._records, self._latency, self._bounds
            for _ in range(len(records)):  # what came before: later records wait for the next time
                totals, key, first, second = records.popleft()
                if totals is None:  # a latency: its bucket (le, as Prometheus counts), then the sum
                    counts = latency.get(key)
                    if counts is None:
                        counts = latency[key] = [0] * (len(bounds) + 2)
                    counts[bisect.bisect_left(bounds, first)] += 1
                    counts[-1] += first
                else:
                    pair = totals[key]
                    pair[0] += first
                    pair[1] += second

    def describe(self) -> list:
        return []  # computed per scrape: nothing to check at registration

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        self._add_up()
        with self._lock:
            queues = [(name, sorted(totals.items())) for name, totals in (("in", self._in), ("out", self._out))]
            latency = {method: list(counts) for method, counts in self._latency.items()}
        for direction, totals in queues:
            messages, nbytes = (self._counter(f"orderlymq_{what}_{direction}_total", ("topic", "queue"))
                                for what in ("messages", "bytes"))
            for (topic, queue_id), (count, size) in totals:
                messages.add_metric((topic, str(queue_id)), count)
                nbytes.add_metric((topic, str(queue_id)), size)
            yield from (messages, nbytes)
        name = "orderlymq_rpc_duration_seconds"
        histogram = HistogramMetricFamily(name, self._docs[name], labels=("method",))
        les = [*map(floatToGoString, self._bounds), "+Inf"]
        for method, counts in sorted(latency.items()):
            cumulative, running = [], 0
            for le, count in zip(les, counts[:-1], strict=True):
                running += count
                cumulative.append((le, running))
            histogram.add_metric((method,), cumulative, counts[-1])
        yield histogram

    def _counter(self, name: str, labels: Sequence[str]) -> CounterMetricFamily:
        return CounterMetricFamily(name.removesuffix("_total"), self._docs[name], labels=labels)
