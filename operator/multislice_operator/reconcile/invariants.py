"""The promises every decision keeps, checked in one place for every branch. Pure.

- no create or resume (CreatePools, CreateJobSet, ValidateJobSet, CreateWorkload,
  SetJobSetSuspend(False), SetWorkloadActive(True), an `OwnAction` that `creates`: the
  preflight's Job, a capacity model's object) on a terminal phase or a job being deleted, nor
  on a job the operator failed with a verdict that sticks (its old status:
  facts.failed_for_good), whatever this decision's phase: such a job never creates a pool or
  runs again;
- no CreatePools unless the job has the finalizer or the same decision adds it first (its pools
  are then always released, even if the operator is down when the job is deleted);
- at most one DeletePools per pool, and no pool both created and deleted;
- no action on a pool the job does not own (another live job's: a name collision).

Each is one small check in CHECKS, run on every action in order; a capacity model checks its own
actions (`CapacityModel.violations`: plugins/dynamic.py's Slices). A message starts with its
promise's key (terminal-create, create-without-finalizer, duplicate-delete, create-and-delete,
not-ours), which the state machine (tests/unit/test_decide_machine.py) reports by.

A violation is a bug. Tests run with STRICT (tests/unit/conftest.py): decide() raises. In
production the action is dropped and the decision says why (`Decision.violations`), which the
shell logs and counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multislice_operator.api.models import ConditionType, Phase
from multislice_operator.reconcile.facts import Facts, failed_for_good
from multislice_operator.reconcile.types import (
    Action,
    AddFinalizer,
    CreateJobSet,
    CreatePools,
    CreateWorkload,
    Decision,
    DeletePools,
    OwnAction,
    SetJobSetSuspend,
    SetWorkloadActive,
    ValidateJobSet,
)

STRICT = False


class InvariantViolation(AssertionError):
    pass


CREATES = (
    CreatePools,
    CreateJobSet,
    ValidateJobSet,
    CreateWorkload,
)


def _creates(a: Action) -> bool:
    return (
        isinstance(a, CREATES)
        or (isinstance(a, OwnAction) and a.creates)
        or (isinstance(a, SetJobSetSuspend) and not a.suspend)
        or (isinstance(a, SetWorkloadActive) and a.active)
    )


@dataclass
class _Seen:
    """One decision's actions so far, in order, and what they are checked against."""

    ending: str | None  # why nothing may be created or resumed (None: it may)
    finalizer: bool  # the job has our finalizer, or an earlier action adds it
    names: dict[int, str]  # slice -> the plan's pool
    taken: set[str]  # another live job's pools of our names
    ours: set[str]  # the pools this job may delete
    created: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, f: Facts, d: Decision) -> _Seen:
        taken = {s.pool for s in f.obs.slices if s.taken_by and s.pool}
        names = {p.slice_index: p.name for p in f.plan.pools} if f.plan else {}
        ours = (set(names.values()) - taken) | set(f.obs.strays)
        return cls(_ending(f, d), f.meta.has_finalizer, names, taken, ours)


def _ending(f: Facts, d: Decision) -> str | None:
    phase = d.status.phase
    if phase in (Phase.SUCCEEDED, Phase.FAILED) or f.meta.deleting:
        return f"a job that is {phase or 'deleting'}"
    if failed_for_good(f.old):
        cond = f.old.condition(ConditionType.FAILED)
        return f"a job the operator failed ({cond.reason if cond else '?'}), now {phase}"
    return None


def _no_create_at_the_end(seen: _Seen, a: Action) -> str | None:
    if seen.ending is not None and _creates(a):
        return f"terminal-create: {type(a).__name__} on {seen.ending}"
    return None


def _create_pools(seen: _Seen, a: Action) -> str | None:
    if not isinstance(a, CreatePools):
        return None
    pools = {seen.names.get(s, f"slice {s}") for s in a.slices}
    seen.created |= pools
    if not seen.finalizer:
        return f"create-without-finalizer: CreatePools {sorted(pools)} before the finalizer"
    if pools & seen.deleted:
        return f"create-and-delete: CreatePools of {sorted(pools & seen.deleted)}, deleted"
    # Another live job's pool of our name, or a slice the plan names no pool for.
    theirs = sorted(pools & seen.taken) + [f"slice {s}" for s in a.slices if s not in seen.names]
    return f"not-ours: CreatePools of {theirs}, not the job's" if theirs else None


def _delete_pools(seen: _Seen, a: Action) -> str | None:
    if not isinstance(a, DeletePools):
        return None
    pools = set(a.pools)
    twice, foreign, created = pools & seen.deleted, pools - seen.ours, pools & seen.created
    seen.deleted |= pools
    if twice:
        return f"duplicate-delete: DeletePools {sorted(twice)} twice in the same pass"
    if foreign:
        return f"not-ours: DeletePools {sorted(foreign)}, not the job's"
    if created:
        return f"create-and-delete: DeletePools {sorted(created)} created in the same pass"
    return None


# In order; the first broken promise is the action's (a create at the end is not tracked). Each
# message starts with the promise's key (the state machine reports each key as a bug of its own).
CHECKS = (_no_create_at_the_end, _create_pools, _delete_pools)


def violations(f: Facts, d: Decision) -> list[tuple[int, str]]:
    """(index of the action, what it breaks) for every action that breaks a promise: the
    core's, then those the job's capacity model keeps over its own actions."""
    seen = _Seen.of(f, d)
    out: list[tuple[int, str]] = []
    for i, a in enumerate(d.actions):
        seen.finalizer = seen.finalizer or isinstance(a, AddFinalizer)
        why = next((w for check in CHECKS if (w := check(seen, a)) is not None), None)
        if why is not None:
            out.append((i, why))
    said = {i for i, _ in out}
    return sorted(out + [v for v in f.capacity.violations(f, d) if v[0] not in said])


def enforce(f: Facts, d: Decision) -> Decision:
    found = violations(f, d)
    if not found:
        return d
    if STRICT:
        raise InvariantViolation("; ".join(why for _, why in found))
    bad = {i for i, _ in found}
    d.actions = [a for i, a in enumerate(d.actions) if i not in bad]
    d.violations = [why for _, why in found]
    return d
