"""The hand-serialized PullResponse (batches given as parts) parses exactly like one built by protobuf,
and the hand parse of one reads what protobuf writes, its batches left in the received bytes."""

from __future__ import annotations

import pytest

from broker.proto import orderlymq_pb2 as pb
from broker.wire import codec
from broker.wire.errors import DamagedRecordError, InternalBrokerError, TopicNotFoundError
from broker.wire.pull_response import decode_pull_response, encode_pull_error, encode_pull_response


@pytest.mark.parametrize("sizes", [[], [0], [1, 127, 128], [16_383, 16_384, 2_097_152]])
def test_parses_as_the_protobuf_message(sizes):
    batches = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    scalars = dict(next_offset=1 << 40, count=len(sizes), min_offset=3, max_offset=(1 << 40) + 7)
    raw = b"".join(encode_pull_response([[b[:1], memoryview(b[1:])] for b in batches], **scalars))
    assert pb.PullResponse.FromString(raw) == pb.PullResponse(batches=batches, **scalars)


def test_zero_scalars_are_omitted_like_protobuf_does():
    assert b"".join(encode_pull_response([], next_offset=0, count=0, min_offset=0, max_offset=0)) == b""


def _field(number: int, wire_type: int) -> bytes:
    return bytes([number << 3 | wire_type])  # the one-byte key of a field numbered below 16


@pytest.mark.parametrize("sizes", [[], [0], [1, 127, 128], [16_383, 16_384, 2_097_152]])
def test_hand_parse_reads_what_protobuf_writes(sizes):
    batches = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    scalars = dict(next_offset=1 << 40, count=len(sizes), min_offset=-1, max_offset=(1 << 40) + 7)
    reply = decode_pull_response(pb.PullResponse(batches=batches, **scalars).SerializeToString())
    assert [b.to_pybytes() for b in reply.batches] == batches
    assert (reply.next_offset, reply.count, reply.min_offset, reply.max_offset) == tuple(scalars.values())


def test_hand_parse_reads_the_broker_encoding_and_skips_unknown_fields():
    raw = b"".join(encode_pull_response([[b"ab", b"c"]], next_offset=9, count=1, min_offset=0, max_offset=12))
    unknown = (_field(12, 0) + b"\x96\x01" + _field(13, 1) + bytes(8) + _field(14, 2) + b"\x02zz"
               + _field(15, 5) + bytes(4))
    reply = decode_pull_response(unknown + raw + pb.PullResponse(count=-3).SerializeToString())
    assert [b.to_pybytes() for b in reply.batches] == [b"abc"]
    assert (reply.next_offset, reply.count, reply.max_offset) == (9, -3, 12)  # the last value wins, as in protobuf


@pytest.mark.parametrize("raw, fault", [
    (_field(2, 0) + b"\x80\x80", "varint at byte 1 is truncated"),
    (_field(2, 0) + b"\xff" * 11, "varint at byte 1 is truncated or longer than 10 bytes"),
    (_field(1, 2) + b"\x05abc", "field 1 of 5 bytes runs past the end at byte 2"),
    (_field(1, 0) + b"\x01", "field 1 at byte 0 has wire type 0"),
    (_field(2, 2) + b"\x01a", "field 2 at byte 0 has wire type 2"),
    (_field(3, 0) + b"\x01" + _field(12, 3), "field 12 at byte 2 has wire type 3"),
    (_field(13, 1) + bytes(4), "field 13 at byte 0 runs past the end"),
    (b"\x00\x00", "field 0 at byte 0 has wire type 0"),
])
def test_a_malformed_reply_names_its_fault(raw, fault):
    with pytest.raises(InternalBrokerError, match=f"malformed Pull reply from the broker .*{fault}"):
        decode_pull_response(raw)


def test_batches_decode_without_copies():
    table = codec.messages_to_batch([{"key": "k", "body": b"x" * 1000}])
    raw = pb.PullResponse(batches=[codec.encode(table)], count=1).SerializeToString()
    reply = decode_pull_response(raw)
    decoded = codec.decode_many(reply.batches)
    assert decoded.equals(table)
    body = decoded.column("body").chunk(0).buffers()[2]
    assert reply.batches[0].address <= body.address < reply.batches[0].address + reply.batches[0].size


@pytest.mark.parametrize("failure", [DamagedRecordError("messages 3..9 are damaged", 10),
                                     TopicNotFoundError("topic 'nope' does not exist"),
                                     KeyError("a bug")])
def test_an_error_answer_raises_what_the_grpc_status_would(failure):
    reply = decode_pull_response(encode_pull_error(failure))
    expected = InternalBrokerError if isinstance(failure, KeyError) else type(failure)
    with pytest.raises(expected) as raised:
        reply.raise_error()
    assert type(raised.value) is expected
    assert str(failure) in str(raised.value)
    if isinstance(failure, DamagedRecordError):
        assert raised.value.next_offset == 10


def test_an_answer_without_error_raises_nothing():
    decode_pull_response(b"".join(encode_pull_response([], next_offset=4, count=0, min_offset=0,
                                                       max_offset=4))).raise_error()
