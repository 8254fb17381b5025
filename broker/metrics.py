"""Prometheus metrics of one broker.

Two kinds, on one registry per broker (so several brokers in one process never mix):

- **traffic**, recorded as it happens: messages and bytes in and out per queue, RPC latency per
  method (those per message, ``broker.traffic``), failed RPCs per method and status, open send
  streams;
- **state**, read when Prometheus scrapes (nothing on the hot path): each queue's offsets and
  stored bytes, each consumer group's committed offset and lag per queue, queue lock holders with
  their epoch and remaining lease, consumers per group, open transactions.

Every name is listed in ``METRICS`` (documented in docs/observability.md). ``serve`` exposes the
registry over HTTP at ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.security.guard import AccessGuard
from broker.security.http import ReloadingSslContext, serve_http
from broker.traffic import Traffic

__all__ = ["METRICS", "BrokerMetrics"]

disable_created_metrics()  # no "*_created" series: they double the series count and nobody graphs them

_QUEUE = ("topic", "queue")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

METRICS = {
    "orderlymq_messages_in_total": "messages stored, per queue",
    "orderlymq_bytes_in_total": "Arrow bytes stored, per queue",
    "orderlymq_messages_out_total": "messages served by Pull, per queue",
    "orderlymq_bytes_out_total": "Arrow bytes served by Pull, per queue",
    "orderlymq_rpc_duration_seconds": "RPC latency per method (histogram; SendStream per request)",
    "orderlymq_rpc_errors_total": "failed RPCs per method and gRPC status",
    "orderlymq_send_streams_open": "SendStream calls open now",
    "orderlymq_queue_min_offset": "earliest offset still stored, per queue",
    "orderlymq_queue_max_offset": "next offset to be written, per queue",
    "orderlymq_queue_stored_bytes": "bytes of the queue's segment files",
    "orderlymq_group_committed_offset": "a consumer group's committed offset, per queue",
    "orderlymq_group_lag_messages": "max offset minus the group's committed offset, per queue",
    "orderlymq_lock_epoch": "fencing epoch of a held queue lock (label client_id: the holder)",
    "orderlymq_lock_lease_remaining_seconds": "time until a held queue lock expires unless renewed",
    "orderlymq_group_consumers": "live consumers (heartbeating) per group",
    "orderlymq_transactions_open": "transactions begun and not yet committed or aborted",
    "orderlymq_transactions_kept_file_bytes": "bytes of finished transactions' staged files kept for reuse",
    "orderlymq_segment_files_open": "segment files open now",
    "orderlymq_segment_files_budget": "segment files kept open at most (half the open-file limit); idle ones close",
    "orderlymq_page_cache_dropped_bytes_total": "bytes of log on disk freed from the page cache by its drops (page_cache_bytes)",
    "orderlymq_loop_busy_poll_seconds_total": "time the event loop spent polling for the next send instead of "
                                              "sleeping (busy_poll_us): a CPU all the while",
}


class BrokerState(Protocol):
    """What the state collector reads: the broker service's parts (see ``broker.server``)."""

    store: object
    offsets: object
    locks: object
    members: object
    txns: object


class BrokerMetrics:
    """The metrics of one broker service; ``serve(port)`` exposes them."""

    def __init__(self, state: BrokerState) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        doc = METRICS
        self.traffic = Traffic(doc, _LATENCY_BUCKETS)  # messages, bytes and latencies: recorded per message
        self.rpc_errors = Counter(
            "orderlymq_rpc_errors", doc["orderlymq_rpc_errors_total"], ("method", "code"), registry=self.registry
        )
        self.send_streams = Gauge(
            "orderlymq_send_streams_open", doc["orderlymq_send_streams_open"], registry=self.registry
        )
        self.loop_busy_poll = Counter(
            "orderlymq_loop_busy_poll_seconds", doc["orderlymq_loop_busy_poll_seconds_total"], registry=self.registry
        )
        self.registry.register(self.traffic)
        self.registry.register(_StateCollector(state))
        self._http = None
        self.stored = self.traffic.stored  # (topic, queue_id, messages, nbytes): called per send and pull
        self.served = self.traffic.served

    def rpc_done(self, method: str, started: float, code: str | None = None) -> None:
        """Record one RPC that began at ``started`` (``time.perf_counter()``); ``code`` when it failed."""
        self.traffic.rpc_took(method, time.perf_counter() - started)
        if code is not None:
            self.rpc_errors.labels(method, code).inc()

    def loop_polled(self, seconds: float) -> None:
        self.loop_busy_poll.inc(seconds)

    def serve(self, port: int, host: str = "127.0.0.1", *, tls: ReloadingSslContext | None = None,
              guard: AccessGuard | None = None) -> int:
        """Serve ``/metrics`` on ``host:port`` (0 picks a free port); returns the port. With ``tls``
        over HTTPS; with ``guard`` to users allowed to (``broker.security.http``)."""
        server = serve_http(make_wsgi_app(self.registry), host, port, tls=tls, guard=guard)
        self._http = server
        return server.server_port

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _StateCollector(Collector):
    """Gauges of the broker's state, computed at scrape time."""

    def __init__(self, state: BrokerState) -> None:
        self._state = state

    def describe(self) -> list:
        return []  # computed per scrape: nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self._queues()
        yield from self._groups()
        yield from self._locks()
        consumers = _gauge("orderlymq_group_consumers", ("group",))
        for group in self._state.members.groups():
            consumers.add_metric((group,), len(self._state.members.consumers(group)))
        yield consumers
        open_txns = _gauge("orderlymq_transactions_open", ())
        open_txns.add_metric((), self._state.txns.open_count())
        yield open_txns
        kept = _gauge("orderlymq_transactions_kept_file_bytes", ())
        kept.add_metric((), self._state.txns.kept_file_bytes())
        yield kept
        files = self._state.store.open_files
        for name, value in (("orderlymq_segment_files_open", len(files)),
                            ("orderlymq_segment_files_budget", files.budget)):
            gauge = _gauge(name, ())
            gauge.add_metric((), value)
            yield gauge
        window = self._state.store.page_cache
        if window is not None:
            name = "orderlymq_page_cache_dropped_bytes_total"
            yield CounterMetricFamily(name.removesuffix("_total"), METRICS[name], value=window.dropped_bytes)

    def _queue_logs(self):
        store = self._state.store
        for topic, count in sorted(store.topics().items()):
            for queue_id in range(count):
                yield topic, queue_id, store.queue(topic, queue_id)

    def _queues(self) -> Iterator[GaugeMetricFamily]:
        low, high, size = (
            _gauge(n, _QUEUE)
            for n in ("orderlymq_queue_min_offset", "orderlymq_queue_max_offset", "orderlymq_queue_stored_bytes")
        )
        for topic, queue_id, log in self._queue_logs():
            labels = (topic, str(queue_id))
            low.add_metric(labels, log.min_offset)
            high.add_metric(labels, log.max_offset)
            size.add_metric(labels, log.size_bytes)
        yield from (low, high, size)

    def _groups(self) -> Iterator[GaugeMetricFamily]:
        committed = _gauge("orderlymq_group_committed_offset", ("group", *_QUEUE))
        lag = _gauge("orderlymq_group_lag_messages", ("group", *_QUEUE))
        store, offsets = self._state.store, self._state.offsets
        topics = store.topics()
        for group in offsets.groups():
            for topic in sorted(topics):
                for queue_id, offset in offsets.group_offsets(group, topic).items():
                    if queue_id >= topics[topic]:
                        continue
                    labels = (group, topic, str(queue_id))
                    committed.add_metric(labels, offset)
                    lag.add_metric(labels, max(0, store.queue(topic, queue_id).max_offset - offset))
        yield from (committed, lag)

    def _locks(self) -> Iterator[GaugeMetricFamily]:
        labels = ("group", *_QUEUE, "client_id")
        epoch = _gauge("orderlymq_lock_epoch", labels)
        lease = _gauge("orderlymq_lock_lease_remaining_seconds", labels)
        for group, info in self._state.locks.all_holders():
            values = (group, info.topic, str(info.queue_id), info.client_id)
            epoch.add_metric(values, info.epoch)
            lease.add_metric(values, info.expires_in_ms / 1000)
        yield from (epoch, lease)


def _gauge(name: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, METRICS[name], labels=list(labels))
