"""Fuzzed credentials: random, unicode, binary and huge auth metadata on every kind of RPC, from
several threads, while a good client keeps producing and consuming; nothing crashes, every bad
call is refused, and the good client's messages arrive complete and in per-key order."""

from __future__ import annotations

import random
import threading
from collections import Counter

import grpc

from broker.proto import orderlymq_pb2 as pb_module
from broker.wire.credentials import ACCESS_KEY_HEADER, SECRET_KEY_HEADER
from connector.client.admin import Admin
from connector.client.connection import BrokerConnection, pb
from connector.client.producer import Producer
from connector.history import History
from tests.security.conftest import SECRETS, credentials
from tests.support import pull_all

SERVICE = pb_module.DESCRIPTOR.services_by_name["OrderlyMQ"]
UNARY = [m for m in SERVICE.methods if not m.client_streaming]
TOPIC = "orders-fuzz"
HEADERS = [ACCESS_KEY_HEADER, SECRET_KEY_HEADER]
# UNAUTHENTICATED, or RESOURCE_EXHAUSTED from gRPC itself for metadata past its size limit.
REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED}


def random_text(rng: random.Random) -> str:
    """Mostly values gRPC will carry (printable ASCII, up to its 8 KiB metadata limit and past it),
    some that its client library refuses to send (control characters, non-ASCII)."""
    if rng.random() < 0.15:
        return rng.choice(["admin\x00", "ünïcødé-κλειδί", "🔑" * rng.randint(1, 50), "line\nbreak"])
    return rng.choice([
        "", " ", "writer", "writer ", " writer", "WRITER", "admin", "*", "x" * rng.randint(1, 12_000),
        "".join(chr(rng.randint(32, 126)) for _ in range(rng.randint(1, 200))),
        SECRETS["writer"] + "x", SECRETS["writer"][:-1], "%s%n%x", "../../etc/passwd", "'; DROP TABLE users",
    ])


def random_metadata(rng: random.Random) -> list[tuple[str, str | bytes]]:
    pairs: list[tuple[str, str | bytes]] = []
    for _ in range(rng.randint(0, 4)):
        roll = rng.random()
        if roll < 0.1:
            pairs.append((rng.choice(HEADERS) + "-bin", rng.randbytes(rng.randint(0, 300))))
        elif roll < 0.2:  # a real key with a wrong secret: the slow scrypt path, kept rare
            pairs += [(ACCESS_KEY_HEADER, "writer"), (SECRET_KEY_HEADER, f"wrong-{rng.randint(0, 20)}")]
        else:
            pairs.append((rng.choice(HEADERS), random_text(rng)))
    return pairs


def fuzz(address: str, seed: int, calls: int, outcomes: list) -> None:
    rng = random.Random(seed)
    with grpc.insecure_channel(address) as channel:
        for _ in range(calls):
            method = rng.choice(UNARY + [None])
            metadata = random_metadata(rng)
            try:
                if method is None:
                    stream = channel.stream_stream(f"/{SERVICE.full_name}/SendStream")
                    list(stream(iter([rng.randbytes(rng.randint(0, 50))]), timeout=10, metadata=metadata))
                else:
                    call = channel.unary_unary(f"/{SERVICE.full_name}/{method.name}")
                    call(rng.randbytes(rng.randint(0, 60)), timeout=10, metadata=metadata)
                outcomes.append("ANSWERED")
            except grpc.RpcError as err:
                # gRPC's own client refuses to send some values and reports it like a status
                unsent = err.code() == grpc.StatusCode.INTERNAL and err.details() == "Invalid metadata"
                outcomes.append("REFUSED BY THE CLIENT LIBRARY" if unsent else err.code())
            except (ValueError, TypeError, UnicodeError):
                outcomes.append("REFUSED BY THE CLIENT LIBRARY")  # metadata gRPC will not even send


def test_fuzzed_auth_metadata_never_crashes_the_broker(secure_broker):
    with Admin(secure_broker.address, credentials=credentials("admin")) as admin:
        admin.create_topic(TOPIC, 4)
    # The good client's credentials are verified before the fuzzers' wrong secrets for the same key
    # pause its checks from this host (broker.security.throttle); verified ones are not slowed down.
    with BrokerConnection(secure_broker.address, credentials=credentials("writer")) as conn:
        conn.call("Health", pb.HealthRequest())
    outcomes: list = []
    threads = [threading.Thread(target=fuzz, args=(secure_broker.address, seed, 750, outcomes)) for seed in range(4)]
    for thread in threads:
        thread.start()
    history = History()
    keys = [f"k{i}" for i in range(8)]
    with Producer(secure_broker.address, credentials=credentials("writer"), linger_ms=1) as producer:
        round_ = 0
        while any(t.is_alive() for t in threads) or round_ < 20:
            futures = [(key, producer.send_async(TOPIC, f"{key}:{round_}", key=key)) for key in keys]
            for key, future in futures:
                history.sent(key, round_, acked=future.exception() is None)
            round_ += 1
    for thread in threads:
        thread.join()

    assert len(outcomes) == 3000
    assert "ANSWERED" not in outcomes, "a call without good credentials was served"
    reached = [o for o in outcomes if isinstance(o, grpc.StatusCode)]
    assert set(reached) <= REFUSED, set(reached)
    assert reached.count(grpc.StatusCode.UNAUTHENTICATED) > 1800, Counter(outcomes)
    with BrokerConnection(secure_broker.address, credentials=credentials("reader")) as conn:
        assert conn.call("Health", pb.HealthRequest()).status == "SERVING"
        for queue_id in range(4):
            table = pull_all(conn, TOPIC, queue_id).to_pylist()
            for row in table:
                key, _, seq = row["body"].decode().rpartition(":")
                history.delivered(key, int(seq), queue_id=queue_id, offset=row["queue_offset"])
    verdict = history.check()
    assert verdict.ok and verdict.duplicated == 0 and verdict.acked == verdict.sends, verdict
