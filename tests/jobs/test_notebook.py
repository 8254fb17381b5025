"""The tour notebook runs top to bottom against the embedded broker."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from tests.jobs.cluster import ROOT, spark_env


def test_tour_notebook_executes(tmp_path, monkeypatch):
    for name, value in spark_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    nb = nbformat.read(ROOT / "notebooks" / "orderlymq_tour.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "orders whose events are out of order or incomplete: 0" in outputs
    assert "final lag: 0" in outputs
