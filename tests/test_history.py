"""The history checker on crafted histories: each kind of fault is counted, and nothing else."""

from __future__ import annotations

from connector.history import Delivery, History, Send, check, check_keyed


def sends(key: str, n: int, unacked: tuple[int, ...] = ()) -> list[Send]:
    return [Send(key, s, s not in unacked) for s in range(n)]


def delivered(key: str, seqs) -> list[Delivery]:
    return [Delivery(key, s) for s in seqs]


def counts(verdict) -> tuple[int, int, int, int]:
    return verdict.lost, verdict.duplicated, verdict.out_of_order, verdict.unexpected


def test_a_clean_history_is_ok_and_sized():
    verdict = check(sends("a", 3) + sends("b", 2), delivered("a", [0, 1, 2]) + delivered("b", [0, 1]))
    assert verdict.ok and counts(verdict) == (0, 0, 0, 0)
    assert (verdict.sends, verdict.acked, verdict.unacked, verdict.deliveries, verdict.keys) == (5, 5, 0, 5, 2)
    assert "lost=0 duplicated=0 out_of_order=0" in verdict.line()


def test_keys_interleave_freely():
    history = [Delivery("a", 0), Delivery("b", 0), Delivery("b", 1), Delivery("a", 1)]
    assert check(sends("a", 2) + sends("b", 2), history).ok


def test_an_acknowledged_send_never_delivered_is_lost():
    verdict = check(sends("a", 4), delivered("a", [0, 1, 3]))
    assert counts(verdict) == (1, 0, 0, 0)
    assert verdict.lost_messages == [("a", 2)]
    assert any("seq 2 was acknowledged but never delivered" in e for e in verdict.examples)


def test_an_unacknowledged_send_may_be_missing_or_present():
    assert check(sends("a", 4, unacked=(2,)), delivered("a", [0, 1, 3])).ok
    assert check(sends("a", 4, unacked=(2,)), delivered("a", [0, 1, 2, 3])).ok
    assert check(sends("a", 4, unacked=(3,)), delivered("a", [0, 1, 2])).ok


def test_a_lost_tail_counts_each_message_once():
    verdict = check(sends("a", 5), delivered("a", [0, 1]))
    assert counts(verdict) == (3, 0, 0, 0)


def test_a_message_delivered_after_a_later_one_is_out_of_order_once():
    verdict = check(sends("a", 5), delivered("a", [0, 1, 3, 2, 4]))
    assert counts(verdict) == (0, 0, 1, 0)
    assert any("seq 2 delivered after 3" in e for e in verdict.examples)


def test_a_message_arriving_last_is_out_of_order():
    assert counts(check(sends("a", 3), delivered("a", [1, 2, 0]))) == (0, 0, 1, 0)


def test_a_late_unacknowledged_message_is_still_out_of_order():
    assert counts(check(sends("a", 3, unacked=(1,)), delivered("a", [0, 2, 1]))) == (0, 0, 1, 0)


def test_a_replay_from_a_committed_offset_is_duplicates_not_disorder():
    # consumed 0..4, committed 2, crashed: the successor replays 2..4 and goes on
    verdict = check(sends("a", 7), delivered("a", [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]))
    assert counts(verdict) == (0, 3, 0, 0)
    assert not verdict.ok


def test_replays_may_repeat_and_start_anywhere_delivered_before():
    verdict = check(sends("a", 5), delivered("a", [0, 1, 2, 0, 1, 2, 3, 1, 2, 3, 4]))
    assert counts(verdict) == (0, 6, 0, 0)


def test_a_replay_that_skips_a_delivered_message_is_out_of_order():
    verdict = check(sends("a", 5), delivered("a", [0, 1, 2, 3, 1, 3, 4]))
    assert counts(verdict) == (0, 2, 1, 0)
    assert any("redelivery of seq 3" in e and "skipping 2" in e for e in verdict.examples)


def test_a_replay_that_jumps_to_new_messages_before_catching_up_is_out_of_order():
    verdict = check(sends("a", 5), delivered("a", [0, 1, 2, 3, 1, 4]))
    assert counts(verdict) == (0, 1, 1, 0)
    assert any("before the replay reached 3" in e for e in verdict.examples)


def test_a_replay_may_pass_over_unstored_unacknowledged_sends():
    assert counts(check(sends("a", 5, unacked=(2,)), delivered("a", [0, 1, 3, 0, 1, 3, 4]))) == (0, 3, 0, 0)


def test_deliveries_of_messages_never_sent_are_unexpected():
    verdict = check(sends("a", 2), delivered("a", [0, 1, 7]) + delivered("ghost", [0]))
    assert counts(verdict) == (0, 0, 0, 2)
    assert verdict.keys == 2


def test_every_kind_at_once_is_counted_separately():
    history = delivered("a", [0, 2, 1, 2, 5]) + delivered("b", [0, 0])
    verdict = check(sends("a", 5) + sends("b", 2), history)
    # a: 1 late, 2 redelivered, 3 and 4 lost, 5 never sent; b: 0 redelivered, 1 lost
    assert counts(verdict) == (3, 2, 1, 1)
    assert verdict.lost_messages == [("a", 3), ("a", 4), ("b", 1)]


def test_the_recorder_is_the_checker_input():
    history = History()
    for seq in range(3):
        history.sent("k", seq, acked=seq != 2)
    assert not history.delivered_all_acked()
    history.delivered("k", 0, consumer="c1", queue_id=0, offset=0)
    history.delivered("k", 1, consumer="c1", queue_id=0, offset=1)
    assert history.delivered_all_acked()
    history.delivered("k", 0, consumer="c2", queue_id=0, offset=0)
    verdict = history.check()
    assert counts(verdict) == (0, 1, 0, 0)
    assert verdict.as_dict()["unacked"] == 1


def test_check_keyed_judges_emission_order():
    assert check_keyed({"a": 3, "b": 1}, [("a", 0), ("b", 0), ("a", 1), ("a", 2)]).ok
    replayed = check_keyed({"a": 4}, [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("a", 1), ("a", 3), ("a", 2)])
    assert replayed.duplicated == 3 and replayed.out_of_order >= 1
    swapped = check_keyed({"a": 3}, [("a", 0), ("a", 2), ("a", 1)])
    assert swapped.out_of_order == 1 and swapped.duplicated == 0 and swapped.lost == 0
    short = check_keyed({"a": 3}, [("a", 0), ("a", 2)])
    assert short.lost == 1 and not short.ok
