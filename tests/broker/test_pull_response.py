"""The hand-serialized PullResponse (batches given as parts) parses exactly like one built by protobuf."""

from __future__ import annotations

import pytest

from broker.proto import orderlymq_pb2 as pb
from broker.wire.pull_response import encode_pull_response


@pytest.mark.parametrize("sizes", [[], [0], [1, 127, 128], [16_383, 16_384, 2_097_152]])
def test_parses_as_the_protobuf_message(sizes):
    batches = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    scalars = dict(next_offset=1 << 40, count=len(sizes), min_offset=3, max_offset=(1 << 40) + 7)
    raw = encode_pull_response([[b[:1], memoryview(b[1:])] for b in batches], **scalars)
    assert pb.PullResponse.FromString(raw) == pb.PullResponse(batches=batches, **scalars)


def test_zero_scalars_are_omitted_like_protobuf_does():
    assert encode_pull_response([], next_offset=0, count=0, min_offset=0, max_offset=0) == b""
