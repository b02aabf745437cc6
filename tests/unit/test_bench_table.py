"""benchmarks/common.table(): column widths, and an empty table (a benchmark with no size run)."""

from __future__ import annotations

import pytest
from benchmarks.common import table


def test_columns_are_as_wide_as_their_widest_cell(capsys: pytest.CaptureFixture[str]) -> None:
    text = table("T", ["jobs", "RSS MiB"], [[5000, 256.65], [1, 2.0]])
    lines = text.splitlines()
    assert lines[1:] == ["== T", "jobs  RSS MiB", "----  -------", "5000   256.65", "   1     2.00"]
    assert capsys.readouterr().out.strip() == text.strip()


def test_an_empty_table_has_its_title_and_headers() -> None:
    lines = table("Nothing ran", ["jobs", "RSS MiB"], []).splitlines()
    assert lines[1:] == ["== Nothing ran", "jobs  RSS MiB", "----  -------"]
