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
from multislice_operator.plan import REPLICATED_JOB, Plan
from multislice_operator.provisioning.base import PoolState
from multislice_operator.reconcile import checkpoint, goodput, maintenance, restarts, startup
from multislice_operator.reconcile import queue as kueue
from multislice_operator.reconcile.capacity import capacity_ready, release, strays
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
    DeletePools,
    JobMeta,
    JobSetObservation,
    Observed,
    RemoveFinalizer,
    SetJobSetSuspend,
    ValidateJobSet,
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
    elif _finished_before(ctx.old) and _world_agrees(ctx, spec):
        _finished(ctx, spec, plan)
    elif _finished_before(ctx.old):
        _status_ignored(ctx)
        _active(ctx, spec, plan)
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


def _world_agrees(ctx: Ctx, spec: MultisliceJobSpec) -> bool:
    """A terminal status is only believed when the world shows that nothing of the job runs: no
    JobSet of ours (none, a stranger's, one being deleted, one suspended: no pods) or ours is
    terminal itself. Status is memory, not a command: a phase written by hand never deletes the
    pools under running pods. The one verdict of the operator's own that a running JobSet
    backs: its uncharged restarts (disruptions and startup evictions) beyond
    maxDisruptionRestarts, which JobSet itself never bounds."""
    js = ctx.obs.jobset
    if js is None or not js.owned or js.completed or js.failed or js.deleting or js.suspended:
        return True
    failed = ctx.old.condition(ConditionType.FAILED)
    return (
        failed is not None
        and failed.reason == restarts.DISRUPTION_BUDGET_REASON
        and js.restarts - js.restarts_counted > spec.failure_policy.max_disruption_restarts
    )


def _status_ignored(ctx: Ctx) -> None:
    ctx.event(
        "Warning",
        "StatusIgnored",
        f"status.phase says {ctx.old.phase} but the JobSet is still running: the operator does "
        "not act on a status it did not derive from the world; the phase is recomputed",
    )
    # Forget the terminal memory that came with it, so the job is judged from the world again.
    ctx.status.completion_time = None
    ctx.status.conditions = [
        c
        for c in ctx.status.conditions
        if c.type not in (ConditionType.COMPLETED, ConditionType.FAILED)
    ]


def _invalid(ctx: Ctx, error: SpecError | None) -> None:
    message = str(error) if error else "the spec could not be read"
    ctx.cond(ConditionType.VALIDATED, "False", "InvalidSpec", message)
    ctx.cond(ConditionType.FAILED, "True", "InvalidSpec", message)
    ctx.phase(Phase.FAILED, f"invalid spec: {message}")
    if ctx.old.message != ctx.status.message and ctx.old.phase == Phase.FAILED:
        ctx.event("Warning", "InvalidSpec", message)
    # Without a plan the job's pools are still known by its uid (a spec that became invalid under
    # a newer operator): they are released, and its JobSet stopped, like any failed job's.
    js = ctx.obs.jobset
    if js is not None and js.owned and not js.deleting:
        ctx.actions.append(DeleteJobSet())
    released = release(ctx, None)
    if ctx.meta.deleting and ctx.meta.has_finalizer and released:
        ctx.actions.append(RemoveFinalizer())


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
        # The next pass deletes the JobSet (_finished), once this status is written: at once,
        # not after a deadline the lifecycle step asked for (the unschedulable one: minutes).
        ctx.requeue_in(1)
        return
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
        and not (js.failed or js.completed or js.suspended or js.deleting)
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
    ctx.status.capacity_ready_time = None
    ctx.cond(ConditionType.PROVISIONED, "False", "Suspended", "capacity released while suspended")
    ctx.cond(ConditionType.SLICES_READY, "False", "Suspended", "job is suspended")
    detail = "" if released else RELEASING_NOTE
    ctx.phase(Phase.SUSPENDED, f"suspended{detail}; set spec.suspend: false to resume")


def _active(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan) -> None:
    if ctx.status.start_time is None:
        ctx.status.start_time = ctx.now
    unused = strays(ctx)  # labelled with our uid, named by no plan of ours: never needed
    if unused:
        ctx.actions.append(DeletePools(tuple(unused)))
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
    if js is None and not _admitted(ctx, plan):
        return
    queue = kueue.queue_name(ctx)
    if queue:  # Kueue admits it: quota first, then the gang (reconcile/queue.py)
        kueue.active(ctx, spec, plan, queue)
        if js is not None and ctx.status.phase in (Phase.STARTING, Phase.RUNNING, Phase.RESTARTING):
            provisioned = ctx.status.condition(ConditionType.PROVISIONED)
            ready = not plan.managed or (provisioned is not None and provisioned.status == "True")
            _startup_deadlines(ctx, spec, plan, js, ready)
        else:
            ctx.status.capacity_ready_time = None
        return
    # Existing pools are the JobSet's business once it runs; Managed pools are ours to repair.
    ready = capacity_ready(ctx, spec, plan) if plan.managed or js is None or js.suspended else True
    if ctx.status.phase == Phase.FAILED:
        if js is not None and js.owned and not js.deleting:
            ctx.actions.append(DeleteJobSet())  # no pods left waiting for released capacity
        return
    if js is None:
        if ready:
            ctx.actions.append(CreateJobSet())
            ctx.status.job_set = plan.name
            ctx.status.capacity_ready_time = ctx.status.capacity_ready_time or ctx.now
            # Written as the next pass will see it (the JobSet, nothing running yet), so creating
            # the JobSet costs one status write, not two.
            running_phase(ctx, plan, JobSetObservation(), ready)
        return
    ctx.status.job_set = plan.name
    count_restarts(ctx, spec, js)
    if js.suspended:
        ctx.status.capacity_ready_time = None  # no pod to judge until it runs
        if ready:
            ctx.actions.append(SetJobSetSuspend(False))
            ctx.phase(Phase.STARTING, "capacity ready again; resuming the JobSet")
        elif ctx.status.phase is None:  # resuming: the capacity released while suspended first
            cond = ctx.status.condition(ConditionType.PROVISIONED)
            waiting = cond.message if cond and cond.message else "waiting for capacity"
            ctx.phase(Phase.PROVISIONING if plan.managed else Phase.PENDING, f"resuming: {waiting}")
        return
    running_phase(ctx, plan, js, ready)
    _startup_deadlines(ctx, spec, plan, js, ready)


def _startup_deadlines(
    ctx: Ctx, spec: MultisliceJobSpec, plan: Plan, js: JobSetObservation, ready: bool
) -> None:
    """A running JobSet whose pods cannot start: the clock counts from when every slice's
    capacity was ready (a JobSet a queue keeps suspended has no pods to judge)."""
    free = ready and not js.suspended and not js.deleting
    ctx.status.capacity_ready_time = (ctx.status.capacity_ready_time or ctx.now) if free else None
    if free and not _unschedulable(ctx, spec, plan):
        _pods_not_created(ctx, spec, plan)


def _admitted(ctx: Ctx, plan: Plan) -> bool:
    """Before the first pool (and before the JobSet): the apiserver's own verdict on the JobSet
    and its Jobs. True: go on; False: judged now (failed, or the question is asked)."""
    verdict = ctx.obs.admission
    if verdict is None:
        ctx.actions.append(ValidateJobSet())
        if ctx.old.phase is None:
            ctx.phase(Phase.PENDING, "checking the JobSet with the apiserver (dry run)")
        else:  # the question is asked again after a restart: nothing else changes
            ctx.phase(Phase(ctx.old.phase), ctx.old.message or "")
        ctx.requeue_in(ctx.cfg.resync_seconds)
        return False
    if not verdict.refused:
        return True
    message = (
        f"the apiserver refuses the JobSet this job renders: {verdict.refused}; fix "
        "spec.template and recreate the job"
    )
    released = release(ctx, plan)
    ctx.cond(ConditionType.FAILED, "True", "JobSetRefused", message)
    ctx.status.completion_time = ctx.now
    ctx.phase(Phase.FAILED, message if released else f"{message}{RELEASING_NOTE}")
    return False


def _unschedulable(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan) -> bool:
    """Pods the scheduler cannot place while every slice's capacity is ready: past the deadline
    the job fails with the scheduler's own reason, its JobSet is deleted and its pools released."""
    timeout = spec.failure_policy.unschedulable_timeout_seconds
    ready_since = ctx.status.capacity_ready_time or ctx.now
    for pod in sorted(ctx.obs.unschedulable, key=lambda p: (p.since, p.pod)):
        waited = (ctx.now - max(pod.since, ready_since)).total_seconds()
        if waited < timeout:
            ctx.requeue_in(timeout - waited)
            continue
        where = f" (slice {pod.slice_index})" if pod.slice_index is not None else ""
        message = (
            f"pod {pod.pod}{where} could not be scheduled for {timeout}s while every slice's "
            f"capacity was ready (spec.failurePolicy.unschedulableTimeoutSeconds); the scheduler "
            f"says: {pod.message}"
        )
        complete(ctx, Phase.FAILED, "Unschedulable", message)
        ctx.actions.append(DeleteJobSet())
        release(ctx, plan)
        return True
    return False


def _pods_not_created(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan) -> bool:
    """No pod at all for a slice, long after its capacity was ready: the apiserver refuses the
    Job controller's pods (Pod Security, quota, a pod webhook: what no dry run of the Job sees).
    The same deadline ends the job; the Job's FailedCreate event has the apiserver's words."""
    pods = ctx.obs.pods_by_slice
    ready_since = ctx.status.capacity_ready_time
    if pods is None or ready_since is None:
        return False
    missing = [i for i in range(plan.slices) if not pods.get(i)]
    if not missing:
        return False
    timeout = spec.failure_policy.unschedulable_timeout_seconds
    waited = (ctx.now - ready_since).total_seconds()
    if waited < timeout:
        ctx.requeue_in(timeout - waited)
        return False
    first = missing[0]
    message = (
        f"no pod of slice {first} was created within {timeout}s while every slice's capacity "
        "was ready (spec.failurePolicy.unschedulableTimeoutSeconds): the apiserver refuses the "
        f"Job controller's pods; `kubectl describe job {plan.name}-{REPLICATED_JOB}-{first}` "
        "shows why (FailedCreate)"
    )
    complete(ctx, Phase.FAILED, "PodsNotCreated", message)
    ctx.actions.append(DeleteJobSet())
    release(ctx, plan)
    return True
