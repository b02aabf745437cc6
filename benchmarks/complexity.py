"""Report: the cyclomatic complexity of the operator's functions (issue 39).

    python -m benchmarks.complexity [--threshold 20] [--top 10]

Radon's cyclomatic complexity (McCabe's: 1, plus one per if, loop, except, boolean operator,
comprehension clause and conditional expression) of every function and method under
operator/multislice_operator, as `radon cc -s` gives it, and of every nested function (which
`radon cc` shows only with --show-closures).
Prints a summary for reconcile/ (the pure core: at most 5 functions at or above the threshold is
issue 39's goal) and for the whole package, the functions at or above the threshold in each, and
the longest functions; writes benchmarks/results/complexity.json. A report, not a test: a missed
goal is printed as MISSED and the exit status stays 0. Classes are not counted (radon rates a
class by its methods, which are counted themselves).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from radon.complexity import cc_visit
from radon.visitors import Function

from benchmarks.common import save, table

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "multislice_operator"
CORE = "reconcile/"  # the scope issue 39's goal is about, relative to PACKAGE
THRESHOLD = 20  # issue 39: "functions of complexity 20 or more"
GOAL = 5  # at most this many of them in reconcile/


@dataclass(frozen=True)
class Block:
    """One function or method: where it is, its complexity and its length in lines."""

    file: str
    name: str
    line: int
    complexity: int
    lines: int


def blocks(source: str, file: str) -> list[Block]:
    """Every function and method of `source`, and every function nested in one (`outer.inner`):
    radon leaves a closure out of its parent's complexity, and so would `radon cc` from its
    report, where branches moved into one would hide."""
    out: list[Block] = []
    todo = [(b, b.fullname) for b in cc_visit(source) if isinstance(b, Function)]
    while todo:
        b, name = todo.pop()
        out.append(Block(file, name, b.lineno, b.complexity, b.endline - b.lineno + 1))
        todo += [(c, f"{name}.{c.name}") for c in b.closures]
    return sorted(out, key=lambda b: b.line)


def package_blocks(root: Path = PACKAGE) -> list[Block]:
    """Every function of the package under `root`, its file relative to `root`."""
    out: list[Block] = []
    for path in sorted(root.rglob("*.py")):
        out += blocks(path.read_text(), path.relative_to(root).as_posix())
    return out


def at_or_above(found: Sequence[Block], threshold: int) -> list[Block]:
    """The functions of complexity `threshold` or more, the most complex first."""
    over = [b for b in found if b.complexity >= threshold]
    return sorted(over, key=lambda b: (-b.complexity, b.file, b.line))


def summary(found: Sequence[Block], threshold: int, goal: int | None) -> dict[str, Any]:
    """Files, functions, mean and largest complexity, and how many reach `threshold`; against
    `goal` (at most that many) when there is one."""
    over = len(at_or_above(found, threshold))
    return {
        "files": len({b.file for b in found}),
        "functions": len(found),
        "mean": round(sum(b.complexity for b in found) / len(found), 2) if found else 0.0,
        "max": max((b.complexity for b in found), default=0),
        "at_or_above": over,
        "goal": goal,
        "met": None if goal is None else over <= goal,
    }


def longest(found: Sequence[Block], top: int) -> list[Block]:
    return sorted(found, key=lambda b: (-b.lines, b.file, b.line))[:top]


def _rows(found: Sequence[Block]) -> list[list[Any]]:
    return [[b.file, b.name, b.line, b.complexity, b.lines] for b in found]


def run(threshold: int = THRESHOLD, top: int = 10, root: Path = PACKAGE) -> dict[str, Any]:
    found = package_blocks(root)
    core = [b for b in found if b.file.startswith(CORE)]
    scopes = {
        CORE: summary(core, threshold, GOAL),
        "operator package": summary(found, threshold, None),
    }
    table(
        f"Complexity: functions of complexity >= {threshold} (radon cc)",
        ["scope", "files", "functions", "mean", "max", f">= {threshold}", "goal", "status"],
        [
            [
                scope,
                s["files"],
                s["functions"],
                s["mean"],
                s["max"],
                s["at_or_above"],
                "-" if s["goal"] is None else f"<= {s['goal']}",
                {True: "met", False: "MISSED", None: "n/a"}[s["met"]],
            ]
            for scope, s in scopes.items()
        ],
    )
    headers = ["file", "function", "line", "complexity", "lines"]
    core_over, all_over = at_or_above(core, threshold), at_or_above(found, threshold)
    table(f"{CORE}: complexity >= {threshold}", headers, _rows(core_over))
    table(f"operator package: complexity >= {threshold}", headers, _rows(all_over))
    table(f"operator package: the {top} longest functions", headers, _rows(longest(found, top)))
    out = {
        "threshold": threshold,
        "scopes": scopes,
        "core_at_or_above": [asdict(b) for b in core_over],
        "at_or_above": [asdict(b) for b in all_over],
        "longest": [asdict(b) for b in longest(found, top)],
    }
    save("complexity", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threshold", type=int, default=THRESHOLD, help="complexity counted as high")
    p.add_argument("--top", type=int, default=10, help="how many of the longest functions")
    args = p.parse_args(argv)
    run(args.threshold, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
