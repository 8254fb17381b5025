"""The size knobs of every fault scenario, in one place.

``ORDERLYMQ_FAULTS=long`` (``make faults``) selects the long runs; unset (CI) or ``short`` selects
runs small enough for CI. Sizes bound traffic and repetitions only: no scenario asserts on time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from broker.wire.errors import InvalidOptionError

__all__ = ["PROFILE", "FaultProfile", "profile_named"]


@dataclass(frozen=True)
class FaultProfile:
    """How much traffic and how many faults each scenario injects.

    Attributes
    ----------
    name : str
        ``short`` or ``long``.
    broker_cycles : int
        ``kill -9`` and restart cycles of the broker (scenarios 1 and 2).
    cycle_seconds : float
        Traffic between two kills.
    producers, keys_per_producer : int
        Producer threads, and the sharding keys each of them owns.
    send_rate : int
        Messages per second of each producer thread at most.
    consumers : int
        Members of the orderly consumer group.
    fenced_messages : int
        Messages consumed by the stale and the new lock holder (scenario 3).
    spark_keys, spark_messages : int
        Keys and input messages of the Spark pipeline (scenario 4).
    spark_max_per_trigger : int
        ``maxMessagesPerTrigger`` of the pipeline: more micro-batches, more places to fail.
    disk_messages : int
        Messages per queue before the log is damaged (scenario 5).
    fuzz_threads, fuzz_requests : int
        Threads sending bad requests, and bad requests per thread (scenario 6).
    fuzz_good_messages : int
        Good messages produced and consumed while the bad requests fly.
    mutated_batches : int
        Byte-mutated Arrow batches sent to the broker (scenario 6, break 9).
    disk_full_cycles : int
        Times the data dir's tmpfs is filled and freed under traffic (break 8); every other
        cycle also restarts the broker with ``kill -9``.
    power_cuts_sync, power_cuts_async : int
        Power cuts of the lazy file system under a broker with ``flush = "sync"`` / ``"async"``
        (break 11); the async count is run twice (a normal and a never-reached flush interval).
    power_cut_acks : int
        Acknowledged sends between two power cuts.
    crowd_streams, crowd_polls, crowd_producers : int
        Idle open send streams, long polls and ``Producer`` clients beside a normal pair (break 6).
    crowd_pair_messages : int
        Messages the normal producer/consumer pair moves while the crowd stands.
    """

    name: str
    broker_cycles: int
    cycle_seconds: float
    producers: int
    keys_per_producer: int
    send_rate: int
    consumers: int
    fenced_messages: int
    spark_keys: int
    spark_messages: int
    spark_max_per_trigger: int
    disk_messages: int
    fuzz_threads: int
    fuzz_requests: int
    fuzz_good_messages: int
    mutated_batches: int
    disk_full_cycles: int
    power_cuts_sync: int
    power_cuts_async: int
    power_cut_acks: int
    crowd_streams: int
    crowd_polls: int
    crowd_producers: int
    crowd_pair_messages: int


SHORT = FaultProfile(
    name="short",
    broker_cycles=5,
    cycle_seconds=1.0,
    producers=3,
    keys_per_producer=4,
    send_rate=150,
    consumers=2,
    fenced_messages=240,
    spark_keys=40,
    spark_messages=1_200,
    spark_max_per_trigger=150,
    disk_messages=60,
    fuzz_threads=3,
    fuzz_requests=300,
    fuzz_good_messages=600,
    mutated_batches=3_000,
    disk_full_cycles=3,
    power_cuts_sync=5,
    power_cuts_async=3,
    power_cut_acks=150,
    crowd_streams=1_000,
    crowd_polls=1_000,
    crowd_producers=70,
    crowd_pair_messages=1_000,
)

LONG = FaultProfile(
    name="long",
    broker_cycles=20,
    cycle_seconds=3.0,
    producers=4,
    keys_per_producer=8,
    send_rate=200,
    consumers=3,
    fenced_messages=2_000,
    spark_keys=200,
    spark_messages=20_000,
    spark_max_per_trigger=1_000,
    disk_messages=400,
    fuzz_threads=6,
    fuzz_requests=3_000,
    fuzz_good_messages=6_000,
    mutated_batches=30_000,
    disk_full_cycles=16,
    power_cuts_sync=24,
    power_cuts_async=20,
    power_cut_acks=600,
    crowd_streams=4_000,
    crowd_polls=4_000,
    crowd_producers=200,
    crowd_pair_messages=20_000,
)

_PROFILES = {p.name: p for p in (SHORT, LONG)}


def profile_named(name: str | None) -> FaultProfile:
    """The profile called ``name`` (``short`` when None or empty)."""
    key = (name or "short").strip().lower()
    if key not in _PROFILES:
        raise InvalidOptionError(f"ORDERLYMQ_FAULTS must be one of {', '.join(_PROFILES)}, got {name!r}")
    return _PROFILES[key]


PROFILE = profile_named(os.environ.get("ORDERLYMQ_FAULTS"))
