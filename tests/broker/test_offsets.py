"""OffsetStore: commit/get, durability across a reopen, resets, drop_topic, validation, threads,
a full disk, the import of an older offsets.json."""

from __future__ import annotations

import json
import threading

import pytest

from broker.offsets import OffsetStore
from broker.wire.errors import DiskFullError, InternalBrokerError, InvalidRequestError
from tests.tmpfs import Ballast, mounted_tmpfs


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


def test_a_full_disk_fails_commits_clearly_and_changes_nothing(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", 256) as disk:
        store = OffsetStore(disk / "offsets.json")
        store.commit("g", "t", 0, 1, "c1")
        ballast = Ballast(disk)
        ballast.fill()
        with pytest.raises(DiskFullError, match=f"disk full: could not commit offset .* data dir {disk}") as info:
            for group in range(1_000):  # new rows grow the log past what the full disk can hold
                store.commit(f"g{group}", "t", 0, 2, "c2")
        assert info.value.data_dir == str(disk)
        failed_group = f"g{group}"
        assert store.committed(failed_group, "t", 0) == (-1, "")
        assert store.committed("g", "t", 0) == (1, "c1")
        ballast.free()
        store.commit(failed_group, "t", 0, 3, "c3")  # works again once space is back
        reopened = OffsetStore(disk / "offsets.json")
        assert reopened.committed("g", "t", 0) == (1, "c1")
        assert reopened.committed(failed_group, "t", 0) == (3, "c3")
        store.close()
        reopened.close()


def test_an_older_offsets_json_is_imported_once(path):
    path.parent.mkdir()
    path.write_text(json.dumps({"version": 2, "offsets": {"g": {"t": {"0": [7, "c"], "3": [9, ""]}}}}))
    store = OffsetStore(path)
    assert store.committed("g", "t", 0) == (7, "c")
    assert store.group_offsets("g", "t") == {0: 7, 3: 9}
    assert not path.exists() and path.with_name("offsets.json.migrated").exists()
    store.commit("g", "t", 0, 8, "c")
    path.write_text(json.dumps({"version": 2, "offsets": {"g": {"t": {"0": [1, "old"]}}}}))  # a stray copy
    assert OffsetStore(path).committed("g", "t", 0) == (8, "c")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("g" * 256, "t", 0, 1), "consumer group 'ggg.* is 256 bytes long; the limit is 255 bytes"),
        (("é" * 128, "t", 0, 1), "consumer group .* is 256 bytes long; the limit is 255 bytes"),
        (("g", "t" * 128, 0, 1), "topic .* is 128 bytes long; the limit is 127 bytes"),
        (("g", "t", 0, 1, "c" * 100_000), r"client id .*\(100002 characters\) is 100000 bytes long; the limit is 255"),
    ],
)
def test_names_are_bounded(path, args, message):
    store = OffsetStore(path)
    with pytest.raises(InvalidRequestError, match=message):
        store.commit(*args)
    assert store.groups() == []
    store.commit("g" * 255, "t" * 127, 0, 1, "c" * 255)  # at the limit is fine


def written_bytes() -> int:
    """Bytes this process has passed to write() so far (``wchar`` of /proc/self/io)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def bytes_per_commit(path, groups: int, commits: int = 300) -> float:
    store = OffsetStore(path)
    for g in range(groups):
        store.commit(f"group-{g:040d}", "t", 0, 1, "client")
    before = written_bytes()
    for i in range(commits):
        store.commit(f"group-{i % groups:040d}", "t", 0, 2 + i, "client")
    written = written_bytes() - before
    store.close()
    return written / commits


def test_what_a_commit_writes_does_not_grow_with_the_number_of_groups(tmp_path):
    few, many = bytes_per_commit(tmp_path / "few" / "offsets.json", 10), bytes_per_commit(
        tmp_path / "many" / "offsets.json", 2_000)
    assert many < 3 * few, f"a commit writes {few:.0f} bytes with 10 groups but {many:.0f} with 2,000"


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
