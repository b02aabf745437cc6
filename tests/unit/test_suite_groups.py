"""The control-plane layer's cluster shards (tests/conftest.py) name tests that exist: a renamed
module or test would otherwise fall back to the first cluster without a word, and the layer's
longest group would grow by minutes."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import _CLUSTER_SHARDS, _FIRST_GROUPS

ROOT = Path(__file__).resolve().parents[2]


def test_every_shard_entry_names_a_module_or_test_that_uses_the_cluster() -> None:
    for entry, group in _CLUSTER_SHARDS.items():
        module, _, function = entry.partition("::")
        path = ROOT / module
        assert path.is_file(), entry
        source = path.read_text()
        assert "kube_cluster" in source, entry
        if function:
            names = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
            assert function in names, entry
        assert group in _FIRST_GROUPS, (entry, group)  # started first, with the long groups
