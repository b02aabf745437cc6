"""decide(): observed state -> actions and status. The reconcile brain, pure and table-tested.

Level-based like the JobSet and Kueue controllers: every call recomputes the desired state from what
is observed now (the job, its JobSet, its slices' pools and nodes, its pods) and from the job's own
status (the only memory: restart count, gang attempts and backoff deadline, per-slice history).
Nothing here does I/O; the controller applies the actions and writes the status, and a crash
between any two steps just means the next call sees a little more done and carries on.
"""

from __future__ import annotations

from datetime import timedelta

from multislice_operator.api.models import (
    ConditionType,
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
)
from multislice_operator.errors import SpecError
from multislice_operator.plan import Plan
from multislice_operator.provisioning.base import PoolState
from multislice_operator.reconcile import checkpoint, goodput, maintenance, restarts, startup
from multislice_operator.reconcile import queue as kueue
from multislice_operator.reconcile.capacity import capacity_ready, release
from multislice_operator.reconcile.context import Ctx
from multislice_operator.reconcile.running import (
    complete,
    count_restarts,
    running_phase,
    why_failed,
)
from multislice_operator.reconcile.slices import slice_statuses
from multislice_operator.reconcile.types import (
    AddFinalizer,
    CreateJobSet,
    DecideConfig,
    Decision,
    DeleteJob,
    DeleteJobSet,
    JobMeta,
    JobSetObservation,
    Observed,
    RemoveFinalizer,
    SetJobSetSuspend,
)

RELEASING_NOTE = " (releasing node pools)"


def decide(
    meta: JobMeta,
    spec: MultisliceJobSpec | None,
    plan: Plan | None,
    spec_error: SpecError | None,
    old_status: MultisliceJobStatus | None,
    obs: Observed,
    cfg: DecideConfig | None = None,
) -> Decision:
    """From what is observed now to what to do next and the status to write."""
    ctx = Ctx(meta, old_status or MultisliceJobStatus(), obs, cfg or DecideConfig())
    if spec_error is not None or spec is None or plan is None:
        _invalid(ctx, spec_error)
        goodput.account(ctx, None)
        return ctx.decision()
    ctx.cond(ConditionType.VALIDATED, "True", "Valid", f"{plan.slices} x {plan.shape.accelerator}")
    ctx.status.total_chips = plan.total_chips
    _dcn_condition(ctx, plan)
    due = None if meta.deleting else maintenance.assess(ctx, spec)
    if meta.deleting:
        _deleting(ctx, plan)
    elif _finished_before(ctx.old):
        _finished(ctx, spec, plan)
    elif spec.suspend:
        _suspended(ctx, plan)
    else:
        if plan.managed and not meta.has_finalizer:
            ctx.actions.append(AddFinalizer())  # before any pool can exist
        _active(ctx, spec, plan)
        _disruptions(ctx, spec, plan, due)
    slice_statuses(ctx, plan)
    goodput.account(ctx, plan)
    return ctx.decision()


def _finished_before(old: MultisliceJobStatus) -> bool:
    if old.phase not in (Phase.SUCCEEDED, Phase.FAILED):
        return False
    validated = old.condition(ConditionType.VALIDATED)
    return not (validated is not None and validated.status == "False")  # a fixed spec runs again


def _invalid(ctx: Ctx, error: SpecError | None) -> None:
    message = str(error) if error else "the spec could not be read"
    ctx.cond(ConditionType.VALIDATED, "False", "InvalidSpec", message)
    ctx.cond(ConditionType.FAILED, "True", "InvalidSpec", message)
    ctx.phase(Phase.FAILED, f"invalid spec: {message}")
    if ctx.old.message != ctx.status.message and ctx.old.phase == Phase.FAILED:
        ctx.event("Warning", "InvalidSpec", message)
    if ctx.meta.deleting and ctx.meta.has_finalizer:
        ctx.actions.append(RemoveFinalizer())  # no plan: no pool name this job could own


def _dcn_condition(ctx: Ctx, plan: Plan) -> None:
    advice = plan.advice
    bound = "True" if advice.verdict == "dcn-bound" else "False"
    reason = {"ok": "BatchLargeEnough", "dcn-bound": "BatchTooSmall"}.get(
        advice.verdict, "NoBatchHint"
    )
    ctx.cond(ConditionType.DCN_BOUND, bound, reason, advice.message)


def _deleting(ctx: Ctx, plan: Plan) -> None:
    """The job is being deleted: release every pool, then let it go."""
    released = release(ctx, plan)
    phase = ctx.old.phase or Phase.PENDING
    if released:
        if ctx.meta.has_finalizer:
            ctx.actions.append(RemoveFinalizer())
        ctx.phase(Phase(phase), "deleted; every node pool released")
    else:
        left = sum(1 for s in ctx.obs.slices if s.pool_state != PoolState.ABSENT)
        ctx.phase(Phase(phase), f"deleting: releasing {left} node pools first")


def _terminal_message(ctx: Ctx, phase: Phase) -> str:
    ctype = ConditionType.COMPLETED if phase == Phase.SUCCEEDED else ConditionType.FAILED
    cond = ctx.old.condition(ctype)
    return cond.message if cond and cond.message else phase.value


def _disruptions(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan, due: str | None) -> None:
    """After the lifecycle step: the operator's own budget (JobSet does not bound the restarts
    it does not charge), the startup deadline, checkpoints on demand."""
    if ctx.status.phase in (Phase.SUCCEEDED, Phase.FAILED):
        ctx.status.startup = None
        return
    over = restarts.over_budget(ctx, spec)
    if over is not None:
        ctx.status.startup = None
        ctx.event("Warning", restarts.DISRUPTION_BUDGET_REASON, over)
        complete(ctx, Phase.FAILED, "MaxDisruptionRestarts", over)
        return  # the next pass deletes the JobSet (_finished), once this status is written
    startup.check(ctx, spec, plan)
    checkpoint.decide(ctx, spec, due)


def _finished(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan) -> None:
    phase = Phase(ctx.old.phase or Phase.FAILED)
    message = _terminal_message(ctx, phase)
    js = ctx.obs.jobset
    if (
        phase == Phase.FAILED
        and js is not None
        and js.owned
        and not (js.failed or js.completed or js.suspended)
    ):
        ctx.actions.append(DeleteJobSet())  # failed by the operator: JobSet would run it on
    if kueue.queue_name(ctx):
        kueue.finished(ctx)
    keep = phase == Phase.SUCCEEDED and spec.provisioning.keep_node_pools
    released = True if keep else release(ctx, plan)
    ctx.phase(phase, message if released else f"{message}{RELEASING_NOTE}")
    ttl = spec.ttl_seconds_after_finished
    done = ctx.old.completion_time
    if ttl is not None and done is not None and released:
        left = (done + timedelta(seconds=ttl) - ctx.now).total_seconds()
        if left <= 0:
            ctx.actions.append(DeleteJob())
        else:
            ctx.requeue_in(left)


def _suspended(ctx: Ctx, plan: Plan) -> None:
    js = ctx.obs.jobset
    if js is not None and js.owned and not js.suspended:
        ctx.actions.append(SetJobSetSuspend(True))
    released = release(ctx, plan)
    ctx.status.attempt_start_time = None
    ctx.status.next_attempt_time = None
    ctx.cond(ConditionType.PROVISIONED, "False", "Suspended", "capacity released while suspended")
    ctx.cond(ConditionType.SLICES_READY, "False", "Suspended", "job is suspended")
    detail = "" if released else RELEASING_NOTE
    ctx.phase(Phase.SUSPENDED, f"suspended{detail}; set spec.suspend: false to resume")


def _active(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan) -> None:
    if ctx.status.start_time is None:
        ctx.status.start_time = ctx.now
    js = ctx.obs.jobset
    if js is not None and not js.owned:
        message = (
            f"a JobSet named {plan.name} exists and is not owned by this job; delete or rename it"
        )
        ctx.cond(ConditionType.FAILED, "True", "JobSetConflict", message)
        ctx.phase(Phase.FAILED, message)
        ctx.status.completion_time = ctx.now
        return
    if js is not None and js.completed:
        complete(ctx, Phase.SUCCEEDED, "Completed", "all slices finished")
        return
    if js is not None and js.failed:
        complete(ctx, Phase.FAILED, js.failure_reason or "JobSetFailed", why_failed(ctx, spec))
        return
    queue = kueue.queue_name(ctx)
    if queue:  # Kueue admits it: quota first, then the gang (reconcile/queue.py)
        kueue.active(ctx, spec, plan, queue)
        return
    # Existing pools are the JobSet's business once it runs; Managed pools are ours to repair.
    ready = capacity_ready(ctx, spec, plan) if plan.managed or js is None or js.suspended else True
    if ctx.status.phase == Phase.FAILED:
        return
    if js is None:
        if ready:
            ctx.actions.append(CreateJobSet())
            ctx.status.job_set = plan.name
            # Written as the next pass will see it (the JobSet, nothing running yet), so creating
            # the JobSet costs one status write, not two.
            running_phase(ctx, plan, JobSetObservation(), ready)
        return
    ctx.status.job_set = plan.name
    count_restarts(ctx, spec, js)
    if js.suspended:
        if ready:
            ctx.actions.append(SetJobSetSuspend(False))
            ctx.phase(Phase.STARTING, "capacity ready again; resuming the JobSet")
        elif ctx.status.phase is None:  # resuming: the capacity released while suspended first
            cond = ctx.status.condition(ConditionType.PROVISIONED)
            waiting = cond.message if cond and cond.message else "waiting for capacity"
            ctx.phase(Phase.PROVISIONING if plan.managed else Phase.PENDING, f"resuming: {waiting}")
        return
    running_phase(ctx, plan, js, ready)
