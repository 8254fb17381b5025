"""codec.join_records: staged sends joined into one stored record without re-encoding."""

from __future__ import annotations

from broker.wire import codec


def _body(messages):
    body, count = codec.message_batch(codec.encode(codec.messages_to_batch(messages)))
    assert count == len(messages)
    return body


def test_joined_bodies_hold_every_message_in_order():
    first = [{"key": "a", "body": b"1", "properties": {"p": "v"}}, {"key": "b", "body": b"2"}]
    second = [{"key": "a", "body": b"3", "tag": "T"}]
    bodies = [_body(first), _body(second), _body(first)]
    parts, count = codec.join_records(bodies)
    assert count == 5
    views = [part for part in parts if isinstance(part, memoryview)]
    assert {id(view.obj) for view in views} == {id(body) for body in bodies}, "no copy: views of the bodies"
    joined = b"".join(parts)
    table = codec.decode_records([joined])
    assert table.column("body").to_pylist() == [b"1", b"2", b"3", b"1", b"2"]
    assert table.column("key").to_pylist() == ["a", "b", "a", "a", "b"]
    assert table.column("tag").to_pylist() == [None, None, "T", None, None]
    assert table.equals(codec.decode_records(bodies))
    assert codec.message_batch(joined) == (joined, 5)  # stored as is: already in the stored layout


def test_a_count_the_caller_knows_is_taken_without_reading_the_bodies():
    bodies = [_body([{"key": "a", "body": b"1"}, {"key": "b", "body": b"2"}]), _body([{"key": "c", "body": b"3"}])]
    parts, count = codec.join_records(bodies, 3)
    assert count == 3 and b"".join(parts) == b"".join(codec.join_records(bodies)[0])


def test_a_body_in_another_layout_is_re_encoded():
    messages = codec.messages_to_batch([{"key": "k", "body": b"x"}])
    with_store_columns = codec.encode(codec.with_store_columns(messages, 7, [1_700_000_000_000], [1]))
    parts, count = codec.join_records([_body([{"key": "j", "body": b"y"}]), with_store_columns])
    assert count == 2
    assert codec.decode_records([b"".join(parts)]).column("body").to_pylist() == [b"y", b"x"]


def test_big_and_small_bodies_decode_in_order_with_their_stamps():
    """Small consecutive bodies are read as one stream, big ones each in place: either way every
    message comes back once, in record order, with its record's store timestamp."""
    big = "x" * 70_000  # over the size under which consecutive bodies are joined
    layout = [("s", 1), ("s", 2), (big, 1), (big, 3), ("s", 2), (big, 1), ("s", 1)]
    bodies, expected = [], []
    for record, (body, count) in enumerate(layout):
        bodies.append(_body([{"key": f"r{record}-{i}", "body": body} for i in range(count)]))
        expected += [(f"r{record}-{i}", 1_000 + record) for i in range(count)]
    table, stamps = codec.decode_stamped_records(bodies, [1_000 + r for r in range(len(layout))],
                                                  [count for _, count in layout])
    assert list(zip(table.column("key").to_pylist(), stamps.tolist(), strict=True)) == expected
    assert table.column("body").to_pylist() == [body.encode() for body, count in layout for _ in range(count)]
