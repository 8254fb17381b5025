"""``encode_rows`` writes the Arrow IPC stream of many messages directly: byte for byte what pyarrow
writes for them, for every mix of messages, kept by the broker as sent; the errors it gives for
bad ones; and no process that sends, serves or consumes loads pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.launcher import BrokerProcess
from broker.wire import codec
from broker.wire.errors import BadBatchError
from broker.wire.message_rows import encode_rows
from tests.broker.test_one_message import ROWS
from tests.support import ROOT, arrow_batch


def _stamped(rows):
    return [{"born_timestamp": 1_700_000_000_000 + i, **row} for i, row in enumerate(rows)]


def _assert_encoded_as_pyarrow_does(rows):
    payload = encode_rows(rows)
    assert payload == codec.encode(arrow_batch(rows))
    stored, count = codec.message_batch(payload)
    assert stored is payload and count == len(rows)
    return payload


@pytest.mark.parametrize("count", [1, 2, 7, 8, 9, 64, 1000])
def test_a_mix_of_messages_is_encoded_as_pyarrow_does(count):
    rows = _stamped(ROWS[i % len(ROWS)] for i in range(count))
    payload = _assert_encoded_as_pyarrow_does(rows)
    decoded = codec.decode(payload)
    assert decoded.column("body").to_pylist() == [bytes(row["body"]) if not isinstance(row["body"], str)
                                                  else row["body"].encode() for row in rows]


@pytest.mark.parametrize("count", [1, 9, 300])
def test_messages_as_a_producer_makes_them_are_encoded_as_pyarrow_does(count):
    """Keyed messages, no tag or properties: what ``send_async`` batches."""
    _assert_encoded_as_pyarrow_does(_stamped({"key": f"key-{i % 7}", "body": b"b" * (i % 50), "tag": None,
                                                          "properties": None} for i in range(count)))


_texts = st.one_of(st.none(), st.text(max_size=12))
_rows = st.fixed_dictionaries(
    {"body": st.one_of(st.binary(max_size=40), st.text(max_size=20))},
    optional={"key": st.one_of(_texts, st.integers(-5, 10**12), st.text(max_size=8).map(str.encode)),
              "tag": _texts,
              "properties": st.one_of(st.none(), st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=4)),
              "born_timestamp": st.integers(-62_135_596_800_000, 253_402_300_799_999)},  # what the broker takes
)


@given(st.lists(_rows, min_size=1, max_size=40))
def test_any_messages_are_encoded_as_pyarrow_does(rows):
    _assert_encoded_as_pyarrow_does(_stamped(rows))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"key": "k"}, "message 1 has no body"),
        ({"key": b"\xff\xfe", "body": b"b"}, "message 1: binary key is not valid UTF-8"),
        ({"key": "\ud800", "body": b"b"}, "message 1: the key is not valid UTF-8"),
        ({"tag": "\udfff", "body": b"b"}, "message 1: the tag is not valid UTF-8"),
        ({"tag": 5, "body": b"b"}, "message 1: tag must be a string, got int"),
        ({"body": "\udfff"}, "message 1: the body is not valid UTF-8"),
        ({"properties": {"k": "\ud800"}, "body": b"b"}, "a property value is not valid UTF-8"),
        ({"born_timestamp": 2**70, "body": b"b"}, "not a 64-bit integer"),
        ({"born_timestamp": "soon", "body": b"b"}, "not a 64-bit integer"),
    ],
)
def test_a_bad_message_among_good_ones_is_a_bad_batch_naming_it(row, message):
    with pytest.raises(BadBatchError, match=message):
        encode_rows([{"key": "k", "body": b"fine"}, row, {"body": b"fine too"}])


def test_an_empty_batch_is_refused():
    with pytest.raises(BadBatchError, match="empty batch"):
        encode_rows([])


_CLIENT = """
import sys
import pyarrow as pa
from broker.wire.codec import string_array
from connector.client import Admin, Producer, PullConsumer

address = sys.argv[1]
Admin(address).create_topic("no-pandas", 1)
with Producer(address) as producer:
    producer.send("no-pandas", b"0", key="k", tag="TagA")
    futures = [producer.send_async("no-pandas", str(i).encode(), key="k", tag="TagB") for i in range(1, 5)]
    assert [f.result().queue_offset for f in futures] == [1, 2, 3, 4]
    producer.send_batch("no-pandas", [{"key": "k", "body": b"5", "tag": "TagA"}, {"key": "k", "body": b"6"}])
    table = pa.Table.from_arrays([string_array(["k", "j"]), string_array([b"7", b"8"], binary=True)], ["key", "body"])
    producer.send_batch("no-pandas", table)  # made without pa.table, which would import pandas itself
consumer = PullConsumer(address)
consumer.assign("no-pandas", start="earliest")
bodies = [m.body for m in consumer.poll(100)]
assert bodies == [str(i).encode() for i in range(9)], bodies
assert consumer.poll(10) == []
assert [m.body for m in consumer.pull("no-pandas", 0, 0, tag_expression="TagA").messages] == [b"0", b"5"]
consumer.close()
assert "pandas" not in sys.modules, "the client imported pandas"
"""


def test_neither_a_broker_nor_its_clients_load_pandas(tmp_path):
    """``pa.array`` of a list imports pandas on first use: half a second of start-up and tens of
    megabytes for a process that never uses it, walked by every full garbage collection. A client
    sending every way and pulling, and the broker serving it (tagged pulls too), never load it."""
    with BrokerProcess(tmp_path / "broker") as broker:
        subprocess.run([sys.executable, "-c", _CLIENT, broker.address], cwd=ROOT, check=True, timeout=120)
        assert "/pandas/" not in Path(f"/proc/{broker.pid}/maps").read_text()
