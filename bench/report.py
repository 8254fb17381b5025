"""Benchmark rows: workload, figure, ceiling, ratio; printed as a table and written as JSON."""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table

__all__ = ["Row", "cpu_seconds", "percentile", "write_report"]


@dataclass
class Row:
    workload: str
    figure: float
    unit: str
    ceiling: float | None = None
    ceiling_name: str = ""
    message_bytes: int = 0
    queues: int = 0
    goal: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        return self.figure / self.ceiling if self.ceiling else None


def cpu_seconds(process) -> float:
    """The user and system CPU a ``psutil.Process`` has spent so far."""
    return sum(process.cpu_times()[:2])


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def medians(rounds: list[tuple[float, ...]]) -> tuple[float, ...]:
    """Per figure, the median over rounds that measured every figure one after the other: on a
    shared machine a figure and its ceiling then see the same load."""
    return tuple(statistics.median(values) for values in zip(*rounds, strict=True))


def round_ratios(rounds: list[tuple[float, ...]], figure: int, ceiling: int) -> dict[str, list[float]]:
    """A row's ``extra``: the ratio of each round (a figure to the ceiling measured beside it), which
    shows how far one run's rounds spread around the ratio of the medians."""
    return {"round ratios": [round(each[figure] / each[ceiling], 3) for each in rounds]}


def in_turn(measures: list[Callable[[], float]], round_index: int) -> tuple[float, ...]:
    """One round: every figure measured once, one after the other, in the listed order in even
    rounds and the reverse order in odd ones, so that no figure always runs first or last (a
    figure run after another pays for what that one left behind: garbage, dirty pages)."""
    order = range(len(measures)) if round_index % 2 == 0 else reversed(range(len(measures)))
    figures = {i: measures[i]() for i in order}
    return tuple(figures[i] for i in range(len(measures)))


def write_report(rows: list[Row], path: Path, mode: str) -> None:
    table = Table(title=f"orderlymq benchmarks ({mode})")
    for col in ("workload", "figure", "ceiling", "ratio", "msg bytes", "queues", "goal"):
        table.add_column(col, justify="left" if col in ("workload", "goal") else "right")
    for r in rows:
        ceiling = f"{r.ceiling:,.0f} ({r.ceiling_name})" if r.ceiling else "-"
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "-"
        spread = r.extra.get("round ratios", [])
        if len(spread) > 1:  # the rounds' own ratios, lowest to highest
            ratio += f" ({min(spread):.2f}-{max(spread):.2f})"
        table.add_row(r.workload, f"{r.figure:,.1f} {r.unit}", ceiling, ratio, str(r.message_bytes or "-"),
                      str(r.queues or "-"), r.goal)
    Console(width=160).print(table)
    doc = {
        "mode": mode,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "rows": [asdict(r) | {"ratio": r.ratio} for r in rows],
    }
    path.write_text(json.dumps(doc, indent=2))
    print(f"wrote {path}")
