"""Report: the plugin seam's budgets (issue 53), as figures, not a failing test.

    python -m benchmarks.seam [--with tests.plugins.labelled:register,...]

- `reconcile/` no larger than it was when the issue was filed (6611 lines at ae446ca: every
  line of its .py files, as `wc -l` counts them);
- no function of cyclomatic complexity 20 or more in the whole operator package (radon's `cc`,
  closures counted apart: benchmarks/complexity.py);
- at most 10 pairs of duplicated places on operator/ (the `duplicates` tool of this workplace,
  `duplicates --repo operator`: pairs sharing runs of 6 or more identical or same-shape lines;
  "not measured" where the tool is not installed);
- each registered plugin's files: where its parts are defined (the model or strategy class,
  its observe, place, plan and check functions, its appliers), read from the registry, so "what
  a new one touches" is measured, not stated. `--with` loads plugins from outside the package
  (tests/plugins/) first.

Writes benchmarks/results/seam.json. A missed budget prints MISSED; the exit status stays 0.
"""

from __future__ import annotations

import argparse
import inspect
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import save, table
from benchmarks.complexity import PACKAGE, THRESHOLD, at_or_above, package_blocks
from multislice_operator.registry import REGISTRY, CapacityPlugin, resolve

ROOT = PACKAGE.parents[1]
RECONCILE_LINES = 6611  # reconcile/ at ae446ca, when issue 53 was filed
DUPLICATE_PAIRS = 10


def lines(root: Path) -> int:
    """Every line of the .py files under `root` (what `wc -l` counts)."""
    return sum(len(p.read_text().splitlines()) for p in sorted(root.rglob("*.py")))


def duplicate_pairs(report: str) -> int | None:
    """The pair count of a `duplicates` report ("N pairs of places ..."; "no duplicates": 0)."""
    if report.startswith("no duplicates"):
        return 0
    m = re.match(r"(\d+) pairs? of places", report)
    return int(m.group(1)) if m else None


def _duplicates() -> tuple[int | None, list[str]]:
    tool = shutil.which("duplicates")
    if tool is None:
        return None, []
    done = subprocess.run(
        [tool, "--repo", str(ROOT / "operator"), "--most", "200", "--seconds", "120"],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    rows = done.stdout.splitlines()
    return (duplicate_pairs(rows[0]) if rows else None), rows[1:]


def _where(obj: Any) -> str | None:
    """The file defining `obj` (a function, class or instance), relative to the repository."""
    target = obj if inspect.isfunction(obj) or inspect.isclass(obj) else type(obj)
    try:
        path = Path(inspect.getsourcefile(target) or "")
    except TypeError:
        return None
    return str(path.resolve().relative_to(ROOT)) if path.is_absolute() else None


def plugin_files(parts: list[Any]) -> list[str]:
    """The files a plugin's parts are defined in, sorted."""
    return sorted({w for w in map(_where, parts) if w})


def _model_parts(m: CapacityPlugin) -> list[Any]:
    refs = [resolve(ref) for ref in m.appliers.values()]
    refs += [resolve(w.summarize) for w in m.watches]
    parts = [m.model, m.observe, m.place, m.pools, m.check]
    return [p for p in [*parts, *refs] if p is not None]


def plugins() -> list[dict[str, Any]]:
    out = [
        {"kind": "capacity model", "name": m.mode, "files": plugin_files(_model_parts(m))}
        for m in REGISTRY.models().values()
    ]
    out += [
        {
            "kind": "restart strategy",
            "name": s.name,
            "files": plugin_files([s, *([resolve(s.probe)] if s.probe else [])]),
        }
        for s in REGISTRY.strategies().values()
    ]
    return out


def _status(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "not measured"}[met]


def run(extra: list[str] | None = None) -> dict[str, Any]:
    REGISTRY.load(extra or [])
    core = lines(PACKAGE / "reconcile")
    over = at_or_above(package_blocks(), THRESHOLD)
    pairs, rows = _duplicates()
    budgets = [
        ["reconcile/ lines", core, f"<= {RECONCILE_LINES}", core <= RECONCILE_LINES],
        [f"functions of complexity >= {THRESHOLD}", len(over), "0", not over],
        ["duplicated pairs on operator/", pairs, f"<= {DUPLICATE_PAIRS}",
         None if pairs is None else pairs <= DUPLICATE_PAIRS],
    ]  # fmt: skip
    table(
        "The seam's budgets (issue 53)",
        ["budget", "now", "goal", "status"],
        [
            [name, "-" if now is None else now, goal, _status(met)]
            for name, now, goal, met in budgets
        ],
    )
    found = plugins()
    table(
        "Plugins registered, and the files their parts are defined in",
        ["kind", "name", "files"],
        [[p["kind"], p["name"], ", ".join(p["files"])] for p in found],
    )
    out = {
        "budgets": [
            {"budget": name, "now": now, "goal": goal, "met": met}
            for name, now, goal, met in budgets
        ],
        "complexity_at_or_above": [b.__dict__ for b in over],
        "duplicates": rows,
        "plugins": found,
    }
    save("seam", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--with", dest="extra", default="", help="plugins to load first, module:func,..."
    )
    args = p.parse_args(argv)
    run([r for r in args.extra.split(",") if r.strip()])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
