"""Table tests for Kueue mode (reconcile/kueue_gate.py): quota first, then the gang, then
admission."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from multislice_operator.common import keys
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.reconcile import (
    AddFinalizer,
    AdmissionCheckObservation,
    CheckObservation,
    CheckState,
    CreateJobSet,
    CreatePools,
    CreateWorkload,
    DecideConfig,
    DeletePools,
    FinishWorkload,
    JobMeta,
    JobSetObservation,
    Pod,
    PodSetUpdate,
    QueueObservation,
    ReleaseWorkload,
    SetAdmissionCheckActive,
    SetAdmissionCheckState,
    SetJobSetSuspend,
    SliceObservation,
    WorkloadObservation,
)
from multislice_operator.reconcile.kueue_gate import activate
from multislice_operator.reconcile.reasons import Reason
from tests.unit import jobs
from tests.unit.jobs import Observed

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None,
    backoff_base_seconds=30, backoff_max_seconds=600, resync_seconds=10,
    kueue_workload_wait_seconds=60,
)  # fmt: skip
LQ = "team-a"
LABELS = {keys.KUEUE_QUEUE_NAME: LQ}
META = JobMeta("ns", "job", "uid-1", 1, labels=LABELS, has_finalizer=True)
CHECK = "gang"


def spec_and_plan(**spec):
    return jobs.spec_and_plan(jobs.body(metadata={"labels": LABELS}, **spec))


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


run = partial(jobs.run, cfg=CFG, now=NOW, meta=META, metadata={"labels": LABELS})


def st(d):
    return d.status.to_dict()


def pools(*states, ready=None, errors=None):
    _, p = spec_and_plan()
    out = []
    for i, state in enumerate(states):
        hosts = ready[i] if ready else (4 if state == PoolState.READY else 0)
        out.append(SliceObservation(i, p.node_pools[i].name, state, hosts, (errors or {}).get(i)))
    return out


def absent():
    return pools(PoolState.ABSENT, PoolState.ABSENT)


def up():
    return pools(PoolState.READY, PoolState.READY)


def wl(check_state: str | None = CheckState.PENDING, retry: int = 0, **kw):
    fields = {
        "name": "multislicejob-job",
        "resource_version": "7",
        "quota_reserved": True,
        "cluster_queue": "cq",
    }
    fields.update(kw)
    check = CheckObservation(CHECK, check_state, "", retry) if check_state else None
    return WorkloadObservation(check=check, **fields)


def obs(workload=None, slices=None, jobset=None, now=NOW, **kw):
    queue = kw.pop("queue", None) or QueueObservation(LQ, cluster_queue="cq", workload=workload)
    return Observed(
        now=now,
        slices=absent() if slices is None else slices,
        jobset=jobset if jobset is not None else JobSetObservation(suspended=True, created=NOW),
        queue=queue,
        **kw,
    )


def kinds(d):
    return [type(a).__name__ for a in d.actions]


def checks(d):
    return [a for a in d.actions if isinstance(a, SetAdmissionCheckState)]


def cond(d, ctype="Admitted"):
    return next(c for c in st(d)["conditions"] if c["type"] == ctype)


def reasons(d):
    return [e.reason for e in d.events]


# ---------------------------------------------------------------- before any quota


def test_a_queued_job_gets_its_workload_and_a_suspended_jobset_at_once_and_no_pool():
    fresh = JobMeta("ns", "job", "uid-1", 1, labels=LABELS)
    d = run(obs=Observed(now=NOW, slices=absent(), queue=QueueObservation(LQ)), meta=fresh)
    assert d.actions == [AddFinalizer(), CreateWorkload(), CreateJobSet()]
    assert st(d)["phase"] == "Queued"
    assert st(d)["queue"]["localQueue"] == LQ
    assert cond(d)["reason"] == Reason.WAITING_FOR_WORKLOAD
    # With a WorkloadPriorityClass, its value goes into the Workload (Kueue orders by it).
    q = QueueObservation(LQ, priority=1000)
    d = run(obs=Observed(now=NOW, slices=absent(), queue=q), meta=fresh)
    assert CreateWorkload(1000) in d.actions


def test_a_missing_workload_priority_class_is_named_and_nothing_is_queued():
    q = QueueObservation(LQ, missing_priority_class="urgent")
    d = run(obs=obs(queue=q))
    assert st(d)["phase"] == "Pending" and "'urgent'" in st(d)["message"]
    assert "kueue.x-k8s.io/priority-class" in st(d)["message"]
    assert cond(d)["reason"] == Reason.NO_KUEUE_WORKLOAD
    assert not any(isinstance(a, CreateWorkload) for a in d.actions)


def test_no_pool_while_the_workload_is_not_seen_yet():
    d = run(obs=obs(workload=None, now=NOW + timedelta(seconds=5)))
    assert d.actions == [CreateWorkload()]  # again until seen: a create is idempotent
    assert st(d)["phase"] == "Queued"
    assert d.requeue_after == pytest.approx(10)


def test_no_workload_after_the_bound_says_so_once_and_holds_no_pool():
    """Issue 14 item 5: the Workload never appears (Kueue's CRD missing, a refused create)."""
    later = NOW + timedelta(seconds=61)
    old = {"phase": "Queued", "startTime": iso(NOW)}
    d = run(old=old, obs=obs(workload=None, slices=up(), now=later))
    assert st(d)["phase"] == "Pending"  # not claiming to be queued
    assert "no Kueue Workload for the job in LocalQueue team-a" in st(d)["message"]
    assert "not seen 60s after the operator created it: Kueue is not installed" in st(d)["message"]
    assert cond(d)["reason"] == Reason.NO_KUEUE_WORKLOAD
    assert reasons(d).count(Reason.NO_KUEUE_WORKLOAD) == 1
    assert kinds(d) == ["CreateWorkload", "DeletePools"]
    assert len(d.actions[1].pools) == 2
    again = run(old=d.status, obs=obs(workload=None, now=later + timedelta(seconds=30)))
    assert Reason.NO_KUEUE_WORKLOAD not in reasons(again)
    assert again.actions == [CreateWorkload()]


def test_no_workload_because_the_operator_does_not_watch_kueue():
    q = QueueObservation(LQ, watching=False)
    d = run(obs=obs(queue=q, now=NOW + timedelta(seconds=61)))
    assert "--kueue" in st(d)["message"]


def test_waiting_for_quota_says_where_and_why_and_releases_any_pool():
    pending = wl(
        quota_reserved=False,
        cluster_queue=None,
        pending_reason="Pending",
        pending_message="couldn't assign flavors to pod set slice: insufficient unused quota "
        "for google.com/tpu in flavor tpu-v5e, 32 more needed",
    )
    d = run(obs=obs(pending, slices=up()), old={"phase": "Queued"})
    assert st(d)["phase"] == "Queued"
    assert "LocalQueue team-a (ClusterQueue cq)" in st(d)["message"]
    assert "32 more needed" in st(d)["message"]
    assert cond(d)["reason"] == Reason.QUOTA_PENDING
    assert st(d)["queue"]["clusterQueue"] == "cq"
    assert kinds(d) == ["DeletePools"]  # never hold pools without quota


def test_unknown_local_queue_is_inadmissible():
    q = QueueObservation(LQ, workload=wl(
        quota_reserved=False, cluster_queue=None, pending_reason="Inadmissible",
        pending_message="LocalQueue team-a doesn't exist",
    ))  # fmt: skip
    d = run(obs=obs(queue=q))
    assert cond(d)["reason"] == Reason.INADMISSIBLE
    assert "doesn't exist" in st(d)["message"]
    assert d.actions == []


# ---------------------------------------------------------------- quota reserved: the gang


def test_quota_and_a_pending_check_start_the_gang():
    d = run(obs=obs(wl()))
    assert d.actions == [CreatePools((0, 1))]
    assert st(d)["phase"] == "Provisioning"
    assert st(d)["provisioningAttempts"] == 1
    assert cond(d)["reason"] == Reason.GANG_PROVISIONING
    assert st(d)["queue"]["admissionCheck"] == CHECK
    assert st(d)["queue"]["checkState"] == "Pending"


def test_gang_ready_sets_the_check_ready_with_pod_set_updates_pinning_the_pools():
    _, p = spec_and_plan()
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    d = run(old=old, obs=obs(wl(), slices=up()))
    (check,) = d.actions
    assert check == SetAdmissionCheckState(
        "multislicejob-job",
        "7",
        CHECK,
        "Ready",
        "all 2 node pools of the gang ready",
        (PodSetUpdate("slice", node_selector={keys.JOB_KEY: p.job_key}),),
    )
    assert st(d)["phase"] == "Starting"
    assert Reason.GANG_PROVISIONED in reasons(d)
    # Seen Ready, JobSet still suspended: wait for Kueue, nothing to write.
    wait = run(old=d.status, obs=obs(wl(CheckState.READY), slices=up()))
    assert wait.actions == [] and st(wait)["phase"] == "Starting"
    # Kueue admitted and resumed it.
    running = run(
        old=wait.status,
        obs=obs(
            wl(CheckState.READY, admitted=True),
            slices=up(),
            jobset=JobSetObservation(ready_jobs=2, created=NOW),
        ),
    )
    assert running.actions == []
    assert st(running)["phase"] == "Running"
    assert cond(running)["status"] == "True"


def test_a_ready_gang_is_not_set_ready_twice():
    old = {"phase": "Starting", "provisioningAttempts": 1}
    seen = wl(CheckState.READY)
    d = run(old=old, obs=obs(seen, slices=up()))
    assert checks(d) == []


def test_stockout_rolls_back_and_hands_the_quota_back_with_retry():
    stockout = PoolError(1, "p1", "GCE_STOCKOUT", "no capacity in zone", False)
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    slices = pools(PoolState.READY, PoolState.FAILED, errors={1: stockout})
    d = run(old=old, obs=obs(wl(), slices=slices))
    assert kinds(d) == ["DeletePools", "SetAdmissionCheckState"]
    (retry,) = checks(d)
    assert retry.state == "Retry" and "GCE_STOCKOUT" in retry.message
    assert st(d)["phase"] == "Queued"
    assert cond(d)["reason"] == Reason.CHECK_RETRY
    assert Reason.GANG_ROLLED_BACK in reasons(d)
    next_at = st(d)["nextAttemptTime"]
    # Kueue has not acted yet: the check says Retry; only release.
    seen_retry = run(old=d.status, obs=obs(wl(CheckState.RETRY), slices=slices))
    assert checks(seen_retry) == [] and st(seen_retry)["phase"] == "Queued"
    # Kueue gave the quota straight back (check Pending again, retryCount 1) before the backoff
    # ended: hold it without any pool until nextAttemptTime.
    back = wl(CheckState.PENDING, retry=1)
    soon = run(old=seen_retry.status, obs=obs(back, now=NOW + timedelta(seconds=5)))
    assert soon.actions == []
    assert st(soon)["phase"] == "Provisioning" and "next attempt at" in st(soon)["message"]
    assert st(soon)["queue"]["retryCount"] == 1
    later = datetime.fromisoformat(next_at.replace("Z", "+00:00")) + timedelta(seconds=1)
    retry2 = run(old=soon.status, obs=obs(back, now=later))
    assert retry2.actions == [CreatePools((0, 1))]
    assert st(retry2)["provisioningAttempts"] == 2


def test_timeout_is_a_retry_too():
    old = {
        "phase": "Provisioning",
        "provisioningAttempts": 1,
        "attemptStartTime": iso(NOW - timedelta(seconds=1801)),
    }
    d = run(old=old, obs=obs(wl(), slices=pools(PoolState.READY, PoolState.CREATING)))
    (retry,) = checks(d)
    assert retry.state == "Retry" and "timeoutSeconds" in retry.message


def test_a_permanent_error_rejects_and_fails():
    bad = PoolError(0, "p0", "INVALID_ARGUMENT", "unknown machine type", True)
    slices = pools(PoolState.FAILED, PoolState.ABSENT, errors={0: bad})
    d = run(old={"phase": "Provisioning"}, obs=obs(wl(), slices=slices))
    (rejected,) = checks(d)
    assert rejected.state == "Rejected" and "INVALID_ARGUMENT" in rejected.message
    assert st(d)["phase"] == "Failed"


def test_a_failed_job_whose_workload_still_holds_quota_is_rejected_after_a_crash():
    failed = {
        "phase": "Failed",
        "completionTime": iso(NOW),
        "conditions": [{"type": "Failed", "status": "True", "reason": "X", "message": "bad"}],
    }
    d = run(old=failed, obs=obs(wl()))
    (rejected,) = checks(d)
    assert rejected.state == "Rejected" and rejected.message == "bad"
    done = run(old=failed, obs=obs(wl(CheckState.REJECTED, active=False)))
    assert checks(done) == []


def test_a_rejected_check_fails_the_job():
    seen = WorkloadObservation(
        "wl", "8", quota_reserved=True, check=CheckObservation(CHECK, "Rejected", "nope")
    )
    d = run(old={"phase": "Provisioning"}, obs=obs(seen, slices=up()))
    assert st(d)["phase"] == "Failed" and "nope" in st(d)["message"]
    # The Workload is finished (Kueue frees the quota: the job's own, no job integration does
    # it), and the pools go.
    assert kinds(d) == ["FinishWorkload", "DeletePools"]
    assert d.actions[0] == FinishWorkload(
        "wl", False, "admission check gang rejected the Workload: nope"
    )


# ---------------------------------------------------------------- admitted, then evicted


def running_obs(workload, **kw):
    return obs(workload, slices=up(), jobset=JobSetObservation(ready_jobs=2, created=NOW), **kw)


def test_preemption_releases_the_pools_counts_once_and_names_the_preemptor():
    before = run(
        old={"phase": "Running", "restarts": 0, "conditions": [
            {"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}]},
        obs=running_obs(wl(CheckState.READY, admitted=True)),
    )  # fmt: skip
    preempted = wl(
        CheckState.PENDING,
        evicted=True,
        eviction_reason="Preempted",
        eviction_message="Preempted to accommodate a workload (UID: u2, JobUID: j2) due to "
        "prioritization in the ClusterQueue",
        eviction_time=NOW + timedelta(seconds=3),
        preempted_by="ns/urgent",
    )
    d = run(
        old=before.status,
        obs=obs(preempted, slices=up(), jobset=JobSetObservation(suspended=True, created=NOW)),
    )
    # Stopped (suspended, no pod): the reservation is given back and the pools go.
    assert d.actions[0] == ReleaseWorkload("multislicejob-job", "7")
    assert kinds(d) == ["ReleaseWorkload", "DeletePools"]
    assert st(d)["phase"] == "Queued"
    assert st(d)["queue"]["preemptions"] == 1
    assert st(d)["queue"]["lastEviction"]["preemptedBy"] == "ns/urgent"
    assert reasons(d).count(Reason.PREEMPTED) == 1
    assert st(d)["restarts"] == 0  # a preemption is not a restart of all slices
    again = run(old=d.status, obs=obs(preempted, slices=absent()))
    assert st(again)["queue"]["preemptions"] == 1 and Reason.PREEMPTED not in reasons(again)
    # Quota again: a fresh gang attempt, counted.
    back = run(old=again.status, obs=obs(wl(CheckState.PENDING, retry=0)))
    assert back.actions == [CreatePools((0, 1))]


def test_an_evicted_job_keeps_its_pools_until_its_jobset_is_suspended_and_its_pods_are_gone():
    """Kueue keeps the quota until the JobSet is no longer active (jobframework, step 6): pools
    deleted earlier end the pods by node shutdown, the Job fails and JobSet restarts every slice,
    a restart counted for a preemption (a CI flake of test_kueue's preemption test)."""
    _, p = spec_and_plan()
    names = [pool.name for pool in p.node_pools]

    def pods(deleting: bool = False) -> list[Pod]:
        return [
            Pod(f"job-slice-{s}-{h}", s, 0, "Running", True, deleting, f"n-{s}-{h}", names[s])
            for s in range(2)
            for h in range(4)
        ]

    running = run(
        old={"phase": "Running", "restarts": 0, "conditions": [
            {"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}]},
        obs=running_obs(wl(CheckState.READY, admitted=True), pods=pods()),
    )  # fmt: skip
    preempted = wl(
        CheckState.READY,
        evicted=True,
        eviction_reason="Preempted",
        eviction_message="Preempted to accommodate a workload",
        eviction_time=NOW,
        preempted_by="ns/urgent",
    )
    # Evicted while it runs: the operator suspends the JobSet (no job integration of Kueue's
    # does: the Workload is the job's); its pods still run on the pools.
    d = run(
        old=running.status,
        obs=obs(preempted, slices=up(), jobset=JobSetObservation(ready_jobs=2, created=NOW),
                pods=pods()),
    )  # fmt: skip
    assert d.actions == [SetJobSetSuspend(True)]
    assert st(d)["phase"] == "Queued" and "once its pods are gone" in st(d)["message"]
    assert d.requeue_after is not None and d.requeue_after <= CFG.resync_seconds
    # Suspended, its pods terminating (their grace period: the SIGTERM checkpoint): still kept.
    later = NOW + timedelta(seconds=5)
    stopping = JobSetObservation(suspended=True, suspended_since=NOW, created=NOW)
    d = run(old=d.status, obs=obs(preempted, slices=up(), jobset=stopping, pods=pods(True),
                                  now=later))  # fmt: skip
    assert d.actions == [], d.actions  # neither the pools nor the quota yet
    assert st(d)["queue"]["preemptions"] == 1 and st(d)["restarts"] == 0
    # Every pod gone: the quota is given back (Kueue requeues the job) and the pools go.
    gone = run(old=d.status, obs=obs(preempted, slices=up(), jobset=stopping, now=later))
    assert gone.actions == [ReleaseWorkload("multislicejob-job", "7"), DeletePools(tuple(names))]
    # A pod stuck past its grace period (30 s, the template sets none) and the margin holds
    # nothing: the pools go anyway.
    stuck = NOW + timedelta(seconds=61)
    d = run(old=d.status, obs=obs(preempted, slices=up(), jobset=stopping, pods=pods(True),
                                  now=stuck))  # fmt: skip
    assert d.actions == [ReleaseWorkload("multislicejob-job", "7"), DeletePools(tuple(names))]
    almost = run(old=d.status, obs=obs(preempted, slices=up(), jobset=stopping, pods=pods(True),
                                       now=NOW + timedelta(seconds=59)))  # fmt: skip
    assert "DeletePools" not in kinds(almost)
    assert almost.requeue_after == pytest.approx(1, abs=0.01)
    # Pods not on the job's pools (pending, unscheduled) hold nothing.
    pending = [Pod("job-slice-0-0", 0, 0, "Pending")]
    d = run(old=running.status, obs=obs(preempted, slices=up(), jobset=stopping, pods=pending,
                                        now=later))  # fmt: skip
    assert d.actions == [ReleaseWorkload("multislicejob-job", "7"), DeletePools(tuple(names))]


def test_a_restart_of_all_slices_inside_an_admitted_job_does_not_requeue():
    old = {
        "phase": "Running",
        "restarts": 0,
        "runningTime": iso(NOW),
        "conditions": [{"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}],
    }
    restarting = obs(
        wl(CheckState.READY, admitted=True),
        slices=up(),
        jobset=JobSetObservation(ready_jobs=0, restarts=1, created=NOW),
    )
    d = run(old=old, obs=restarting)
    assert d.actions == []
    assert st(d)["phase"] == "Restarting" and st(d)["restarts"] == 1
    assert cond(d)["status"] == "True"


def test_a_lost_slice_of_an_admitted_job_is_repaired_alone():
    old = {
        "phase": "Running",
        "conditions": [{"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}],
        "slices": [{"index": i, "hosts": 4, "seenReady": True} for i in range(2)],
    }
    lost = obs(
        wl(CheckState.READY, admitted=True),
        slices=pools(PoolState.READY, PoolState.READY, ready=[4, 0]),
        jobset=JobSetObservation(ready_jobs=1, restarts=1, created=NOW),
    )
    d = run(old=old, obs=lost)
    _, p = spec_and_plan()
    assert d.actions == [DeletePools((p.node_pools[1].name,))]
    assert checks(d) == []


def test_a_deactivated_workload_holds_nothing():
    d = run(obs=obs(wl(active=False, quota_reserved=False), slices=up()))
    assert kinds(d) == ["DeletePools"]
    assert cond(d)["reason"] == Reason.DEACTIVATED


def test_the_queue_message_is_only_said_while_the_job_waits():
    """Issue 56: a Succeeded queued job still said "waiting for Kueue to look at it" in
    status.queue.message (the first pass's hold, carried over). The message is Kueue's word on
    why the job waits: each pass that holds says its own, and none once the job no longer
    waits."""
    fresh = JobMeta("ns", "job", "uid-1", 1, labels=LABELS)
    d = run(obs=Observed(now=NOW, slices=absent(), queue=QueueObservation(LQ)), meta=fresh)
    assert "waiting for Kueue to look at it" in st(d)["queue"]["message"]
    pending = wl(quota_reserved=False, cluster_queue=None, pending_message="3 more needed")
    queued = run(old=d.status, obs=obs(pending))
    assert "3 more needed" in st(queued)["queue"]["message"]
    provisioning = run(old=queued.status, obs=obs(wl()))
    assert st(provisioning)["phase"] == "Provisioning"
    assert "message" not in st(provisioning)["queue"]
    admitted = wl(CheckState.READY, admitted=True)
    jobset = JobSetObservation(ready_jobs=2, created=NOW)
    running = run(old=provisioning.status, obs=obs(admitted, slices=up(), jobset=jobset))
    assert st(running)["phase"] == "Running" and "message" not in st(running)["queue"]
    done = JobSetObservation(completed=True, succeeded_jobs=2, created=NOW)
    succeeded = run(old=running.status, obs=obs(admitted, slices=up(), jobset=done))
    assert st(succeeded)["phase"] == "Succeeded" and "message" not in st(succeeded)["queue"]
    # A status an older operator wrote (the hold's word kept) is corrected by the next pass.
    stale = succeeded.status.model_copy(deep=True)
    assert stale.queue is not None
    stale.queue.message = "Workload w in LocalQueue team-a: waiting for Kueue to look at it"
    again = run(old=stale, obs=obs(admitted, slices=up(), jobset=done))
    assert st(again)["phase"] == "Succeeded" and "message" not in st(again)["queue"]


# ---------------------------------------------------------------- quota only


def test_existing_mode_with_the_check_is_ready_at_once_without_pod_set_updates():
    d = run(obs=obs(wl(), slices=[]), provisioning={"mode": "Existing"})
    (ready,) = d.actions
    assert isinstance(ready, SetAdmissionCheckState)
    assert ready.state == "Ready" and ready.pod_set_updates == ()


def test_existing_mode_quota_only_runs_once_kueue_resumes_it():
    d = run(
        obs=obs(wl(None, admitted=True), slices=[], jobset=JobSetObservation(ready_jobs=2)),
        provisioning={"mode": "Existing"},
    )
    assert d.actions == [] and st(d)["phase"] == "Running"


def test_managed_quota_only_provisions_after_admission():
    admitted = obs(wl(None, admitted=True), slices=absent(), jobset=JobSetObservation(created=NOW))
    d = run(obs=admitted)
    assert d.actions == [CreatePools((0, 1))]
    waiting = run(obs=obs(wl(None), slices=absent()))
    assert waiting.actions == [] and st(waiting)["phase"] == "Starting"


def test_no_queue_label_is_todays_flow():
    plain = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
    d = run(obs=Observed(now=NOW, slices=absent()), meta=plain)
    assert d.actions == [CreatePools((0, 1))]
    assert "queue" not in st(d)


# ---------------------------------------------------------------- the AdmissionCheck object


def test_admission_checks_of_ours_become_active_once_per_generation():
    fresh = AdmissionCheckObservation("gang", generation=1, resource_version="3")
    assert activate([fresh]) == [
        SetAdmissionCheckActive("gang", "3", 1, activate([fresh])[0].message)
    ]
    done = AdmissionCheckObservation("gang", 1, "4", active=True, observed_generation=1)
    assert activate([done]) == []
    changed = AdmissionCheckObservation("gang", 2, "5", active=True, observed_generation=1)
    assert [a.generation for a in activate([changed])] == [2]


def test_a_lost_slice_being_repaired_stays_a_repair_on_the_next_pass():
    """The repair's own status (Provisioned=False, Repairing) is not read as 'the gang is not
    up' on the next pass: that pass started a new gang attempt on the same world (the decide()
    state machine found it: a fixpoint broken, provisioningAttempts 1 -> 2)."""
    old = {
        "phase": "Running",
        "provisioningAttempts": 1,
        "conditions": [{"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}],
        "slices": [{"index": i, "hosts": 4, "seenReady": True} for i in range(2)],
    }
    lost = obs(
        wl(CheckState.READY, admitted=True),
        slices=pools(PoolState.ABSENT, PoolState.READY),
        jobset=JobSetObservation(ready_jobs=1, restarts=1, created=NOW),
    )
    first = run(old=old, obs=lost)
    assert first.actions == [CreatePools((0,))]
    assert cond(first, "Provisioned")["reason"] == Reason.REPAIRING
    creating = obs(
        wl(CheckState.READY, admitted=True),
        slices=pools(PoolState.CREATING, PoolState.READY),
        jobset=JobSetObservation(ready_jobs=1, restarts=1, created=NOW),
    )
    again = run(old=first.status, obs=creating)
    assert cond(again, "Provisioned")["reason"] == Reason.REPAIRING
    assert st(again).get("provisioningAttempts") == 1 and "attemptStartTime" not in st(again)
    assert st(again)["phase"] == "Restarting"
