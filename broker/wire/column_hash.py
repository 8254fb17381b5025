"""XXH64 of every value of an Arrow binary column at once, in NumPy.

Hashing value by value costs a Python call and a ``bytes`` per value, about 100 ns a row: a
micro-batch whose keys seldom repeat (an order's events a few batches apart) pays it on every row.
Here the values of one byte length are hashed together, eight bytes of every value per NumPy
operation, as XXH64 reads them (https://github.com/Cyan4973/xxHash/blob/dev/doc/xxhash_spec.md).
Lengths shared by few values are hashed one by one: NumPy's cost per call would outweigh them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import xxhash

__all__ = ["xxh64_column"]

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_MASK = (1 << 64) - 1
_FEW = 1024  # values of one length hashed one by one below this many: as quick as NumPy there
# Rows hashed per NumPy operation: its temporaries (128 KiB) stay below malloc's mmap threshold,
# whose fresh pages cost more than the arithmetic.
_CHUNK = 16384


def xxh64_column(values: pa.Array, seed: int) -> np.ndarray:
    """The unsigned XXH64 (``uint64``) of every value of a ``binary`` or ``large_binary`` array
    without nulls, as ``xxhash.xxh64_intdigest(value, seed)`` gives it."""
    if len(values) < _FEW:
        return _one_by_one(values, seed)
    offsets, data = _layout(values)
    lengths = np.diff(offsets)
    out = np.empty(len(values), dtype=np.uint64)
    if lengths.min() == lengths.max():
        _same_length(data[offsets[0]:offsets[-1]], int(lengths[0]), seed, out)
        return out
    if lengths.max() < 2**15:  # a stable sort of 16-bit values is a radix sort: 3x faster
        lengths = lengths.astype(np.int16)
    order = np.argsort(lengths, kind="stable")
    grouped = values.take(pa.array(order))
    offsets, data = _layout(grouped)
    sorted_lengths = lengths[order]
    starts = np.flatnonzero(np.diff(sorted_lengths, prepend=-1))
    for lo, hi in zip(starts.tolist(), [*starts[1:].tolist(), len(order)], strict=True):
        length, rows = int(sorted_lengths[lo]), order[lo:hi]
        if hi - lo < _FEW:
            out[rows] = _one_by_one(grouped.slice(lo, hi - lo), seed)
        else:
            out[rows] = _same_length(data[offsets[lo]:offsets[hi]], length, seed, np.empty(hi - lo, np.uint64))
    return out


def _one_by_one(values: pa.Array, seed: int) -> np.ndarray:
    """xxhash's own call per value: quicker than NumPy for a few values."""
    digest = xxhash.xxh64_intdigest
    return np.fromiter((digest(value, seed) for value in values.to_pylist()), dtype=np.uint64, count=len(values))


def _layout(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The value offsets (``len + 1`` of them, absolute in the data) and the data bytes."""
    offset_type = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    _, offsets_buffer, data_buffer = values.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=offset_type)[values.offset:values.offset + len(values) + 1]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    return offsets, data


def _same_length(data: np.ndarray, length: int, seed: int, out: np.ndarray) -> np.ndarray:
    """``out`` filled with the XXH64 of its count of values of ``length`` bytes each, laid end to
    end in ``data``."""
    for lo in range(0, len(out), _CHUNK):
        count = min(_CHUNK, len(out) - lo)
        out[lo:lo + count] = _chunk(data[lo * length:], count, length, seed)
    return out


def _chunk(data: np.ndarray, count: int, length: int, seed: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        if length >= 32:
            h, done = _stripes(data, count, length, seed), length // 32 * 32
        else:
            h, done = np.full(count, (seed + int(_P5)) & _MASK, dtype=np.uint64), 0
        h += np.uint64(length)
        while length - done >= 8:
            h ^= _round(np.zeros(count, np.uint64), _lane(data, count, length, done, "<u8"))
            _rotl(h, 27)
            h *= _P1
            h += _P4
            done += 8
        if length - done >= 4:
            word = _lane(data, count, length, done, "<u4").astype(np.uint64)
            word *= _P1
            h ^= word
            _rotl(h, 23)
            h *= _P2
            h += _P3
            done += 4
        for at in range(done, length):
            byte = _lane(data, count, length, at, "u1").astype(np.uint64)
            byte *= _P5
            h ^= byte
            _rotl(h, 11)
            h *= _P1
        return _avalanche(h)


def _lane(data: np.ndarray, count: int, length: int, at: int, dtype: str) -> np.ndarray:
    """The word of type ``dtype`` at byte ``at`` of every value: a strided view, no copy."""
    return np.ndarray((count,), dtype=dtype, buffer=data, offset=at, strides=(length,))


def _stripes(data: np.ndarray, count: int, length: int, seed: int) -> np.ndarray:
    """The four accumulators of XXH64's 32-byte stripes, converged."""
    accumulators = [np.full(count, (seed + start) & _MASK, dtype=np.uint64)
                    for start in (int(_P1) + int(_P2), int(_P2), 0, -int(_P1))]
    for stripe in range(0, length // 32 * 32, 32):
        for lane, acc in enumerate(accumulators):
            _round(acc, _lane(data, count, length, stripe + lane * 8, "<u8"))
    h = np.zeros(count, np.uint64)
    for acc, bits in zip(accumulators, (1, 7, 12, 18), strict=True):
        h += _rotl(acc.copy(), bits)
    for acc in accumulators:
        h ^= _round(np.zeros(count, np.uint64), acc)
        h *= _P1
        h += _P4
    return h


def _round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """XXH64's round, in place on ``acc``."""
    acc += lane * _P2
    _rotl(acc, 31)
    acc *= _P1
    return acc


def _rotl(x: np.ndarray, bits: int) -> np.ndarray:
    """``x`` rotated left by ``bits``, in place."""
    high = x >> np.uint64(64 - bits)
    x <<= np.uint64(bits)
    x |= high
    return x


def _avalanche(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h
