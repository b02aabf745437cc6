"""Kueue is the front door: quota first, then the gang, then admission. Pure, like the rest.

A job that names a queue (label kueue.x-k8s.io/queue-name) gets its JobSet at once, suspended and
labelled; Kueue makes a Workload for it and reserves quota in a ClusterQueue. If that ClusterQueue
lists an AdmissionCheck whose controllerName is this operator's (multislice.dev/gang-provisioning),
the check is ours, and it works like Kueue's own ProvisioningRequest check
(pkg/controller/admissionchecks/provisioning, v0.17.0), with node pools for capacity:

* no quota reserved, or evicted: no node pool, whatever happened before (release them);
* quota reserved and the check Pending: provision the gang (capacity.py, all or none);
* every slice ready: the check Ready, with podSetUpdates pinning the pods to this job's pools;
  Kueue admits and resumes the JobSet;
* a stockout or timeout rolls the gang back: the check Retry, so Kueue evicts the Workload,
  releases the quota and queues it again (the check back to Pending, retryCount + 1);
* a permanent error: the check Rejected (Kueue deactivates the Workload) and the job fails.

Retry is written without requeueAfterSeconds on purpose: in Kueue v0.17.0 a check's
requeueAfterSeconds sets the Workload's requeueState.requeueAt at once, and the workload controller
returns "Waiting for backoff to finish" before it reaches the check-based eviction
(workload_controller.go, Reconcile), so the quota stays held for the whole backoff, the opposite of
what a Retry is for. Without it Kueue evicts in the same reconcile. The pace of cloud attempts stays
ours: if Kueue hands the quota straight back before status.nextAttemptTime, the job holds it
without any node pool until then (docs/kueue.md says when that happens).

Without a check of ours on the Workload (a ClusterQueue for quota only, or Existing mode) Kueue
admits on quota alone; Managed pools are then provisioned once the JobSet runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from multislice_operator import keys
from multislice_operator.api.models import (
    ConditionType,
    EvictionStatus,
    MultisliceJobSpec,
    Phase,
    QueueStatus,
)
from multislice_operator.plan import REPLICATED_JOB, Plan
from multislice_operator.reconcile.capacity import capacity_ready, release
from multislice_operator.reconcile.context import Ctx
from multislice_operator.reconcile.running import count_restarts, running_phase
from multislice_operator.reconcile.types import (
    AdmissionCheckObservation,
    CheckObservation,
    CheckState,
    CreateJobSet,
    JobSetObservation,
    PodSetUpdate,
    QueueObservation,
    SetAdmissionCheckActive,
    SetAdmissionCheckState,
    WorkloadObservation,
)

ADMITTED = ConditionType.ADMITTED
ACTIVE_MESSAGE = "multislice-operator provisions the node pools of each admitted gang"
# Kueue's eviction reason when a check said Retry (kueue.WorkloadEvictedByAdmissionCheck).
EVICTED_BY_CHECK = "AdmissionCheck"
PREEMPTED = "Preempted"


def queue_name(ctx: Ctx) -> str | None:
    return ctx.meta.labels.get(keys.KUEUE_QUEUE_NAME) or None


# ---------------------------------------------------------------- the active job


def active(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan, queue: str) -> None:
    """decide()'s `_active` for a job that names a queue (its JobSet is ours, not finished)."""
    q = ctx.obs.queue or QueueObservation(local_queue=queue, watching=False)
    _record(ctx, q, queue)
    js = ctx.obs.jobset
    if js is None:
        # At once, before any quota or pool: Kueue needs the JobSet to make a Workload.
        ctx.actions.append(CreateJobSet())
        ctx.status.job_set = plan.name
        release(ctx, plan)
        _waiting(
            ctx,
            "WaitingForWorkload",
            f"JobSet {plan.name} created suspended in LocalQueue {queue}: waiting for Kueue",
        )
        return
    ctx.status.job_set = plan.name
    count_restarts(ctx, spec, js)
    wl = q.workload
    if wl is None:
        if not js.suspended:  # resumed by someone else (no Kueue to ask): it runs
            _running(ctx, spec, plan, js, "the JobSet runs without a Kueue Workload")
            return
        release(ctx, plan)
        _no_workload(ctx, plan, q, js)
        return
    _note_eviction(ctx, wl)
    check = wl.check
    if check is not None and check.state == CheckState.REJECTED:
        _rejected(ctx, plan, wl, check)
        return
    if not wl.active:
        release(ctx, plan)
        _waiting(
            ctx,
            "Deactivated",
            f"Kueue deactivated Workload {wl.name} (spec.active: false)"
            f"{': ' + wl.eviction_message if wl.eviction_message else ''}; the job waits, "
            "without node pools, until it is active again",
        )
        return
    if wl.evicted or not wl.quota_reserved:
        _queued(ctx, plan, q, wl)
        return
    if check is None:  # the ClusterQueue lists no check of ours: quota only
        if js.suspended:
            _starting(ctx, wl, "quota reserved; waiting for Kueue to admit and resume the JobSet")
            return
        _running(ctx, spec, plan, js, f"admitted by Kueue in ClusterQueue {wl.cluster_queue}")
        return
    if check.state == CheckState.RETRY:
        release(ctx, plan)
        _waiting(
            ctx,
            "CheckRetry",
            f"admission check {check.name} is Retry ({check.message}): Kueue takes the quota "
            "back and queues the job again",
        )
        return
    if check.state == CheckState.PENDING:
        _provision(ctx, spec, plan, wl, check)
        return
    # Ready
    if js.suspended:
        _starting(ctx, wl, f"admission check {check.name} Ready: waiting for Kueue to admit and "
                  "resume the JobSet")  # fmt: skip
        return
    _running(ctx, spec, plan, js, f"admitted by Kueue in ClusterQueue {wl.cluster_queue}")


def _provision(
    ctx: Ctx, spec: MultisliceJobSpec, plan: Plan, wl: WorkloadObservation, check: CheckObservation
) -> None:
    """Quota reserved, our check Pending: the gang, all or none, before admission."""
    cq = wl.cluster_queue or "?"
    if not plan.managed:
        message = "Existing mode: the slices run on node pools that exist; nothing to provision"
        _set_check(ctx, wl, check, CheckState.READY, message)
        _starting(ctx, wl, f"quota reserved in ClusterQueue {cq}; {message}")
        return
    ready = capacity_ready(ctx, spec, plan, started=False)
    if ctx.status.phase == Phase.FAILED:  # a permanent error: retrying cannot help
        _set_check(ctx, wl, check, CheckState.REJECTED, ctx.status.message or "provisioning failed")
        ctx.cond(ADMITTED, "False", "Rejected", ctx.status.message or "")
        return
    if ctx.rolled_back is not None:
        _set_check(ctx, wl, check, CheckState.RETRY, ctx.rolled_back)
        _waiting(
            ctx,
            "CheckRetry",
            f"{ctx.status.message}; admission check {check.name} set to Retry: Kueue takes the "
            "quota back and queues the job again",
        )
        return
    if ready:
        message = f"all {plan.slices} node pools of the gang ready"
        _set_check(ctx, wl, check, CheckState.READY, message, pin(plan))
        _starting(
            ctx, wl, f"{message}; admission check {check.name} Ready: waiting for Kueue to admit"
        )
        return
    # Provisioning, waiting out the backoff of a rolled-back attempt, or no provisioner: the
    # gang's own phase and message say which; the check stays Pending and the quota ours.
    ctx.cond(ADMITTED, "False", "GangProvisioning", f"quota reserved in ClusterQueue {cq}; "
             f"{ctx.status.message}")  # fmt: skip


def pin(plan: Plan) -> tuple[PodSetUpdate, ...]:
    """podSetUpdates for the one pod set ("slice"): this job's node pools only."""
    return (PodSetUpdate(REPLICATED_JOB, node_selector={keys.JOB_KEY: plan.job_key}),)


def _running(
    ctx: Ctx, spec: MultisliceJobSpec, plan: Plan, js: JobSetObservation, why: str
) -> None:
    """Admitted and resumed: the ordinary running job. A lost slice is repaired in place and a
    restart of all slices is the JobSet's: neither goes back to the queue."""
    ctx.cond(ADMITTED, "True", "Admitted", why)
    if plan.managed:
        provisioned = ctx.old.condition(ConditionType.PROVISIONED)
        gang_up = provisioned is not None and provisioned.status == "True"
        ready = capacity_ready(ctx, spec, plan, started=gang_up)
        if ctx.status.phase == Phase.FAILED:
            return
    else:
        ready = True  # Existing pools are the JobSet's business once it runs
    running_phase(ctx, plan, js, ready)


def _starting(ctx: Ctx, wl: WorkloadObservation, message: str) -> None:
    ctx.cond(ADMITTED, "False", "WaitingForAdmission", message)
    ctx.phase(Phase.STARTING, message)
    ctx.requeue_in(ctx.cfg.resync_seconds)


def _queued(ctx: Ctx, plan: Plan, q: QueueObservation, wl: WorkloadObservation) -> None:
    """No quota (or being evicted): no node pool; say where the job waits and why."""
    released = release(ctx, plan)
    ctx.status.attempt_start_time = None  # an attempt in flight is abandoned with the quota
    if plan.managed:
        ctx.cond(ConditionType.PROVISIONED, "False", "Queued", "no quota reserved: no node pools")
    cq = q.cluster_queue or wl.cluster_queue
    where = f"LocalQueue {q.local_queue}" + (f" (ClusterQueue {cq})" if cq else "")
    if wl.evicted:
        reason, why = "Evicted", f"evicted by Kueue ({wl.eviction_reason}): {wl.eviction_message}"
    elif wl.pending_reason == "Inadmissible":
        reason, why = "Inadmissible", wl.pending_message or "Kueue cannot admit it"
    else:
        reason, why = "QuotaPending", wl.pending_message or "waiting for quota"
    note = "" if released else " (releasing node pools)"
    _waiting(ctx, reason, f"queued in {where}: {why}{note}")


def _no_workload(ctx: Ctx, plan: Plan, q: QueueObservation, js: JobSetObservation) -> None:
    waited = (ctx.now - js.created).total_seconds() if js.created else 0.0
    bound = ctx.cfg.kueue_workload_wait_seconds
    if waited < bound:
        _waiting(
            ctx,
            "WaitingForWorkload",
            f"JobSet {plan.name} in LocalQueue {q.local_queue}: waiting for Kueue to create "
            "its Workload",
        )
        ctx.requeue_in(bound - waited)
        return
    cause = (
        "the operator does not watch Kueue (run it with --kueue, chart value kueue.enabled)"
        if not q.watching
        else "Kueue is not installed, or it does not manage this JobSet (its Configuration must "
        "list jobset.x-k8s.io/jobset in integrations.frameworks and not exclude this namespace)"
    )
    message = (
        f"no Kueue Workload exists for JobSet {plan.name} after {bound:.0f}s: {cause}; the job "
        f"holds no node pools and stays suspended until Kueue admits it"
    )
    before = ctx.old.condition(ADMITTED)
    if before is None or before.reason != "NoKueueWorkload":
        ctx.event("Warning", "NoKueueWorkload", message)
    ctx.cond(ADMITTED, "False", "NoKueueWorkload", message)
    ctx.phase(Phase.PENDING, message)  # not Queued: nothing queues it
    ctx.requeue_in(ctx.cfg.resync_seconds * 3)


def _rejected(ctx: Ctx, plan: Plan, wl: WorkloadObservation, check: CheckObservation) -> None:
    """Rejected (by us, or seen after a crash between writing it and failing): the job fails."""
    release(ctx, plan)
    message = f"admission check {check.name} rejected the Workload: {check.message}"
    ctx.cond(ADMITTED, "False", "Rejected", message)
    ctx.cond(ConditionType.FAILED, "True", "AdmissionCheckRejected", message)
    ctx.status.completion_time = ctx.now
    ctx.phase(Phase.FAILED, message)


def _waiting(ctx: Ctx, reason: str, message: str) -> None:
    ctx.cond(ADMITTED, "False", reason, message)
    ctx.phase(Phase.QUEUED, message)
    if ctx.status.queue is not None:
        ctx.status.queue.message = message
    ctx.requeue_in(ctx.cfg.resync_seconds)


def _set_check(
    ctx: Ctx,
    wl: WorkloadObservation,
    check: CheckObservation,
    state: str,
    message: str,
    updates: tuple[PodSetUpdate, ...] = (),
) -> None:
    message = message[:1024]  # Kueue truncates condition messages; ours are short
    if check.state == state and check.message == message:
        return
    ctx.actions.append(
        SetAdmissionCheckState(wl.name, wl.resource_version, check.name, state, message, updates)
    )
    if ctx.status.queue is not None:
        ctx.status.queue.check_state = state


# ---------------------------------------------------------------- memory and display


def _record(ctx: Ctx, q: QueueObservation, queue: str) -> None:
    """status.queue from this observation; the eviction memory is carried over."""
    old = ctx.old.queue
    wl = q.workload
    status = QueueStatus(
        local_queue=queue,
        cluster_queue=(wl.cluster_queue if wl else None) or q.cluster_queue,
        workload=wl.name if wl else None,
        admission_check=wl.check.name if wl and wl.check else None,
        check_state=wl.check.state if wl and wl.check else None,
        retry_count=wl.check.retry_count if wl and wl.check and wl.check.retry_count else None,
        pending_workloads=q.pending_workloads,
        message=old.message if old else None,
        preemptions=old.preemptions if old else 0,
        last_eviction=old.last_eviction.model_copy() if old and old.last_eviction else None,
    )
    ctx.status.queue = status


def _note_eviction(ctx: Ctx, wl: WorkloadObservation) -> None:
    """A new eviction (Evicted=True with a transition time not seen before) is remembered, and a
    preemption counted and announced once."""
    status = ctx.status.queue
    if not wl.evicted or wl.eviction_time is None or status is None:
        return
    last = status.last_eviction
    if last is not None and last.time == wl.eviction_time:
        return
    status.last_eviction = EvictionStatus(
        reason=wl.eviction_reason,
        message=wl.eviction_message,
        preempted_by=wl.preempted_by,
        time=wl.eviction_time,
    )
    if wl.eviction_reason == EVICTED_BY_CHECK:
        return  # our own Retry: GangRolledBack said it
    by = f" by {wl.preempted_by}" if wl.preempted_by else ""
    if wl.eviction_reason == PREEMPTED:
        status.preemptions += 1
    ctx.event(
        "Warning",
        "Preempted" if wl.eviction_reason == PREEMPTED else "Evicted",
        f"Kueue evicted Workload {wl.name}{by} ({wl.eviction_reason}): {wl.eviction_message}; "
        "its node pools are released, it queues again and resumes from its last checkpoint "
        "once admitted",
    )


# ---------------------------------------------------------------- a finished job


def finished(ctx: Ctx) -> None:
    """A job that failed on its own (before admission) must not leave its Workload holding quota
    with our check Pending: Rejected hands the quota back (level-based: also after a crash)."""
    q = ctx.obs.queue
    wl = q.workload if q else None
    if wl is None or wl.check is None or ctx.old.phase != Phase.FAILED:
        return
    if wl.finished or not wl.active or not wl.quota_reserved:
        return
    if wl.check.state in (CheckState.PENDING, CheckState.RETRY):
        failed = ctx.old.condition(ConditionType.FAILED)
        message = (failed.message if failed else "") or "the job failed"
        _set_check(ctx, wl, wl.check, CheckState.REJECTED, message)


# ---------------------------------------------------------------- the AdmissionCheck objects


def activate(
    checks: Iterable[AdmissionCheckObservation], _now: datetime | None = None
) -> list[SetAdmissionCheckActive]:
    """Every AdmissionCheck naming our controller gets Active=True for its generation, as
    Kueue's own acReconciler does for its ProvisioningRequest checks; until then every
    ClusterQueue listing it is inactive and admits nothing."""
    return [
        SetAdmissionCheckActive(c.name, c.resource_version, c.generation, ACTIVE_MESSAGE)
        for c in sorted(checks, key=lambda c: c.name)
        if not c.active or c.observed_generation != c.generation
    ]
