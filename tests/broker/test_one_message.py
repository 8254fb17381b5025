"""``encode_one`` writes the Arrow IPC stream of one message directly: byte for byte what pyarrow
writes for it, for every shape of message, and the errors it gives for bad ones."""

from __future__ import annotations

import struct

import pytest

from broker.wire import codec
from broker.wire.errors import BadBatchError
from broker.wire.ipc_layout import BODY_AT
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


def test_a_keyed_message_of_any_sizes_is_laid_out_as_pyarrow_does_and_read_back():
    """A message with a key and nothing else is written from a template of its key's and body's
    sizes (kept for 1,024 pairs of sizes, then started again): every pair gives pyarrow's bytes."""
    sizes = [*range(18), 63, 64, 65, 4097]
    for key_size in sizes:
        for body_size in sizes:
            row = {"key": "k" * key_size, "body": bytes(range(256)) * 17, "born_timestamp": key_size - body_size}
            row["body"] = row["body"][:body_size]
            payload = encode_one(row)
            assert payload == codec.encode(arrow_batch([row])), (key_size, body_size)
            assert decode_one(payload) == {**row, "tag": None, "properties": None}
    for body_size in range(1_100):  # more pairs than are kept
        payload = encode_one({"key": "é", "body": b"b" * body_size, "born_timestamp": 3})
        assert decode_one(payload)["body"] == b"b" * body_size


def test_every_damaged_byte_of_a_keyed_message_is_refused_or_still_a_valid_message():
    """The same for the usual message (a key, no tag, no properties), read by its template."""
    payload = encode_one({"key": "key-1", "body": b"x" * 13, "born_timestamp": 7})
    for at in range(len(payload)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = payload[:at] + bytes([payload[at] ^ flip]) + payload[at + 1:]
            row = decode_one(damaged)
            if row is not None:
                assert encode_one(row) == damaged
    assert decode_one(payload[:-1]) is None and decode_one(payload + b"\0") is None
    empty = encode_one({"key": "k", "body": b"", "born_timestamp": 7})
    size_at = BODY_AT + 8 + 8 + 16  # the body's offsets: after the key's offsets, the key padded, the null tag
    for size in (-1, -7):  # sizes that would still fit the payload's length
        crafted = empty[:size_at + 4] + struct.pack("<i", size) + empty[size_at + 8:]
        assert decode_one(crafted) is None
        with pytest.raises(BadBatchError):
            codec.message_batch(crafted)
