"""Malformed batches are ``BadBatchError`` wherever the bad bytes sit, and names and message
metadata are bounded with errors that name the limit (codec alone, then a real broker)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from broker.wire import codec
from broker.wire.errors import BadBatchError, InvalidRequestError
from connector.client.connection import BrokerConnection, pb
from tests.support import send_rows

INVALID_UTF8 = b"\xff\xfe\xc3"


def raw_strings(values: list[bytes]) -> pa.Array:
    """A string array holding ``values`` as they are, valid UTF-8 or not."""
    binary = pa.array(values, pa.binary())
    return pa.Array.from_buffers(pa.string(), len(binary), binary.buffers())


def message_table(**columns) -> pa.Table:
    base = {
        "key": pa.array(["a", "b"]),
        "tag": pa.array(["t", "t"]),
        "body": pa.array([b"x", b"y"]),
        "properties": pa.array([[("k", "v")], [("k", "v")]], codec.PROPERTIES_TYPE),
        "born_timestamp": pa.array([1, 2], codec.TIMESTAMP_MS),
    }
    return pa.table({**base, **columns}, schema=codec.MESSAGE_SCHEMA)


def renamed_column(table: pa.Table, name: bytes, new: bytes) -> bytes:
    """``table`` encoded, with one column name's bytes replaced (same length) in the schema."""
    raw = codec.encode(table)
    at = raw.index(name)
    return raw[:at] + new + raw[at + len(new):]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (codec.encode(message_table(key=raw_strings([INVALID_UTF8, b"ok"]))), "Invalid UTF8"),
        (codec.encode(message_table(tag=raw_strings([b"ok", INVALID_UTF8]))), "Invalid UTF8"),
        (codec.encode(message_table(properties=pa.MapArray.from_arrays(
            pa.array([0, 1, 2], pa.int32()), raw_strings([INVALID_UTF8, b"k"]), raw_strings([b"v", b"v"])))),
         "Invalid UTF8"),
        (codec.encode(message_table(properties=pa.MapArray.from_arrays(
            pa.array([0, 1, 2], pa.int32()), raw_strings([b"k", b"k"]), raw_strings([b"v", INVALID_UTF8])))),
         "Invalid UTF8"),
        (renamed_column(pa.table({"body": [b"x"], "zz": [1]}), b"zz", b"\xff\xfe"), "UnicodeDecodeError"),
        (renamed_column(pa.table({"body": [b"x"], "tag": ["t"]}), b"tag", b"\xf0ag"), "UnicodeDecodeError"),
        (codec.encode(message_table(born_timestamp=pa.array([2**62, 1], codec.TIMESTAMP_MS))),
         "born_timestamp' holds 4611686018427387904, not a time in years 1 to 9999"),
        (codec.encode(message_table(tag=pa.array(["t" * 256, "t"]))),
         "a tag in the batch is 256 bytes long; the limit is 255 bytes"),
        (codec.encode(message_table(properties=pa.array([[("k" * 256, "v")], []], codec.PROPERTIES_TYPE))),
         "a property key in the batch is 256 bytes long; the limit is 255 bytes"),
        (codec.encode(message_table(properties=pa.array([[], [("k", "é" * 20_000)]], codec.PROPERTIES_TYPE))),
         "a property value in the batch is 40000 bytes long; the limit is 32768 bytes"),
    ],
    ids=["key", "tag", "property-key", "property-value", "column-name", "known-column-name", "born-timestamp",
         "long-tag", "long-property-key", "long-property-value"],
)
def test_malformed_or_oversized_batches_are_bad_batches(payload, message):
    with pytest.raises(BadBatchError, match=message):
        codec.message_batch(payload)


def test_metadata_at_the_limits_is_accepted():
    table = message_table(tag=pa.array(["t" * 255, "标" * 85]),
                          properties=pa.array([[("k" * 255, "v" * 32_768)], []], codec.PROPERTIES_TYPE))
    assert codec.message_batch(codec.encode(table))[1] == 2


@pytest.mark.parametrize("rows", [3, 64, 65, 1000])
def test_every_row_is_checked_in_batches_small_and_large(rows):
    """A small batch's born timestamps are compared in Python, a large one's with numpy, and a
    properties column that is mostly null is still read: the one bad value is found either way."""
    def table(**columns) -> pa.Table:
        base = {"key": pa.array(["k"] * rows), "tag": pa.nulls(rows, pa.string()), "body": pa.array([b"x"] * rows),
                "properties": pa.nulls(rows, codec.PROPERTIES_TYPE),
                "born_timestamp": pa.array([1] * rows, codec.TIMESTAMP_MS)}
        return pa.table({**base, **columns}, schema=codec.MESSAGE_SCHEMA)

    last = rows - 1
    assert codec.message_batch(codec.encode(table()))[1] == rows
    too_late = codec.MAX_BORN_MS + 1
    with pytest.raises(BadBatchError, match=f"holds {too_late}, not a time"):
        codec.message_batch(codec.encode(table(born_timestamp=pa.array([1] * last + [too_late], codec.TIMESTAMP_MS))))
    with pytest.raises(BadBatchError, match="property value in the batch is 32769 bytes"):
        properties = pa.array([None] * last + [[("k", "v" * 32_769)]], codec.PROPERTIES_TYPE)
        codec.message_batch(codec.encode(table(properties=properties)))


def test_the_limits_count_only_non_null_values_of_any_slice():
    # A null tag whose offsets span 300 bytes: Arrow allows it, and the limit is not about it.
    data = pa.py_buffer(b"t" * 301)
    offsets = pa.py_buffer(pa.array([0, 300, 301], pa.int32()).buffers()[1])
    validity = pa.py_buffer(bytes([0b10]))
    tags = pa.Array.from_buffers(pa.string(), 2, [validity, offsets, data], null_count=1)
    assert codec.message_batch(codec.encode(message_table(tag=tags)))[1] == 2
    long_tags = message_table(tag=pa.array(["t" * 256, "t"]))
    with pytest.raises(BadBatchError, match="256 bytes long"):
        codec.message_batch(codec.encode(long_tags.slice(0, 1)))
    assert codec.message_batch(codec.encode(long_tags.slice(1, 1)))[1] == 1  # the slice left the long one out


@pytest.mark.parametrize(
    ("method", "request_", "message"),
    [
        ("CommitOffset", pb.CommitOffsetRequest(group="g" * 100_000, topic="t", queue_id=0, offset=0),
         "consumer group 'ggg.* is 100000 bytes long; the limit is 255 bytes"),
        ("GetOffset", pb.GetOffsetRequest(group="g" * 256, topic="t", queue_id=0),
         "consumer group .* the limit is 255 bytes"),
        ("LockBatch", pb.LockBatchRequest(group="g", client_id="c" * 300, topic="t", queue_ids=[0]),
         "client_id .* is 300 bytes long; the limit is 255 bytes"),
        ("Heartbeat", pb.HeartbeatRequest(group="g", client_id="c", topics=["t" * 200]),
         "subscribed topic .* is 200 bytes long; the limit is 127 bytes"),
        ("DescribeTopic", pb.DescribeTopicRequest(topic="t" * 100_000),
         r"invalid topic name 'ttt.*\(100002 characters\): use 1-127 characters"),
        ("CreateTopic", pb.CreateTopicRequest(topic="t" * 128, queue_count=1), "use 1-127 characters"),
    ],
    ids=["commit-group", "get-group", "lock-client", "heartbeat-topic", "describe-topic", "create-topic"],
)
def test_over_long_names_are_refused_naming_the_limit(broker, method, request_, message):
    with BrokerConnection(broker.address, retry_timeout=5) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="t", queue_count=1))
        with pytest.raises(InvalidRequestError, match=message) as info:
            conn.call(method, request_)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and len(str(info.value)) < 400


def test_a_send_with_an_over_long_tag_is_a_bad_batch(broker):
    with BrokerConnection(broker.address, retry_timeout=5) as conn:
        conn.call("CreateTopic", pb.CreateTopicRequest(topic="t", queue_count=1))
        with pytest.raises(BadBatchError, match="the limit is 255 bytes"):
            send_rows(conn, "t", 0, [{"key": "k", "body": b"b", "tag": "x" * 1000}])
        assert send_rows(conn, "t", 0, [{"key": "k", "body": b"b", "tag": "x" * 255}]).base_offset == 0


def test_a_batch_that_made_arrow_abort_the_process_is_a_bad_batch():
    """A mutated batch whose properties map has null keys made a cast abort the whole broker
    (``Check failed``, SIGABRT); every column is now validated before anything computes on it.
    Run in a child process, so a regression fails this test instead of killing the test run."""
    sample = Path(__file__).parent / "data" / "map-with-null-keys.arrows"
    script = (
        "import sys\nfrom broker.wire import codec\nfrom broker.wire.errors import BadBatchError\n"
        f"try:\n    codec.message_batch(open({str(sample)!r}, 'rb').read())\nexcept BadBatchError as exc:\n"
        "    print(exc)\n    sys.exit(0)\nsys.exit(3)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-500:]}"
    assert "Map array keys array should have no nulls" in done.stdout
