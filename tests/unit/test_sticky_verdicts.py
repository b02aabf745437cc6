"""A failure verdict sticks (issue 39, section 2): decided on one pass, it holds on the next even
when its evidence is gone.

The shell writes the status before it applies the actions (controller/reconciler.py), so a crash
between the two, or a refused delete, leaves a Failed status beside a JobSet that still runs and
pools that are still there. For every failure verdict of the registry (a terminal reason that is
not Completed) this builds that world: the pass that decides the verdict, its status written (read
back through JSON), none of its actions applied, the operator restarted (its memory of the
apiserver's dry run lost), and the verdict's evidence gone (the pod scheduled after all, the
admission check no longer Rejected, the pool error gone, ...) or still there. The next decide()
must keep the verdict (phase Failed, the same reason), create and resume nothing, stop the JobSet
and release the pools.

A new terminal reason fails here until it has its worlds in CASES.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from multislice_operator.api.models import MultisliceJobStatus, Phase
from multislice_operator.common import keys
from multislice_operator.common.errors import FieldError, SpecError
from multislice_operator.common.ownership import Owner
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.reconcile import (
    Action,
    Admission,
    CheckObservation,
    CheckState,
    CreateJobSet,
    CreatePools,
    DecideConfig,
    Decision,
    DeleteJobSet,
    DeletePools,
    JobMeta,
    JobSetObservation,
    Observed,
    Pod,
    QueueObservation,
    SetJobSetSuspend,
    SetWorkloadActive,
    SliceObservation,
    ValidateJobSet,
    WorkloadObservation,
    decide,
    invariants,
)
from multislice_operator.reconcile.facts import derive
from multislice_operator.reconcile.reasons import REGISTRY, Reason
from multislice_operator.reconcile.types import PreflightObservation
from tests.unit import jobs

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
LATER = NOW + timedelta(seconds=30)  # the operator's first pass after its restart
CFG = DecideConfig.from_settings()
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
QUEUED = {keys.KUEUE_QUEUE_NAME: "team-a"}
POOLS = [p.name for p in jobs.spec_and_plan()[1].node_pools]
RUNNING = {
    "phase": "Running",
    "runningTime": "2026-12-01T11:00:00Z",
    "capacityReadyTime": "2026-12-01T11:00:00Z",
    "conditions": [{"type": "Provisioned", "status": "True", "reason": "GangReady"}],
    "slices": [{"index": i, "phase": "Running", "hosts": 4, "seenReady": True} for i in range(2)],
}
JS_RUNNING = JobSetObservation(ready_jobs=2, active_jobs=2, created=NOW - timedelta(hours=1))
FAILURES = [r for r, info in REGISTRY.items() if info.terminal and r != Reason.COMPLETED]


def pool(i: int, state: PoolState = PoolState.READY, **kw: Any) -> SliceObservation:
    hosts = 4 if state == PoolState.READY else 0
    return SliceObservation(i, POOLS[i], state, hosts, **kw)


UP = [pool(0), pool(1)]


@dataclass(frozen=True)
class Case:
    """One failure verdict: the world it is decided in (`before`, after the status `old`), and
    the world of the next pass once its status is written and before its actions ran, with its
    evidence gone (`gone`). The job's spec (`spec`: body fields; `error`: an invalid spec) and
    metadata (`meta`) stay as they were."""

    old: dict[str, Any]
    before: Observed
    gone: Observed
    spec: dict[str, Any] | None = None
    error: SpecError | None = None
    meta: JobMeta = META

    def decide(self, old: MultisliceJobStatus, obs: Observed) -> Decision:
        if self.error is not None:
            return decide(self.meta, None, None, self.error, old, obs, CFG)
        labels = {"labels": self.meta.labels} if self.meta.labels else None
        spec, plan = jobs.spec_and_plan(jobs.body(metadata=labels, **(self.spec or {})))
        return decide(self.meta, spec, plan, None, old, obs, CFG)


def _observed(**kw: Any) -> Observed:
    return jobs.Observed(now=NOW, **kw)


def _after(**kw: Any) -> Observed:
    """The next pass's world: the operator restarted (blind since the crash, the apiserver's
    dry-run verdict forgotten)."""
    return Observed(now=LATER, blind_since=NOW, admission=None, **kw)


def _invalid_spec() -> Case:
    # The spec edited under a running job into one that does not validate; the shell observes
    # the JobSet and the pools labelled with the job's uid (a plan it no longer has).
    strays = {POOLS[0]: PoolState.READY}
    world = {"jobset": JS_RUNNING, "pods": jobs.running({0: 4, 1: 4}), "strays": strays}
    return Case(
        old=RUNNING,
        before=_observed(**world),
        gone=_after(**world),  # a spec stays invalid until edited: its own evidence
        error=SpecError([FieldError("spec.parallelism.ici", "product 2 != 16")]),
    )


def _jobset_conflict() -> Case:
    stranger = JobSetObservation(owner=Owner.STRANGER, uid="other", ready_jobs=2)
    return Case(
        old={"phase": "Provisioning"},
        before=_observed(slices=UP, jobset=stranger),
        gone=_after(slices=UP),  # the stranger's JobSet deleted
    )


def _jobset_failed() -> Case:
    failed = JobSetObservation(failed=True, restarts=3, created=NOW - timedelta(hours=1))
    return Case(
        old=RUNNING,
        before=_observed(slices=UP, jobset=failed),
        gone=_after(slices=UP),  # the failed JobSet deleted by hand
    )


def _check(state: str, message: str = "") -> WorkloadObservation:
    return WorkloadObservation(
        "jobset-job-abcde",
        "7",
        quota_reserved=True,
        admitted=True,
        cluster_queue="cq",
        check=CheckObservation("gang", state, message),
    )


def _queue(state: str, message: str = "") -> QueueObservation:
    return QueueObservation("team-a", cluster_queue="cq", workload=_check(state, message))


def _admission_check_rejected() -> Case:
    world = {"slices": UP, "jobset": JS_RUNNING, "pods": jobs.running({0: 4, 1: 4})}
    return Case(
        old=RUNNING,
        before=_observed(**world, queue=_queue(CheckState.REJECTED, "no capacity of this type")),
        gone=_after(**world, queue=_queue(CheckState.READY)),  # the check Ready again
        meta=replace(META, labels=QUEUED),
    )


def _multikueue_unavailable() -> Case:
    # A MultiKueue manager's Workload with quota in a ClusterQueue without MultiKueue's check.
    hostage = WorkloadObservation(
        "jobset-job-abcde", "7", quota_reserved=True, admitted=True, cluster_queue="cq"
    )
    mk = CheckObservation("multikueue", CheckState.PENDING)
    fixed = replace(hostage, multikueue_check=mk)  # the ClusterQueue got one since
    return Case(
        old={},
        before=_observed(queue=QueueObservation("team-a", cluster_queue="cq", workload=hostage)),
        gone=_after(queue=QueueObservation("team-a", cluster_queue="cq", workload=fixed)),
        spec={"managedBy": keys.MULTIKUEUE_MANAGED_BY},
        meta=replace(META, labels=QUEUED, has_finalizer=False),
    )


def _pod_security_refused() -> Case:
    refused = "namespace ns enforces Pod Security level baseline (hostNetwork)"
    before = _observed(slices=[pool(0, PoolState.ABSENT), pool(1, PoolState.ABSENT)])
    before.pod_security = refused
    return Case(
        old={},
        before=before,
        gone=_after(slices=before.slices),  # the namespace relabelled
        meta=replace(META, has_finalizer=False),
    )


def _priority_class_not_found() -> Case:
    before = _observed(slices=[pool(0, PoolState.ABSENT), pool(1, PoolState.ABSENT)])
    before.missing_priority_class = "hi"
    return Case(
        old={},
        before=before,
        gone=_after(slices=before.slices),  # the PriorityClass created since
        meta=replace(META, has_finalizer=False),
    )


def _jobset_refused() -> Case:
    none = [pool(0, PoolState.ABSENT), pool(1, PoolState.ABSENT)]
    return Case(
        old={"phase": "Pending"},
        before=_observed(slices=none, admission=Admission(refused="spec.replicatedJobs: bad")),
        gone=_after(slices=none),  # the verdict forgotten with the operator's memory
        meta=replace(META, has_finalizer=False),
    )


def _preflight_failed() -> Case:
    none = [pool(0, PoolState.ABSENT), pool(1, PoolState.ABSENT)]
    said = '{"fits": false, "hbm_bytes_per_device": 20000000000}'
    failed = PreflightObservation(
        "job-preflight", generation=1, finished=True, exit_code=78, message=said
    )
    return Case(
        old={"phase": "Pending"},
        before=_observed(slices=none, preflight=failed),
        gone=_after(slices=none),  # its Job deleted: only the status remembers
        spec={"preflight": {}},
        meta=replace(META, has_finalizer=False),
    )


def _pool_name_taken() -> Case:
    taken = pool(1, taken_by="ns/other", taken_by_older=True)
    world = {"jobset": JS_RUNNING, "pods": jobs.running({0: 4})}
    return Case(
        old=RUNNING,
        before=_observed(slices=[pool(0), taken], **world),
        gone=_after(slices=[pool(0), pool(1, PoolState.ABSENT)], **world),  # the other job gone
    )


def _provisioning_failed() -> Case:
    bad = PoolError(1, POOLS[1], "INVALID_ARGUMENT", "unknown machine type", True)
    world = {"jobset": JS_RUNNING, "pods": jobs.running({0: 4})}
    return Case(
        old=RUNNING,
        before=_observed(slices=[pool(0), pool(1, PoolState.FAILED, error=bad)], **world),
        gone=_after(slices=[pool(0), pool(1, PoolState.ABSENT)], **world),  # the failed pool gone
    )


def _max_disruption_restarts() -> Case:
    over = JobSetObservation(restarts=2, restarts_counted=0, ready_jobs=2, active_jobs=2)
    world = {"slices": UP, "jobset": over, "pods": jobs.running({0: 4, 1: 4}, attempt=2)}
    return Case(
        old=RUNNING,
        before=_observed(**world),
        gone=_after(**world),  # a JobSet's restart counters never go down
        spec={"failurePolicy": {"maxDisruptionRestarts": 1}},
    )


def _unschedulable() -> Case:
    since = NOW - timedelta(hours=1)
    stuck = Pod("job-slice-1-0", 1, unschedulable_since=since, scheduler_message="0/8 nodes")
    js = replace(JS_RUNNING, ready_jobs=1)
    return Case(
        old=RUNNING,
        before=_observed(slices=UP, jobset=js, pods=[*jobs.running({0: 4}), stuck]),
        gone=_after(slices=UP, jobset=JS_RUNNING, pods=jobs.running({0: 4, 1: 4})),  # scheduled
        spec={"failurePolicy": {"unschedulableTimeoutSeconds": 300}},
    )


def _scheduler_not_running() -> Case:
    created = NOW - timedelta(minutes=5)
    unseen = [
        Pod(f"job-slice-{i}-0", i, unschedulable_since=created, looked_at=False) for i in range(2)
    ]
    js = replace(JS_RUNNING, ready_jobs=0)
    return Case(
        old=RUNNING,
        before=_observed(slices=UP, jobset=js, pods=unseen),
        # The scheduler started since: every pod bound and running.
        gone=_after(slices=UP, jobset=JS_RUNNING, pods=jobs.running({0: 4, 1: 4})),
    )


def _pods_not_created() -> Case:
    js = replace(JS_RUNNING, ready_jobs=1, active_jobs=1)
    return Case(
        old={**RUNNING, "phase": "Starting"},  # a first start: the capacity clock counts
        before=_observed(slices=UP, jobset=js, pods=jobs.running({0: 4})),
        gone=_after(slices=UP, jobset=JS_RUNNING, pods=jobs.running({0: 4, 1: 4})),  # created
        spec={"failurePolicy": {"unschedulableTimeoutSeconds": 300}},
    )


CASES: dict[Reason, Callable[[], Case]] = {
    Reason.INVALID_SPEC: _invalid_spec,
    Reason.JOBSET_CONFLICT: _jobset_conflict,
    Reason.JOBSET_FAILED: _jobset_failed,
    Reason.ADMISSION_CHECK_REJECTED: _admission_check_rejected,
    Reason.MULTIKUEUE_UNAVAILABLE: _multikueue_unavailable,
    Reason.POD_SECURITY_REFUSED: _pod_security_refused,
    Reason.PRIORITY_CLASS_NOT_FOUND: _priority_class_not_found,
    Reason.JOBSET_REFUSED: _jobset_refused,
    Reason.PREFLIGHT_FAILED: _preflight_failed,
    Reason.POOL_NAME_TAKEN: _pool_name_taken,
    Reason.PROVISIONING_FAILED: _provisioning_failed,
    Reason.MAX_DISRUPTION_RESTARTS: _max_disruption_restarts,
    Reason.UNSCHEDULABLE: _unschedulable,
    Reason.SCHEDULER_NOT_RUNNING: _scheduler_not_running,
    Reason.PODS_NOT_CREATED: _pods_not_created,
}


def _creates(a: Action) -> bool:
    return (
        isinstance(a, CreatePools | CreateJobSet | ValidateJobSet)
        or a == SetJobSetSuspend(False)
        or (isinstance(a, SetWorkloadActive) and a.active)
    )


def _failed_reason(d: Decision) -> str | None:
    cond = d.status.condition("Failed")
    return cond.reason if cond is not None and cond.status == "True" else None


def _case(reason: Reason) -> Case:
    if reason not in CASES:
        pytest.fail(f"{reason}: a terminal failure reason without a crash world in CASES")
    return CASES[reason]()


def _verdict(reason: Reason) -> tuple[Case, Decision, MultisliceJobStatus]:
    """The pass that decides the verdict, and its status as the apiserver stores it."""
    case = _case(reason)
    first = case.decide(MultisliceJobStatus.from_dict(case.old), case.before)
    assert first.status.phase == Phase.FAILED, first.status.message
    assert _failed_reason(first) == reason
    return case, first, MultisliceJobStatus.from_dict(first.status.to_dict())


def _assert_sticks(reason: Reason, d: Decision, obs: Observed) -> None:
    assert d.status.phase == Phase.FAILED, f"{reason} -> {d.status.phase}: {d.status.message}"
    assert _failed_reason(d) == reason
    assert [a for a in d.actions if _creates(a)] == []
    js = obs.jobset
    if js is not None and js.owned and not (js.failed or js.completed or js.deleting):
        assert DeleteJobSet() in d.actions  # JobSet would run it on
    live = {s.pool for s in obs.slices if s.pool_state != PoolState.ABSENT and not s.taken_by}
    live |= set(obs.strays)
    deleted = {n for a in d.actions if isinstance(a, DeletePools) for n in a.pools}
    assert live <= deleted, f"pools {sorted(live - deleted)} kept"


@pytest.mark.parametrize("reason", FAILURES, ids=str)
def test_a_failure_verdict_sticks_once_its_evidence_is_gone(reason: Reason) -> None:
    case, _, written = _verdict(reason)
    _assert_sticks(reason, case.decide(written, case.gone), case.gone)


@pytest.mark.parametrize("reason", FAILURES, ids=str)
def test_a_failure_verdict_sticks_while_its_evidence_holds(reason: Reason) -> None:
    case, _, written = _verdict(reason)
    still = replace(case.before, now=LATER, blind_since=NOW)
    _assert_sticks(reason, case.decide(written, still), still)


# ---------------------------------------------------------------- what sticks, and what does not

STICKY = [r for r in FAILURES if REGISTRY[r].sticky]


def test_every_terminal_reason_sticks_or_says_why_not() -> None:
    for reason, info in REGISTRY.items():
        assert info.sticky == (info.terminal and not info.not_sticky), reason
        assert not info.not_sticky or info.terminal, f"{reason}: not terminal, nothing to stick"
    assert not REGISTRY[Reason.COMPLETED].sticky  # a hand-written Succeeded never wins
    assert Reason.UNSCHEDULABLE in STICKY and Reason.MAX_DISRUPTION_RESTARTS in STICKY


@pytest.mark.parametrize("phase", ["Succeeded", "Running", None])
@pytest.mark.parametrize("reason", STICKY, ids=str)
def test_a_phase_written_over_a_sticking_verdict_does_not_revive_the_job(
    reason: Reason, phase: str | None
) -> None:
    case, _, written = _verdict(reason)
    written.phase = Phase(phase) if phase else None
    d = case.decide(written, case.gone)
    assert Reason.STATUS_IGNORED not in [e.reason for e in d.events]
    _assert_sticks(reason, d, case.gone)


@pytest.mark.parametrize("reason", STICKY, ids=str)
def test_a_failed_status_written_by_hand_beside_a_running_jobset_is_recomputed(
    reason: Reason,
) -> None:
    # No observedGeneration: the operator did not write it (every condition it writes has one).
    old = {**RUNNING, "phase": "Failed"}
    old["conditions"] = [{"type": "Failed", "status": "True", "reason": str(reason)}]
    obs = jobs.Observed(now=NOW, slices=UP, jobset=JS_RUNNING, pods=jobs.running({0: 4, 1: 4}))
    d = CASES[Reason.UNSCHEDULABLE]().decide(MultisliceJobStatus.from_dict(old), obs)
    assert d.status.phase == Phase.RUNNING and Reason.STATUS_IGNORED in [e.reason for e in d.events]
    assert d.actions == []


def test_jobsets_own_failure_reason_beside_a_running_jobset_is_recomputed() -> None:
    # A failed JobSet stays failed until deleted: a running one beside its copied reason
    # (JobSetFailed does not stick) means the status was not derived from it.
    failed = JobSetObservation(failed=True, failure_reason="ReachedMaxRestarts", restarts=3)
    case = replace(_jobset_failed(), before=_observed(slices=UP, jobset=failed))
    first = case.decide(MultisliceJobStatus.from_dict(case.old), case.before)
    assert _failed_reason(first) == "ReachedMaxRestarts"
    written = MultisliceJobStatus.from_dict(first.status.to_dict())
    running = _after(slices=UP, jobset=JS_RUNNING, pods=jobs.running({0: 4, 1: 4}))
    d = case.decide(written, running)
    assert d.status.phase == Phase.RUNNING and Reason.STATUS_IGNORED in [e.reason for e in d.events]
    assert d.actions == []


def test_a_fixed_spec_runs_again() -> None:
    # InvalidSpec does not stick: the registry says so (Validated=False, facts._finished_before).
    case, _, written = _verdict(Reason.INVALID_SPEC)
    valid = replace(case, error=None)
    pods = jobs.running({0: 4, 1: 4})
    d = valid.decide(written, _after(slices=UP, jobset=JS_RUNNING, pods=pods))
    assert d.status.phase not in (Phase.FAILED, Phase.SUCCEEDED)
    assert not [a for a in d.actions if isinstance(a, DeleteJobSet | DeletePools)]


@pytest.mark.parametrize("reason", STICKY, ids=str)
def test_the_invariants_forbid_a_create_on_a_job_the_operator_failed(reason: Reason) -> None:
    case, _, written = _verdict(reason)
    spec, plan = jobs.spec_and_plan()
    f = derive(replace(case.meta, has_finalizer=True), spec, plan, None, written, case.gone, CFG)
    for action in (CreatePools((1,)), CreateJobSet(), SetJobSetSuspend(False)):
        d = Decision(MultisliceJobStatus(phase=Phase.RUNNING), [action])
        ((_, why),) = invariants.violations(f, d)
        assert f"a job the operator failed ({reason})" in why
