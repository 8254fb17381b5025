"""column_hash.xxh64_column: the XXH64 of every value of a column, as xxhash gives it value by value,
whichever way the column is hashed (NumPy by length, or one by one where a length is rare)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from broker.wire.column_hash import _FEW, xxh64_column

SEED = 42


def _expected(values: list[bytes], seed: int = SEED) -> list[int]:
    return [xxhash.xxh64_intdigest(value, seed) for value in values]


def _random_values(rng: np.random.Generator, count: int, lengths: list[int]) -> list[bytes]:
    return [rng.bytes(int(length)) for length in rng.choice(lengths, count)]


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary()])
@pytest.mark.parametrize("length", [0, 1, 3, 4, 7, 8, 12, 15, 16, 31, 32, 33, 63, 64, 100, 257])
def test_values_of_one_length_hash_as_xxhash_does(typ, length):
    """Each branch of XXH64: 32-byte stripes, 8-byte lanes, a 4-byte word, single bytes."""
    values = _random_values(np.random.default_rng(length), _FEW + 5, [length])
    assert xxh64_column(pa.array(values, typ), SEED).tolist() == _expected(values)


def test_mixed_lengths_common_and_rare_hash_as_xxhash_does_in_place():
    """Lengths shared by many values go through NumPy, rare ones one by one; each hash lands at its
    value's row. A slice of a column is hashed over its own values only."""
    rng = np.random.default_rng(1)
    common = _random_values(rng, 3 * _FEW, [9, 40])
    rare = _random_values(rng, 200, list(range(0, 80)))
    values = [*common, *rare]
    rng.shuffle(values)
    column = pa.array(values, pa.binary())
    assert xxh64_column(column, SEED).tolist() == _expected(values)
    assert xxh64_column(column.slice(17, 2 * _FEW), SEED).tolist() == _expected(values[17:17 + 2 * _FEW])
    assert xxh64_column(column.slice(5, 10), 7).tolist() == _expected(values[5:15], 7)


def test_an_empty_column_and_empty_values():
    assert xxh64_column(pa.array([], pa.binary()), SEED).tolist() == []
    assert xxh64_column(pa.array([b""] * (_FEW + 1), pa.binary()), SEED).tolist() == _expected([b""] * (_FEW + 1))


def test_seeds_and_high_bits_are_kept():
    """Any 64-bit seed, and hashes above 2**63 (unsigned) as xxhash gives them."""
    values = _random_values(np.random.default_rng(2), _FEW * 2, [11])
    for seed in (0, 2**63 + 5, 2**64 - 1):
        hashes = xxh64_column(pa.array(values, pa.binary()), seed)
        assert hashes.dtype == np.uint64 and hashes.tolist() == _expected(values, seed)
    assert max(_expected(values)) >= 2**63
