"""LockManager: RocketMQ's lock rules one by one, fencing epochs, persistence, thread safety."""

from __future__ import annotations

import json
import threading

import pytest

from broker.locks import LockInfo, LockManager
from broker.wire.errors import DiskFullError, FencedError, InvalidRequestError
from tests.support import FakeClock
from tests.tmpfs import Ballast, mounted_tmpfs

LEASE = 1_000


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def state_path(tmp_path):
    return tmp_path / "locks" / "epochs.json"


@pytest.fixture
def locks(state_path, clock):
    return LockManager(state_path, lease_ms=LEASE, clock=clock)


def test_free_queue_goes_to_the_asker(locks):
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
    assert locks.holders("g", "t") == [LockInfo("t", 0, "A", 1, LEASE)]


def test_holder_relocking_renews_the_lease_and_keeps_the_epoch(locks, clock):
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
    clock.advance(LEASE - 1)
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
    assert locks.holders("g", "t")[0].expires_in_ms == LEASE
    clock.advance(LEASE - 1)  # past the first lease, within the renewed one
    assert locks.holders("g", "t")[0].client_id == "A"
    locks.check("g", "t", 0, "A", 1)


def test_other_client_refused_until_expiry(locks, clock):
    locks.lock_batch("g", "A", "t", [0])
    assert locks.lock_batch("g", "B", "t", [0]) == {}
    clock.advance(LEASE - 1)
    assert locks.lock_batch("g", "B", "t", [0]) == {}
    assert locks.holders("g", "t")[0].client_id == "A"


def test_expired_lock_goes_to_a_new_client_with_a_higher_epoch(locks, clock):
    locks.lock_batch("g", "A", "t", [0])
    clock.advance(LEASE)  # live while now < expires_at
    assert locks.holders("g", "t") == []
    assert locks.lock_batch("g", "B", "t", [0]) == {0: 2}
    assert locks.holders("g", "t") == [LockInfo("t", 0, "B", 2, LEASE)]
    assert locks.lock_batch("g", "A", "t", [0]) == {}


def test_same_client_after_expiry_gets_a_new_epoch(locks, clock):
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
    clock.advance(LEASE)
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 2}
    with pytest.raises(FencedError, match="stale epoch 1"):
        locks.check("g", "t", 0, "A", 1)
    locks.check("g", "t", 0, "A", 2)


def test_same_client_after_unlock_gets_a_new_epoch(locks):
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
    assert locks.unlock_batch("g", "A", "t", [0]) == [0]
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 2}


def test_unlock_by_non_holder_changes_nothing(locks):
    locks.lock_batch("g", "A", "t", [0, 1])
    assert locks.unlock_batch("g", "B", "t", [0, 1, 2]) == []
    assert [(h.queue_id, h.client_id, h.epoch) for h in locks.holders("g", "t")] == [(0, "A", 1), (1, "A", 1)]
    assert locks.lock_batch("g", "B", "t", [0]) == {}


def test_unlock_returns_exactly_what_was_released(locks):
    locks.lock_batch("g", "A", "t", [0, 1])
    locks.lock_batch("g", "B", "t", [2])
    assert locks.unlock_batch("g", "A", "t", [2, 1, 0, 7]) == [0, 1]
    assert [h.queue_id for h in locks.holders("g", "t")] == [2]
    assert locks.lock_batch("g", "B", "t", [0]) == {0: 2}


def test_lock_batch_returns_exactly_the_set_locked(locks):
    locks.lock_batch("g", "B", "t", [1, 3])
    assert locks.lock_batch("g", "A", "t", [0, 1, 2, 3, 4]) == {0: 1, 2: 1, 4: 1}
    assert locks.lock_batch("g", "A", "t", []) == {}
    assert locks.lock_batch("g", "A", "t", [0, 0, 2]) == {0: 1, 2: 1}


def test_epoch_bumps_on_every_holder_change_not_on_renewal(locks, clock):
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}  # renewal
    clock.advance(LEASE)
    assert locks.lock_batch("g", "B", "t", [0]) == {0: 2}  # holder change
    assert locks.lock_batch("g", "B", "t", [0]) == {0: 2}  # renewal
    clock.advance(LEASE)
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 3}  # holder change back


def test_groups_topics_and_queues_are_independent(locks):
    assert locks.lock_batch("g1", "A", "t", [0]) == {0: 1}
    assert locks.lock_batch("g2", "B", "t", [0]) == {0: 1}
    assert locks.lock_batch("g1", "C", "u", [0]) == {0: 1}
    assert locks.lock_batch("g1", "C", "t", [1]) == {1: 1}
    assert locks.holders("g1", "t") == [LockInfo("t", 0, "A", 1, LEASE), LockInfo("t", 1, "C", 1, LEASE)]


def test_check_passes_for_live_holder_with_its_epoch(locks):
    locks.lock_batch("g", "A", "t", [0])
    locks.check("g", "t", 0, "A", 1)


def test_check_refuses_stale_epoch(locks, clock):
    locks.lock_batch("g", "A", "t", [0])
    clock.advance(LEASE)
    locks.lock_batch("g", "B", "t", [0])
    clock.advance(LEASE)
    locks.lock_batch("g", "A", "t", [0])  # A again, epoch 3
    with pytest.raises(FencedError, match=r"stale epoch 1 for queue t/0 of group 'g'.*epoch 3.*re-lock the queue"):
        locks.check("g", "t", 0, "A", 1)
    with pytest.raises(FencedError, match="stale epoch 4"):
        locks.check("g", "t", 0, "A", 4)


def test_check_refuses_non_holder_naming_the_holder(locks):
    locks.lock_batch("g", "A", "t", [0])
    with pytest.raises(FencedError, match=r"locked by client 'A' at epoch 1, not by 'B'.*re-lock the queue"):
        locks.check("g", "t", 0, "B", 1)


def test_check_refuses_expired_lock(locks, clock):
    locks.lock_batch("g", "A", "t", [0])
    clock.advance(LEASE)
    with pytest.raises(FencedError, match=r"not locked \(the lock of 'A' expired.*current epoch 1.*re-lock the queue"):
        locks.check("g", "t", 0, "A", 1)


def test_check_refuses_never_locked_queue(locks):
    with pytest.raises(FencedError, match=r"not locked \(nobody holds it; current epoch 0\)"):
        locks.check("g", "t", 5, "A", 1)


def test_check_refuses_after_unlock(locks):
    locks.lock_batch("g", "A", "t", [0])
    locks.unlock_batch("g", "A", "t", [0])
    with pytest.raises(FencedError, match="not locked"):
        locks.check("g", "t", 0, "A", 1)


def test_check_does_not_renew(locks, clock):
    locks.lock_batch("g", "A", "t", [0])
    clock.advance(LEASE - 1)
    locks.check("g", "t", 0, "A", 1)
    clock.advance(1)
    with pytest.raises(FencedError):
        locks.check("g", "t", 0, "A", 1)


def test_epochs_persist_and_go_higher_after_restart(state_path, clock):
    first = LockManager(state_path, lease_ms=LEASE, clock=clock)
    assert first.lock_batch("g", "A", "t", [0, 1]) == {0: 1, 1: 1}
    clock.advance(LEASE)
    assert first.lock_batch("g", "B", "t", [0]) == {0: 2}

    restarted = LockManager(state_path, lease_ms=LEASE, clock=clock)
    with pytest.raises(FencedError, match="the broker restarted; it is kept for client 'B'"):
        restarted.check("g", "t", 0, "B", 2)  # the old holder is fenced
    # B's 0 at a new epoch; 1 is kept for A, whose lease had lapsed unseen (a restart gives it a lease).
    assert restarted.lock_batch("g", "B", "t", [0, 1, 2]) == {0: 3, 2: 1}


def test_a_restart_keeps_each_queue_for_its_holder_for_one_lease(state_path, clock):
    first = LockManager(state_path, lease_ms=LEASE, clock=clock)
    assert first.lock_batch("g", "A", "t", [0, 1, 2]) == {0: 1, 1: 1, 2: 1}
    assert first.unlock_batch("g", "A", "t", [2]) == [2]
    clock.advance(LEASE - 1)
    assert first.lock_batch("g", "A", "t", [0, 1]) == {0: 1, 1: 1}  # a renewal writes nothing
    first.close()

    restarted = LockManager(state_path, lease_ms=LEASE, clock=clock)
    assert [(h.queue_id, h.client_id, h.epoch, h.expires_in_ms) for h in restarted.holders("g", "t")] == [
        (0, "A", 1, LEASE), (1, "A", 1, LEASE)]
    assert restarted.lock_batch("g", "B", "t", [0, 1, 2]) == {2: 2}  # the unlocked one is free
    with pytest.raises(FencedError, match="not locked .*kept for client 'A'"):
        restarted.check("g", "t", 0, "B", 1)
    assert restarted.lock_batch("g", "A", "t", [0]) == {0: 2}  # its holder takes it at a new epoch
    restarted.check("g", "t", 0, "A", 2)
    clock.advance(LEASE)
    assert restarted.lock_batch("g", "B", "t", [0, 1]) == {0: 3, 1: 2}  # kept no longer than a lease


def test_a_new_master_keeps_no_queue_for_holders_of_the_last(state_path, clock):
    first = LockManager(state_path, lease_ms=LEASE, clock=clock)
    first.lock_batch("g", "A", "t", [0])
    first.raise_floor(10)
    first.close()
    restarted = LockManager(state_path, lease_ms=LEASE, clock=clock)
    assert restarted.holders("g", "t") == []
    assert restarted.lock_batch("g", "B", "t", [0]) == {0: 11}


def test_on_a_full_disk_renewals_go_on_and_new_epochs_fail_clearly(tmp_path, clock):
    with mounted_tmpfs(tmp_path / "disk", 256) as disk:
        locks = LockManager(disk / "lock-epochs.json", lease_ms=LEASE, clock=clock)
        assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
        ballast = Ballast(disk)
        ballast.fill()
        for _ in range(3):  # renewals write nothing, so a full disk does not stop them
            clock.advance(LEASE - 1)
            assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}
        with pytest.raises(DiskFullError, match=f"could not record new fencing epochs .* data dir {disk}"):
            for queue in range(1, 1_000):
                locks.lock_batch("g", "A", "t", [queue])
        assert [h.queue_id for h in locks.holders("g", "t")] == list(range(queue)), "the failed grant is not held"
        ballast.free()
        assert locks.lock_batch("g", "A", "t", [queue]) == {queue: 1}
        ballast.fill()
        assert locks.unlock_batch("g", "A", "t", [1]) == [1]  # an unlock is never refused for want of room
        ballast.free()
        locks.close()
        restarted = LockManager(disk / "lock-epochs.json", lease_ms=LEASE, clock=clock)
        assert restarted.lock_batch("g", "A", "t", [0, queue]) == {0: 2, queue: 2}  # kept for A over the restart
        restarted.close()


def test_an_older_epoch_file_is_imported_once(state_path, clock):
    state_path.parent.mkdir()
    state_path.write_text(json.dumps({"version": 1, "floor": 4, "epochs": [["g", "t", 0, 7]]}))
    locks = LockManager(state_path, lease_ms=LEASE, clock=clock)
    assert locks.lock_batch("g", "A", "t", [0, 1]) == {0: 8, 1: 5}
    assert not state_path.exists() and state_path.with_name("epochs.json.migrated").exists()
    assert LockManager(state_path, lease_ms=LEASE, clock=clock).lock_batch("g", "B", "t", [2]) == {2: 5}


def test_names_are_bounded(locks):
    with pytest.raises(InvalidRequestError, match="group 'ggg.* is 256 bytes long; the limit is 255 bytes"):
        locks.lock_batch("g" * 256, "A", "t", [0])
    with pytest.raises(InvalidRequestError, match="client_id .* is 100000 bytes long; the limit is 255 bytes"):
        locks.lock_batch("g", "c" * 100_000, "t", [0])
    with pytest.raises(InvalidRequestError, match="topic .* the limit is 127 bytes"):
        locks.check("g", "t" * 128, 0, "A", 1)
    assert locks.lock_batch("g" * 255, "c" * 255, "t" * 127, [0]) == {0: 1}


def test_refused_lock_does_not_bump_the_epoch(locks):
    locks.lock_batch("g", "A", "t", [0])
    for _ in range(3):
        assert locks.lock_batch("g", "B", "t", [0]) == {}
    assert locks.holders("g", "t")[0].epoch == 1


def test_memory_only_manager(clock):
    locks = LockManager(None, lease_ms=LEASE, clock=clock)
    assert locks.lock_batch("g", "A", "t", [0]) == {0: 1}


def test_drop_topic_forgets_locks_but_never_reissues_an_epoch(state_path, locks, clock):
    locks.lock_batch("g", "A", "t", [0])
    clock.advance(LEASE)
    locks.lock_batch("g", "B", "t", [0])
    locks.lock_batch("g", "A", "other", [0])
    locks.drop_topic("t")
    assert locks.holders("g", "t") == []
    assert [h.client_id for h in locks.holders("g", "other")] == ["A"]
    assert locks.lock_batch("g", "B", "t", [0]) == {0: 3}
    locks.drop_topic("t")
    restarted = LockManager(state_path, lease_ms=LEASE, clock=clock)
    assert restarted.holders("g", "t") == []
    assert restarted.lock_batch("g", "C", "t", [0, 1]) == {0: 4, 1: 4}


@pytest.mark.parametrize(
    ("group", "client", "topic", "message"),
    [
        ("", "A", "t", "group must be a non-empty string"),
        ("g", "", "t", "client_id must be a non-empty string"),
        ("g", "A", "", "topic must be a non-empty string"),
    ],
)
def test_empty_names_are_invalid(locks, group, client, topic, message):
    with pytest.raises(InvalidRequestError, match=message):
        locks.lock_batch(group, client, topic, [0])
    with pytest.raises(InvalidRequestError, match=message):
        locks.unlock_batch(group, client, topic, [0])
    with pytest.raises(InvalidRequestError, match=message):
        locks.check(group, topic, 0, client, 1)


def test_bad_queue_ids_are_invalid(locks):
    with pytest.raises(InvalidRequestError, match="queue ids must be integers >= 0, got -1"):
        locks.lock_batch("g", "A", "t", [0, -1])
    assert locks.holders("g", "t") == []
    with pytest.raises(InvalidRequestError, match="queue ids"):
        locks.unlock_batch("g", "A", "t", ["0"])


def test_bad_lease_is_invalid(tmp_path):
    with pytest.raises(InvalidRequestError, match="lease_ms"):
        LockManager(None, lease_ms=0)


def test_concurrent_clients_never_share_a_queue(state_path, clock):
    locks = LockManager(state_path, lease_ms=LEASE, clock=clock)
    queues = list(range(16))
    results: dict[str, dict[int, int]] = {}
    barrier = threading.Barrier(8)

    def run(client: str) -> None:
        barrier.wait()
        got: dict[int, int] = {}
        for _ in range(20):
            got.update(locks.lock_batch("g", client, "t", queues))
        results[client] = got

    threads = [threading.Thread(target=run, args=(f"c{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    owners: dict[int, str] = {}
    for client, got in results.items():
        for qid in got:
            assert qid not in owners, f"queue {qid} granted to {owners.get(qid)} and {client}"
            owners[qid] = client
    assert sorted(owners) == queues
    assert all(h.epoch == 1 and owners[h.queue_id] == h.client_id for h in locks.holders("g", "t"))
