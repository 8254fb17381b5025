"""Pure parts of the client: messages from Arrow, the process queue's bookkeeping, local offsets,
the scheduler, the error mapping and the exported names."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

import connector.client
from broker.wire import codec, errors
from connector.client import Message, MessageQueue
from connector.client.offset_store import LocalOffsetStore
from connector.client.process_queue import ProcessQueue
from connector.client.scheduler import Scheduler

MQ = MessageQueue("t", 0)


def stored(rows: list[dict], base: int = 0) -> pa.Table:
    return codec.with_store_columns(codec.messages_to_batch(rows), base, [1_700_000_000_000], [len(rows)])


def messages(n: int, base: int = 0) -> list[Message]:
    return Message.from_table(stored([{"body": str(i), "key": "k"} for i in range(base, base + n)], base), "t", 0)


def test_messages_from_table_keep_columns_and_order():
    table = stored(
        [
            {"body": b"a", "key": "k1", "tag": "TagA", "properties": {"RECONSUME_TIMES": "2", "x": "y"}},
            {"body": "b", "key": 7, "born_timestamp": 5},
        ],
        base=10,
    )
    first, second = Message.from_table(table, "orders", 3)
    assert (first.body, first.key, first.tag, first.queue_id, first.queue_offset) == (b"a", "k1", "TagA", 3, 10)
    assert first.properties == {"RECONSUME_TIMES": "2", "x": "y"} and first.reconsume_times == 2
    assert (second.key, second.tag, second.properties, second.born_timestamp) == ("7", None, {}, 5)
    assert second.queue_offset == 11 and second.store_timestamp == 1_700_000_000_000
    assert Message.from_table(codec.empty_stored_table(), "t", 0) == []
    # Built past __init__, a message is still the dataclass it would have made: equal, hashable, replaceable.
    assert first == Message(topic="orders", body=b"a", key="k1", tag="TagA", properties={"RECONSUME_TIMES": "2", "x": "y"},
                            born_timestamp=first.born_timestamp, queue_id=3, queue_offset=10,
                            store_timestamp=1_700_000_000_000, reconsume_times=2)
    assert dataclasses.replace(second, reconsume_times=1).reconsume_times == 1 and second.reconsume_times == 0


def test_messages_from_a_table_of_several_chunks_keep_their_order():
    table = pa.concat_tables([stored([{"body": str(i), "key": "k", "born_timestamp": i}], base=i) for i in range(3)])
    assert table.column("born_timestamp").num_chunks == 3
    got = Message.from_table(table, "t", 0)
    assert [(m.body, m.queue_offset, m.born_timestamp) for m in got] == [(b"0", 0, 0), (b"1", 1, 1), (b"2", 2, 2)]


def test_orderly_take_commit_and_consume_again():
    pq = ProcessQueue(MQ, 0, epoch=3)
    pq.put(messages(5))
    first = pq.take(2)
    assert [m.queue_offset for m in first] == [0, 1]
    again = pq.consume_again(first[1:])
    assert [m.reconsume_times for m in again] == [1]
    assert [m.queue_offset for m in pq.take(2)] == [1, 2]  # the suspended message comes first again
    assert pq.commit() == 3
    assert pq.commit() is None
    assert pq.count == 2 and pq.has_temp_message()


def test_rollback_returns_everything_since_the_last_commit():
    pq = ProcessQueue(MQ, 0)
    pq.put(messages(6))
    pq.take(2)
    assert pq.commit() == 2
    pq.take(1)
    pq.take(2)
    pq.rollback()
    assert [m.queue_offset for m in pq.take(10)] == [2, 3, 4, 5]


def test_concurrent_remove_commits_the_lowest_outstanding_offset():
    pq = ProcessQueue(MQ, 10)
    batch = messages(4, base=10)
    pq.put_outstanding(batch)
    assert pq.remove([batch[2]]) == 10
    assert pq.remove([batch[0]]) == 11
    assert pq.remove([batch[1], batch[3]]) == 14
    assert pq.idle()


def test_commit_staging_never_moves_backwards():
    pq = ProcessQueue(MQ, 0)
    assert pq.stage_commit(5)
    pq.commit_done(5)
    assert not pq.stage_commit(4)
    assert pq.stage_commit(7) and pq.pending_commit == 7


def test_local_offsets_survive_a_new_store(tmp_path):
    store = LocalOffsetStore(tmp_path, "g")
    assert store.read(MQ) == -1
    store.commit(MQ, 42)
    store.flush()
    assert LocalOffsetStore(tmp_path, "g").read(MQ) == 42


def test_scheduler_runs_tasks_in_due_order():
    scheduler = Scheduler("test")
    done, ran = threading.Event(), []
    scheduler.call_later(0.05, lambda: (ran.append("late"), done.set()))
    scheduler.call_later(0.0, lambda: ran.append("now"))
    assert done.wait(5)
    scheduler.stop()
    assert ran == ["now", "late"]


def test_exported_names_are_pinned():
    assert sorted(connector.client.__all__) == sorted(
        [
            "BROADCASTING",
            "CLUSTERING",
            "Admin",
            "BrokerGroup",
            "ConcurrentConsumer",
            "ConsumeConcurrentlyContext",
            "ConsumeConcurrentlyStatus",
            "ConsumeOrderlyContext",
            "ConsumeOrderlyStatus",
            "GroupOffset",
            "GroupState",
            "LockHolder",
            "Message",
            "MessageQueue",
            "OpenTransaction",
            "OrderlyConsumer",
            "Producer",
            "PullConsumer",
            "PullResult",
            "QueueProgress",
            "QueueStatus",
            "SelectByHash",
            "SelectByModulo",
            "SelectRandom",
            "SelectRoundRobin",
            "SendResult",
            "SendResults",
            "TopicInfo",
            "Transaction",
            "allocate_averagely",
            "allocate_by_circle",
            "dlq_topic",
            "retry_topic",
        ]
    )
    for name in connector.client.__all__:
        assert hasattr(connector.client, name)


def test_the_client_imports_only_the_wire_layer_of_the_broker():
    import subprocess
    import sys

    code = (
        "import sys, connector.client, connector.cli; "
        "bad = sorted(m for m in sys.modules if m.startswith('broker') and not "
        "(m in ('broker', 'broker.proto', 'broker.wire') or m.startswith(('broker.proto.', 'broker.wire.')))); "
        "print(bad)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"


def _error_classes() -> list[type[errors.OrderlyMQError]]:
    """The wire's error classes: those of ``broker.wire.errors`` (a client's own subclass, such as
    the Spark source's ``DataLossError``, never crosses it), whatever other modules are imported."""
    found, todo = [], [errors.OrderlyMQError]
    while todo:
        cls = todo.pop()
        if cls.__module__ == errors.__name__:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


@pytest.mark.parametrize("code", [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK], ids=lambda c: c.name)
def test_every_grpc_status_maps_to_an_error_class_and_back(code):
    error = errors.from_status(code, "what happened")
    assert isinstance(error, errors.OrderlyMQError) and str(error) == "what happened"
    assert type(errors.from_status(error.code, "again")) is type(error)  # the class's own code leads back to it


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda c: c.__name__)
def test_every_error_class_crosses_the_wire_as_itself(cls):
    code, message, kind = errors.to_status(cls("what happened"))
    assert code is not grpc.StatusCode.OK
    assert errors.error_class_for_kind(kind) is cls, f"two error classes are named {kind}"
    rebuilt = errors.from_status(code, message, kind)
    assert type(rebuilt) is cls and str(rebuilt) == "what happened"
    assert errors.__all__.count(cls.__name__) == 1, f"{cls.__name__} is not exported by broker.wire.errors"


def test_an_unnamed_error_is_translated_by_its_status_only():
    assert type(errors.to_status(KeyError("x"))[0]) is grpc.StatusCode
    assert isinstance(errors.from_status(grpc.StatusCode.DEADLINE_EXCEEDED, ""), errors.BrokerUnavailableError)
    assert not isinstance(errors.from_status(grpc.StatusCode.UNAVAILABLE, "m"), errors.SendOutcomeUnknownError)


def test_the_consumption_log_of_the_client_tests_refuses_a_skipping_replay():
    from tests.client.helpers import OrderLog

    log = OrderLog()
    for seq in (0, 1, 2, 3, 1, 3, 2):  # a replay from 1 that skips 2: consumed 3 before 2 the second time
        log.entries.append(("c", "k", seq, 0, seq))
    verdict = log.verdict({"k": 4})
    assert (verdict.duplicated, verdict.out_of_order) == (3, 1)
    with pytest.raises(AssertionError, match="skipping 2"):
        log.check({"k": 4})
