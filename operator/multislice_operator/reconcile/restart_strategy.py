"""Restart strategies: how every slice of a job restarts, as one interface chosen per cause.

A `RestartStrategy` says what it renders into the JobSet (`jobset_fields`, its failurePolicy:
JobSet carries those restarts out itself) and what the operator does on a pass to carry it out
(`carry_out`: nothing for JobSet's own restarts; delete the JobSet and create it again for a
resize). `STRATEGIES` registers one per `RestartCause`; decide() reads the registry and never
tests which strategy a cause has. render/jobset.py renders the JobSet's half
(`JOBSET_RESTART_FIELDS`; render sits below decide() and imports nothing of it), and
tests/unit/test_restart_strategies.py holds the two equal. Implementations: restart_recreate.py
(JobSet's Recreate), restart_inplace.py (JobSet's InPlaceRestart) and restart_resize.py
(resize: spec.elastic).

Two registries, chosen by a fact about the cluster (`in_place`: controller/versions.py found
JobSet's InPlaceRestart usable; decide() reads it as a fact): `STRATEGIES` where it is not
(every cause JobSet restarts recreates), `IN_PLACE_STRATEGIES` where it is (the program's own
failures, a hang and a restart the workload asks for restart in place; causes whose pods are
gone or must move recreate).

A JobSet has one failurePolicy.restartStrategy: the causes JobSet restarts must agree on it
(`jobset_fields` raises otherwise), except that InPlaceRestart includes Recreate: JobSet
recreates a failed Job under it (`INCLUDES`). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from multislice_operator.api.models import ConditionType, MultisliceJobStatus, Phase, RestartCause
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.restart_inplace import IN_PLACE_RESTART, INPLACE
from multislice_operator.reconcile.restart_recreate import RECREATE
from multislice_operator.reconcile.restart_resize import RESIZE
from multislice_operator.reconcile.types import CreateJobSet

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


# Where the cluster restarts pods in place: a pod that failed where it runs restarts there; a
# pod that is gone (disruption: preemption, maintenance, a lost node or pool) or was evicted by
# the operator (startup) fails its Job, which JobSet recreates; a resize makes a new JobSet.
IN_PLACE_STRATEGIES: Mapping[RestartCause, RestartStrategy] = {
    RestartCause.DISRUPTION: RECREATE,
    RestartCause.WORKLOAD: INPLACE,
    RestartCause.HANG: INPLACE,
    RestartCause.STARTUP: RECREATE,
    RestartCause.RESIZE: RESIZE,
}

# JobSet restartStrategy values that carry out another's restarts too: under InPlaceRestart a
# failed Job is recreated (jobset v0.12.0 api/jobset/v1alpha2/jobset_types.go, InPlaceRestart).
INCLUDES: Mapping[str, frozenset[str]] = {IN_PLACE_RESTART: frozenset({RECREATE.name})}


def registry(in_place: bool = False) -> Mapping[RestartCause, RestartStrategy]:
    return IN_PLACE_STRATEGIES if in_place else STRATEGIES


def strategy_of(cause: RestartCause, in_place: bool = False) -> RestartStrategy:
    return registry(in_place)[cause]


def strategies(in_place: bool = False) -> list[RestartStrategy]:
    """Each registered strategy once, in the registry's order."""
    seen: list[RestartStrategy] = []
    for s in registry(in_place).values():
        if all(s is not t for t in seen):
            seen.append(s)
    return seen


def _merge(key: str, old: Any, new: Any) -> Any:
    if old is None or old == new:
        return new
    if key == "restartStrategy" and old in INCLUDES.get(new, ()):
        return new
    if key == "restartStrategy" and new in INCLUDES.get(old, ()):
        return old
    raise ValueError(f"restart strategies disagree on JobSet failurePolicy.{key}: {old}, {new}")


def jobset_fields(in_place: bool = False) -> dict[str, Any]:
    """The JobSet failurePolicy fields of every strategy (what render/jobset.py must render)."""
    fields: dict[str, Any] = {}
    for s in strategies(in_place):
        for key, value in s.jobset_fields().items():
            fields[key] = _merge(key, fields.get(key), value)
    return fields


def carry_out(
    f: Facts, b: Builder, cap: Capacity, in_place: bool = False
) -> tuple[Phase, str] | None:
    """The restart the operator carries out this pass, if any (the first in flight wins)."""
    for s in strategies(in_place):
        restarting = s.carry_out(f, b, cap)
        if restarting is not None:
            return restarting
    return None


def rendered_in_place(status: MultisliceJobStatus) -> bool:
    """The job's JobSet was rendered for in-place restart (its RestartInPlace condition)."""
    cond = status.condition(ConditionType.RESTART_IN_PLACE)
    return cond is not None and cond.status == "True"


def in_place_usable(f: Facts) -> bool:
    return f.obs.in_place is not None and f.obs.in_place.usable


def restart_mode(f: Facts, b: Builder) -> None:
    """The JobSet created on this pass restarts in place where the cluster can (a fact from
    controller/versions.py); the job says which, and why not (condition RestartInPlace, and an
    event when it falls back to recreating the pods)."""
    support = f.obs.in_place
    for i, a in enumerate(b.actions):
        if not isinstance(a, CreateJobSet) or support is None:
            continue
        b.actions[i] = dataclasses.replace(a, in_place=support.usable)
        if support.usable:
            why = "program failures, hangs and asked restarts (exit 42) restart the pods in place"
            b.cond(ConditionType.RESTART_IN_PLACE, "True", Reason.IN_PLACE_RESTART, why)
            continue
        why = f"every restart recreates the pods: {support.why}"
        b.cond(ConditionType.RESTART_IN_PLACE, "False", Reason.IN_PLACE_UNAVAILABLE, why)
        if not any(e.reason == Reason.IN_PLACE_UNAVAILABLE for e in b.events):
            b.event(Reason.IN_PLACE_UNAVAILABLE, why)


def summary() -> str:
    """How a job's slices restart, by cause, for `plan` (offline: the cluster decides which
    registry applies; the operator's start-up log and the job's RestartInPlace condition say)."""
    in_place = [c.value for c in RestartCause if strategy_of(c, in_place=True).name == INPLACE.name]
    rest = [
        f"{c.value} {strategy_of(c, in_place=True).name}"
        for c in RestartCause
        if c.value not in in_place
    ]
    return (
        f"{', '.join(in_place)} {INPLACE.name} where the cluster has it (JobSet >= v0.11 with its "
        f"InPlaceRestart gate, Kubernetes >= 1.35, --in-place-agent-image), else Recreate; "
        f"{', '.join(rest)}"
    )
