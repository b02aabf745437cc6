"""Kueue as a gate: quota first, then the gang, then admission. Pure, like the rest.

Kueue does not get a lifecycle of its own: `gate()` maps what Kueue says (a switch over a few
predicates, as Kueue's own provisioning admission check is) to what this pass may do (hold in
the queue, provision the gang, wait for admission, run) and the check state to report; the one
lifecycle (flow.py) runs under it.

A job that names a queue (label kueue.x-k8s.io/queue-name) gets its own Workload at once (the
operator creates it, render/kueue_workload.py) and its JobSet, suspended and without a queue label;
Kueue reserves quota for the Workload in a ClusterQueue. If that ClusterQueue
lists an AdmissionCheck whose controllerName is this operator's (multislice.dev/gang-provisioning),
the check is ours, and it works like Kueue's own ProvisioningRequest check
(pkg/controller/admissionchecks/provisioning, v0.17.0), with node pools for capacity:

* no quota reserved, or evicted: no node pool, whatever happened before (release them);
* quota reserved and the check Pending: provision the gang (capacity.py, all or none);
* every slice ready: the check Ready (its podSetUpdates name this job's pools, for whoever reads
  the Workload: Kueue applies them only through its own job integrations, and the JobSet's pods
  select the pools already); Kueue admits the Workload and the operator resumes the JobSet;
* a stockout or timeout rolls the gang back: the check Retry, so Kueue evicts the Workload, the
  operator unsets its reservation (`stop`) and Kueue queues it again (the check back to Pending,
  retryCount + 1);
* a permanent error: the check Rejected (Kueue deactivates the Workload) and the job fails.

What Kueue's job reconciler does for a Go job the operator does for its Workload: it stops the
job when Kueue evicts it and unsets the reservation once it stopped (`stop`), reports finished
slices as reclaimable (`reclaim`) and finishes the Workload when the job ends (`finish`).

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
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from multislice_operator.api.models import ConditionType, EvictionStatus, Phase, QueueStatus
from multislice_operator.common import keys
from multislice_operator.common.names import REPLICATED_JOB
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile import multikueue
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    AdmissionCheckObservation,
    AdoptWorkload,
    CheckObservation,
    CheckState,
    CreateWorkload,
    DeleteWorkload,
    FinishWorkload,
    PodSetUpdate,
    QueueObservation,
    ReclaimPods,
    ReleaseWorkload,
    SetAdmissionCheckActive,
    SetAdmissionCheckState,
    SetJobSetSuspend,
    SetWorkloadActive,
    WorkloadObservation,
)
from multislice_operator.render.kueue_workload import workload_name

ADMITTED = ConditionType.ADMITTED
ACTIVE_MESSAGE = "multislice-operator provisions the node pools of each admitted gang"
# Kueue's eviction reason when a check said Retry (kueue.WorkloadEvictedByAdmissionCheck).
EVICTED_BY_CHECK = "AdmissionCheck"
PREEMPTED = "Preempted"


class Pass(StrEnum):
    HOLD = "Hold"  # waits in the queue (or for a Workload): no node pool, nothing runs
    PROVISION = "Provision"  # quota reserved and our check Pending: the gang, all or none
    ADMISSION = "Admission"  # quota (and our check) ready: Kueue admits the Workload next
    RUN = "Run"  # admitted and resumed: the ordinary running job


@dataclass(frozen=True)
class Gate:
    allows: Pass
    reason: Reason | None = None  # the Admitted condition's reason while not admitted
    message: str = ""
    phase: Phase = Phase.QUEUED  # HOLD: Queued, or Pending when nothing queues it
    workload: WorkloadObservation | None = None
    check: CheckObservation | None = None


def workload(f: Facts) -> WorkloadObservation | None:
    q = f.obs.queue
    return q.workload if f.queue and q is not None else None


def gate(f: Facts, b: Builder) -> Gate:
    """What Kueue allows this pass; records status.queue and announces evictions."""
    assert f.queue is not None and f.plan is not None
    q = f.obs.queue or QueueObservation(local_queue=f.queue, watching=False)
    _record(f, b, q)
    if f.obs.kueue_problem:
        return _unsupported(f, b, f.obs.kueue_problem)
    wl = q.workload
    if wl is None:
        return _no_workload(f, b, q)
    if not wl.adopted:  # MultiKueue's prebuilt Workload: the job's from now on
        b.add(AdoptWorkload(wl.name, wl.resource_version))
    elif (key := _asks_for_another(f, wl)) is not None:
        b.add(DeleteWorkload(wl.name, wl.resource_version))
        assert b.status.queue is not None  # _record wrote it
        b.status.queue.workload_replaced_time = f.now
        return Gate(Pass.HOLD, Reason.WAITING_FOR_WORKLOAD,
                    f"replacing Workload {wl.name}: it asks for the quota of {wl.quota_key!r}, "
                    f"the job now asks for {key!r}", workload=wl)  # fmt: skip
    _note_eviction(f, b, wl)
    if not wl.active:
        return _deactivated(b, wl)
    if not wl.seen_by_kueue:
        return _not_seen(f, b, q, wl)
    if wl.evicted or not wl.quota_reserved:
        return _queued(f, q, wl)
    handed_back = multikueue.handed_back(f, b, wl)
    if handed_back is not None:
        return Gate(Pass.HOLD, Reason.CHECK_RETRY, handed_back, workload=wl, check=wl.check)
    return _quota_reserved(wl)


def _asks_for_another(f: Facts, wl: WorkloadObservation) -> str | None:
    """The plan's quota key when the Workload asks for other quota (Plan.quota_key: a Fallback
    job's option; one Workload per key, as Kueue's jobframework replaces a Workload that no
    longer matches its job), else None."""
    key = f.plan.quota_key if f.plan is not None else None
    return key if key is not None and not wl.finished and wl.quota_key != key else None


def _unsupported(f: Facts, b: Builder, problem: str) -> Gate:
    """Kueue is there but cannot be used (announced once per problem): the job waits."""
    if f.old.queue is None or f.old.queue.message != problem:
        b.event(Reason.KUEUE_UNSUPPORTED, problem)
    return Gate(Pass.HOLD, Reason.KUEUE_UNSUPPORTED, problem, Phase.PENDING)


def _deactivated(b: Builder, wl: WorkloadObservation) -> Gate:
    """The Workload is inactive: the job waits. One we deactivated for spec.suspend (now lifted,
    or this pass would have ended suspended) is activated again."""
    if b.status.queue is not None and b.status.queue.suspended:  # our suspend, now lifted
        b.add(SetWorkloadActive(wl.name, True))
        b.status.queue.suspended = False
    return Gate(
        Pass.HOLD,
        Reason.DEACTIVATED,
        f"Kueue deactivated Workload {wl.name} (spec.active: false)"
        f"{': ' + wl.eviction_message if wl.eviction_message else ''}; the job waits, "
        "without node pools, until it is active again",
        workload=wl,
    )


def _quota_reserved(wl: WorkloadObservation) -> Gate:
    """Quota reserved: our check (if the ClusterQueue lists one) decides, then Kueue admits and
    the JobSet is resumed (by the operator: Kueue does not manage it)."""
    check = wl.check
    if check is not None and check.state == CheckState.RETRY:
        return Gate(
            Pass.HOLD,
            Reason.CHECK_RETRY,
            f"admission check {check.name} is Retry ({check.message}): Kueue takes the quota "
            "back and queues the job again",
            workload=wl,
            check=check,
        )
    if check is not None and check.state == CheckState.PENDING:
        return Gate(Pass.PROVISION, Reason.GANG_PROVISIONING, workload=wl, check=check)
    if not wl.admitted:  # quota only, or our check Ready: Kueue admits next
        ready = f"admission check {check.name} Ready" if check else "quota reserved"
        return Gate(Pass.ADMISSION, Reason.WAITING_FOR_ADMISSION,
                    f"{ready}: waiting for Kueue to admit the Workload", workload=wl,
                    check=check)  # fmt: skip
    return Gate(Pass.RUN, message=f"admitted by Kueue in ClusterQueue {wl.cluster_queue}",
                workload=wl, check=check)  # fmt: skip


def hold(f: Facts, b: Builder, g: Gate) -> tuple[Phase, str]:
    """The job waits: it says where and why (its pools are released by the caller)."""
    b.cond(ADMITTED, "False", g.reason or Reason.QUOTA_PENDING, g.message)
    if b.status.queue is not None:
        b.status.queue.message = g.message
    b.requeue_in(f.cfg.resync_seconds)
    return g.phase, g.message


def waiting_for_admission(f: Facts, b: Builder, message: str) -> tuple[Phase, str]:
    b.cond(ADMITTED, "False", Reason.WAITING_FOR_ADMISSION, message)
    b.requeue_in(f.cfg.resync_seconds)
    return Phase.STARTING, message


def admitted(b: Builder, g: Gate) -> None:
    b.cond(ADMITTED, "True", Reason.ADMITTED, g.message)


def report(f: Facts, b: Builder, g: Gate, state: str, message: str, pin: bool = False) -> None:
    """Our check's state on the Workload, when it changes."""
    wl, check = g.workload, g.check
    if wl is None or check is None:
        return
    message = message[:1024]  # Kueue truncates condition messages; ours are short
    if check.state == state and check.message == message:
        return
    updates = pin_to_pools(f.plan) if pin and f.plan is not None else ()
    b.add(SetAdmissionCheckState(wl.name, wl.resource_version, check.name, state, message, updates))
    if b.status.queue is not None:
        b.status.queue.check_state = state


def pin_to_pools(plan: Plan) -> tuple[PodSetUpdate, ...]:
    """podSetUpdates for the pod set "slice": this job's node pools only. Informative since the
    Workload is the job's (no Kueue job integration applies them); the rendered pod template
    carries the same selector."""
    return (PodSetUpdate(REPLICATED_JOB, node_selector={keys.JOB_KEY: plan.job_key}),)


def _queued(f: Facts, q: QueueObservation, wl: WorkloadObservation) -> Gate:
    """No quota (or being evicted): no node pool; say where the job waits and why."""
    cq = q.cluster_queue or wl.cluster_queue
    where = f"LocalQueue {q.local_queue}" + (f" (ClusterQueue {cq})" if cq else "")
    if wl.evicted:
        reason, why = (
            Reason.EVICTED,
            f"evicted by Kueue ({wl.eviction_reason}): {wl.eviction_message}",
        )
    elif wl.pending_reason == "Inadmissible":
        reason, why = Reason.INADMISSIBLE, wl.pending_message or "Kueue cannot admit it"
    else:
        reason, why = Reason.QUOTA_PENDING, wl.pending_message or "waiting for quota"
    return Gate(Pass.HOLD, reason, f"queued in {where}: {why}", workload=wl, check=wl.check)


def _no_workload(f: Facts, b: Builder, q: QueueObservation) -> Gate:
    """No Workload seen: the operator creates it (it is the job's own, render/kueue_workload.py),
    unless it cannot: it does not watch Kueue, or the WorkloadPriorityClass is missing."""
    assert f.plan is not None
    cause = None
    made_elsewhere = multikueue.prebuilt(f)
    if made_elsewhere and q.watching:  # MultiKueue made it: none is created here
        b.requeue_in(f.cfg.resync_seconds)
        return Gate(Pass.HOLD, Reason.WAITING_FOR_WORKLOAD,
                    f"waiting for Workload {made_elsewhere}, which MultiKueue made for this job "
                    f"({keys.KUEUE_PREBUILT_WORKLOAD})")  # fmt: skip
    if not q.watching:
        cause = "the operator does not watch Kueue (run it with --kueue, chart value kueue.enabled)"
    elif q.missing_priority_class:
        cause = (
            f"WorkloadPriorityClass {q.missing_priority_class!r} (label "
            f"{keys.KUEUE_PRIORITY_CLASS}) does not exist: create it, or fix or remove the label"
        )
    if cause is None:
        b.add(CreateWorkload(q.priority))
        if b.status.queue is not None:  # said as the next pass will see it (one write)
            b.status.queue.workload = workload_name(f.plan.name)
        # A MultiKueue manager's job records no start (no status): it waits since its creation.
        elsewhere = f.steps.multikueue and multikueue.managed_elsewhere(f)
        made = f.meta.creation_time if elsewhere else None
        started = f.old.start_time or made or f.now
        replaced = f.old.queue.workload_replaced_time if f.old.queue else None
        started = max(started, replaced) if replaced is not None else started
        waited = (f.now - started).total_seconds()
        bound = f.cfg.kueue_workload_wait_seconds
        if waited < bound:
            b.requeue_in(bound - waited)
            return Gate(Pass.HOLD, Reason.WAITING_FOR_WORKLOAD,
                        _awaiting(workload_name(f.plan.name), q.local_queue))  # fmt: skip
        cause = (
            f"its Workload is not seen {bound:.0f}s after the operator created it: Kueue is not "
            "installed (no Workload API is served), or the create was refused (the operator's "
            "log says why)"
        )
    return _unqueued(f, b, f"no Kueue Workload for the job in LocalQueue {q.local_queue}: {cause}")


def _unqueued(f: Facts, b: Builder, why: str, wl: WorkloadObservation | None = None) -> Gate:
    """Nothing queues the job (NoKueueWorkload, announced once): Pending, not Queued."""
    message = f"{why}; the job holds no node pools and stays suspended until Kueue admits it"
    before = f.old.condition(ADMITTED)
    if before is None or before.reason != Reason.NO_KUEUE_WORKLOAD:
        b.event(Reason.NO_KUEUE_WORKLOAD, message)
    b.requeue_in(f.cfg.resync_seconds * 3)
    return Gate(Pass.HOLD, Reason.NO_KUEUE_WORKLOAD, message, Phase.PENDING, workload=wl)


def _awaiting(workload: str, queue: str) -> str:
    """Said from the create until Kueue looks at the Workload (one text: one status write)."""
    return f"Workload {workload} in LocalQueue {queue}: waiting for Kueue to look at it"


def _not_seen(f: Facts, b: Builder, q: QueueObservation, wl: WorkloadObservation) -> Gate:
    """A Workload Kueue never looked at (no QuotaReserved condition): just created, or Kueue's
    controller does not run (its CRDs do)."""
    bound = f.cfg.kueue_workload_wait_seconds
    waited = (f.now - wl.created).total_seconds() if wl.created else 0.0
    if waited < bound:
        b.requeue_in(bound - waited)
        return Gate(Pass.HOLD, Reason.WAITING_FOR_WORKLOAD, _awaiting(wl.name, q.local_queue),
                    workload=wl)  # fmt: skip
    why = (
        f"Kueue has not looked at Workload {wl.name} (LocalQueue {q.local_queue}) in "
        f"{bound:.0f}s: Kueue is not installed or not running (its API is served, its controller "
        "does not answer)"
    )
    return _unqueued(f, b, why, wl)


def stop(f: Facts, b: Builder, stopped: bool) -> None:
    """A queued job that may not run (evicted, waiting, suspended): its JobSet is suspended, and
    once it is `stopped` (no pod of it left on the pools) an evicted Workload's quota reservation
    is unset, which is what Kueue waits for to requeue it (jobframework, "handle eviction")."""
    js, wl = f.js, workload(f)
    if js is not None and not js.suspended and not js.deleting:
        b.add(SetJobSetSuspend(True))
        return
    if wl is not None and wl.evicted and wl.quota_reserved and stopped:
        b.add(ReleaseWorkload(wl.name, wl.resource_version))


def reclaim(f: Facts, b: Builder) -> None:
    """A running job's succeeded slices free their quota before the whole job ends, as Kueue's
    JobSet integration reports them (ReclaimablePods: succeeded Jobs x pods per Job)."""
    wl, js, plan = workload(f), f.js, f.plan
    if wl is None or js is None or plan is None or not wl.admitted:
        return
    count = min(js.succeeded_jobs, plan.slices) * plan.shape.hosts
    if count > wl.reclaimable:
        b.add(ReclaimPods(wl.name, wl.resource_version, count))


def finish(f: Facts, b: Builder, succeeded: bool, message: str) -> None:
    """The job ended: its Workload Finished, which frees the quota (level-based). It waits for
    nothing any more, so status.queue says no reason to wait."""
    if b.status.queue is not None:
        b.status.queue.message = None
    wl = workload(f)
    if wl is not None and not wl.finished:
        b.add(FinishWorkload(wl.name, succeeded, message or ("succeeded" if succeeded else
                                                              "failed")))  # fmt: skip


# ---------------------------------------------------------------- memory and display


def _record(f: Facts, b: Builder, q: QueueObservation) -> None:
    """status.queue from this observation; the eviction and suspend memory is carried over."""
    old = f.old.queue
    wl = q.workload
    assert f.queue is not None
    b.status.queue = QueueStatus(
        local_queue=f.queue,
        cluster_queue=(wl.cluster_queue if wl else None) or q.cluster_queue,
        workload=wl.name if wl else None,
        cluster=q.cluster if multikueue.from_manager(f) else None,
        admission_check=wl.check.name if wl and wl.check else None,
        check_state=wl.check.state if wl and wl.check else None,
        retry_count=wl.check.retry_count if wl and wl.check and wl.check.retry_count else None,
        pending_workloads=q.pending_workloads,
        message=None,  # why it waits: said by each pass that holds it (`hold`), none otherwise
        preemptions=old.preemptions if old else 0,
        last_eviction=old.last_eviction.model_copy() if old and old.last_eviction else None,
        suspended=old.suspended if old else False,
        workload_replaced_time=old.workload_replaced_time if old else None,
    )


def remember_suspended(b: Builder) -> None:
    if b.status.queue is not None:
        b.status.queue.suspended = True


def _note_eviction(f: Facts, b: Builder, wl: WorkloadObservation) -> None:
    """A new eviction (Evicted=True with a transition time not seen before) is remembered, and a
    preemption counted and announced once."""
    status = b.status.queue
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
    b.event(
        Reason.PREEMPTED if wl.eviction_reason == PREEMPTED else Reason.EVICTED,
        f"Kueue evicted Workload {wl.name}{by} ({wl.eviction_reason}): {wl.eviction_message}; "
        "its node pools are released, it queues again and resumes from its last checkpoint "
        "once admitted",
    )


# ---------------------------------------------------------------- a failed job


def reject(f: Facts, b: Builder, message: str) -> None:
    """A job that failed on its own must not leave its Workload holding quota with our check
    Pending: Rejected hands the quota back (level-based: also after a crash)."""
    wl = workload(f)
    if wl is None or wl.check is None or wl.finished or not wl.active or not wl.quota_reserved:
        return
    if wl.check.state in (CheckState.PENDING, CheckState.RETRY):
        g = Gate(Pass.HOLD, workload=wl, check=wl.check)
        report(f, b, g, CheckState.REJECTED, message or "the job failed")


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
