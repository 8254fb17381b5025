"""The tour notebook runs top to bottom against the embedded broker."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tests.jobs.cluster import ROOT, spark_env


def _printed(nb) -> str:
    """What the notebook's code cells printed (the kernel forwards its child processes' output too)."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_tour_notebook_executes(tmp_path, monkeypatch):
    for name, value in spark_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    scratch = tmp_path / "kernel-tmp"  # the notebook's temporary directory goes here, not into /tmp
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    nb = nbformat.read(ROOT / "notebooks" / "orderlymq_tour.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}})
    try:
        client.execute()
    except CellExecutionError as exc:
        raise AssertionError(f"the notebook failed; what its cells printed:\n{_printed(nb)[-6000:]}") from exc
    outputs = _printed(nb)
    assert "orders whose events are out of order or incomplete: 0" in outputs
    assert "final lag: 0" in outputs
    assert not list(scratch.glob("orderlymq-tour-*")), "the notebook's last cell leaves its working directory behind"
