"""``broker.wire.spare_cpu``: whether the machine has a CPU to spare for a busy poll, counted
against the CPUs the process may use, and when polls that keep missing give way to probes."""

from __future__ import annotations

import os
from pathlib import Path

from broker.wire import spare_cpu
from broker.wire.spare_cpu import MissedPolls, SpareCpu, usable_cpus


def test_polls_stop_while_the_machine_runs_more_threads_than_it_has_cpus_but_not_for_a_moment(monkeypatch):
    now, runnable = [0.0], [2]
    monkeypatch.setattr(spare_cpu, "_runnable_now", lambda: runnable[0])
    spare = SpareCpu(cpus=2, clock=lambda: now[0])

    def asked(threads: int, seconds: float) -> list[bool]:  # as a lone sender's sends ask, every 5 ms
        runnable[0], answers = threads, []
        for _ in range(round(seconds / 0.005)):
            now[0] += 0.005
            answers.append(spare())
        return answers

    assert all(asked(2, 0.4)), "the poller and the broker: two threads on two CPUs"
    assert all(asked(5, 0.02)), "a moment's extra threads"
    assert all(asked(2, 0.4))
    assert asked(3, 0.2)[-1] is False, "three threads for a while: no CPU to spare"
    assert asked(2, 0.3)[-1] is False, "nor for about a second after"
    assert asked(2, 1.5)[-1] is True
    assert asked(8, 1.0)[-1] is False, "a burst of threads"
    assert asked(2, 2.5)[-1] is True, "the burst is out of the average seconds later, not ten"
    now[0] += 5.0
    assert all(asked(4, 0.005)), "one look after a pause is not the whole average"


def _cgroup_tree(root: Path, files: dict[str, str], own: str) -> Path:
    """A cgroup hierarchy as ``/sys/fs/cgroup`` shows one, under ``root``; the path of the file
    that names the process's cgroups."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "self-cgroup").write_text(own)
    return root / "self-cgroup"


def test_the_cpus_counted_are_a_cgroup_quota_where_it_is_fewer_than_the_cpus(tmp_path):
    v2 = tmp_path / "v2"
    own = _cgroup_tree(v2, {"cpu.max": "max 100000\n", "pod/cpu.max": "50000 100000\n",
                            "pod/app/cpu.max": "max 100000\n"}, "0::/pod/app\n")
    assert usable_cpus(v2, own) == 0.5, "a quota of a cgroup above the process's counts"
    v1 = tmp_path / "v1"
    own = _cgroup_tree(v1, {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
                       "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n")
    assert usable_cpus(v1, own) == usable_cpus(tmp_path / "none", own), "no quota: the CPUs it may run on"
    (v1 / "cpu,cpuacct/cpu.cfs_quota_us").write_text("25000\n")
    assert usable_cpus(v1, own) == 0.25, "a container's own view: its cgroup is the root of what it sees"
    assert usable_cpus(v1, tmp_path / "missing") == len(os.sched_getaffinity(0))
    assert SpareCpu().cpus == usable_cpus()


def test_polls_that_keep_missing_are_due_once_in_sixteen_chances_until_one_finds_something():
    polls = MissedPolls()
    assert all(polls.due() for _ in range(8)), "no miss yet: always due"
    for _ in range(4):
        polls.missed()
    assert [polls.due() for _ in range(32)].count(True) == 2
    polls.found()
    assert all(polls.due() for _ in range(8))
