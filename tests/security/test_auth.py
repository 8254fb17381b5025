"""Authentication and authorization on a real broker over gRPC: every RPC, streams included."""

from __future__ import annotations

import grpc
import pytest

from broker.security.acl import Rule
from broker.wire.credentials import Credentials
from broker.wire.errors import PermissionDeniedError, UnauthenticatedError
from connector.client.admin import Admin
from connector.client.connection import BrokerConnection, pb
from connector.client.producer import Producer
from connector.client.pull_consumer import PullConsumer
from tests.security.conftest import BASE_RULES, SECRETS, credentials
from tests.support import pull_all, send_rows, wait_until

TOPIC = "orders-a"


@pytest.fixture
def topic(secure_broker):
    with Admin(secure_broker.address, credentials=credentials("admin")) as admin:
        admin.create_topic(TOPIC, 2)
    return TOPIC


def _conn(broker, user: str | None = None, secret: str | None = None) -> BrokerConnection:
    creds = None if user is None else Credentials(user, secret or SECRETS[user])
    return BrokerConnection(broker.address, timeout=10, retry_timeout=2, credentials=creds)


def test_no_credentials_is_unauthenticated_with_a_clear_message(secure_broker, topic):
    with _conn(secure_broker) as conn, pytest.raises(UnauthenticatedError, match="no credentials") as err:
        conn.call("DescribeTopic", pb.DescribeTopicRequest(topic=topic))
    assert "orderlymq-access-key" in str(err.value) and "auth.accessKey" in str(err.value)
    with _conn(secure_broker) as conn, pytest.raises(UnauthenticatedError, match="no credentials"):
        conn.call("Health", pb.HealthRequest())


def test_wrong_secret_names_the_key_never_the_secret(secure_broker, topic):
    with _conn(secure_broker, "writer", "not-the-secret-9") as conn, pytest.raises(UnauthenticatedError) as err:
        send_rows(conn, topic, 0, [{"key": "k", "body": b"x"}])
    assert str(err.value) == "wrong secret key for access key 'writer'"
    with _conn(secure_broker, "writer", "not-the-secret-9") as conn, pytest.raises(UnauthenticatedError):
        pull_all(conn, topic, 0)  # Pull has its own handler: checked there too


def test_unknown_access_key_is_unauthenticated(secure_broker, topic):
    with _conn(secure_broker, "mallory", "whatever-secret") as conn, pytest.raises(
            UnauthenticatedError, match="unknown access key 'mallory'"):
        conn.call("ListTopics", pb.ListTopicsRequest())


def test_writer_sends_but_may_not_read_nor_administer(secure_broker, topic):
    with _conn(secure_broker, "writer") as conn:
        assert send_rows(conn, topic, 0, [{"key": "k", "body": b"x"}]).count == 1
        with pytest.raises(PermissionDeniedError) as err:
            pull_all(conn, topic, 0)
        assert "user 'writer' may not subscribe on topic:orders-a" in str(err.value)
        with pytest.raises(PermissionDeniedError, match="user 'writer' may not admin on topic:orders-new"):
            conn.call("CreateTopic", pb.CreateTopicRequest(topic="orders-new", queue_count=1))
        with pytest.raises(PermissionDeniedError, match="may not publish on topic:payments"):
            send_rows(conn, "payments", 0, [{"key": "k", "body": b"x"}])


def test_subscriber_commits_its_group_only_and_cannot_send(secure_broker, topic):
    with _conn(secure_broker, "writer") as conn:
        send_rows(conn, topic, 1, [{"key": "k", "body": b"x"}, {"key": "k", "body": b"y"}])
    with _conn(secure_broker, "reader") as conn:
        assert pull_all(conn, topic, 1).num_rows == 2
        conn.call("CommitOffset", pb.CommitOffsetRequest(group="billing", topic=topic, queue_id=1, offset=2))
        assert conn.call("GetOffset", pb.GetOffsetRequest(group="billing", topic=topic, queue_id=1)).offset == 2
        with pytest.raises(PermissionDeniedError, match="user 'reader' may not subscribe on group:shipping"):
            conn.call("CommitOffset", pb.CommitOffsetRequest(group="shipping", topic=topic, queue_id=1, offset=2))
        with pytest.raises(PermissionDeniedError, match="group:shipping"):
            conn.call("LockBatch", pb.LockBatchRequest(group="shipping", client_id="c", topic=topic, queue_ids=[0]))
        with pytest.raises(PermissionDeniedError, match="user 'reader' may not publish on topic:orders-a"):
            send_rows(conn, topic, 0, [{"key": "k", "body": b"x"}])
        with pytest.raises(PermissionDeniedError, match="may not publish on any topic"):
            conn.call("BeginTxn", pb.BeginTxnRequest(txn_id="t1"))
    consumer = PullConsumer(secure_broker.address, group="billing", credentials=credentials("reader"))
    with consumer:
        assert consumer.lock(topic, 0) >= 1  # a fenced pull and commit of its own group
        consumer.assign(topic, [0], start="earliest")
        consumer.commit(topic, 0, 0)


def test_streaming_sends_are_checked_when_the_stream_opens_and_per_topic(secure_broker, topic):
    with Producer(secure_broker.address, credentials=credentials("writer")) as producer:
        results = [producer.send(topic, f"m{i}", key="k") for i in range(20)]
    assert [r.queue_offset for r in results] == list(range(20))
    with Producer(secure_broker.address, credentials=credentials("reader"), retry_timeout=5) as producer:
        with pytest.raises(PermissionDeniedError, match="user 'reader' may not publish on topic:orders-a"):
            producer.send(topic, "m", key="k")
    with grpc.insecure_channel(secure_broker.address) as channel:
        stream = channel.stream_stream("/orderlymq.v1.OrderlyMQ/SendStream")
        with pytest.raises(grpc.RpcError) as err:
            list(stream(iter([b""]), timeout=10))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_long_poll_pull_of_an_authorized_reader(secure_broker, topic):
    with _conn(secure_broker, "reader") as conn:
        answer = conn.call("Pull", pb.PullRequest(topic=topic, queue_id=0, offset=0, wait_ms=200))
    assert answer.count == 0


def test_list_topics_shows_only_what_the_user_has_rights_on(secure_broker, topic):
    with Admin(secure_broker.address, credentials=credentials("admin")) as admin:
        admin.create_topic("payments", 1)
        assert {t.name for t in admin.list_topics()} == {TOPIC, "payments"}
    with Admin(secure_broker.address, credentials=credentials("reader")) as admin:
        assert [t.name for t in admin.list_topics()] == [TOPIC]
        assert admin.health()["status"]
        with pytest.raises(PermissionDeniedError, match="may not admin on broker"):
            admin.groups()


def test_acl_file_changes_apply_without_restart(secure_broker, acl_file, topic):
    with _conn(secure_broker, "reader") as conn:
        with pytest.raises(PermissionDeniedError):
            send_rows(conn, topic, 0, [{"key": "k", "body": b"x"}])
        acl_file.write((*BASE_RULES, Rule("reader", "allow", ("publish",), ("topic:orders-*",))))

        def sends() -> bool:
            try:
                return send_rows(conn, topic, 0, [{"key": "k", "body": b"x"}]).count == 1
            except PermissionDeniedError:
                return False

        assert wait_until(sends, timeout=10)
        acl_file.write((*BASE_RULES, Rule("*", "deny", ("publish",), ("topic:*",))))
        assert wait_until(lambda: not sends(), timeout=10)
        acl_file.write(users={k: v for k, v in SECRETS.items() if k != "reader"})

        def refused() -> bool:
            try:
                conn.call("Health", pb.HealthRequest())
            except UnauthenticatedError as exc:
                return "unknown access key 'reader'" in str(exc)
            return False

        assert wait_until(refused, timeout=10)


def test_a_bad_acl_edit_keeps_the_last_good_rules(secure_broker, acl_file, topic):
    acl_file.path.write_text("[[rules]]\nuser = 'reader'\neffect = 'maybe'\n")
    with _conn(secure_broker, "writer") as conn:
        wait_until(lambda: False, timeout=1.5)  # past the re-read interval
        assert send_rows(conn, topic, 0, [{"key": "k", "body": b"x"}]).count == 1


def test_a_broker_without_acl_ignores_credentials(broker, topic_name):
    with Admin(broker.address, credentials=credentials("writer")) as admin:
        admin.create_topic(topic_name, 1)
    with _conn(broker) as conn:
        assert send_rows(conn, topic_name, 0, [{"key": "k", "body": b"x"}]).count == 1


@pytest.mark.parametrize("method", ["QueryRoute", "SendMessage", "ReceiveMessage", "Telemetry"])
def test_rocketmq_clients_are_refused_with_the_reason_under_access_control(secure_broker, method):
    with grpc.insecure_channel(secure_broker.address) as channel:
        call = channel.stream_stream(f"/apache.rocketmq.v2.MessagingService/{method}")
        with pytest.raises(grpc.RpcError) as refused:
            list(call(iter([b"\x0a\x00"]), timeout=10, metadata=credentials("admin").metadata()))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value
    assert "does not serve the RocketMQ 5 protocol" in refused.value.details()
    assert "HMAC of their plaintext secret key" in refused.value.details()
