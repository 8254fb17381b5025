"""SendResults reads like the list of SendResult it stands for."""

from __future__ import annotations

import numpy as np
import pytest

from connector.client import SendResult, SendResults


def _run(queue_id: int, first: int, count: int, stamp: int = 7, duplicate: bool = False) -> SendResults:
    return SendResults.stored_run("t", queue_id, first, count, stamp, duplicate)


def test_a_run_reads_as_one_result_per_message():
    results = _run(3, 100, 4, duplicate=True)
    expected = [SendResult("t", 3, 100 + i, 7, True) for i in range(4)]
    assert len(results) == 4
    assert list(results) == expected and results == expected
    assert results[0] == expected[0] and results[-1] == expected[-1]
    assert results[1:3] == expected[1:3]
    assert [type(v) for v in (results[0].queue_id, results[0].queue_offset, results[0].duplicate)] == [int, int, bool]
    with pytest.raises(IndexError):
        results[4]


def test_gather_puts_each_part_at_its_input_positions():
    # Rows 0, 2, 5 went to queue 1 and rows 1, 3, 4 to queue 0, in input order within each queue.
    by_queue = [([0, 2, 5], SendResults.concat("t", [_run(1, 10, 2), _run(1, 12, 1, stamp=8)])),
                ([1, 3, 4], _run(0, 40, 3))]
    results = SendResults.gather("t", 6, by_queue)
    assert [(r.queue_id, r.queue_offset, r.store_timestamp) for r in results] == [
        (1, 10, 7), (0, 40, 7), (1, 11, 7), (0, 41, 7), (0, 42, 7), (1, 12, 8)]
    assert np.array_equal(results.queue_ids, [1, 0, 1, 0, 0, 1])


def test_empty_and_unequal():
    assert SendResults.gather("t", 0, []) == []
    assert _run(0, 0, 2) != [SendResult("t", 0, 0, 7)]
    assert _run(0, 0, 1) != [SendResult("t", 0, 0, 8)]
