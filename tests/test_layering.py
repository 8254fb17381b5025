"""The dependency direction of DESIGN.md: broker never imports connector; connector imports only
the wire layer of broker (broker.wire, broker.proto)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WIRE = ("broker.wire", "broker.proto")


def imports(package: str) -> list[tuple[Path, str]]:
    found = []
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(path, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.module))
    return found


def test_broker_never_imports_connector():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m in imports("broker") if m.split(".")[0] == "connector"]
    assert bad == []


def test_connector_uses_only_the_wire_layer_of_broker():
    bad = [f"{p.relative_to(ROOT)}: {m}" for p, m in imports("connector")
           if m.split(".")[0] == "broker" and not m.startswith(WIRE)]
    assert bad == []
