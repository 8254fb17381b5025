"""One summary per scenario: a printed line, a JSON file under the test's tmp dir, and a line in
the run's ``fault-summaries.jsonl`` (shown again at the end of the pytest run)."""

from __future__ import annotations

import json
from pathlib import Path

from connector.history import Verdict
from tests.faults.fault_profile import PROFILE

__all__ = ["SUMMARIES", "summarize"]

#: Lines of the scenarios that ran in this session, for the terminal summary.
SUMMARIES: list[str] = []


def summarize(scenario: str, histories: dict[str, Verdict], figures: dict, tmp: Path, run_dir: Path) -> dict:
    """Record a scenario's result: each history's sizes and counts, and the scenario's own figures."""
    entry = {
        "scenario": scenario,
        "profile": PROFILE.name,
        "histories": {label: verdict.as_dict() for label, verdict in histories.items()},
        "figures": figures,
    }
    parts = [f"{label}: {verdict.line()}" for label, verdict in histories.items()]
    parts += [" ".join(f"{name}={value}" for name, value in figures.items())] if figures else []
    line = f"[faults {PROFILE.name}] {scenario} | " + " | ".join(parts)
    print(line)
    (tmp / "fault-summary.json").write_text(json.dumps(entry, indent=2))
    with open(run_dir / "fault-summaries.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")
    SUMMARIES.append(line)
    return entry
