"""Spark SQL's pmod(xxhash64(key), N) / pmod(key, N) route every key as queue_for_key does."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from broker.wire.routing import queue_for_key
from connector.spark.sharding import queue_expr

pytestmark = pytest.mark.spark


def _keys(seed: int):
    rng = random.Random(seed)
    strings = ["", "a", "héllo wörld", "日本語", "🚀🚀", "Ω≈ç√∫"]
    strings += ["".join(rng.choices("abcxyzé日本🚀 ", k=rng.randint(0, 60))) for _ in range(400)]
    binaries = [bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40))) for _ in range(400)]
    ints = [rng.randint(-(2**63), 2**63 - 1) for _ in range(400)] + [0, 1, -1, 2**63 - 1, -(2**63)]
    return strings, binaries, ints


@pytest.mark.parametrize("seed", [1, 2])
def test_spark_sql_routing_equals_queue_for_key(ospark, seed):
    strings, binaries, ints = _keys(seed)
    for keys, typ in ((strings, StringType()), (binaries, BinaryType()), (ints, LongType())):
        df = ospark.createDataFrame([(k,) for k in keys], StructType([StructField("k", typ)]))
        counts = (1, 2, 7, 16, 31)
        out = df.select("k", *(queue_expr("k", typ, n).alias(f"q{n}") for n in counts)).collect()
        for row in out:
            key = bytes(row["k"]) if isinstance(typ, BinaryType) else row["k"]
            assert [row[f"q{n}"] for n in counts] == [queue_for_key(key, n) for n in counts], key
    # The expression is literally pmod(xxhash64(key), N) for strings.
    df = ospark.createDataFrame([(k,) for k in strings[:50]], "k string")
    plain = df.select(F.expr("pmod(xxhash64(k), 7)").alias("q")).collect()
    assert [r["q"] for r in plain] == [queue_for_key(k, 7) for k in strings[:50]]


@pytest.mark.parametrize("keys", [
    [f"order-{i}" for i in range(6_000)],  # distinct, of five lengths: each row hashed
    [f"{i:08x}-日本" for i in range(6_000)],  # distinct, of one length
    [f"account-{i % 300}" for i in range(6_000)],  # repeating: each distinct key hashed once
], ids=["distinct keys", "distinct keys of one length", "repeating keys"])
def test_spark_sql_routing_equals_queue_ids_over_a_column(ospark, keys):
    from broker.wire.routing import queue_ids

    df = ospark.createDataFrame([(i, k) for i, k in enumerate(keys)], "i long, k string")
    out = df.select("i", queue_expr("k", StringType(), 13).alias("q")).orderBy("i").collect()
    assert [row["q"] for row in out] == queue_ids(pa.array(keys), 13).tolist()
