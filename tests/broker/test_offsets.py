"""OffsetStore: commit/get, durability across a reopen, resets, drop_topic, validation, threads."""

from __future__ import annotations

import json
import threading

import pytest

from broker.offsets import OffsetStore
from broker.wire.errors import InternalBrokerError, InvalidRequestError


@pytest.fixture
def path(tmp_path):
    return tmp_path / "state" / "offsets.json"


def test_never_committed_is_minus_one(path):
    store = OffsetStore(path)
    assert store.get("g", "t", 0) == -1
    assert store.group_offsets("g", "t") == {}
    assert store.groups() == []
    assert not path.exists()


def test_commit_then_get(path):
    store = OffsetStore(path)
    store.commit("g", "t", 0, 10)
    store.commit("g", "t", 2, 0)
    assert store.get("g", "t", 0) == 10
    assert store.get("g", "t", 2) == 0
    assert store.get("g", "t", 1) == -1
    assert store.get("other", "t", 0) == -1


def test_commit_is_durable_on_return(path):
    store = OffsetStore(path)
    store.commit("g", "t", 3, 42)
    store.commit("h", "u", 0, 7)
    reopened = OffsetStore(path)
    assert reopened.get("g", "t", 3) == 42
    assert reopened.get("h", "u", 0) == 7
    assert reopened.groups() == ["g", "h"]


def test_backwards_commit_is_a_reset(path):
    store = OffsetStore(path)
    store.commit("g", "t", 0, 100)
    store.commit("g", "t", 0, 5)
    assert store.get("g", "t", 0) == 5
    assert OffsetStore(path).get("g", "t", 0) == 5


def test_group_offsets_sorted_by_queue(path):
    store = OffsetStore(path)
    for qid, offset in [(3, 30), (0, 0), (1, 10)]:
        store.commit("g", "t", qid, offset)
    store.commit("g", "u", 0, 99)
    assert list(store.group_offsets("g", "t").items()) == [(0, 0), (1, 10), (3, 30)]


def test_groups_sorted(path):
    store = OffsetStore(path)
    for group in ["b", "a", "c"]:
        store.commit(group, "t", 0, 1)
    assert store.groups() == ["a", "b", "c"]


def test_drop_topic(path):
    store = OffsetStore(path)
    store.commit("g", "t", 0, 1)
    store.commit("g", "u", 0, 2)
    store.commit("h", "t", 0, 3)
    store.drop_topic("t")
    store.drop_topic("never-existed")
    assert store.get("g", "t", 0) == -1
    assert store.get("g", "u", 0) == 2
    assert store.groups() == ["g"]
    reopened = OffsetStore(path)
    assert reopened.get("h", "t", 0) == -1
    assert reopened.groups() == ["g"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("g", "t", 0, -1), r"offset to commit for group 'g' on t/0 must be an integer >= 0, got -1"),
        (("g", "t", 0, 1.0), "must be an integer >= 0, got 1.0"),
        (("", "t", 0, 1), "consumer group must be a non-empty string"),
        (("g", "", 0, 1), "topic must be a non-empty string"),
        (("g", "t", -1, 1), "queue id must be an integer >= 0, got -1"),
    ],
)
def test_invalid_commits(path, args, message):
    store = OffsetStore(path)
    with pytest.raises(InvalidRequestError, match=message):
        store.commit(*args)
    assert store.groups() == []


def test_corrupt_file_is_named(path):
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(InternalBrokerError, match="offsets.json"):
        OffsetStore(path)
    path.write_text(json.dumps({"version": 1, "offsets": {"g": {"t": {"x": 1}}}}))
    with pytest.raises(InternalBrokerError, match="offset file .* is not valid"):
        OffsetStore(path)


def test_failed_write_leaves_memory_and_file_unchanged(path, monkeypatch):
    store = OffsetStore(path)
    store.commit("g", "t", 0, 1)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("broker.offsets.write_json_atomic", broken)
    with pytest.raises(OSError, match="disk full"):
        store.commit("g", "t", 0, 2)
    assert store.get("g", "t", 0) == 1
    assert OffsetStore(path).get("g", "t", 0) == 1


def test_concurrent_commits_all_land(path):
    store = OffsetStore(path)

    def run(qid: int) -> None:
        for offset in range(10):
            store.commit("g", "t", qid, offset)

    threads = [threading.Thread(target=run, args=(qid,)) for qid in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.group_offsets("g", "t") == {qid: 9 for qid in range(6)}
    assert OffsetStore(path).group_offsets("g", "t") == {qid: 9 for qid in range(6)}


def test_committer_is_remembered_across_restart(path):
    store = OffsetStore(path)
    store.commit("g", "t", 0, 5, "client-a")
    store.commit("g", "t", 1, 9)
    reopened = OffsetStore(path)
    assert reopened.committed("g", "t", 0) == (5, "client-a")
    assert reopened.committed("g", "t", 1) == (9, "")
    assert reopened.committed("g", "t", 2) == (-1, "")


def test_version_1_file_reads_back_without_committers(path):
    path.parent.mkdir()
    path.write_text(json.dumps({"version": 1, "offsets": {"g": {"t": {"0": 7}}}}))
    assert OffsetStore(path).committed("g", "t", 0) == (7, "")
