"""The one routing function: which MessageQueue a sharding key goes to.

``pmod(key, N)`` for integer keys and ``pmod(xxhash64(bytes, seed=42), N)`` for string (UTF-8) and
binary keys: exactly Spark SQL's ``pmod(xxhash64(key), N)``, so the Python producer and the Spark
writer send every key to the same queue.
"""

from __future__ import annotations

import xxhash

from broker.wire.errors import InvalidRequestError

__all__ = ["SPARK_XXHASH_SEED", "key_bytes", "queue_for_key", "spark_xxhash64"]

SPARK_XXHASH_SEED = 42
_TWO_64 = 1 << 64
_TWO_63 = 1 << 63


def key_bytes(key: str | bytes | bytearray | memoryview) -> bytes:
    """The bytes a string or binary key is hashed over (UTF-8 for strings)."""
    if isinstance(key, str):
        return key.encode("utf-8")
    return bytes(key)


def spark_xxhash64(data: bytes) -> int:
    """Spark SQL's ``xxhash64`` of a string/binary value: signed 64-bit XXH64 with seed 42."""
    h = xxhash.xxh64_intdigest(data, SPARK_XXHASH_SEED)
    return h - _TWO_64 if h >= _TWO_63 else h


def queue_for_key(key: int | str | bytes, queue_count: int) -> int:
    """The queue id of ``key`` among ``queue_count`` queues.

    Raises ``InvalidRequestError`` for a null key or an unsupported type: a caller without a key
    must choose the queue itself.
    """
    if queue_count <= 0:
        raise InvalidRequestError(f"queue count must be positive, got {queue_count}")
    if type(key) is str:  # the usual key, first
        return spark_xxhash64(key.encode("utf-8")) % queue_count
    if key is None:
        raise InvalidRequestError(
            "a null sharding key cannot be routed: give every message a key or pick the queue "
            "explicitly (queue_id / a selector)"
        )
    if isinstance(key, bool):
        raise InvalidRequestError("a boolean is not a sharding key; use an int, str or bytes key")
    if isinstance(key, int):
        return key % queue_count  # Python's % is already pmod for a positive divisor
    if isinstance(key, (str, bytes, bytearray, memoryview)):
        return spark_xxhash64(key_bytes(key)) % queue_count
    raise InvalidRequestError(
        f"sharding key of type {type(key).__name__} is not supported: use int, str or bytes"
    )
