"""Pulls on the lean port (broker/pull_port.py, connector/client/pull_port.py): the same answers
as gRPC's ``Pull``, in request order, the same errors, and a connection that outlives bad requests."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from broker.proto import orderlymq_pb2 as pb
from broker.wire import codec
from broker.wire.errors import FencedError, InvalidRequestError, OffsetOutOfRangeError, TopicNotFoundError
from broker.wire.frames import HELLO_SIZE, PULLS, SENDS, VERSION, hello
from broker.wire.pull_response import decode_pull_response
from connector.client.connection import BrokerConnection
from connector.client.lean_port import WrongVersionError
from connector.client.pull_port import LINK_RETRY_S, PullLink, PullLinkPool, PullPortFailure, open_pull_link
from tests.broker.test_send_port import Raw, _send_port
from tests.faults.workload import body
from tests.support import served_calls

QUEUE_MESSAGES = 2_800


def _pull_port_calls(broker, code: str | None = None) -> float:
    labels = {"method": "PullPort"} | ({"code": code} if code else {})
    name = "orderlymq_rpc_errors_total" if code else "orderlymq_rpc_duration_seconds_count"
    return broker.service.metrics.registry.get_sample_value(name, labels) or 0


@pytest.fixture
def filled(broker, topic_name):
    """A topic of two queues, each holding ``QUEUE_MESSAGES`` messages of one key, in batches of 100."""
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=2))
        for queue_id in range(2):
            for start in range(0, QUEUE_MESSAGES, 100):
                rows = [{"key": f"k{queue_id}", "body": body(f"k{queue_id}", seq)} for seq in range(start, start + 100)]
                conn.call("Send", pb.SendRequest(topic=topic_name, queue_id=queue_id,
                                                 batch=codec.encode(codec.messages_to_batch(rows))))
    return broker


def _link(broker) -> PullLink:
    return PullLink("127.0.0.1", _send_port(broker.address), 10)


def _rows(reply) -> list[tuple[int, bytes]]:
    table = codec.decode_many(reply.batches)
    return list(zip(table.column("queue_offset").to_pylist(), table.column("body").to_pylist(), strict=True))


def test_pulls_answer_what_grpc_answers_in_request_order(filled, topic_name):
    link = _link(filled)
    with BrokerConnection(filled.address) as conn:
        for queue_id in range(2):
            offset, seen = 0, []
            while offset < QUEUE_MESSAGES:
                requests = [pb.PullRequest(topic=topic_name, queue_id=queue_id, offset=offset, max_messages=700),
                            pb.PullRequest(topic=topic_name, queue_id=queue_id, offset=offset + 700, max_messages=700)]
                for request in requests:  # pipelined: both written before either answer is read
                    link.issue(request)
                for request in requests:
                    ours, theirs = link.receive(), conn.call("Pull", request)
                    assert _rows(ours) == _rows(theirs)
                    assert (ours.next_offset, ours.count, ours.min_offset, ours.max_offset) == (
                        theirs.next_offset, theirs.count, theirs.min_offset, theirs.max_offset)
                    seen += _rows(ours)
                offset += 1400
            key = f"k{queue_id}"
            assert seen == [(seq, body(key, seq)) for seq in range(QUEUE_MESSAGES)], "each message once, in order"
    link.close()
    assert _pull_port_calls(filled) == 2 * 2 * 2


def test_a_failed_pull_raises_its_error_and_the_connection_goes_on(filled, topic_name):
    link = _link(filled)
    with pytest.raises(TopicNotFoundError, match="nope"):
        link.issue(pb.PullRequest(topic="nope", queue_id=0, offset=0))
        link.receive()
    with pytest.raises(OffsetOutOfRangeError):
        link.issue(pb.PullRequest(topic=topic_name, queue_id=0, offset=QUEUE_MESSAGES + 5))
        link.receive()
    with pytest.raises(FencedError):
        link.issue(pb.PullRequest(topic=topic_name, queue_id=0, offset=0, group="g", client_id="c", epoch=7))
        link.receive()
    link.issue(pb.PullRequest(topic=topic_name, queue_id=1, offset=10, max_messages=5))
    assert [offset for offset, _ in _rows(link.receive())] == [10, 11, 12, 13, 14]
    link.close()
    assert _pull_port_calls(filled, "NOT_FOUND") == 1


def test_a_malformed_request_gets_an_error_answer_and_the_connection_goes_on(filled, topic_name):
    raw = Raw(filled.address, _send_port(filled.address), carries=PULLS)
    assert (raw.version, raw.carries) == (VERSION, PULLS)
    raw.write(b"\xff\xff\xff")
    raw.write(pb.PullRequest(topic=topic_name, queue_id=0, offset=2, max_messages=1).SerializeToString())
    refused = decode_pull_response(raw.frame())
    with pytest.raises(InvalidRequestError, match="not a valid orderlymq.v1.PullRequest"):
        refused.raise_error()
    answered = decode_pull_response(raw.frame())
    assert [offset for offset, _ in _rows(answered)] == [2]
    raw.close()


def test_an_oversized_frame_is_refused_then_the_connection_closes(broker_factory):
    broker = broker_factory(max_request_bytes=1024)
    raw = Raw(broker.address, _send_port(broker.address), carries=PULLS)
    raw.sock.sendall((1 << 20).to_bytes(4, "little") + b"x" * 100)
    with pytest.raises(Exception, match="over the broker's limit of 1024 bytes"):
        decode_pull_response(raw.frame()).raise_error()
    with pytest.raises(ConnectionError):
        raw.read(1)


def test_a_long_poll_waits_on_the_port_for_the_next_message(broker, topic_name):
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
        link = _link(broker)
        link.issue(pb.PullRequest(topic=topic_name, queue_id=0, offset=0, wait_ms=20_000))
        time.sleep(0.3)  # the pull waits on the broker's loop, holding no thread
        batch = codec.encode(codec.messages_to_batch([{"key": "k", "body": b"late"}]))
        conn.call("Send", pb.SendRequest(topic=topic_name, queue_id=0, batch=batch))
        assert _rows(link.receive()) == [(0, b"late")]
        link.close()


def test_a_broker_that_stops_ends_the_link_with_a_failure(broker_factory, topic_name):
    broker = broker_factory()
    with BrokerConnection(broker.address) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic=topic_name, queue_count=1))
    link = _link(broker)
    link.issue(pb.PullRequest(topic=topic_name, queue_id=0, offset=0, wait_ms=20_000))
    broker.stop()
    with pytest.raises(PullPortFailure):
        link.receive()


def test_a_broker_whose_port_takes_only_sends_is_not_used_for_pulls():
    """An older broker echoes SENDS to a pull hello: the reader must not send it pulls."""
    server = socket.create_server(("127.0.0.1", 0))

    def older_broker():
        client, _ = server.accept()
        client.recv(HELLO_SIZE)
        client.sendall(hello(VERSION, SENDS))
        client.recv(1)
        client.close()

    thread = threading.Thread(target=older_broker)
    thread.start()
    with pytest.raises(WrongVersionError):
        PullLink("127.0.0.1", server.getsockname()[1], 5)
    thread.join()
    server.close()


def test_no_link_without_the_port(broker_factory):
    broker = broker_factory(send_port=-1)
    with BrokerConnection(broker.address) as conn:
        assert open_pull_link(conn) is None


def test_a_link_pool_reuses_idle_links_and_asks_a_broker_without_a_port_again_only_later(broker_factory):
    """Idle links are leased again; a broker serving no lean port, or whose link failed, is asked
    again only later, not at every lease."""
    with_port, without = broker_factory(), broker_factory(send_port=-1)
    pool = PullLinkPool()
    with BrokerConnection(with_port.address) as conn, BrokerConnection(without.address) as bare:
        link = pool.lease(conn)
        pool.give_back(conn, link)
        assert pool.lease(conn) is link
        other = pool.lease(conn)
        assert other not in (None, link), "a thread pulling meanwhile gets a link of its own"
        pool.discard(conn, other)  # it failed
        assert pool.lease(conn) is None, f"no new link within {LINK_RETRY_S} s of a failure"
        pool.give_back(conn, link)
        assert pool.lease(conn) is link, "an idle link is still leased"
        asked = served_calls(without, "Health")
        assert pool.lease(bare) is None and pool.lease(bare) is None
        assert served_calls(without, "Health") == asked + 1, f"asked again within {LINK_RETRY_S} s"
    pool.close()
