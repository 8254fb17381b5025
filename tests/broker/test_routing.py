"""routing.queue_ids: a whole column of keys routed as queue_for_key routes each key, whether its keys
repeat (each distinct key hashed once) or seldom do (every row hashed), for every key type."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from broker.wire import routing
from broker.wire.routing import queue_for_key, queue_ids

ROWS = 20_000


def _keys(shape: str) -> list[str]:
    if shape == "repeating":
        return [f"account-{i % 700}" for i in range(ROWS)]
    if shape == "seldom repeating":  # an order's events, far apart
        return [f"order-{i % (ROWS // 2)}" for i in range(ROWS)]
    return [f"{i:08x}-é" for i in np.random.default_rng(3).permutation(ROWS)]  # one length, all distinct


@pytest.mark.parametrize(("shape", "distinct"), [("repeating", False), ("seldom repeating", True),
                                                 ("distinct", True)])
@pytest.mark.parametrize("typ", [pa.string(), pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary()])
def test_a_column_of_keys_routes_as_each_key_does(shape, distinct, typ):
    keys = _keys(shape)
    column = pa.array(keys if pa.types.is_string(typ) or pa.types.is_large_string(typ)
                      or pa.types.is_string_view(typ) else [key.encode() for key in keys], typ)
    assert routing._mostly_distinct(column.cast(pa.large_binary())) is distinct
    for count in (1, 7, 16):
        routed = queue_ids(column, count)
        assert routed.dtype == np.int32
        assert routed.tolist() == [queue_for_key(key, count) for key in keys]


def test_chunked_and_integer_columns():
    keys = _keys("distinct")
    chunked = pa.chunked_array([keys[:5_000], keys[5_000:]])
    assert queue_ids(chunked, 5).tolist() == [queue_for_key(key, 5) for key in keys]
    ints = [-(2**63), -7, -1, 0, 1, 2**63 - 1] * 500
    assert queue_ids(pa.array(ints, pa.int64()), 7).tolist() == [queue_for_key(key, 7) for key in ints]


def test_keys_that_are_not_routable_are_refused():
    with pytest.raises(TypeError, match="integer, string or binary"):
        queue_ids(pa.array([1.5, 2.5]), 4)
