"""Random bytes and random field values at every RPC, from several threads, interleaved with
good traffic: every bad request gets a status, the broker keeps serving, stored data is intact."""

from __future__ import annotations

import random
import threading

import grpc
from google.protobuf.descriptor import FieldDescriptor

from broker.proto import orderlymq_pb2 as pb_module
from connector.client.connection import BrokerConnection, pb
from tests.support import pull_all, send_rows

SERVICE = pb_module.DESCRIPTOR.services_by_name["OrderlyMQ"]
UNARY = [m for m in SERVICE.methods if not m.client_streaming]


def random_value(field, rng: random.Random, topics: list[str]):
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return rng.choice(topics + ["", "x" * rng.randint(1, 300), "é∑\u0000", "TagA || ", "../../etc", "%DLQ%g"])
    if t == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 400))
    if t == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32):
        return rng.choice([0, 1, -1, 3, 2**31 - 1, -(2**31), rng.randint(-10, 10)])
    return rng.choice([0, 1, -1, 2**63 - 1, -(2**63), rng.randint(-100, 100)])


def random_request(method, rng: random.Random, topics: list[str]):
    request = getattr(pb_module, method.input_type.name)()
    for field in method.input_type.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.is_repeated:
            getattr(request, field.name).extend(random_value(field, rng, topics) for _ in range(rng.randint(0, 4)))
        elif rng.random() < 0.8:
            setattr(request, field.name, random_value(field, rng, topics))
    return request


def test_random_requests_to_every_rpc_leave_data_intact(broker, topic_name):
    good = BrokerConnection(broker.address, retry_timeout=2)
    good.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=2))
    expected = [f"good-{i}".encode() for i in range(60)]
    channel = grpc.insecure_channel(broker.address)
    statuses: list[grpc.StatusCode] = []
    problems: list[str] = []

    def fuzz(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(150):
            method = rng.choice(UNARY)
            path = f"/{SERVICE.full_name}/{method.name}"
            if rng.random() < 0.3:  # raw garbage instead of a protobuf message
                call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
                payload = rng.randbytes(rng.randint(0, 200))
            else:
                call = channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                           response_deserializer=None)
                payload = random_request(method, rng, [topic_name, "nope"])
                if method.name in ("DeleteTopic", "UpdateTopic") and payload.topic == topic_name:
                    payload.topic = "nope"  # keep the good topic alive: the good traffic checks it
            try:
                call(payload, timeout=5)
                statuses.append(grpc.StatusCode.OK)
            except grpc.RpcError as err:
                statuses.append(err.code())
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL) or not err.details():
                    problems.append(f"{method.name}: {err.code()} {err.details()!r}")

    threads = [threading.Thread(target=fuzz, args=(seed,)) for seed in range(3)]
    for t in threads:
        t.start()
    for i, body in enumerate(expected):
        send_rows(good, topic_name, i % 2, [{"key": str(i % 2), "body": body}])
    for t in threads:
        t.join()
    channel.close()
    assert problems == [], "every bad request gets a precise status, never INTERNAL or UNAVAILABLE"
    assert len(set(statuses)) > 2, "the fuzzer must reach several kinds of failure"
    assert good.call("Health", pb.HealthRequest()).status == "SERVING"
    for q in range(2):
        bodies = pull_all(good, topic_name, q).column("body").to_pylist()
        assert bodies == expected[q::2]
    good.close()
