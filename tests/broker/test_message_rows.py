"""``encode_rows`` writes the Arrow IPC stream of many messages directly: byte for byte what the
general encoder writes, for every mix of messages, kept by the broker as sent; the errors it gives
for bad ones; and no process that only sends and serves imports pandas."""

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
from connector.client import Admin, Producer
from connector.client.connection import BrokerConnection
from tests.broker.test_one_message import ROWS
from tests.support import ROOT, pull_all


def _stamped(rows):
    return [{"born_timestamp": 1_700_000_000_000 + i, **row} for i, row in enumerate(rows)]


def _assert_encoded_as_the_general_encoder_does(rows):
    payload = encode_rows(rows)
    assert payload == codec.encode(codec.messages_to_batch(rows))
    stored, count = codec.message_batch(payload)
    assert stored is payload and count == len(rows)
    return payload


@pytest.mark.parametrize("count", [1, 2, 7, 8, 9, 64, 1000])
def test_a_mix_of_messages_is_encoded_as_the_general_encoder_does(count):
    rows = _stamped(ROWS[i % len(ROWS)] for i in range(count))
    payload = _assert_encoded_as_the_general_encoder_does(rows)
    decoded = codec.decode(payload)
    assert decoded.column("body").to_pylist() == [bytes(row["body"]) if not isinstance(row["body"], str)
                                                  else row["body"].encode() for row in rows]


@pytest.mark.parametrize("count", [1, 9, 300])
def test_messages_as_a_producer_makes_them_are_encoded_as_the_general_encoder_does(count):
    """Keyed messages, no tag or properties: what ``send_async`` batches."""
    _assert_encoded_as_the_general_encoder_does(_stamped({"key": f"key-{i % 7}", "body": b"b" * (i % 50), "tag": None,
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
def test_any_messages_are_encoded_as_the_general_encoder_does(rows):
    _assert_encoded_as_the_general_encoder_does(_stamped(rows))


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


def _loads_pandas(pid: int) -> bool:
    return "/pandas/" in Path(f"/proc/{pid}/maps").read_text()


def test_a_broker_and_a_pipelining_producer_do_not_load_pandas(tmp_path):
    """``pa.array`` of a list imports pandas on first use: half a second of start-up and tens of
    megabytes for a process that never uses it, walked by every full garbage collection. Neither a
    broker serving sends and tagged pulls nor a producer sending one at a time and pipelined loads it."""
    with BrokerProcess(tmp_path / "broker") as broker, Producer(broker.address) as producer:
        Admin(broker.address).create_topic("tagged", 2)
        producer.send("tagged", b"one", key="k", tag="TagA")
        futures = [producer.send_async("tagged", f"{i}".encode(), key="k", tag="TagA" if i % 2 else "TagB")
                   for i in range(10)]
        assert [f.result().queue_offset for f in futures] == list(range(1, 11))
        queue_id = futures[0].result().queue_id
        conn = BrokerConnection(broker.address)
        tagged = pull_all(conn, "tagged", queue_id, tag_expression="TagA")
        conn.close()
        assert tagged.column("body").to_pylist() == [b"one"] + [f"{i}".encode() for i in range(1, 10, 2)]
        assert not _loads_pandas(broker.pid)
    script = ("import sys\n"
              "import broker.server, connector.client\n"
              "from broker.wire.message_rows import encode_rows\n"
              "encode_rows([{'key': 'k', 'body': b'b'}] * 3)\n"
              "assert 'pandas' not in sys.modules, 'pandas was imported'\n")
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=120)
