"""``encode_one`` writes the Arrow IPC stream of one message directly: byte for byte what pyarrow
writes for it, for every shape of message, and the errors it gives for bad ones."""

from __future__ import annotations

import pytest

from broker.wire import codec
from broker.wire.errors import BadBatchError
from broker.wire.one_message import decode_one, encode_one
from tests.support import arrow_batch

ROWS = [
    {"key": "key-1", "body": b"x" * 100, "tag": None, "properties": None, "born_timestamp": 5},
    {"key": None, "body": b"abc", "tag": "TagA", "properties": {"a": "bb", "ccc": "d"}, "born_timestamp": 5},
    {"key": 42, "body": "héllo", "tag": "", "properties": {}, "born_timestamp": -62_135_596_800_000},
    {"key": b"bin", "body": b"", "tag": "t" * 255, "properties": {"k": ""}, "born_timestamp": 2**40},
    {"key": "", "body": bytearray(b"q" * 7), "tag": None, "properties": {"x": 1, 2: "y"}, "born_timestamp": 0},
    {"key": "标" * 30, "body": memoryview(b"z" * 4097), "tag": "é", "properties": {"k" * 9: "v" * 17},
     "born_timestamp": 253_402_300_799_999},
    {"body": b"only a body"},
]


@pytest.mark.parametrize("row", ROWS, ids=range(len(ROWS)))
def test_one_message_is_encoded_as_pyarrow_does_and_stored_as_sent(row):
    row = {"born_timestamp": 1_700_000_000_000, **row}
    payload = encode_one(row)
    assert payload == codec.encode(arrow_batch([row]))
    stored, count = codec.message_batch(payload)
    assert stored is payload and count == 1


def test_a_message_without_born_timestamp_is_stamped_now():
    before = codec.now_ms()
    (row,) = codec.decode(encode_one({"body": b"b"})).to_pylist()
    assert before <= int(row["born_timestamp"].timestamp() * 1000) <= codec.now_ms()


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"key": "k"}, "has no body"),
        ({"key": b"\xff\xfe", "body": b"b"}, "binary key is not valid UTF-8"),
        ({"key": "\ud800", "body": b"b"}, "the key is not valid UTF-8"),
        ({"tag": "\udfff", "body": b"b"}, "the tag is not valid UTF-8"),
        ({"properties": {"k": "\ud800"}, "body": b"b"}, "a property value is not valid UTF-8"),
        ({"born_timestamp": 2**70, "body": b"b"}, "not a 64-bit integer"),
    ],
)
def test_a_bad_message_is_a_bad_batch(row, message):
    with pytest.raises(BadBatchError, match=message):
        encode_one(row)


def test_every_damaged_byte_is_refused_or_still_a_valid_message():
    """``decode_one`` accepts only what re-encodes to the same bytes: a flipped byte anywhere either
    takes the general path (which stores or refuses it) or still reads as a valid message."""
    payload = encode_one({"key": "k", "tag": "t", "body": b"body", "properties": {"p": "v"}, "born_timestamp": 7})
    for at in range(len(payload)):
        damaged = payload[:at] + bytes([payload[at] ^ 0x5A]) + payload[at + 1:]
        row = decode_one(damaged)
        if row is not None:
            assert encode_one(row) == damaged
        try:
            stored, count = codec.message_batch(damaged)
        except BadBatchError:
            continue
        assert count == 1 and len(codec.decode(stored)) == 1
