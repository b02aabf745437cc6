"""Every decision a unit test makes is checked against the core's invariants (invariants.py):
a violation raises instead of being dropped and logged as in production."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from multislice_operator.reconcile import invariants


@pytest.fixture(autouse=True)
def strict_invariants() -> Iterator[None]:
    invariants.STRICT = True
    yield
    invariants.STRICT = False


# The GKE simulator's fixtures of test_gke_sim.py and test_gke_sim_slices.py (imported when used).
@pytest.fixture
def registrar() -> Any:
    from multislice_local.gke_sim import InMemoryRegistrar

    return InMemoryRegistrar()


@pytest.fixture
def sim(registrar: Any) -> Iterator[Any]:
    from multislice_local.gke_sim import GkeSimulator, SimConfig
    from tests.unit.test_gke_sim import LATENCY

    with GkeSimulator(SimConfig(op_latency_s=LATENCY), registrar=registrar) as s:
        yield s


@pytest.fixture
def gke(sim: Any) -> Iterator[Any]:
    from tests.unit.test_gke_sim import close, gke_client

    client = gke_client(sim.url)
    yield client
    close(client)


@pytest.fixture
def registry() -> Iterator[Any]:
    """The plugin registry (registry.py), put back as it was after the test: a test may register
    a plugin (tests/plugins/) without the next one seeing it."""
    from multislice_operator.registry import REGISTRY

    state = REGISTRY.snapshot()
    yield REGISTRY
    REGISTRY.restore(state)
