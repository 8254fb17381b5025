"""``SendResults``: the results of a ``send_batch``, one per message, made when read.

A batch of 10,000 messages acknowledged as a few requests would otherwise build 10,000
``SendResult`` tuples on the producer's thread, place each at its input position and free them
all again, most often unread: more CPU than routing, encoding and sending the batch together. A
``SendResults`` keeps each field as one numpy column and makes a ``SendResult`` per message read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from connector.client.messages import SendResult

__all__ = ["SendResults"]

_COLUMNS = ("queue_ids", "queue_offsets", "store_timestamps", "duplicates")
_DTYPES = (np.int32, np.int64, np.int64, np.bool_)


class SendResults(Sequence):
    """A sequence of ``SendResult`` (indexing, slicing, iteration, ``len``, equality with any
    sequence of them); its fields also as numpy columns of the same names, plural."""

    __slots__ = ("topic", *_COLUMNS)

    def __init__(self, topic: str, queue_ids: np.ndarray, queue_offsets: np.ndarray, store_timestamps: np.ndarray,
                 duplicates: np.ndarray) -> None:
        self.topic = topic
        self.queue_ids = queue_ids
        self.queue_offsets = queue_offsets
        self.store_timestamps = store_timestamps
        self.duplicates = duplicates

    @classmethod
    def stored_run(cls, topic: str, queue_id: int, first_offset: int, count: int, store_timestamp: int,
                   duplicate: bool) -> SendResults:
        """``count`` messages stored one after another from ``first_offset`` (one request's)."""
        return cls(topic, np.full(count, queue_id, np.int32), np.arange(first_offset, first_offset + count,
                                                                        dtype=np.int64),
                   np.full(count, store_timestamp, np.int64), np.full(count, duplicate, np.bool_))

    @classmethod
    def concat(cls, topic: str, parts: Sequence[SendResults]) -> SendResults:
        if len(parts) == 1:
            return parts[0]
        return cls(topic, *(np.concatenate([getattr(p, name) for p in parts]) if parts else np.empty(0, dtype)
                            for name, dtype in zip(_COLUMNS, _DTYPES, strict=True)))

    @classmethod
    def gather(cls, topic: str, total: int, parts: Iterable[tuple[Sequence[int], SendResults]]) -> SendResults:
        """The results of ``total`` messages, given as the results of the messages at each list of
        input positions."""
        columns = [np.empty(total, dtype) for dtype in _DTYPES]
        for positions, results in parts:
            index = np.asarray(positions, dtype=np.int64)
            for column, name in zip(columns, _COLUMNS, strict=True):
                column[index] = getattr(results, name)
        return cls(topic, *columns)

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return SendResults(self.topic, *(getattr(self, name)[index] for name in _COLUMNS))
        return SendResult(self.topic, int(self.queue_ids[index]), int(self.queue_offsets[index]),
                          int(self.store_timestamps[index]), bool(self.duplicates[index]))

    def __iter__(self) -> Iterator[SendResult]:
        topic = self.topic
        for queue_id, offset, stamp, duplicate in zip(*(getattr(self, name).tolist() for name in _COLUMNS),
                                                       strict=True):
            yield SendResult(topic, queue_id, offset, stamp, duplicate)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which do not hash

    def __repr__(self) -> str:
        return f"SendResults(topic={self.topic!r}, {len(self)} message(s))"
