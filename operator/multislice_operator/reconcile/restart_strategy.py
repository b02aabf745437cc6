"""Restart strategies: how every slice of a job restarts, as one interface chosen per cause.

A `RestartStrategy` says what it renders into the JobSet (`jobset_fields`, its failurePolicy:
JobSet carries those restarts out itself) and what the operator does on a pass to carry it out
(`carry_out`: nothing for JobSet's own restarts; delete the JobSet and create it again for a
resize). `STRATEGIES` registers one per `RestartCause`; decide() reads the registry and never
tests which strategy a cause has. render/jobset.py renders the JobSet's half
(`JOBSET_RESTART_FIELDS`; render sits below decide() and imports nothing of it), and
tests/unit/test_restart_strategies.py holds the two equal. Implementations: restart_recreate.py
(disruption, workload, hang, startup: JobSet's Recreate) and restart_resize.py (resize:
spec.elastic).

A JobSet has one failurePolicy.restartStrategy: the causes JobSet restarts must agree on it
(`jobset_fields` raises otherwise). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from multislice_operator.api.models import Phase, RestartCause
from multislice_operator.reconcile.restart_recreate import RECREATE
from multislice_operator.reconcile.restart_resize import RESIZE

if TYPE_CHECKING:
    from multislice_operator.reconcile.capacity import Capacity
    from multislice_operator.reconcile.context import Builder
    from multislice_operator.reconcile.facts import Facts


class RestartStrategy(Protocol):
    """How all slices restart: one implementation per strategy, registered per cause."""

    name: str

    def jobset_fields(self) -> dict[str, Any]:
        """The JobSet failurePolicy fields it needs (JobSet carries those restarts out)."""
        ...

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        """What the operator does this pass; a phase and message: a restart in flight, which
        ends the lifecycle's pass."""
        ...


STRATEGIES: Mapping[RestartCause, RestartStrategy] = {
    RestartCause.DISRUPTION: RECREATE,
    RestartCause.WORKLOAD: RECREATE,
    RestartCause.HANG: RECREATE,
    RestartCause.STARTUP: RECREATE,
    RestartCause.RESIZE: RESIZE,
}


def strategy_of(cause: RestartCause) -> RestartStrategy:
    return STRATEGIES[cause]


def strategies() -> list[RestartStrategy]:
    """Each registered strategy once, in the registry's order."""
    seen: list[RestartStrategy] = []
    for s in STRATEGIES.values():
        if all(s is not t for t in seen):
            seen.append(s)
    return seen


def jobset_fields() -> dict[str, Any]:
    """The JobSet failurePolicy fields of every strategy (what render/jobset.py must render)."""
    fields: dict[str, Any] = {}
    for s in strategies():
        for key, value in s.jobset_fields().items():
            if fields.setdefault(key, value) != value:
                raise ValueError(f"restart strategies disagree on JobSet failurePolicy.{key}")
    return fields


def carry_out(f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
    """The restart the operator carries out this pass, if any (the first in flight wins)."""
    for s in strategies():
        restarting = s.carry_out(f, b, cap)
        if restarting is not None:
            return restarting
    return None
