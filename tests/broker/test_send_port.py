"""The lean send port (broker/send_port.py, broker/wire/frames.py) spoken over a raw socket: what
it stores and answers, in order, and how it refuses what it must not take."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.proto import orderlymq_pb2 as pb
from broker.send_port import serves_send_port
from broker.wire import codec
from broker.wire.frames import HELLO_SIZE, LENGTH, PULLS, SENDS, VERSION, hello, parse_hello
from broker.wire.one_message import encode_one
from connector.client.connection import BrokerConnection
from connector.history import History
from tests.faults.workload import body, stored_deliveries


class Raw:
    """A hand-driven lean port connection (sends unless ``carries`` says otherwise)."""

    def __init__(self, address: str, port: int, version: int = VERSION, carries: int = SENDS, *,
                 then: bytes = b"", piece: int = 1 << 30) -> None:
        """Connect and exchange hellos; ``then`` is written right behind ours, in ``piece``-byte writes."""
        self.sock = socket.create_connection((address.rpartition(":")[0], port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stream = hello(version, carries) + then
        for at in range(0, len(stream), piece):
            self.sock.sendall(stream[at:at + piece])
        self.version, self.carries = parse_hello(self.read(HELLO_SIZE))

    def read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def write(self, payload: bytes) -> None:
        self.sock.sendall(LENGTH.pack(len(payload)) + payload)

    def frame(self) -> bytes:
        (size,) = LENGTH.unpack(self.read(LENGTH.size))
        return self.read(size)

    def answer(self) -> pb.SendResponse:
        return pb.SendResponse.FromString(self.frame())

    def close(self) -> None:
        self.sock.close()


def _request(topic: str, key: str, seq: int, **fields) -> bytes:
    row = {"key": key, "body": body(key, seq), "born_timestamp": codec.now_ms()}
    return pb.SendRequest(topic=topic, queue_id=0, batch=encode_one(row), **fields).SerializeToString()


def _send_port(address: str) -> int:
    with BrokerConnection(address) as conn:
        return conn.call("Health", pb.HealthRequest()).send_port


@pytest.fixture
def port_broker(broker, topic_name):
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
    raw = Raw(broker.address, _send_port(broker.address))
    yield broker, raw
    raw.close()


def test_pipelined_requests_are_stored_and_answered_in_order_and_a_resend_is_a_duplicate(port_broker, topic_name):
    broker, raw = port_broker
    assert raw.version == VERSION
    for seq in range(50):  # all written before any answer is read
        raw.write(_request(topic_name, "k", seq, producer_id="p1", sequence=seq))
    answers = [raw.answer() for _ in range(50)]
    assert [a.base_offset for a in answers] == list(range(50))
    assert not any(a.error_code or a.duplicate for a in answers)
    raw.write(_request(topic_name, "k", 7, producer_id="p1", sequence=7))  # a resend: stored at most once
    again = raw.answer()
    assert again.duplicate and again.base_offset == 7
    history = History()
    for seq in range(50):
        history.sent("k", seq, acked=True)
    with BrokerConnection(broker.address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic_name))
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == 50, verdict


def test_big_and_small_frames_cut_anywhere_are_stored_whole_and_in_order(broker, topic_name):
    """A big frame is read into a buffer of its own, small ones into the connection's: frames of
    both sizes, written right behind the hello in pieces that cut them anywhere, are each stored
    once and in order."""
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
    key = "k" + "x" * 500  # about 0.5 KB a message: a batch of 1,500 is a frame of 0.8 MB
    history, requests, seq = History(), [], 0
    for rows in (1, 300, 1, 1, 1500, 1, 700, 1):
        batch = codec.messages_to_batch([{"key": key, "body": body(key, seq + i)} for i in range(rows)])
        requests.append(pb.SendRequest(topic=topic_name, queue_id=0, batch=codec.encode(batch)).SerializeToString())
        for i in range(rows):
            history.sent(key, seq + i, acked=True)
        seq += rows
    frames = b"".join(LENGTH.pack(len(request)) + request for request in requests)
    raw = Raw(broker.address, _send_port(broker.address), then=frames, piece=65_521)
    answers = [raw.answer() for _ in requests]
    raw.close()
    assert not any(answer.error_code for answer in answers), answers
    assert [answer.count for answer in answers] == [1, 300, 1, 1, 1500, 1, 700, 1]
    with BrokerConnection(broker.address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic_name))
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == seq, verdict


@pytest.mark.parametrize("size", [16 << 20, 100 << 20])  # memory malloc takes from its heap, or maps
def test_frames_announced_and_never_sent_hold_no_memory(broker, size):
    """Twenty clients each announce a big frame and send 1 KiB of it: the broker's buffers take
    memory as bytes arrive, not as frames are announced."""
    import psutil

    from tests.support import wait_until

    port = _send_port(broker.address)
    before = psutil.Process().memory_info().rss
    clients = [Raw(broker.address, port, then=LENGTH.pack(size) + b"\0" * 1024) for _ in range(20)]

    def reading() -> int:  # connections reading an announced frame into its own buffer
        return sum(getattr(c, "_frame", None) is not None for c in broker.send_port.connections)

    try:
        assert wait_until(lambda: reading() == 20)
        assert psutil.Process().memory_info().rss - before < 20 * size // 4
        healthy = Raw(broker.address, port)  # the port goes on serving
        healthy.write(_request("no-such-topic", "k", 0))
        assert healthy.answer().error_kind == "TopicNotFoundError"
        healthy.close()
    finally:
        for client in clients:
            client.close()


def test_a_bad_request_gets_an_error_answer_and_the_connection_goes_on(port_broker, topic_name):
    _broker, raw = port_broker
    raw.write(b"\xff\xff\xff")  # not a SendRequest
    malformed = raw.answer()
    assert malformed.error_kind == "InvalidRequestError" and "SendRequest" in malformed.error_message
    raw.write(_request("no-such-topic", "k", 0))
    missing = raw.answer()
    assert missing.error_kind == "TopicNotFoundError" and "no-such-topic" in missing.error_message
    raw.write(pb.SendRequest(topic=topic_name, queue_id=0, batch=b"not arrow").SerializeToString())
    assert raw.answer().error_kind == "BadBatchError"
    raw.write(_request(topic_name, "k", 0))
    stored = raw.answer()
    assert stored.error_code == 0 and stored.base_offset == 0


def test_a_burst_read_at_once_is_answered_whole_in_order_with_each_error_in_its_place(port_broker, topic_name):
    """Answers to the frames of one read go out together (a few dozen per write): a burst of 300
    frames in one write, some of them bad, and frames behind a transactional send (answered off the
    loop) all get their answer, in request order, and nothing waits for a later read."""
    broker, raw = port_broker
    requests, expected = [], []
    seq = 0
    with BrokerConnection(broker.address) as conn:
        conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="tx-burst"))
        for i in range(300):
            if i % 97 == 13:
                requests.append(b"\xff\xff\xff")
                expected.append("InvalidRequestError")
            elif i == 150:
                requests.append(_request(topic_name, "staged", 0, txn_id="tx-burst"))
                expected.append("staged")
            else:
                requests.append(_request(topic_name, "k", seq))
                expected.append(seq)
                seq += 1
        raw.sock.sendall(b"".join(LENGTH.pack(len(r)) + r for r in requests))
        answers = [raw.answer() for _ in requests]
        conn.call("AbortTxn", pb.AbortTxnRequest(txn_id="tx-burst"))
    got = [a.error_kind if a.error_code else "staged" if a.base_offset == -1 else a.base_offset for a in answers]
    assert got == expected
    history = History()
    for n in range(seq):
        history.sent("k", n, acked=True)
    with BrokerConnection(broker.address) as conn:
        history.extend_deliveries(stored_deliveries(conn, topic_name))
    verdict = history.check()
    assert verdict.ok and verdict.deliveries == seq, verdict


def test_a_transactional_send_is_staged_like_on_grpc(port_broker, topic_name):
    broker, raw = port_broker
    with BrokerConnection(broker.address) as conn:
        conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="tx-1"))
        raw.write(_request(topic_name, "k", 0, txn_id="tx-1"))
        raw.write(_request(topic_name, "k", 1))  # queued behind the staged one (it runs on a thread)
        staged, direct = raw.answer(), raw.answer()
        assert staged.base_offset == -1 and staged.error_code == 0
        assert direct.base_offset == 0
        conn.call("CommitTxn", pb.CommitTxnRequest(txn_id="tx-1"))
        assert [d.seq for d in stored_deliveries(conn, topic_name)] == [1, 0]


def test_an_oversized_frame_is_refused_then_the_connection_closes(broker_factory, topic_name):
    broker = broker_factory(max_request_bytes=4096)
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
    raw = Raw(broker.address, _send_port(broker.address))
    raw.sock.sendall(LENGTH.pack(10_000) + b"x" * 100)
    refused = raw.answer()
    assert "over the broker's limit of 4096 bytes" in refused.error_message
    with pytest.raises(ConnectionError):
        raw.read(1)


def test_a_client_that_does_not_speak_the_protocol_is_closed(broker):
    sock = socket.create_connection(("127.0.0.1", _send_port(broker.address)), timeout=10)
    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert sock.recv(100) == b""
    sock.close()


def test_a_connection_of_an_unknown_kind_is_closed(broker):
    sock = socket.create_connection(("127.0.0.1", _send_port(broker.address)), timeout=10)
    sock.sendall(hello(VERSION, PULLS + 5))
    assert sock.recv(100) == b""
    sock.close()


def test_a_client_asking_another_version_is_told_the_brokers(broker):
    raw = Raw(broker.address, _send_port(broker.address), version=VERSION + 1)
    assert raw.version == VERSION  # the client closes: it cannot speak this version
    raw.close()


def test_the_port_is_not_served_with_access_control_tls_or_when_turned_off_but_is_in_a_group(broker_factory, tmp_path):
    from tests.security.conftest import AclFile, credentials

    acl = AclFile(tmp_path / "acl.toml")
    acl.write()
    secure = broker_factory(acl_file=str(acl.path))
    assert secure.send_port is None
    with BrokerConnection(secure.address, credentials=credentials("admin")) as conn:
        assert conn.call("Health", pb.HealthRequest()).send_port == 0
    off = broker_factory(send_port=-1)
    assert off.send_port is None and _send_port(off.address) == 0
    assert not serves_send_port(BrokerConfig(tls_cert_file="broker.pem", tls_key_file="broker.key"), False)
    assert serves_send_port(BrokerConfig(zookeeper="127.0.0.1:2181"), False), "a group's master answers there"
    assert serves_send_port(BrokerConfig(), False)


def _keepalive_timer_on(port: int, peer_port: int) -> bool:
    """Whether the kernel's TCP socket from ``port`` to ``peer_port`` runs its keepalive timer
    (``/proc/net/tcp``: the ``tr`` field is 2)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, timer = fields[1], fields[2], fields[5]
        if int(local.split(":")[1], 16) == port and int(remote.split(":")[1], 16) == peer_port:
            return timer.split(":")[0] == "02"
    raise AssertionError(f"no connection from port {port} to port {peer_port}")


def test_a_quiet_connection_is_probed_by_tcp_keepalive(broker_factory):
    """A client gone without a word (its host, or a firewall dropping the connection) is found
    by TCP keepalive and the connection closed, as the gRPC port's are by pings."""
    broker = broker_factory(keepalive_ms=7_000)
    port = _send_port(broker.address)
    raw = Raw(broker.address, port)
    try:
        assert _keepalive_timer_on(port, raw.sock.getsockname()[1])
    finally:
        raw.close()
