"""The verdicts that end a pass: checked in one order, the first that fires wins. Pure.

Like JobSet, which returns right after its failure policy acts, and Kueue's job reconciler,
whose numbered steps return early: every way a pass can end without the lifecycle (capacity,
JobSet, pods) running is a verdict below, a pure function of the pass's facts. `VERDICTS` lists
them once, in order; `finish` carries one out with its own actions only (a failed job deletes
its JobSet and releases its pools in the same pass; nothing is created), so a late verdict can
never leave an earlier step's create behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from multislice_operator.api.models import ConditionType, Phase
from multislice_operator.common.names import REPLICATED_JOB
from multislice_operator.common.ownership import Owner
from multislice_operator.reconcile import (
    elastic,
    kueue_gate,
    multikueue,
    preflight,
    restarts,
    scheduling,
)
from multislice_operator.reconcile.capacity import (
    Released,
    pools_present,
    release,
    release_stopped,
    stop_wait,
)
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts, failed_for_good
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.running import why_failed
from multislice_operator.reconcile.types import (
    CheckState,
    DeleteJob,
    DeleteJobSet,
    RemoveFinalizer,
    SetJobSetSuspend,
    SetWorkloadActive,
)


class End(StrEnum):
    FAIL = "Fail"  # the job fails now (condition Failed)
    SUCCEED = "Succeed"  # the job succeeds now (condition Completed)
    FINISHED = "Finished"  # it had finished: release, TTL
    DELETING = "Deleting"  # being deleted: release, then let it go
    SUSPENDED = "Suspended"  # spec.suspend: release and hold
    WAIT = "Wait"  # an orphan JobSet of an earlier job of this name: delete it, wait


@dataclass(frozen=True)
class Verdict:
    end: End
    reason: Reason | None  # None: a pass that ends without a condition (deleting)
    message: str
    # Provisioned=False with this reason (the capacity verdicts).
    provisioned: Reason | None = None
    # Admitted=False with this reason (a job that names a queue).
    admitted: Reason | None = None
    event: Reason | None = None  # announced besides the phase transition
    copied_reason: str = ""  # JobSet's own failure reason, kept as the condition's reason


Rule = Callable[[Facts], Verdict | None]


# ---------------------------------------------------------------- the verdicts, in order


def invalid_spec(f: Facts) -> Verdict | None:
    if f.error is None and f.spec is not None and f.plan is not None:
        unqueued = multikueue.unqueued(f) if f.steps.multikueue else None  # never dispatched
        return Verdict(End.FAIL, Reason.INVALID_SPEC, unqueued) if unqueued else None
    message = str(f.error) if f.error else "the spec could not be read"
    return Verdict(End.FAIL, Reason.INVALID_SPEC, message)


def deleting(f: Facts) -> Verdict | None:
    return Verdict(End.DELETING, None, "") if f.deleting else None


def finished(f: Facts) -> Verdict | None:
    if not (f.finished_before and f.world_agrees):
        return None
    # The operator's own verdict that sticks is the job's end, whatever phase is written over it.
    phase = Phase.FAILED if failed_for_good(f.old) else Phase(f.old.phase or Phase.FAILED)
    ctype = ConditionType.COMPLETED if phase == Phase.SUCCEEDED else ConditionType.FAILED
    cond = f.old.condition(ctype)
    message = cond.message if cond and cond.message else phase.value
    reason = Reason.COMPLETED if phase == Phase.SUCCEEDED else Reason.JOBSET_FAILED
    return Verdict(End.FINISHED, reason, message, copied_reason=cond.reason if cond else "")


def suspended(f: Facts) -> Verdict | None:
    if f.spec is None or not f.spec.suspend:
        return None
    return Verdict(End.SUSPENDED, Reason.SUSPENDED, "suspended")


def orphan_jobset(f: Facts) -> Verdict | None:
    js = f.js_other
    if js is None or js.owner != Owner.ORPHAN:
        return None
    return Verdict(
        End.WAIT,
        Reason.ORPHAN_JOBSET,
        f"JobSet {f.meta.name} (uid {js.uid or '?'}) belongs to an earlier job of this name: "
        "it is deleted, never adopted; this job starts once it is gone",
    )


def jobset_conflict(f: Facts) -> Verdict | None:
    js = f.js_other
    if js is None or js.owner == Owner.ORPHAN:
        return None
    return Verdict(
        End.FAIL,
        Reason.JOBSET_CONFLICT,
        f"a JobSet named {f.meta.name} exists and is not owned by this job; delete or rename it",
    )


def completed(f: Facts) -> Verdict | None:
    if f.js is None or not f.js.completed:
        return None
    return Verdict(End.SUCCEED, Reason.COMPLETED, "all slices finished")


def jobset_failed(f: Facts) -> Verdict | None:
    js, spec = f.js, f.spec
    if js is None or not js.failed or spec is None:
        return None
    return Verdict(
        End.FAIL, Reason.JOBSET_FAILED, why_failed(f, spec, js), copied_reason=js.failure_reason
    )


def check_rejected(f: Facts) -> Verdict | None:
    wl = kueue_gate.workload(f) if f.steps.kueue else None
    if wl is None or wl.check is None or wl.check.state != CheckState.REJECTED:
        return None
    message = f"admission check {wl.check.name} rejected the Workload: {wl.check.message}"
    return Verdict(End.FAIL, Reason.ADMISSION_CHECK_REJECTED, message, admitted=Reason.REJECTED)


def multikueue_unavailable(f: Facts) -> Verdict | None:
    why = multikueue.undispatchable(f) if f.steps.multikueue else None
    if why is None:
        return None
    reason = Reason.MULTIKUEUE_UNAVAILABLE
    return Verdict(End.FAIL, reason, why, admitted=reason)


def before_first_pool(f: Facts) -> bool:
    """Nothing of the job holds capacity yet: no JobSet of its own, no pool of its own."""
    return f.js is None and not pools_present(f)


def pod_security(f: Facts) -> Verdict | None:
    refused = f.obs.pod_security
    if not refused or not before_first_pool(f):
        return None
    return Verdict(End.FAIL, Reason.POD_SECURITY_REFUSED, refused)


def priority_class_missing(f: Facts) -> Verdict | None:
    name = f.obs.missing_priority_class
    if not name or not before_first_pool(f):
        return None
    return Verdict(
        End.FAIL,
        Reason.PRIORITY_CLASS_NOT_FOUND,
        f"spec.template.spec.priorityClassName: no PriorityClass {name!r} exists, so the "
        "apiserver would refuse every pod of the job (nothing was provisioned); create it "
        "(`kubectl get priorityclasses` lists those there) or fix the name, then recreate the job",
    )


def jobset_refused(f: Facts) -> Verdict | None:
    verdict = f.obs.admission
    if f.js is not None or verdict is None or not verdict.refused:
        return None
    message = (
        f"the apiserver refuses the JobSet this job renders: {verdict.refused}; fix "
        "spec.template and recreate the job"
    )
    return Verdict(End.FAIL, Reason.JOBSET_REFUSED, message)


def preflight_failed(f: Facts) -> Verdict | None:
    message = preflight.failure(f) if f.steps.preflight else None
    return Verdict(End.FAIL, Reason.PREFLIGHT_FAILED, message) if message else None


def pool_name_taken(f: Facts) -> Verdict | None:
    taken = f.capacity.taken(f)
    if not taken:
        return None
    s = taken[0]
    message = (
        f"node pool {s.pool} (slice {s.index}) belongs to job {s.taken_by}, which was created "
        "first: the two jobs' node pool names collide; nothing of that job is touched; rename "
        "this job and recreate it"
    )
    return Verdict(End.FAIL, Reason.POOL_NAME_TAKEN, message, provisioned=Reason.POOL_NAME_TAKEN)


def provisioning_failed(f: Facts) -> Verdict | None:
    permanent = f.capacity.permanent_errors(f, gang_up(f))
    if not permanent:
        return None
    message = (
        f"{permanent[0]}; retrying cannot help, fix the spec or the project and recreate the job"
    )
    reason = Reason.PROVISIONING_FAILED
    return Verdict(End.FAIL, reason, message, provisioned=reason, admitted=Reason.REJECTED)


def disruption_budget(f: Facts) -> Verdict | None:
    if f.spec is None or f.js is None:
        return None
    over = restarts.over_budget(f.restarts.by_cause, f.spec)
    if over is None:
        return None
    reason = Reason.MAX_DISRUPTION_RESTARTS
    return Verdict(End.FAIL, reason, over, event=reason)


def _due(wait: tuple[float, str] | None, reason: Reason) -> Verdict | None:
    """A deadline's verdict: the job fails once its (seconds left, message) wait ran out."""
    if wait is None or wait[0] > 0:
        return None
    return Verdict(End.FAIL, reason, wait[1])


def _unschedulable_wait(f: Facts) -> tuple[float, str] | None:
    """(seconds left, message) while a pod waits for a node and every slice's capacity is
    ready, counted from status.scheduling.waitingSince (scheduling.py: no pool replacement or
    restart of the startup deadline resets it)."""
    waits, spec = f.scheduling, f.spec
    since = waits.waiting_since if waits is not None else None
    if since is None or spec is None or f.capacity_ready_since is None or not f.unschedulable:
        return None
    timeout = spec.failure_policy.unschedulable_timeout_seconds
    pod = min(f.unschedulable, key=lambda p: (p.unschedulable_since, p.name))
    where = f" (slice {pod.slice_index})" if pod.slice_index is not None else ""
    return (
        timeout - (f.now - since).total_seconds(),
        f"pod {pod.name}{where} could not be scheduled for {timeout}s while every "
        "slice's capacity was ready (spec.failurePolicy.unschedulableTimeoutSeconds, counted "
        "from the job's first pod waiting: the startup deadline's pool replacements and "
        f"restarts do not reset it); the scheduler says: {pod.scheduler_message}",
    )


def scheduler_known_absent(f: Facts) -> Verdict | None:
    """Before the first pool: the scheduler the template names is known not to run."""
    absent = f.obs.scheduler_absent
    if not absent or f.spec is None or not before_first_pool(f):
        return None
    return Verdict(
        End.FAIL,
        Reason.SCHEDULER_NOT_RUNNING,
        f"spec.template.spec.schedulerName is {scheduling.scheduler_name(f.spec)!r}, a "
        f"scheduler known not to run: {absent}; nothing was provisioned: start that scheduler "
        "or remove the field (the default scheduler), then recreate the job",
    )


def _unseen_wait(f: Facts) -> tuple[float, str] | None:
    """(seconds left, message) while no scheduler has looked at any pod of the job, counted
    from the first one's creation (status.scheduling.unseenSince). Not while that scheduler was
    seen at work on other pods within the grace: behind is not absent (the unschedulable
    deadline judges its backlog)."""
    waits, spec = f.scheduling, f.spec
    since = waits.unseen_since if waits is not None else None
    if since is None or spec is None or f.obs.scheduler_working:
        return None
    grace = f.cfg.scheduler_grace_seconds
    return (
        grace - (f.now - since).total_seconds(),
        f"no scheduler looked at any pod of the job within {grace:.0f}s of the first one's "
        "creation (no PodScheduled condition; --scheduler-grace-seconds): "
        f"spec.template.spec.schedulerName is {scheduling.scheduler_name(spec)!r}: is a "
        "scheduler of that name running? Remove the field for the default scheduler",
    )


def _pods_not_created_wait(f: Facts) -> tuple[float, str] | None:
    """Counted from the capacity clock at a first start, else from when the slice's pods went
    (status.scheduling.podsMissingSince): a job that ran an hour is not failed the moment a
    drain or a restart leaves a slice without pods."""
    ready, spec, plan = f.capacity_ready_since, f.spec, f.plan
    gone = f.scheduling.pods_missing_since if f.scheduling is not None else None
    since = gone if f.ran else ready
    if ready is None or since is None or spec is None or plan is None:
        return None
    missing = [i for i in range(f.active) if not f.pods_by_slice.get(i)]
    if not missing:
        return None
    timeout = spec.failure_policy.unschedulable_timeout_seconds
    first = missing[0]
    return (
        timeout - (f.now - since).total_seconds(),
        f"no pod of slice {first} was created within {timeout}s while every slice's capacity "
        "was ready (spec.failurePolicy.unschedulableTimeoutSeconds): the apiserver refuses the "
        f"Job controller's pods; `kubectl describe job {plan.name}-{REPLICATED_JOB}-{first}` "
        "shows why (FailedCreate)",
    )


# The time-based verdicts, in order: each a wait ((seconds left, message), None while its clock
# does not run) and the reason the job fails with once the wait ran out.
Wait = Callable[[Facts], tuple[float, str] | None]
DEADLINES: tuple[tuple[Wait, Reason], ...] = (
    (_unseen_wait, Reason.SCHEDULER_NOT_RUNNING),
    (_unschedulable_wait, Reason.UNSCHEDULABLE),
    (_pods_not_created_wait, Reason.PODS_NOT_CREATED),
)


def deadlines(f: Facts) -> Verdict | None:
    for wait, reason in DEADLINES:
        verdict = _due(wait(f), reason)
        if verdict is not None:
            return verdict
    return None


VERDICTS: tuple[Rule, ...] = (
    invalid_spec,
    deleting,
    finished,
    suspended,
    orphan_jobset,
    jobset_conflict,
    completed,
    jobset_failed,
    check_rejected,
    multikueue_unavailable,
    pod_security,
    priority_class_missing,
    scheduler_known_absent,
    jobset_refused,
    preflight_failed,
    pool_name_taken,
    provisioning_failed,
    disruption_budget,
    deadlines,
)


def first(f: Facts) -> Verdict | None:
    for rule in VERDICTS:
        verdict = rule(f)
        if verdict is not None:
            return verdict
    return None


def next_deadline(f: Facts) -> float | None:
    """Seconds until a time-based verdict would fire (a pass is wanted then)."""
    waits = (wait(f) for wait, _ in DEADLINES)
    lefts = [wait[0] for wait in waits if wait is not None]
    return min(lefts) if lefts else None


def gang_up(f: Facts) -> bool:
    """The gang was provisioned and its JobSet runs on it: a lost slice is repaired alone.
    A queued job's JobSet exists (suspended) before its gang: the Provisioned memory says."""
    if f.js is None:
        # Between the JobSets of an elastic resize: the slices were up, lost pools are repaired.
        return f.plan is not None and f.plan.elastic is not None and elastic.resized(f.old)
    if f.queue is None:
        return True
    provisioned = f.old.condition(ConditionType.PROVISIONED)
    # A repair (Provisioned=False, Repairing) is a gang that was up and lost a slice.
    return provisioned is not None and (
        provisioned.status == "True" or provisioned.reason == Reason.REPAIRING
    )


# ---------------------------------------------------------------- carrying one out


def finish(f: Facts, b: Builder, v: Verdict) -> tuple[Phase, str]:
    """The verdict's actions and memory; the phase and message of the pass."""
    b.status.startup = None
    if v.end in (End.FAIL, End.SUCCEED):
        return _complete(f, b, v)
    if v.end == End.FINISHED:
        return _finished(f, b, v)
    if v.end == End.DELETING:
        return _deleting(f, b)
    if v.end == End.SUSPENDED:
        return _suspended(f, b)
    return _wait_for_orphan(f, b, v)


def _stop_jobset(f: Facts, b: Builder) -> None:
    """A JobSet of the job's own that still runs pods: deleted (JobSet would run it on, or keep
    its pods waiting for capacity that is released)."""
    js = f.js
    if js is not None and not (js.failed or js.completed or js.suspended or js.deleting):
        b.add(DeleteJobSet())


def _complete(f: Facts, b: Builder, v: Verdict) -> tuple[Phase, str]:
    phase = Phase.SUCCEEDED if v.end == End.SUCCEED else Phase.FAILED
    b.status.completion_time = f.now
    _verdict_conditions(f, b, v, phase)
    if v.event is not None:
        b.event(v.event, v.message)
    if f.js is not None:
        b.status.restarts = max(b.status.restarts, f.js.restarts)
    released = _end(f, b, phase, v.message)
    if f.deleting and f.meta.has_finalizer and released:
        b.add(RemoveFinalizer())  # an invalid spec being deleted: nothing of it is left
    elif not f.deleting:
        _ttl(f, b, f.now, released)
    return phase, v.message if released else f"{v.message}{Released.RELEASING}"


def _verdict_conditions(f: Facts, b: Builder, v: Verdict, phase: Phase) -> None:
    """The conditions a verdict writes: Completed or Failed with its reason, and the others it
    names (Validated for an invalid spec, Provisioned, Admitted for a job that names a queue)."""
    assert v.reason is not None
    if v.reason == Reason.INVALID_SPEC:
        b.cond(ConditionType.VALIDATED, "False", v.reason, v.message)
    ctype = ConditionType.COMPLETED if phase == Phase.SUCCEEDED else ConditionType.FAILED
    b.cond_copied(ctype, "True", v.copied_reason or v.reason.value, v.message)
    if v.provisioned:
        b.cond(ConditionType.PROVISIONED, "False", v.provisioned, v.message)
    if v.admitted and f.queue:
        b.cond(ConditionType.ADMITTED, "False", v.admitted, v.message)


def _end(f: Facts, b: Builder, phase: Phase, message: str) -> bool:
    """What an ended job leaves running goes: a failed job's JobSet (JobSet would run it on) and
    its Workload's quota, every pool unless a success keeps them (spec.provisioning
    .keepNodePools). True when no pool is left."""
    if phase == Phase.FAILED:
        _stop_jobset(f, b)
    if f.steps.kueue and phase == Phase.FAILED:
        kueue_gate.reject(f, b, message)
    if f.steps.kueue:
        kueue_gate.finish(f, b, phase == Phase.SUCCEEDED, message)
    keep = phase == Phase.SUCCEEDED and f.spec is not None and f.spec.provisioning.keep_node_pools
    return True if keep else release(f, b)


def _finished(f: Facts, b: Builder, v: Verdict) -> tuple[Phase, str]:
    phase = Phase.SUCCEEDED if v.reason == Reason.COMPLETED else Phase.FAILED  # see `finished`
    released = _end(f, b, phase, v.message)
    _ttl(f, b, f.old.completion_time, released)
    return phase, v.message if released else f"{v.message}{Released.RELEASING}"


def _ttl(f: Facts, b: Builder, done: datetime | None, released: bool) -> None:
    """ttlSecondsAfterFinished, from the completion (this pass's, when it completes now)."""
    ttl = f.spec.ttl_seconds_after_finished if f.spec else None
    if ttl is None or done is None or not released:
        return
    left = (done + timedelta(seconds=ttl) - f.now).total_seconds()
    if left <= 0:
        b.add(DeleteJob())
    else:
        b.requeue_in(left)


def _deleting(f: Facts, b: Builder) -> tuple[Phase, str]:
    """The job is being deleted: release every pool, then let it go."""
    released = release(f, b)
    phase = Phase(f.old.phase or Phase.PENDING)
    if released:
        if f.meta.has_finalizer:
            b.add(RemoveFinalizer())
        return phase, "deleted; every node pool released"
    # No count in the text: one status write for the deletion, not one per pool released.
    return phase, "deleting: releasing the node pools first"


def _suspended(f: Facts, b: Builder) -> tuple[Phase, str]:
    js, wl = f.js, kueue_gate.workload(f) if f.steps.kueue else None
    if wl is not None:
        # A queued job also gives its quota back: its Workload inactive (Kueue evicts it), the
        # reservation unset once the JobSet stopped; active again when the suspend is lifted.
        if wl.active:
            b.add(SetWorkloadActive(wl.name, False))
        kueue_gate.remember_suspended(b)
        kueue_gate.stop(f, b, stop_wait(f) is None)
    elif js is not None and not js.suspended:
        b.add(SetJobSetSuspend(True))
    note = release_stopped(f, b)
    b.status.attempt_start_time = None
    b.status.next_attempt_time = None
    b.status.capacity_ready_time = None
    b.cond(
        ConditionType.PROVISIONED, "False", Reason.SUSPENDED, "capacity released while suspended"
    )
    b.cond(ConditionType.SLICES_READY, "False", Reason.SUSPENDED, "job is suspended")
    return Phase.SUSPENDED, f"suspended{note}; set spec.suspend: false to resume"


def _wait_for_orphan(f: Facts, b: Builder, v: Verdict) -> tuple[Phase, str]:
    js = f.js_other
    assert js is not None
    if not js.deleting:
        b.add(DeleteJobSet(uid=js.uid))
    if f.old.message != v.message:
        b.event(Reason.ORPHAN_JOBSET, v.message)
    b.requeue_in(f.cfg.resync_seconds)
    return Phase.PENDING, v.message
