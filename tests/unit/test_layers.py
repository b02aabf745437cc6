"""Arrows point down: the pure core never imports an adapter, the model never imports planning
(architecture.md). Read from the source's imports, so a new module is checked too."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "operator" / "multislice_operator"

# package (directory under multislice_operator) -> modules it must never import
FORBIDDEN = {
    "reconcile": (
        "multislice_operator.provisioning",
        "multislice_operator.controller",
        "multislice_operator.cli",
        "multislice_operator.metrics",
        "kopf",
        "google",
    ),
    "api": (
        "multislice_operator.plan",
        "multislice_operator.render",
        "multislice_operator.reconcile",
        "multislice_operator.provisioning",
        "multislice_operator.controller",
    ),
}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_arrows_point_down() -> None:
    checked = 0
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((PKG / package).glob("*.py")):
            checked += 1
            bad = {i for i in imports(path) if i.startswith(forbidden)}
            assert not bad, f"{package}/{path.name} imports {sorted(bad)}"
    assert checked > 15
