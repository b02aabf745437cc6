"""benchmarks/seam.py: what it counts (issue 53's budgets), on small inputs; nothing here
depends on the repository's own figures."""

from __future__ import annotations

from pathlib import Path

from benchmarks import seam

from multislice_operator.plugins.nodepools import NODE_POOLS, plan_pools
from tests.plugins.blocking import BLOCKING


def test_lines_are_every_line_of_the_python_files(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n\n# c\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "notes.md").write_text("not\ncounted\n")
    assert seam.lines(tmp_path) == 4


def test_the_duplicates_report_is_read_for_its_pair_count() -> None:
    assert seam.duplicate_pairs("10 pairs of places (93 files read), each ...") == 10
    assert seam.duplicate_pairs("1 pair of places (3 files read)") == 1
    assert seam.duplicate_pairs("no duplicates (93 files read)") == 0
    assert seam.duplicate_pairs("incomplete: ...") is None


def test_a_plugins_files_are_where_its_parts_are_defined() -> None:
    assert seam.plugin_files([NODE_POOLS, plan_pools]) == [
        "operator/multislice_operator/plugins/nodepools.py"
    ]
    assert seam.plugin_files([BLOCKING]) == ["tests/plugins/blocking.py"]
