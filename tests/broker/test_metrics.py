"""The broker's Prometheus endpoint, scraped over HTTP, against traffic the test made itself."""

from __future__ import annotations

import queue
import urllib.request
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import METRICS
from broker.proto import orderlymq_pb2_grpc as pb_grpc
from broker.storage.page_cache import CHUNK_BYTES
from broker.wire import codec
from connector.client.connection import BrokerConnection, pb
from tests.faults.tcp_proxy import TcpProxy
from tests.support import pull_all, scrape, send_rows, value, wait_until


def test_traffic_offsets_lag_and_locks_match_what_was_done(broker_factory, topic_name):
    broker = broker_factory(metrics_port=0)
    port = broker.metrics_port
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=2))
        send_rows(conn, topic_name, 0, [{"key": f"k{i}", "body": b"x" * 10} for i in range(30)])
        send_rows(conn, topic_name, 1, [{"key": "k", "body": b"y"}] * 5)
        pulled = pull_all(conn, topic_name, 0, max_messages=20)
        locked = conn.call("LockBatch", pb.LockBatchRequest(group="g", client_id="c1", topic=topic_name, queue_ids=[0]))
        conn.call(
            "CommitOffset",
            pb.CommitOffsetRequest(
                group="g", topic=topic_name, queue_id=0, offset=12, client_id="c1", epoch=locked.locked[0].epoch
            ),
        )
        with_error = None
        try:
            conn.call("Pull", pb.PullRequest(topic=topic_name, queue_id=7, offset=0), retry=False)
        except Exception as exc:  # noqa: BLE001 - the failure itself is what the metric must count
            with_error = exc
    assert pulled.num_rows == 30 and with_error is not None
    s = scrape(port)
    q0, q1 = {"topic": topic_name, "queue": "0"}, {"topic": topic_name, "queue": "1"}
    assert value(s, "orderlymq_messages_in_total", **q0) == 30
    assert value(s, "orderlymq_messages_in_total", **q1) == 5
    assert value(s, "orderlymq_messages_out_total", **q0) == 30
    assert value(s, "orderlymq_bytes_in_total", **q0) > 0
    assert value(s, "orderlymq_queue_max_offset", **q0) == 30
    assert value(s, "orderlymq_queue_min_offset", **q0) == 0
    assert value(s, "orderlymq_group_committed_offset", group="g", **q0) == 12
    assert value(s, "orderlymq_group_lag_messages", group="g", **q0) == 18
    holder = {"group": "g", "client_id": "c1", **q0}
    assert value(s, "orderlymq_lock_epoch", **holder) == locked.locked[0].epoch
    assert value(s, "orderlymq_lock_lease_remaining_seconds", **holder) > 0
    assert value(s, "orderlymq_rpc_duration_seconds_count", method="Send") == 2
    assert value(s, "orderlymq_rpc_errors_total", method="Pull", code="INVALID_ARGUMENT") == 1


def test_lag_follows_a_consumer_catching_up(broker_factory, topic_name):
    broker = broker_factory(metrics_port=0)
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        send_rows(conn, topic_name, 0, [{"key": "k", "body": b"x"}] * 10)
        q0 = {"group": "g", "topic": topic_name, "queue": "0"}
        lags = []
        for offset in (0, 4, 10):
            conn.call("CommitOffset", pb.CommitOffsetRequest(group="g", topic=topic_name, queue_id=0, offset=offset))
            lags.append(value(scrape(broker.metrics_port), "orderlymq_group_lag_messages", **q0))
    assert lags == [10, 6, 0]


def test_the_staged_files_kept_for_reuse_are_counted(broker_factory, topic_name):
    broker = broker_factory(metrics_port=0)
    assert value(scrape(broker.metrics_port), "orderlymq_transactions_kept_file_bytes") == 0
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="t"))
        send_rows(conn, topic_name, 0, [{"key": "k", "body": b"x" * 10_000}], txn_id="t")
        conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="t"))
    kept = list((Path(broker.config.data_dir) / "txns" / "staged").glob("free-*"))
    assert len(kept) == 1
    assert value(scrape(broker.metrics_port), "orderlymq_transactions_kept_file_bytes") == kept[0].stat().st_size


def test_log_dropped_from_the_page_cache_is_counted(broker_factory, topic_name):
    broker = broker_factory(metrics_port=0, page_cache_bytes=CHUNK_BYTES, flush_interval_ms=50)
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        for _ in range(3 * CHUNK_BYTES >> 20):  # 3 chunks and a little more: one chunk within the window
            send_rows(conn, topic_name, 0, [{"key": "k", "body": b"x" * 1024}] * 1024)

        def dropped() -> float:  # old log is dropped as new log is written: a message at each look
            send_rows(conn, topic_name, 0, [{"key": "k", "body": b"x"}])
            return value(scrape(broker.metrics_port), "orderlymq_page_cache_dropped_bytes_total")

        assert wait_until(lambda: dropped() == 2 * CHUNK_BYTES, timeout=30, interval=0.1), dropped()


def test_every_exposed_family_is_documented(broker_factory, topic_name):
    broker = broker_factory(metrics_port=0)
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        send_rows(conn, topic_name, 0, [{"key": "k", "body": b"x"}])
    text = urllib.request.urlopen(f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=10).read().decode()
    names = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("orderlymq_")}
    documented = {n.removesuffix("_total") for n in METRICS}
    assert names and names <= documented, names - documented


def test_counters_and_lag_agree_with_n_sent_through_the_producer_and_m_pulled(broker_factory, topic_name):
    from connector.client import Admin, Producer, PullConsumer

    sent, pull_size = 300, 40  # keyed over three queues; each queue pulled once, short of its end
    broker = broker_factory(metrics_port=0)
    with Producer(broker.address, retry_timeout=10.0) as producer, \
            PullConsumer(broker.address, group="g") as consumer:
        with Admin(broker.address) as admin:
            admin.create_topic(topic_name, 3)
        results = [f.result(timeout=30) for f in
                   [producer.send_async(topic_name, b"m%d" % i, key=f"order-{i % 17}") for i in range(sent)]]
        stored = {q: sum(1 for r in results if r.queue_id == q) for q in range(3)}
        pulled = {q: len(consumer.pull(topic_name, q, 0, max_messages=pull_size)) for q in range(3)}
        for q, count in pulled.items():
            consumer.commit(topic_name, q, count)
    s = scrape(broker.metrics_port)
    assert sum(stored.values()) == sent and all(count > pull_size for count in stored.values())
    for q in range(3):
        labels = {"topic": topic_name, "queue": str(q)}
        assert value(s, "orderlymq_messages_in_total", **labels) == stored[q]
        assert value(s, "orderlymq_queue_max_offset", **labels) == stored[q]
        assert value(s, "orderlymq_messages_out_total", **labels) == pulled[q] == pull_size
        assert value(s, "orderlymq_group_committed_offset", group="g", **labels) == pull_size
        assert value(s, "orderlymq_group_lag_messages", group="g", **labels) == stored[q] - pull_size
    assert value(s, "orderlymq_rpc_duration_seconds_count", method="PullPort") == 3  # the lean port
    assert value(s, "orderlymq_rpc_duration_seconds_count", method="CommitOffset") == 3


def test_every_metric_is_in_the_observability_doc():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    assert [name for name in METRICS if f"`{name}`" not in doc] == []


def test_a_client_gone_silent_is_dropped_with_its_stream(broker_factory, topic_name):
    """A client whose connection went half-open (a vanished host, a firewall dropping it) is
    pinged, does not answer, and is dropped: its stream does not stay open for good."""
    broker = broker_factory(keepalive_ms=1_000, metrics_port=0)
    proxy = TcpProxy(broker.address)
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))

    def open_streams() -> float:
        return value(scrape(broker.metrics_port), "orderlymq_send_streams_open")

    requests: queue.SimpleQueue = queue.SimpleQueue()
    batch = codec.encode(codec.messages_to_batch([{"key": "k", "body": b"m"}]))
    try:
        with grpc.insecure_channel(proxy.address) as channel:
            answers = pb_grpc.OrderlyMQStub(channel).SendStream(iter(requests.get, None))
            requests.put(pb.SendRequest(topic=topic_name, queue_id=0, batch=batch))
            assert next(answers).base_offset == 0
            assert open_streams() == 1
            proxy.silence()
            assert wait_until(lambda: open_streams() == 0, timeout=30), "the silent client's stream stayed open"
            requests.put(None)
    finally:
        proxy.close()
