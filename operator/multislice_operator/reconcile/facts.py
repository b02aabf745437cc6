"""What one pass knows, derived once from its inputs: the views every step reads. Pure.

decide() first turns (job, spec, plan, old status, observation) into `Facts`: the job's own
JobSet (by owner uid, ownership.py), the pod views of the current attempt (one `Pod` record per
pod, one definition of running, failed and unschedulable), which slices are ready, lost or in a
NotReady blip, the restarts split by cause, and the one clock of capacity readiness. Verdicts,
the Kueue gate and the lifecycle steps read these and never re-derive them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime

from multislice_operator import keys
from multislice_operator.api.models import (
    ConditionType,
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
)
from multislice_operator.errors import SpecError
from multislice_operator.plan import Plan
from multislice_operator.pools import PoolState
from multislice_operator.reconcile import elastic, restarts
from multislice_operator.reconcile.context import at_second
from multislice_operator.reconcile.reasons import sticky
from multislice_operator.reconcile.types import (
    DecideConfig,
    JobMeta,
    JobSetObservation,
    Observed,
    Pod,
    SliceObservation,
)


def slice_ready(s: SliceObservation, hosts: int) -> bool:
    return (
        s.pool_state in (PoolState.READY, PoolState.UPDATING)
        and s.ready_hosts >= hosts
        and not s.foreign
        and not s.taken_by
    )


def slice_lost(s: SliceObservation, seen_ready: bool) -> bool:
    """Capacity that was there is gone: pool broken or deleted, or its nodes disappeared.

    A READY pool without nodes is only lost if its nodes were seen Ready since it was created
    (`seen_ready`): a fresh pool's nodes take a moment to register. Nodes that are there but not
    Ready are a blip until the grace period passes, not a loss.
    """
    if s.foreign or s.taken_by:
        return True
    if s.pool_state in (PoolState.FAILED, PoolState.ABSENT, PoolState.DELETING):
        return True
    return (
        s.pool_state in (PoolState.READY, PoolState.DEGRADED)
        and s.hosts_present == 0
        and seen_ready
    )


def _seen(old: MultisliceJobStatus, index: int) -> bool:
    before = old.slice(index)
    return bool(before and before.seen_ready)


def live(s: SliceObservation) -> bool:
    """The slice's pool exists and is not already going away."""
    return bool(s.pool) and s.pool_state not in (PoolState.ABSENT, PoolState.DELETING)


@dataclass(frozen=True)
class Slices:
    """The slices' capacity, as the lifecycle and the verdicts see it."""

    hosts: int
    ready: frozenset[int] = frozenset()
    # Lost while the gang was up (Managed): slice -> why (a repair replaces its pool).
    lost: dict[int, str] = field(default_factory=dict)
    # NotReady with their nodes there, within the grace period (a blip): slice -> seconds.
    blips: dict[int, float] = field(default_factory=dict)
    all_ready: bool = False  # every pool (spares too) ready, or ready but for a blip
    # Flex-start pools up and error-free whose nodes have not come yet: waiting for capacity.
    waiting: frozenset[int] = frozenset()
    up: int = 0  # pools ready or in a blip
    complete: bool = False  # every pool of the plan observed (present or absent)
    # The slices the JobSet runs on: spec.slices, or fewer (spec.elastic, elastic.Size.target).
    need: int = 0

    @property
    def enough(self) -> bool:
        """At least `need` pools ready (or in a blip): the JobSet can run; with spec.spares a
        lost pool's slice restarts at once on a spare while the lost pool is replaced."""
        return self.complete and self.up >= self.need


@dataclass(frozen=True)
class Facts:
    meta: JobMeta
    spec: MultisliceJobSpec | None
    plan: Plan | None
    error: SpecError | None
    old: MultisliceJobStatus
    obs: Observed
    cfg: DecideConfig
    now: datetime
    queue: str | None  # the LocalQueue the job names (Kueue)
    js: JobSetObservation | None  # the job's own JobSet (owner uid is the job's)
    js_other: JobSetObservation | None  # a JobSet of the job's name that is not its own
    attempt: int  # the JobSet's current restart attempt (0 without a JobSet)
    failures: tuple[Pod, ...]  # failed pods, every attempt
    running: dict[int, int]  # slice -> pods running and ready (current attempt)
    succeeded: dict[int, int]  # slice -> pods succeeded (current attempt)
    unschedulable: tuple[Pod, ...]  # current attempt, Pending, the scheduler cannot place them
    pods_by_slice: dict[int, int]  # slice -> pods of the current attempt that exist
    live_pods: tuple[Pod, ...]  # Pending or Running, every attempt
    slices: Slices
    restarts: restarts.Attribution
    finished_before: bool  # the status says Succeeded/Failed (and the spec was valid)
    world_agrees: bool  # ... and nothing of the job runs (or its verdict still holds)
    # The JobSet runs (exists, not suspended, not being deleted): its pods can be judged.
    jobset_runs: bool
    # The one clock of capacity readiness (status.capacityReadyTime): since when every slice's
    # capacity has been ready without a break while the JobSet runs; None: not now.
    capacity_ready_since: datetime | None
    # The slices the JobSet should run on now (spec.elastic: fewer after a loss; elastic.py).
    size: elastic.Size

    @property
    def active(self) -> int:
        """The slices the job's JobSet runs on (or is about to be created on)."""
        if self.js is not None and self.js.replicas:
            return self.js.replicas
        return self.size.target

    @property
    def deleting(self) -> bool:
        return self.meta.deleting

    @property
    def managed(self) -> bool:
        return self.plan is not None and self.plan.managed

    def seen_ready(self, index: int) -> bool:
        old = self.old.slice(index)
        return bool(old and old.seen_ready)


def _finished_before(old: MultisliceJobStatus) -> bool:
    if failed_for_good(old):
        return True  # a phase written over it by hand does not revive the job
    if old.phase not in (Phase.SUCCEEDED, Phase.FAILED):
        return False
    validated = old.condition(ConditionType.VALIDATED)
    return not (validated is not None and validated.status == "False")  # a fixed spec runs again


def failed_for_good(old: MultisliceJobStatus) -> bool:
    """The operator failed the job with a verdict that sticks: its own Failed condition (one it
    wrote carries observedGeneration; one written by hand need not) with a sticky reason
    (reasons.py). The job never runs again, whatever the world or the phase shows now."""
    failed = old.condition(ConditionType.FAILED)
    return (
        failed is not None
        and failed.status == "True"
        and failed.observed_generation is not None
        and sticky(failed.reason)
    )


def _world_agrees(old: MultisliceJobStatus, _spec: MultisliceJobSpec | None,
                  js: JobSetObservation | None) -> bool:  # fmt: skip
    """A terminal status is only believed when the world shows that nothing of the job runs: no
    JobSet of its own (none, one being deleted, one suspended: no pods) or its own is terminal.
    Status is memory, not a command: a phase written by hand never deletes the pools under
    running pods. A verdict of the operator's own that sticks is believed beside a running
    JobSet too (`failed_for_good`): the status was written before the verdict's actions, which
    a crash or a refused delete left undone, and its evidence may be gone since; the JobSet is
    stopped and the pools released. (`_spec`: unused, kept for derive's call.)"""
    if js is None or js.completed or js.failed or js.deleting or js.suspended:
        return True
    return failed_for_good(old)


def _not_ready_for(old: MultisliceJobStatus, s: SliceObservation, hosts: int,
                   now: datetime) -> float | None:  # fmt: skip
    """Seconds a once-ready slice has had fewer Ready hosts than it needs while its pool is up;
    None when it is not in that state."""
    before = old.slice(s.index)
    if before is None or not before.seen_ready or slice_ready(s, hosts):
        return None
    if s.pool_state not in (PoolState.READY, PoolState.DEGRADED, PoolState.UPDATING):
        return None
    since = before.not_ready_time or now
    return (now - since).total_seconds()


def _slices(f_old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
            now: datetime) -> Slices:  # fmt: skip
    hosts = plan.shape.hosts
    ready = frozenset(s.index for s in obs.slices if slice_ready(s, hosts))
    if not plan.managed:
        up = len(ready) >= plan.slices
        return Slices(hosts, ready, all_ready=up, up=len(ready), complete=True, need=plan.slices)
    waiting = frozenset(
        s.index
        for s in obs.slices
        if s.flex_start
        and s.index not in ready
        and s.pool_state == PoolState.READY
        and s.error is None
        and s.hosts_present < hosts
        and not _seen(f_old, s.index)  # once its nodes came, nodes gone are a loss
    )
    lost: dict[int, str] = {}
    blips: dict[int, float] = {}
    for s in obs.slices:
        before = f_old.slice(s.index)
        if slice_lost(s, bool(before and before.seen_ready)):
            lost[s.index] = (
                s.error.code
                if s.error
                else (
                    "nodes gone"
                    if s.pool_state in (PoolState.READY, PoolState.DEGRADED)
                    else str(s.pool_state)
                )
            )
            continue
        elapsed = _not_ready_for(f_old, s, hosts, now)
        if elapsed is None:
            continue
        if elapsed >= cfg.not_ready_grace_seconds:
            lost[s.index] = f"{s.ready_hosts}/{hosts} hosts Ready, NotReady for {elapsed:.0f}s"
        else:
            blips[s.index] = elapsed
    complete = len(obs.slices) == len(plan.pools)
    up = complete and all(s.index in ready or s.index in blips for s in obs.slices)
    return Slices(
        hosts,
        ready,
        lost,
        blips,
        all_ready=up,
        waiting=waiting,
        up=len(ready | blips.keys()),
        complete=complete,
        need=plan.slices,
    )


def derive(
    meta: JobMeta,
    spec: MultisliceJobSpec | None,
    plan: Plan | None,
    error: SpecError | None,
    old: MultisliceJobStatus,
    obs: Observed,
    cfg: DecideConfig,
) -> Facts:
    now = at_second(obs.now)
    seen = obs.jobset
    js = seen if seen is not None and seen.owned else None
    attempt = js.restarts if js is not None else 0
    pods = obs.pods
    current = [p for p in pods if p.attempt == attempt and p.slice_index is not None]
    running: dict[int, int] = {}
    succeeded: dict[int, int] = {}
    by_slice: dict[int, int] = {}
    for p in current:
        i = p.slice_index
        assert i is not None
        if p.deleting:
            continue
        by_slice[i] = by_slice.get(i, 0) + 1
        if p.running:
            running[i] = running.get(i, 0) + 1
        elif p.phase == "Succeeded":
            succeeded[i] = succeeded.get(i, 0) + 1
    unschedulable = tuple(
        p
        for p in pods
        if p.attempt == attempt
        and p.unschedulable_since is not None
        and not p.deleting
        and p.phase == "Pending"
    )
    failures = tuple(p for p in pods if p.failed)
    slices = _slices(old, obs, plan, cfg, now) if plan is not None else Slices(0)
    size = (
        elastic.size(
            plan, old, slices.ready, slices.up, obs.slices, js, now, frozenset(slices.lost)
        )
        if plan is not None
        else elastic.Size(0, 0)
    )
    slices = dataclasses.replace(slices, need=size.target)  # spec.elastic: maybe fewer
    runs = js is not None and not js.suspended and not js.deleting
    capacity_now = slices.enough if plan is not None and plan.managed else True
    clock = (old.capacity_ready_time or now) if runs and capacity_now else None
    return Facts(
        meta=meta,
        spec=spec,
        plan=plan,
        error=error,
        old=old,
        obs=obs,
        cfg=cfg,
        now=now,
        queue=meta.labels.get(keys.KUEUE_QUEUE_NAME) or None,
        js=js,
        js_other=seen if seen is not None and not seen.owned else None,
        attempt=attempt,
        failures=failures,
        running=running,
        succeeded=succeeded,
        unschedulable=unschedulable,
        pods_by_slice=by_slice,
        live_pods=tuple(p for p in pods if p.live),
        slices=slices,
        restarts=restarts.attribute(old, js, failures),
        finished_before=_finished_before(old),
        world_agrees=_world_agrees(old, spec, js),
        jobset_runs=runs,
        capacity_ready_since=clock,
        size=size,
    )
