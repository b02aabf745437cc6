"""The promises every decision keeps, checked in one place for every branch. Pure.

- no create or resume (CreatePools, CreateJobSet, ValidateJobSet, SetJobSetSuspend(False),
  SetWorkloadActive(True)) on a terminal phase or a job being deleted;
- no CreatePools unless the job has the finalizer or the same decision adds it first (its pools
  are then always released, even if the operator is down when the job is deleted);
- at most one DeletePools per pool, and no pool both created and deleted;
- no action on a pool the job does not own (another live job's: a name collision).

A violation is a bug. Tests run with STRICT (tests/unit/conftest.py): decide() raises. In
production the action is dropped and the decision says why (`Decision.violations`), which the
shell logs and counts.
"""

from __future__ import annotations

from multislice_operator.api.models import Phase
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.types import (
    Action,
    AddFinalizer,
    CreateJobSet,
    CreatePools,
    Decision,
    DeletePools,
    SetJobSetSuspend,
    SetWorkloadActive,
    ValidateJobSet,
)

STRICT = False


class InvariantViolation(AssertionError):
    pass


def _creates(a: Action) -> bool:
    return (
        isinstance(a, (CreatePools, CreateJobSet, ValidateJobSet))
        or (isinstance(a, SetJobSetSuspend) and not a.suspend)
        or (isinstance(a, SetWorkloadActive) and a.active)
    )


def violations(f: Facts, d: Decision) -> list[tuple[int, str]]:
    """(index of the action, what it breaks) for every action that breaks a promise."""
    out: list[tuple[int, str]] = []
    ending = d.status.phase in (Phase.SUCCEEDED, Phase.FAILED) or f.meta.deleting
    finalizer = f.meta.has_finalizer
    taken = {s.pool for s in f.obs.slices if s.taken_by and s.pool}
    names = {p.slice_index: p.name for p in f.plan.pools} if f.plan else {}
    ours = (set(names.values()) - taken) | set(f.obs.strays)
    deleted: set[str] = set()
    created: set[str] = set()
    for i, a in enumerate(d.actions):
        if isinstance(a, AddFinalizer):
            finalizer = True
        if ending and _creates(a):
            out.append((i, f"{type(a).__name__} on a job that is {d.status.phase or 'deleting'}"))
            continue
        if isinstance(a, CreatePools):
            pools = {names.get(s, f"slice {s}") for s in a.slices}
            if not finalizer:
                out.append((i, f"CreatePools {sorted(pools)} before the finalizer"))
            elif pools & (deleted | taken):
                out.append((i, f"CreatePools of {sorted(pools & (deleted | taken))}, deleted or "
                               "another job's"))  # fmt: skip
            created |= pools
        if isinstance(a, DeletePools):
            twice = set(a.pools) & deleted
            foreign = set(a.pools) - ours
            if twice or foreign or set(a.pools) & created:
                why = f"twice {sorted(twice)}, not the job's {sorted(foreign)}, or created"
                out.append((i, f"DeletePools {sorted(a.pools)}: {why} in the same pass"))
            deleted |= set(a.pools)
    return out


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
