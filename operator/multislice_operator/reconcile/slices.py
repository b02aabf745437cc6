"""status.slices: one entry per slice (and spare pool), from the observation and the phase just
decided."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from multislice_operator.api.models import Phase, SlicePhase, SliceStatus
from multislice_operator.common.pools import PoolState
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts, slice_ready
from multislice_operator.reconcile.types import CreatePools, SliceObservation

UP = (SlicePhase.READY, SlicePhase.RUNNING, SlicePhase.SUCCEEDED)


def slice_statuses(
    f: Facts, b: Builder, plan: Plan, repairing: frozenset[int], blips: frozenset[int]
) -> None:
    """`repairing`: slices whose lost pool this pass replaces; `blips`: slices NotReady within
    the grace period (both from the capacity step)."""
    hosts = plan.shape.hosts
    by_index = {s.index: s for s in f.obs.slices}
    on = _pods_on_pools(f)
    out = []
    for i in range(len(plan.pools) or plan.slices):  # spare pools too (spec.spares)
        s = by_index.get(i)
        entry = SliceStatus(index=i, hosts=hosts)
        if s is not None:
            entry.node_pool = s.pool
            entry.ready_hosts = min(s.ready_hosts, hosts)
            if s.error is not None:
                entry.message = f"{s.error.code}: {s.error.message}"
        entry.phase = _slice_phase(f, b, s, i, repairing, blips, on)
        _remember(f, entry, s, hosts, repairing, blips)
        out.append(entry)
    b.status.slices = out
    ready = sum(1 for e in out if e.phase in UP)
    b.status.ready_slices = f"{ready}/{len(out)}"


def _remember(
    f: Facts,
    entry: SliceStatus,
    s: SliceObservation | None,
    hosts: int,
    repairing: frozenset[int],
    blips: frozenset[int],
) -> None:
    """The per-slice memory: nodes seen Ready since the pool was created, and when it was lost."""
    old = f.old.slice(entry.index)
    if (
        s is None
        or s.pool_state in (PoolState.ABSENT, PoolState.CREATING)
        or s.foreign
        or s.taken_by
    ):
        entry.seen_ready = False
    else:
        entry.seen_ready = slice_ready(s, hosts) or bool(old and old.seen_ready)
    if entry.index in repairing:
        entry.lost_time = (old.lost_time if old else None) or f.now
    elif s is not None and slice_ready(s, hosts):
        entry.lost_time = None
    else:
        entry.lost_time = old.lost_time if old else None
    if entry.index in blips:
        entry.not_ready_time = (old.not_ready_time if old else None) or f.now
        entry.message = entry.message or (
            f"{entry.ready_hosts}/{hosts} hosts Ready, nodes there: NotReady since "
            f"{entry.not_ready_time.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        )
    else:
        entry.not_ready_time = None


@dataclass(frozen=True)
class _OnPools:
    """Pods of the current attempt by the pool they run on. Managed pods say their pool, and a
    slice may run on any of the job's pools (a spare's, after a loss); where no pod says one
    (Existing mode), slice i is taken to be on pool i."""

    running: Counter[str]
    succeeded: Counter[str]

    def count(self, f: Facts, s: SliceObservation, i: int, succeeded: bool) -> int:
        if not self.running and not self.succeeded:
            return (f.succeeded if succeeded else f.running).get(i, 0)
        return (self.succeeded if succeeded else self.running).get(str(s.pool), 0)


def _pods_on_pools(f: Facts) -> _OnPools:
    current = [p for p in f.obs.pods if p.attempt == f.attempt and p.pool and not p.deleting]
    return _OnPools(
        Counter(str(p.pool) for p in current if p.running),
        Counter(str(p.pool) for p in current if p.phase == "Succeeded"),
    )


def _created_now(b: Builder, i: int) -> bool:
    return any(isinstance(a, CreatePools) and i in a.slices for a in b.actions)


def _slice_phase(
    f: Facts,
    b: Builder,
    s: SliceObservation | None,
    i: int,
    repairing: frozenset[int],
    blips: frozenset[int],
    on: _OnPools,
) -> SlicePhase:
    hosts = f.slices.hosts
    phase = b.status.phase
    if phase == Phase.SUCCEEDED:
        return SlicePhase.SUCCEEDED
    if phase == Phase.FAILED:
        return SlicePhase.FAILED
    if s is None:
        return SlicePhase.PENDING
    if i in repairing:
        return SlicePhase.REPAIRING
    if i in blips:  # a blip: the slice keeps its capacity (see entry.message)
        return SlicePhase.RUNNING if on.count(f, s, i, False) >= hosts else SlicePhase.READY
    if phase == Phase.SUSPENDED and s.pool_state != PoolState.ABSENT:
        return SlicePhase.RELEASING
    if on.count(f, s, i, True) >= hosts:
        return SlicePhase.SUCCEEDED
    if slice_ready(s, hosts):
        running = on.count(f, s, i, False) >= hosts
        return SlicePhase.RUNNING if running else SlicePhase.READY
    if s.pool_state in (PoolState.CREATING, PoolState.UPDATING) or s.operation_pending:
        return SlicePhase.PROVISIONING
    if s.pool_state == PoolState.ABSENT and _created_now(b, i):
        return SlicePhase.PROVISIONING  # as the next pass will see it: one status write
    if s.error is not None or s.pool_state == PoolState.FAILED:
        return SlicePhase.FAILED
    return SlicePhase.PENDING
