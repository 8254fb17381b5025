"""Scenario 6: bad input at volume. Several threads send garbage, hostile and byte-mutated
requests to every RPC while a producer and an orderly consumer group move keyed traffic through
the same broker: every bad request is refused with a status that says why, the good traffic's
history is clean, and the broker process is still up and serving. Thousands of byte-mutated Arrow
batches are each stored (and readable) or refused as ``BadBatchError``, never an internal error."""

from __future__ import annotations

import collections
import threading

import grpc

from broker.wire import codec
from connector.client import Admin
from connector.client.connection import BrokerConnection, pb
from connector.history import History, check_keyed
from tests.faults.fault_profile import PROFILE
from tests.faults.fuzz import METHODS, BadRequests, call_once
from tests.faults.workload import KeyedProducer, body, parse_body, shutdown_all, start_orderly_group
from tests.support import pull_all, send_rows, wait_until

GOOD_TOPIC, FUZZ_TOPIC, GROUP = "good-orders", "fuzz-target", "good-group"


def fuzz(address: str, seed: int, requests: int, keep_going: threading.Event, outcomes: list) -> None:
    """``requests`` bad requests at least, and more while ``keep_going`` is set."""
    bad = BadRequests(seed, topics=[GOOD_TOPIC, FUZZ_TOPIC, "missing"], protected_topics={GOOD_TOPIC},
                      groups=["fuzz-group", "%DLQ%fuzz"])
    with grpc.insecure_channel(address) as channel:
        sent = 0
        while sent < requests or keep_going.is_set():
            method = METHODS[sent % len(METHODS)] if sent < len(METHODS) else bad.rng.choice(METHODS)
            count = bad.rng.randint(1, 4) if method.client_streaming else 1
            payloads = [bad.payload(method) for _ in range(count)]
            outcomes.extend(call_once(channel, method, [raw for _, raw in payloads]))
            sent += 1


def test_bad_requests_at_volume_leave_good_traffic_and_the_broker_intact(broker_proc, fault_report):
    proc = broker_proc()
    with Admin(proc.address) as admin:
        admin.create_topic(GOOD_TOPIC, 4)
        admin.create_topic(FUZZ_TOPIC, 2)
    history = History()
    consumers = start_orderly_group(proc.address, GOOD_TOPIC, GROUP, 2, history)
    keys = [f"acct-{i}" for i in range(8)]
    producer = KeyedProducer(proc.address, GOOD_TOPIC, keys, history, rate=300, limit=PROFILE.fuzz_good_messages)
    outcomes: list = []
    producing = threading.Event()
    producing.set()
    fuzzers = [threading.Thread(target=fuzz, args=(proc.address, seed, PROFILE.fuzz_requests, producing, outcomes))
               for seed in range(PROFILE.fuzz_threads)]
    try:
        producer.start()
        for t in fuzzers:
            t.start()
        producer.join()
        producing.clear()
        for t in fuzzers:
            t.join()
        delivered = wait_until(history.delivered_all_acked, timeout=60)
    finally:
        shutdown_all(consumers)
    verdict = history.check()
    failures = [o for o in outcomes if o.broker_failed]
    codes = collections.Counter(o.code.name for o in outcomes)
    tracebacks = proc.log_text().count("Traceback")
    with BrokerConnection(proc.address, retry_timeout=5) as conn:
        health = conn.call("Health", pb.HealthRequest()).status
    fault_report("6 bad input at volume", {"good traffic": verdict}, bad_requests=len(outcomes),
                 methods=len({o.method for o in outcomes}), statuses=dict(codes), broker_failures=len(failures),
                 broker_tracebacks=tracebacks, broker_alive=proc.proc.poll() is None)
    assert delivered and verdict.ok, str(verdict)
    assert not failures, f"{len(failures)} bad request(s) got a broker failure, e.g. {failures[:3]}"
    assert {o.method for o in outcomes} == {m.name for m in METHODS}, "every RPC was hit"
    assert len(codes) > 3, "the bad requests reached several kinds of refusal"
    assert proc.proc.poll() is None and health == "SERVING"
    assert tracebacks == 0, proc.log_text()[-3000:]


def test_a_malformed_frame_on_send_stream_is_refused_and_the_stream_goes_on(broker, topic_name):
    with BrokerConnection(broker.address, retry_timeout=5) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        good = pb.SendRequest(topic=topic_name, queue_id=0, batch=codec.encode(codec.messages_to_batch(
            [{"key": "k", "body": b"m"}]))).SerializeToString()
        with grpc.insecure_channel(broker.address) as channel:
            stream = channel.stream_stream("/orderlymq.v1.OrderlyMQ/SendStream", request_serializer=None,
                                           response_deserializer=pb.SendResponse.FromString)
            responses = list(stream(iter([good, b"\xff\xff\xff not protobuf", good]), timeout=10))
    assert [r.error_code for r in responses] == [0, grpc.StatusCode.INVALID_ARGUMENT.value[0], 0]
    assert "malformed request" in responses[1].error_message and responses[1].error_kind == "InvalidRequestError"
    assert [r.base_offset for r in (responses[0], responses[2])] == [0, 1]


def test_thousands_of_mutated_batches_are_refused_as_bad_batches_and_stored_data_stays_readable(broker_proc,
                                                                                               fault_report):
    """Byte-mutated Arrow batches (keys, tags, property maps, names, framing): each is either a
    valid batch, stored and readable, or refused as ``BadBatchError``; never an internal error."""
    proc = broker_proc()
    bad = BadRequests(9, topics=[FUZZ_TOPIC], protected_topics=set(), groups=[])
    with BrokerConnection(proc.address, retry_timeout=5) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=GOOD_TOPIC, queue_count=1))
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=FUZZ_TOPIC, queue_count=2))
        good = [{"key": "k", "body": body("k", seq), "tag": "T", "properties": {"p": "v"}} for seq in range(50)]
        send_rows(conn, GOOD_TOPIC, 0, good)
        kinds: collections.Counter = collections.Counter()
        stored_rows, examples = 0, []
        with grpc.insecure_channel(proc.address) as channel:
            send = channel.unary_unary("/orderlymq.v1.OrderlyMQ/Send", request_serializer=None,
                                       response_deserializer=pb.SendResponse.FromString)
            for i in range(PROFILE.mutated_batches):
                request = pb.SendRequest(topic=FUZZ_TOPIC, queue_id=i % 2, batch=bad.mutated_batch())
                try:
                    stored_rows += send(request.SerializeToString(), timeout=10).count
                    kinds["stored"] += 1
                except grpc.RpcError as err:
                    kind = dict(err.trailing_metadata() or ()).get("orderlymq-error", "")
                    kinds[f"{err.code().name} {kind}"] += 1
                    if kind != "BadBatchError" and len(examples) < 5:
                        examples.append(f"{err.code().name} {kind}: {err.details()}")
        # Everything stored reads back, down to Python values (born timestamps as datetimes).
        tables = [pull_all(conn, FUZZ_TOPIC, qid) for qid in range(2)]
        read_rows = sum(t.num_rows for t in tables)
        for table in tables:
            table.to_pylist()
        verdict = check_keyed({"k": 50}, [parse_body(b) for b in pull_all(conn, GOOD_TOPIC, 0).column("body").to_pylist()])
        health = conn.call("Health", pb.HealthRequest()).status
    tracebacks = proc.log_text().count("Traceback")
    fault_report("9 mutated batches", {"good topic": verdict}, batches=PROFILE.mutated_batches, outcomes=dict(kinds),
                 stored_rows=stored_rows, read_rows=read_rows, broker_tracebacks=tracebacks)
    assert not examples, f"refusals other than BadBatchError: {examples}"
    assert set(kinds) <= {"stored", "INVALID_ARGUMENT BadBatchError"}
    assert kinds["INVALID_ARGUMENT BadBatchError"] > PROFILE.mutated_batches // 2
    assert read_rows == stored_rows and verdict.ok and health == "SERVING"
    assert tracebacks == 0, proc.log_text()[-3000:]
