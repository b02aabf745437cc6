"""A/B: the operator of another git revision against this tree's, in one session.

    python -m benchmarks.ab --rev 8a83d03 [--n 1000] [--rounds 3]

The operator's CPU per job moves with the machine (the same code measured 5.1 and 7.2 ms per job
on one day), so a change is judged against its baseline run beside it: each round runs the
reconcile benchmark's operator side (`reconcile.run_operator`: N Existing jobs to Starting on a
fresh `api` control plane) once with the revision's operator package and once with this tree's,
alternating. The revision is checked out with `git worktree` into a temporary directory and put
first on the operator process's PYTHONPATH (this tree's virtual environment serves both: the
revision must need no other dependency). Besides CPU per job it reports the operator's CPU
against the apiserver's in the same run, which a slower machine raises on both sides alike.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import reconcile
from benchmarks.common import save, say, table

ROOT = Path(__file__).resolve().parents[1]


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
        check=True,
        capture_output=True,
    )
    return into


def one(label: str, tree: Path, n: int) -> dict[str, Any]:
    res = reconcile.run_operator(n, 120 + n * 0.5, env={"PYTHONPATH": str(tree / "operator")})
    cpu = res["cpu_s"]
    return {
        "tree": label,
        "total_s": res["total_s"],
        "cpu_ms_per_job": cpu["operator"] / n * 1000,
        "apiserver_cpu_s": cpu["apiserver"],
        "cpu_vs_apiserver": cpu["operator"] / cpu["apiserver"] if cpu["apiserver"] else None,
        "writes_per_job": res["writes_per_job"],
        "others_cores": cpu["others"] / max(cpu["wall"], 1e-9),
    }


def run(rev: str, n: int, rounds: int) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="msj-ab-") as tmp:
        base = worktree(rev, Path(tmp) / "rev")
        try:
            for r in range(rounds):
                for label, tree in ((rev, base), ("this tree", ROOT)):
                    say(f"ab round {r + 1}/{rounds}: {label}, {n} jobs")
                    rows.append({"round": r + 1, **one(label, tree, n)})
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                check=False,
                capture_output=True,
            )
    text = table(
        f"A/B at N = {n}: {rev} against this tree, alternating ({rounds} rounds)",
        ["round", "operator", "op s", "op CPU ms/job", "apiserver CPU s", "op/apiserver CPU",
         "writes/job", "others' cores"],
        [[x["round"], x["tree"], x["total_s"], x["cpu_ms_per_job"], x["apiserver_cpu_s"],
          x["cpu_vs_apiserver"], x["writes_per_job"], x["others_cores"]] for x in rows],
    )  # fmt: skip
    out = {"rev": rev, "n": n, "rounds": rows, "table": text}
    save("ab", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rev", required=True, help="the git revision to compare against")
    p.add_argument("--n", type=int, default=1000, help="jobs per run")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    run(args.rev, args.n, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
