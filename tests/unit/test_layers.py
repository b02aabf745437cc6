"""Arrows point down: the pure core never imports an adapter, the model never imports planning
(the README's "How it works"). Read from the source's imports, so a new module is checked too."""

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


def test_ownership_is_one_rule() -> None:
    """Every caller matches objects to jobs through ownership.py, never by label or name alone."""
    from multislice_operator.ownership import Owner, orphaned, owner_of

    me = ("ns", "job")
    assert owner_of(made_by_us=False, claim_uid="u1", claim_key=me, job_key=me, job_uid="u1") == (
        Owner.STRANGER
    )
    assert owner_of(made_by_us=True, claim_uid="u1", claim_key=me, job_key=me, job_uid="u1") == (
        Owner.MINE
    )
    # The same name, another uid: a predecessor's (Argo CD's delete and recreate).
    assert owner_of(made_by_us=True, claim_uid="u0", claim_key=me, job_key=me, job_uid="u1") == (
        Owner.ORPHAN
    )
    other = ("ns", "other")
    live = {other: "u9"}
    args = {"made_by_us": True, "claim_key": other, "job_key": me, "job_uid": "u1"}
    assert owner_of(claim_uid="u9", live_jobs=live, **args) == Owner.OTHER_JOB
    assert owner_of(claim_uid="u8", live_jobs=live, **args) == Owner.ORPHAN  # recreated since
    assert owner_of(claim_uid="u9", live_jobs={}, **args) == Owner.OTHER_JOB  # a cache: unsure
    assert owner_of(claim_uid="u9", live_jobs={}, complete=True, **args) == Owner.ORPHAN
    assert not orphaned(None, other, {other: "u9"}, complete=True)  # no uid recorded: kept
    callers = ["controller/observe.py", "controller/reconciler.py", "controller/gc.py",
               "provisioning/gke.py"]  # fmt: skip
    for path in callers:
        assert "ownership import" in (PKG / path).read_text(), path
