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
        "kopf",
        "google",
    ),
    "api": (
        "multislice_operator.planning",
        "multislice_operator.render",
        "multislice_operator.reconcile",
        "multislice_operator.provisioning",
        "multislice_operator.controller",
    ),
    "common": (
        "multislice_operator.tpu",
        "multislice_operator.api",
        "multislice_operator.planning",
        "multislice_operator.render",
        "multislice_operator.reconcile",
        "multislice_operator.controller",
        "multislice_operator.provisioning",
        "multislice_operator.cli",
    ),
    "tpu": (
        "multislice_operator.api",
        "multislice_operator.planning",
        "multislice_operator.render",
        "multislice_operator.reconcile",
        "multislice_operator.controller",
        "multislice_operator.provisioning",
        "multislice_operator.cli",
    ),
    "planning": (
        "multislice_operator.render",
        "multislice_operator.reconcile",
        "multislice_operator.controller",
        "multislice_operator.provisioning",
        "multislice_operator.cli",
    ),
    "render": (
        "multislice_operator.reconcile",
        "multislice_operator.controller",
        "multislice_operator.provisioning",
        "multislice_operator.cli",
    ),
    "provisioning": (
        "multislice_operator.controller",
        "multislice_operator.cli",
    ),
    "controller": ("multislice_operator.cli",),
}


def imports(path: Path) -> set[str]:
    return imports_in(path.read_text())


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """The nodes under `if TYPE_CHECKING:`: never run, so they make no circle at import time."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for child in node.body:
                skipped |= set(ast.walk(child))
    return skipped


def imports_in(source: str, runtime_only: bool = False) -> set[str]:
    """Every module and imported name, at any depth (a function's own imports too); with
    `runtime_only`, not those only a type checker reads."""
    found = set()
    tree = ast.parse(source)
    skipped = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
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
    """Every caller matches objects to jobs through common/ownership.py, never by label or name
    alone."""
    from multislice_operator.common.ownership import Owner, orphaned, owner_of

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


# ---------------------------------------------------------------- no import cycles


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def internal_imports(source: str, me: str, known: set[str]) -> set[str]:
    """The operator's modules `me` imports: `from pkg import mod` names the module, `from pkg
    import name` the package's __init__. A package `me` sits in is left out: Python runs it
    before `me` either way, and its __init__ re-exporting `me` is no circle."""
    found = set()
    for name in imports_in(source, runtime_only=True):
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return {m for m in found if m != me and not me.startswith(m + ".")}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            found.append(sorted([*component, node]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [c for c in found if len(c) > 1]


def test_no_import_cycles() -> None:
    """No two operator modules import each other, directly or around a circle, not even through
    an import inside a function (which hides a circle until that function first runs)."""
    paths = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}
    known = set(paths)
    graph = {me: internal_imports(p.read_text(), me, known) for me, p in paths.items()}
    assert len(graph) > 50
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_circle_through_a_function_import() -> None:
    known = {"multislice_operator.x", "multislice_operator.x.y", "multislice_operator.z"}
    lazy = "import os\n\ndef f():\n    from multislice_operator.x import y, name\n"
    found = internal_imports(lazy, "multislice_operator.z", known)
    assert found == {"multislice_operator.x", "multislice_operator.x.y"}
    own_package = internal_imports(lazy, "multislice_operator.x.w", known)
    assert own_package == {"multislice_operator.x.y"}
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_an_import_only_a_type_checker_reads_makes_no_circle() -> None:
    """`if TYPE_CHECKING:` imports never run (a capacity model names `Facts` in its signatures
    while facts.py imports the models): no circle; the same import at run time is one."""
    known = {"multislice_operator.a", "multislice_operator.b"}
    typed = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from multislice_operator.b import F\n"
    )
    assert internal_imports(typed, "multislice_operator.a", known) == set()
    typed_alias = "import typing\nif typing.TYPE_CHECKING:\n    import multislice_operator.b\n"
    assert internal_imports(typed_alias, "multislice_operator.a", known) == set()
    run = "from multislice_operator.b import F\n"
    assert internal_imports(run, "multislice_operator.a", known) == {"multislice_operator.b"}


def test_the_registry_sits_below_every_layer() -> None:
    """registry.py is read by the API (the CRD's enums) and every layer above: at run time it
    imports no module of the package (its plugins load by name, its types are the checker's)."""
    source = (PKG / "registry.py").read_text()
    ours = {i for i in imports_in(source, runtime_only=True) if i.startswith("multislice_operator")}
    assert ours == set()
