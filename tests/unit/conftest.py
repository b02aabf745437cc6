"""Every decision a unit test makes is checked against the core's invariants (invariants.py):
a violation raises instead of being dropped and logged as in production."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from multislice_operator.reconcile import invariants


@pytest.fixture(autouse=True)
def strict_invariants() -> Iterator[None]:
    invariants.STRICT = True
    yield
    invariants.STRICT = False
