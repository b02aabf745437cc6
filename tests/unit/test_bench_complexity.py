"""benchmarks/complexity.py: what it counts, on small code strings and a small package (issue 39's
report; nothing here depends on the repository's own figures)."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmarks import complexity
from benchmarks.complexity import Block, at_or_above, blocks, longest, summary
from benchmarks.run import targets

SOURCE = '''
def simple():
    return 1


def branchy(x, y):
    def inner(z):
        if z:
            return 1
        return 2

    if x and y:
        return inner(x)
    for i in range(3):
        if i:
            pass
    return 0


class Thing:
    """A class is not counted; its methods are."""

    def method(self, a):
        return a if a else None
'''


def _by_name(found: list[Block]) -> dict[str, Block]:
    return {b.name: b for b in found}


def test_functions_methods_and_closures_are_counted_each_and_classes_are_not() -> None:
    got = _by_name(blocks(SOURCE, "m.py"))
    assert set(got) == {"simple", "branchy", "branchy.inner", "Thing.method"}
    assert got["simple"].complexity == 1
    # 1 + if/and (2) + for (1) + if (1); the closure's if counts in the closure, not here
    assert got["branchy"].complexity == 5
    assert got["branchy.inner"].complexity == 2
    assert got["Thing.method"].complexity == 2  # a conditional expression is a branch
    assert (got["branchy"].file, got["branchy"].line, got["branchy"].lines) == (
        "m.py",
        6,
        12,
    )  # def to return 0


def _block(name: str, cc: int, lines: int = 5, file: str = "reconcile/a.py") -> Block:
    return Block(file, name, 1, cc, lines)


def test_the_threshold_counts_from_its_value_up_and_the_most_complex_comes_first() -> None:
    found = [_block("low", 19), _block("at", 20), _block("high", 35)]
    assert [b.name for b in at_or_above(found, 20)] == ["high", "at"]


def test_the_goal_is_at_most_that_many_and_a_scope_without_one_has_no_status() -> None:
    found = [_block("a", 20), _block("b", 25), _block("c", 3)]
    s = summary(found, 20, 2)
    assert (s["functions"], s["at_or_above"], s["max"], s["mean"], s["met"]) == (
        3,
        2,
        25,
        16.0,
        True,
    )
    assert summary(found, 20, 1)["met"] is False
    assert summary(found, 20, None)["met"] is None
    assert summary([], 20, 5)["mean"] == 0.0


def test_longest_is_by_lines() -> None:
    found = [_block("short", 30, lines=10), _block("long", 2, lines=80), _block("mid", 5, lines=40)]
    assert [b.name for b in longest(found, 2)] == ["long", "mid"]


def test_a_run_reports_the_core_apart_from_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(21))
    (tmp_path / "reconcile").mkdir()
    (tmp_path / "reconcile" / "core.py").write_text(f"def big(x):\n{branches}\n    return -1\n")
    (tmp_path / "view.py").write_text(f"def wide(x):\n{branches}\n    return -1\n")
    monkeypatch.setattr(complexity, "save", lambda name, data: tmp_path / f"{name}.json")
    out = complexity.run(threshold=20, top=1, root=tmp_path)
    core, package = out["scopes"][complexity.CORE], out["scopes"]["operator package"]
    assert (core["functions"], core["at_or_above"], core["max"], core["met"]) == (1, 1, 22, True)
    assert (package["functions"], package["at_or_above"], package["met"]) == (2, 2, None)
    assert [b["name"] for b in out["core_at_or_above"]] == ["big"]
    assert len(out["longest"]) == 1
    assert "MISSED" not in capsys.readouterr().out


def test_make_bench_judges_the_core_against_its_goal_without_failing() -> None:
    scope = summary([_block("a", 20), _block("b", 21)], 20, 1)
    got = targets({"complexity": {"threshold": 20, "scopes": {complexity.CORE: scope}}})["targets"]
    assert [(t["target"], t["value"], t["goal"], t["met"]) for t in got] == [
        ("reconcile/ functions of complexity >= 20", 2, "<= 1", False)
    ]
