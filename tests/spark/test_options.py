"""Option validation, offset bookkeeping and vectorized routing: no Spark, no broker."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from broker.wire.errors import InvalidOptionError
from broker.wire.routing import queue_for_key
from connector.spark.offsets import admit, carried_read_at, client_id_of, positions_of, read_at_of, to_json
from connector.spark.options import SinkOptions, SourceOptions
from connector.spark.sharding import queue_ids

BASE = {"brokers": "127.0.0.1:9876", "topic": "orders", "consumerGroup": "billing"}


def source(streaming=True, **extra):
    return SourceOptions.from_options({**BASE, **extra}, streaming=streaming)


def test_group_offset_conflict_modes():
    assert source().group_offset_conflict == "fail"
    assert source(groupOffsetConflict="Group").group_offset_conflict == "group"
    assert source(groupOffsetConflict="checkpoint").group_offset_conflict == "checkpoint"
    with pytest.raises(InvalidOptionError, match="'groupOffsetConflict' applies to streaming reads only"):
        source(streaming=False, groupOffsetConflict="group")


def test_defaults_and_case_insensitive_keys():
    opts = SourceOptions.from_options({"BROKERS": "h:1", "Topics": "a, b", "consumergroup": "g"})
    assert opts.topics == ("a", "b")
    assert opts.starting.kind == "committed"
    assert opts.fail_on_data_loss and opts.include_properties
    assert opts.tags == "*" and opts.max_messages_per_trigger is None
    batch = SourceOptions.from_options({"brokers": "h:1", "topic": "a"}, streaming=False)
    assert batch.starting.kind == "earliest" and batch.ending.kind == "latest"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t", "consumerGroup": "g"}, "option 'brokers' is required"),
        ({"brokers": "nohost", "topic": "t", "consumerGroup": "g"}, "not host:port"),
        ({"brokers": "h:1", "consumerGroup": "g"}, "option 'topic' is required"),
        ({"brokers": "h:1", "topic": "t"}, "option 'consumerGroup' is required"),
        ({**BASE, "topics": "x"}, "'topic' and 'topics' are both set"),
        ({**BASE, "topic": "a,,b"}, "empty topic name"),
        ({**BASE, "startingOffset": "earliest"}, "unknown option 'startingOffset'.*did you mean 'startingOffsets'"),
        ({**BASE, "startingOffsets": "newest"}, "option 'startingOffsets' must be committed, earliest, latest"),
        ({**BASE, "startingOffsets": '{"orders": {"0": 1'}, "option 'startingOffsets' is not valid JSON"),
        ({**BASE, "startingOffsets": '{"other": {"0": 1}}'}, "names topic 'other'"),
        ({**BASE, "startingOffsets": '{"orders": {"x": 1}}'}, "queue id 'x'"),
        ({**BASE, "startingOffsets": '{"orders": {"0": -3}}'}, "offset -3 of queue orders/0 is not valid"),
        ({**BASE, "startingOffsets": "latest", "startingTimestamp": "5"}, "both set"),
        ({**BASE, "startingTimestamp": "soon"}, "option 'startingTimestamp' must be an integer"),
        ({**BASE, "endingOffsets": "latest"}, "option 'endingOffsets' applies to batch reads only"),
        ({**BASE, "maxMessagesPerTrigger": "0"}, "option 'maxMessagesPerTrigger' must be at least 1"),
        ({**BASE, "failOnDataLoss": "maybe"}, "option 'failOnDataLoss' must be true or false"),
        ({**BASE, "lockTimeoutMs": "-1"}, "option 'lockTimeoutMs' must be at least 0"),
        ({**BASE, "groupOffsetConflict": "newest"}, "option 'groupOffsetConflict' must be fail, group or checkpoint"),
    ],
)
def test_bad_stream_options_name_the_option_and_fix(options, message):
    with pytest.raises(InvalidOptionError, match=message):
        SourceOptions.from_options(options, streaming=True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"brokers": "h:1", "topic": "t", "startingOffsets": "committed"}, "no 'consumerGroup' is set"),
        ({"brokers": "h:1", "topic": "t", "maxMessagesPerTrigger": "5"}, "applies to streaming reads only"),
        ({"brokers": "h:1", "topic": "t", "endingOffsets": '{"t": {"0": -2}}'}, "offset -2 of queue t/0"),
        ({"brokers": "h:1", "topic": "t", "endingOffsets": "latest", "endingTimestamp": "1"}, "both set"),
        ({"brokers": "h:1", "topics": "a,b", "startingOffsets": '{"a": {"0": 0}}'}, "no offsets for topic"),
    ],
)
def test_bad_batch_options(options, message):
    with pytest.raises(InvalidOptionError, match=message):
        SourceOptions.from_options(options, streaming=False)


def test_offset_specs_parse():
    opts = source(startingOffsets='{"orders": {"0": 5, "1": -2}}')
    assert opts.starting.kind == "offsets" and opts.starting.offsets == {"orders": {0: 5, 1: -2}}
    assert source(startingTimestamp="1700000000000").starting.timestamp == 1700000000000
    batch = source(streaming=False, endingOffsets='{"orders": {"0": 9, "1": -1}}', consumerGroup=None)
    assert batch.ending.offsets == {"orders": {0: 9, 1: -1}}


def test_options_are_frozen():
    opts = source()
    with pytest.raises(AttributeError):
        opts.topics = ("x",)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "t"}, "option 'brokers' is required"),
        ({"brokers": "h:1", "topic": "a,b"}, "names one topic"),
        ({"brokers": "h:1", "shardKey": "k"}, "unknown option 'shardKey'.*did you mean 'shardingKey'"),
        ({"brokers": "h:1", "exactlyOnce": "sure"}, "option 'exactlyOnce' must be true or false"),
        ({"brokers": "h:1", "maxBatchBytes": "10"}, "option 'maxBatchBytes' must be at least 1024"),
        ({"brokers": "h:1", "propertiesColumns": "a,,b"}, "empty column name"),
        ({"brokers": "h:1", "transactionTimeoutMs": "3000000000"},
         r"option 'transactionTimeoutMs' must be at most 2147483647 \(ms\), got 3000000000"),
        ({"brokers": "h:1", "requestTimeoutMs": "0"}, r"option 'requestTimeoutMs' must be at least 1 \(ms\), got 0"),
        ({"brokers": "h:1", "requestTimeoutMs": "3s"}, r"option 'requestTimeoutMs' must be an integer \(ms\)"),
    ],
)
def test_bad_sink_options(options, message):
    with pytest.raises(InvalidOptionError, match=message):
        SinkOptions.from_options(options)


def test_sink_defaults_and_spark_options_ignored():
    opts = SinkOptions.from_options({"brokers": "h:1", "topic": "t", "checkpointLocation": "/tmp/x", "path": "p"})
    assert opts.exactly_once and opts.body_column == "body" and opts.sharding_key is None
    assert opts.transaction_timeout_ms == 24 * 3600 * 1000  # a batch's first tasks wait for its last
    assert opts.request_timeout_ms == 30_000 and opts.connect().timeout == 30.0
    quick = SinkOptions.from_options({"brokers": "h:1", "requestTimeoutMs": "2500"})
    assert quick.connect().timeout == quick.connect().retry_timeout == 2.5


def test_offsets_json_is_canonical_and_round_trips():
    positions = {("b", 10): 3, ("a", 2): 7, ("b", 9): 1}
    offset = to_json("c1", positions)
    assert list(offset["queues"]) == ["a", "b"] and list(offset["queues"]["b"]) == ["9", "10"]
    assert positions_of(offset) == positions and client_id_of(offset) == "c1"
    with pytest.raises(InvalidOptionError, match="new checkpointLocation"):
        client_id_of({"queues": {}})


def test_read_times_round_trip_and_stay_put_where_a_queue_did_not_move():
    begin, begun_at = {("t", 0): 5, ("t", 1): 9}, {("t", 0): 100, ("t", 1): 100}
    end, ended_at = {("t", 0): 5, ("t", 1): 12, ("t", 2): 3}, {("t", 0): 200, ("t", 1): 200, ("t", 2): 200}
    read_at = carried_read_at(begin, begun_at, end, ended_at)
    # An idle queue keeps its time, so an idle query's offsets stay the same JSON for Spark.
    assert read_at == {("t", 0): 100, ("t", 1): 200, ("t", 2): 200}
    offset = to_json("c1", end, read_at=read_at)
    assert read_at_of(offset) == read_at and positions_of(offset) == end
    assert read_at_of(to_json("c1", end)) == {} and "readAtMs" not in to_json("c1", end)  # older checkpoints


def test_admit_respects_the_budget_and_always_progresses():
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    latest = {("t", 0): 100, ("t", 1): 12, ("t", 2): 5, ("t", 3): 4}  # queue 3 is new
    assert admit(start, latest, None) == latest
    end = admit(start, latest, 10)
    assert sum(end[r] - start.get(r, 0) for r in end) == 10
    assert end[("t", 1)] == 12 and end[("t", 3)] == 4  # small backlogs are served whole
    tiny = admit(start, latest, 1)
    assert sum(tiny[r] - start.get(r, 0) for r in tiny) == 1
    assert all(start.get(r, 0) <= tiny[r] <= latest[r] for r in tiny)


def test_vectorized_routing_equals_queue_for_key():
    rng = random.Random(7)
    strings = [
        "",
        "a",
        "héllo wörld",
        "日本語キー",
        "🚀",
        *("".join(rng.choices("abcxyzé日", k=rng.randint(0, 40))) for _ in range(300)),
    ]
    binaries = [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 30))) for _ in range(300)]
    ints = [rng.randint(-(2**63), 2**63 - 1) for _ in range(300)] + [0, -1, 1, 7, -7]
    for n in (1, 3, 8, 13):
        assert queue_ids(pa.array(strings), n).tolist() == [queue_for_key(k, n) for k in strings]
        assert queue_ids(pa.array(strings, pa.large_string()).slice(3), n).tolist() == [
            queue_for_key(k, n) for k in strings[3:]
        ]
        assert queue_ids(pa.array(binaries, pa.binary()), n).tolist() == [queue_for_key(k, n) for k in binaries]
        repeated = rng.sample(strings * 3, len(strings) * 3)  # each distinct key is hashed once
        assert queue_ids(pa.array(repeated), n).tolist() == [queue_for_key(k, n) for k in repeated]
        assert queue_ids(pa.array(ints, pa.int64()), n).tolist() == [queue_for_key(k, n) for k in ints]
        assert queue_ids(pa.array([5, -5], pa.int8()), n).tolist() == [queue_for_key(k, n) for k in (5, -5)]
