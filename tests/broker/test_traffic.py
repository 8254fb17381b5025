"""``Traffic``: per-message metrics recorded by many threads at once lose nothing, and read as
prometheus_client's own counters and histogram would for the same records."""

from __future__ import annotations

import random
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import _LATENCY_BUCKETS, METRICS
from broker.traffic import _BATCH, Traffic


def _samples(registry: CollectorRegistry) -> dict[tuple, float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _records(seed: int, count: int, latencies: list[float]):
    """``count`` records, the same for the same seed: (way, topic, queue id, messages, bytes, method, seconds)."""
    rng = random.Random(seed)
    for _ in range(count):
        topic, queue_id, messages, size = rng.choice("ab"), rng.randrange(3), rng.randrange(1, 5), rng.randrange(99)
        yield "in" if rng.random() < 0.5 else "out", topic, queue_id, messages, size, rng.choice(("Send", "Pull")), \
            rng.choice(latencies)


def test_records_of_many_threads_add_up_to_what_prometheus_counts_while_scrapes_run():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    traffic = Traffic(METRICS, _LATENCY_BUCKETS)
    ours.register(traffic)
    labels = ("topic", "queue")
    counters = {name: Counter(name.removesuffix("_total"), METRICS[name], labels, registry=theirs)
                for name in ("orderlymq_messages_in_total", "orderlymq_bytes_in_total",
                             "orderlymq_messages_out_total", "orderlymq_bytes_out_total")}
    histogram = Histogram("orderlymq_rpc_duration_seconds", METRICS["orderlymq_rpc_duration_seconds"], ("method",),
                          buckets=_LATENCY_BUCKETS, registry=theirs)
    # every bound itself (a bucket counts what is <= its bound), values between and beyond them
    latencies = [*_LATENCY_BUCKETS, 0.0, 0.0003, 0.007, 0.3, 31.0, 1e-9]
    per_thread, threads = 3 * _BATCH + 17, 6
    done = threading.Event()

    def record(seed: int) -> None:
        for way, topic, queue_id, messages, size, method, seconds in _records(seed, per_thread, latencies):
            (traffic.stored if way == "in" else traffic.served)(topic, queue_id, messages, size)
            traffic.rpc_took(method, seconds)

    def scrape_meanwhile() -> None:
        while not done.is_set():
            generate_latest(ours)

    scraper = threading.Thread(target=scrape_meanwhile)
    scraper.start()
    workers = [threading.Thread(target=record, args=(seed,)) for seed in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    scraper.join()
    for seed in range(threads):  # the same records, into prometheus_client's own metrics
        for way, topic, queue_id, messages, size, method, seconds in _records(seed, per_thread, latencies):
            counters[f"orderlymq_messages_{way}_total"].labels(topic, str(queue_id)).inc(messages)
            counters[f"orderlymq_bytes_{way}_total"].labels(topic, str(queue_id)).inc(size)
            histogram.labels(method).observe(seconds)
    expected = _samples(theirs)
    assert expected[("orderlymq_rpc_duration_seconds_count", (("method", "Send"),))] > 0
    assert _samples(ours) == pytest.approx(expected, rel=1e-12)  # sums added in another order
    traffic.served("empty", 0, 0, 0)  # a pull that found nothing, as prometheus_client was never told of it
    assert not any(("topic", "empty") in labels for _, labels in _samples(ours))
