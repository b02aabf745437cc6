"""What one pass knows, derived once from its inputs: the views every step reads. Pure.

decide() first turns (job, spec, plan, old status, observation) into `Facts`: the job's own
JobSet (by owner uid, common/ownership.py), the pod views of the current attempt (one `Pod` record
per pod, one definition of running, failed and unschedulable), which slices are ready, lost or in a
NotReady blip (as the job's capacity model says: `Facts.capacity`, capacity.model_of), the
restarts split by cause, and the one clock of capacity readiness. Verdicts, the Kueue gate and
the lifecycle steps read these and never re-derive them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from multislice_operator.api.models import (
    ConditionType,
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
    SchedulingStatus,
)
from multislice_operator.common import keys
from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile import restart_strategy, restarts, scheduling
from multislice_operator.reconcile.capacity import CapacityModel, Size, Slices, model_of
from multislice_operator.reconcile.capacity import live as live
from multislice_operator.reconcile.capacity import slice_ready as slice_ready
from multislice_operator.reconcile.context import at_second
from multislice_operator.reconcile.reasons import sticky
from multislice_operator.reconcile.steps import Steps, select
from multislice_operator.reconcile.types import (
    DecideConfig,
    JobMeta,
    JobSetObservation,
    Observed,
    Pod,
)


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
    # The one clock of capacity readiness (status.capacityReadyTime): since when every slice's
    # capacity has been ready without a break while the JobSet runs; None: not now.
    capacity_ready_since: datetime | None
    # Since when its pods wait for a node, and since when no scheduler looked at any
    # (scheduling.py): clocks no pool replacement or restart of the operator's own resets.
    scheduling: SchedulingStatus | None
    # The slices the JobSet should run on now (spec.elastic: fewer after a loss; elastic.py).
    size: Size
    # How the job's slices get their nodes (capacity.py), chosen once from its plan.
    capacity: CapacityModel
    # How its slices restart, by cause (restart_strategy.py), chosen once per pass.
    restart: restart_strategy.Chosen
    # The optional steps its spec selects (steps.py): a plain job runs none of them.
    steps: Steps

    @property
    def active(self) -> int:
        """The slices the job's JobSet runs on (or is about to be created on)."""
        return _active(self.js, self.size)

    @property
    def deleting(self) -> bool:
        return self.meta.deleting

    @property
    def ran(self) -> bool:
        """The job ran before this pass (a restart since, or it was Running)."""
        return _ran(self.attempt, self.old)


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


def _world_agrees(old: MultisliceJobStatus, js: JobSetObservation | None) -> bool:
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


@dataclass(frozen=True)
class _PodViews:
    running: dict[int, int]
    succeeded: dict[int, int]
    by_slice: dict[int, int]
    unschedulable: tuple[Pod, ...]


def _pod_views(pods: Sequence[Pod], attempt: int) -> _PodViews:
    """The current attempt's pods, counted per slice once (deleting pods are not counted)."""
    running: dict[int, int] = {}
    succeeded: dict[int, int] = {}
    by_slice: dict[int, int] = {}
    for p in pods:
        i = p.slice_index
        if p.attempt != attempt or i is None or p.deleting:
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
    return _PodViews(running, succeeded, by_slice, unschedulable)


def _ran(attempt: int, old: MultisliceJobStatus) -> bool:
    return attempt > 0 or old.phase in (Phase.RUNNING, Phase.RESTARTING)


def _pods_gap(attempt: int, old: MultisliceJobStatus, js: JobSetObservation | None, size: Size,
              by_slice: dict[int, int]) -> bool:  # fmt: skip
    """A slice of a job that ran has no pod of the current attempt (scheduling.pods_missing_
    since). Not while JobSet says every slice's Job is ready or done (the pod cache is behind,
    or the pods are gone by design: a finished JobSet)."""
    if not _ran(attempt, old) or js is None or js.completed or js.failed:
        return False
    active = _active(js, size)
    if js.up >= active:
        return False
    return any(not by_slice.get(i) for i in range(active))


def _active(js: JobSetObservation | None, size: Size) -> int:
    """The slices the job's JobSet runs on (or is about to be created on)."""
    return js.replicas if js is not None and js.replicas else size.target


def _capacity_view(model: CapacityModel, plan: Plan | None, old: MultisliceJobStatus,
                   obs: Observed, js: JobSetObservation | None, cfg: DecideConfig,
                   now: datetime) -> tuple[Slices, Size]:  # fmt: skip
    """The slices as the job's capacity model sees them, and the size the JobSet runs at."""
    if plan is None:
        return Slices(0), Size(0, 0)
    slices = model.slices(old, obs, plan, cfg, now)
    size = model.size(plan, old, slices, obs, js, now)
    return dataclasses.replace(slices, need=size.target), size  # spec.elastic: maybe fewer


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
    pods = _pod_views(obs.pods, attempt)
    # A pod restarted in place is not failed: its program's last exit is (restarts.py).
    earlier = (p.previous_run() for p in obs.pods)
    failures = tuple(p for p in obs.pods if p.failed) + tuple(p for p in earlier if p)
    model = model_of(plan)
    chosen = restart_strategy.choose(spec, js, obs)
    slices, size = _capacity_view(model, plan, old, obs, js, cfg, now)
    runs = js is not None and not js.suspended and not js.deleting
    clock = (old.capacity_ready_time or now) if runs and model.clock_ready(slices) else None
    # At a first start the capacity clock counts (verdicts.DEADLINES, PodsNotCreated).
    gap = _pods_gap(attempt, old, js, size, pods.by_slice)
    waits = scheduling.clocks(
        old.scheduling, runs, attempt, obs.pods, pods.unschedulable, clock, gap, now
    )
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
        running=pods.running,
        succeeded=pods.succeeded,
        unschedulable=pods.unschedulable,
        pods_by_slice=pods.by_slice,
        live_pods=tuple(p for p in obs.pods if p.live),
        slices=slices,
        restarts=restarts.attribute(old, js, failures, chosen),
        finished_before=_finished_before(old),
        world_agrees=_world_agrees(old, js),
        capacity_ready_since=clock,
        scheduling=waits,
        size=size,
        capacity=model,
        restart=chosen,
        steps=select(meta, spec),
    )
