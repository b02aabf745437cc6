"""decide() for issue 14: no bad input, update or blip leaves a job holding TPU node pools
(table tests, pure)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from functools import partial

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common.errors import FieldError, SpecError
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.reconcile import (
    Admission,
    CreateJobSet,
    CreatePools,
    DecideConfig,
    DeleteJobSet,
    DeletePools,
    JobMeta,
    JobSetObservation,
    Observed,
    Pod,
    RemoveFinalizer,
    SliceObservation,
    ValidateJobSet,
    decide,
)
from multislice_operator.reconcile.reasons import Reason
from tests.unit import jobs
from tests.unit.jobs import spec_and_plan

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(
    None,
    backoff_base_seconds=30,
    backoff_max_seconds=600,
    resync_seconds=10,
    not_ready_grace_seconds=60,
)
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
OK = Admission()


_, PLAN = spec_and_plan()
POOL = [p.name for p in PLAN.node_pools]


run = partial(jobs.run, cfg=CFG, now=NOW, meta=META)


def ready(*hosts: int, present: tuple[int, ...] | None = None) -> list[SliceObservation]:
    return [
        SliceObservation(
            i, POOL[i], PoolState.READY, h, present_hosts=(present[i] if present else h)
        )
        for i, h in enumerate(hosts)
    ]


def kinds(d) -> list[str]:
    return [type(a).__name__ for a in d.actions]


def reasons(d) -> list[str]:
    return [e.reason for e in d.events]


def cond(d, ctype: str) -> dict:
    return {c["type"]: c for c in d.status.to_dict()["conditions"]}[ctype]


RUNNING = {
    "phase": "Running",
    "runningTime": "2026-11-30T11:00:00Z",
    "capacityReadyTime": "2026-11-30T11:00:00Z",
    "slices": [{"index": i, "phase": "Running", "hosts": 4, "seenReady": True} for i in range(2)],
}
JS_RUNNING = JobSetObservation(ready_jobs=2, active_jobs=2)
PODS = jobs.running({0: 4, 1: 4})  # a running JobSet has its pods


# ---------------------------------------------------------------- admission before any pool


def test_the_jobset_is_judged_before_any_pool():
    new = JobMeta("ns", "job", "uid-1", 1)
    d = run(
        meta=new, obs=Observed(now=NOW, slices=[SliceObservation(i, POOL[i]) for i in range(2)])
    )
    assert d.actions == [ValidateJobSet()]
    # Nothing else changes until the apiserver answered (a moment later): nothing is written.
    assert d.status == MultisliceJobStatus() and d.events == []


def test_an_existing_mode_job_is_judged_by_its_jobset_create():
    # No capacity to protect: the create itself is the apiserver's verdict (no dry run).
    d = run(
        obs=Observed(
            now=NOW,
            slices=[SliceObservation(i, f"p{i}", PoolState.READY, 4) for i in (0, 1)],
            admission=None,
        ),
        provisioning={"mode": "Existing"},
    )
    assert d.actions == [CreateJobSet()]


def test_a_refused_jobset_fails_the_job_with_the_apiservers_words_and_no_pool():
    refused = Admission(refused='Job.batch "job-slice-0" is invalid: spec.template.labels: bad')
    obs = Observed(
        now=NOW, slices=[SliceObservation(i, POOL[i]) for i in range(2)], admission=refused
    )
    d = run(obs=obs)
    assert "CreatePools" not in kinds(d) and "CreateJobSet" not in kinds(d)
    assert d.status.phase == "Failed"
    assert "spec.template.labels: bad" in (d.status.message or "")
    assert cond(d, "Failed")["reason"] == Reason.JOBSET_REFUSED


def test_a_refusal_after_pools_exist_releases_them():
    refused = Admission(refused="admission webhook denied the request: subdomain")
    d = run(obs=Observed(now=NOW, slices=ready(4, 4), admission=refused))
    assert DeletePools(tuple(POOL)) in d.actions
    assert d.status.phase == "Failed"
    after = run(old=d.status, obs=Observed(now=NOW, slices=ready(4, 4), admission=refused))
    assert DeletePools(tuple(POOL)) in after.actions  # a Failed job keeps releasing until none


# ---------------------------------------------------------------- unschedulable pods


def unschedulable(since: datetime) -> list[Pod]:
    """Slice 0 runs; a pod of slice 1 cannot be placed since `since`."""
    message = "0/8 nodes are available: 8 node(s) didn't match Pod's node affinity/selector."
    stuck = Pod("job-slice-1-0-abc", 1, unschedulable_since=since, scheduler_message=message)
    return [*jobs.running({0: 4}), stuck]


def test_unschedulable_pods_wait_out_the_deadline_from_when_capacity_was_ready():
    old = {**RUNNING, "capacityReadyTime": "2026-11-30T11:58:00Z"}  # 120 s ago
    obs = Observed(
        now=NOW,
        slices=ready(4, 4),
        jobset=JobSetObservation(ready_jobs=1, active_jobs=2),
        admission=OK,
        pods=unschedulable(NOW - timedelta(hours=1)),  # Pending while repairing
    )
    d = run(old=old, obs=obs, failurePolicy={"unschedulableTimeoutSeconds": 300})
    assert d.status.phase != "Failed" and d.actions == []
    assert d.requeue_after == 180


def test_unschedulable_past_the_deadline_fails_with_the_schedulers_reason_and_releases():
    obs = Observed(
        now=NOW,
        slices=ready(4, 4),
        jobset=JobSetObservation(ready_jobs=1, active_jobs=2),
        admission=OK,
        pods=unschedulable(NOW - timedelta(seconds=301)),
    )
    d = run(old=RUNNING, obs=obs, failurePolicy={"unschedulableTimeoutSeconds": 300})
    assert d.status.phase == "Failed"
    assert "didn't match Pod's node affinity/selector" in (d.status.message or "")
    assert "unschedulableTimeoutSeconds" in (d.status.message or "")
    assert cond(d, "Failed")["reason"] == Reason.UNSCHEDULABLE
    assert DeleteJobSet() in d.actions and DeletePools(tuple(POOL)) in d.actions
    # Next pass: the JobSet is being deleted; the Failed status stands and the pools go.
    again = Observed(
        now=NOW,
        slices=ready(4, 4),
        jobset=JobSetObservation(ready_jobs=1, active_jobs=2, deleting=True),
        admission=OK,
    )
    d2 = run(old=d.status, obs=again, failurePolicy={"unschedulableTimeoutSeconds": 300})
    assert d2.status.phase == "Failed" and DeletePools(tuple(POOL)) in d2.actions


def test_the_capacity_clock_starts_when_every_slice_is_ready_and_stops_when_one_is_not():
    old = {k: v for k, v in RUNNING.items() if k != "capacityReadyTime"}
    d = run(
        old=old,
        obs=Observed(now=NOW, slices=ready(4, 4), jobset=JS_RUNNING, pods=PODS, admission=OK),
    )
    assert d.status.capacity_ready_time == NOW
    lost = Observed(now=NOW, slices=ready(4, 0), jobset=JS_RUNNING, pods=PODS, admission=OK)
    assert run(old=d.status, obs=lost).status.capacity_ready_time is None


# ---------------------------------------------------------------- NotReady: a blip, then a loss


def test_a_not_ready_blip_is_an_event_not_a_repair():
    blip = Observed(
        now=NOW, slices=ready(4, 0, present=(4, 4)), jobset=JS_RUNNING, pods=PODS, admission=OK
    )
    d = run(old=RUNNING, obs=blip)
    assert d.actions == []
    assert reasons(d) == [Reason.SLICE_NOT_READY]
    assert d.status.phase == "Running"
    assert cond(d, "Provisioned")["status"] == "True"
    assert d.status.slices[1].not_ready_time == NOW
    assert d.requeue_after == 60
    later = Observed(
        now=NOW + timedelta(seconds=30),
        slices=ready(4, 0, present=(4, 4)),
        jobset=JS_RUNNING,
        pods=PODS,
        admission=OK,
    )
    d2 = run(old=d.status, obs=later)
    assert d2.actions == [] and reasons(d2) == []  # announced once
    back = Observed(
        now=NOW + timedelta(seconds=40),
        slices=ready(4, 4),
        jobset=JS_RUNNING,
        pods=PODS,
        admission=OK,
    )
    d3 = run(old=d2.status, obs=back)
    assert d3.actions == [] and reasons(d3) == [Reason.SLICE_READY]
    assert d3.status.slices[1].not_ready_time is None


def test_not_ready_past_the_grace_period_is_a_lost_slice():
    d = run(
        old=RUNNING,
        obs=Observed(
            now=NOW, slices=ready(4, 1, present=(4, 4)), jobset=JS_RUNNING, pods=PODS, admission=OK
        ),
    )
    late = Observed(
        now=NOW + timedelta(seconds=61),
        slices=ready(4, 1, present=(4, 4)),
        jobset=JS_RUNNING,
        pods=PODS,
        admission=OK,
    )
    d2 = run(old=d.status, obs=late)
    assert d2.actions == [DeletePools((POOL[1],))]
    lost = next(e for e in d2.events if e.reason == Reason.SLICE_LOST)
    assert "NotReady for 61s" in lost.message


def test_nodes_gone_is_a_lost_slice_at_once():
    gone = Observed(
        now=NOW, slices=ready(4, 0, present=(4, 0)), jobset=JS_RUNNING, pods=PODS, admission=OK
    )
    d = run(old=RUNNING, obs=gone)
    assert d.actions == [DeletePools((POOL[1],))]
    assert Reason.SLICE_LOST in reasons(d)


# ---------------------------------------------------------------- status is not a command


def test_a_terminal_status_the_world_contradicts_is_ignored():
    old = {**RUNNING, "phase": "Succeeded", "completionTime": "2026-11-30T11:59:00Z"}
    d = run(
        old=old,
        obs=Observed(now=NOW, slices=ready(4, 4), jobset=JS_RUNNING, pods=PODS, admission=OK),
    )
    assert not any(isinstance(a, DeletePools) for a in d.actions)
    assert Reason.STATUS_IGNORED in reasons(d)
    assert d.status.phase == "Running" and d.status.completion_time is None


def test_a_terminal_status_the_world_confirms_releases():
    old = {**RUNNING, "phase": "Succeeded", "completionTime": "2026-11-30T11:59:00Z"}
    done = JobSetObservation(completed=True, succeeded_jobs=2)
    d = run(old=old, obs=Observed(now=NOW, slices=ready(4, 4), jobset=done, admission=OK))
    assert DeletePools(tuple(POOL)) in d.actions and d.status.phase == "Succeeded"
    # A job that failed before it had a JobSet (nothing can run on its pools) stays Failed.
    failed = {"phase": "Failed", "completionTime": "2026-11-30T11:59:00Z"}
    d2 = run(old=failed, obs=Observed(now=NOW, slices=ready(4, 4), admission=OK))
    assert DeletePools(tuple(POOL)) in d2.actions and d2.status.phase == "Failed"


def test_a_permanent_pool_error_while_running_stops_the_jobset_too():
    err = PoolError(1, POOL[1], "PERMISSION_DENIED", "no", True)
    slices = ready(4, 4)
    slices[1] = SliceObservation(1, POOL[1], PoolState.FAILED, 0, err)
    d = run(
        old=RUNNING,
        obs=Observed(now=NOW, slices=slices, jobset=JS_RUNNING, pods=PODS, admission=OK),
    )
    assert d.status.phase == "Failed"
    assert DeleteJobSet() in d.actions and any(isinstance(a, DeletePools) for a in d.actions)


# ---------------------------------------------------------------- pool-name collisions


def taken(older: bool) -> list[SliceObservation]:
    return [
        SliceObservation(0, POOL[0], PoolState.READY, 4, taken_by="ns/other", taken_by_older=older),
        SliceObservation(1, POOL[1], PoolState.READY, 4),
    ]


def test_a_pool_of_an_older_live_job_fails_this_job_and_is_never_deleted():
    d = run(obs=Observed(now=NOW, slices=taken(True), admission=OK))
    assert d.status.phase == "Failed" and cond(d, "Failed")["reason"] == Reason.POOL_NAME_TAKEN
    assert "ns/other" in (d.status.message or "") and POOL[0] in (d.status.message or "")
    deleted = [p for a in d.actions if isinstance(a, DeletePools) for p in a.pools]
    assert deleted == [POOL[1]]  # ours only
    deleting = JobMeta("ns", "job", "uid-1", 1, deleting=True, has_finalizer=True)
    gone = [SliceObservation(0, POOL[0], PoolState.READY, 4, taken_by="ns/other")]
    gone.append(SliceObservation(1, POOL[1]))
    d2 = run(meta=deleting, old=d.status, obs=Observed(now=NOW, slices=gone, admission=OK))
    assert d2.actions == [RemoveFinalizer()]  # the other job's pool does not hold us


def test_an_older_job_waits_for_the_younger_one_to_release_its_name():
    d = run(obs=Observed(now=NOW, slices=taken(False), admission=OK))
    assert d.status.phase == "Provisioning"
    assert not any(isinstance(a, DeletePools | CreatePools | CreateJobSet) for a in d.actions)
    assert "waiting for job ns/other" in (d.status.message or "")


# ---------------------------------------------------------------- strays: never leak


def test_pools_of_this_uid_that_no_plan_names_are_released_in_any_mode():
    obs = Observed(
        now=NOW,
        slices=[SliceObservation(i, f"p{i}", PoolState.READY, 4) for i in (0, 1)],
        admission=OK,
        strays={"msj-job-old-0": PoolState.READY, "msj-job-old-1": PoolState.DELETING},
    )
    d = run(obs=obs, provisioning={"mode": "Existing"})
    assert d.actions[0] == DeletePools(("msj-job-old-0",))
    deleting = JobMeta("ns", "job", "uid-1", 1, deleting=True, has_finalizer=True)
    d2 = run(meta=deleting, obs=obs, provisioning={"mode": "Existing"})
    assert RemoveFinalizer() not in d2.actions  # a pool of ours still exists
    obs.strays = {}
    assert run(meta=deleting, obs=obs, provisioning={"mode": "Existing"}).actions == [
        RemoveFinalizer()
    ]


def test_an_invalid_job_still_releases_its_pools_and_jobset():
    err = SpecError([FieldError("spec.template", "no longer valid")])
    obs = Observed(now=NOW, strays={POOL[0]: PoolState.READY}, jobset=JS_RUNNING, pods=PODS)
    deleting = JobMeta("ns", "job", "uid-1", 1, deleting=True, has_finalizer=True)
    d = decide(deleting, None, None, err, MultisliceJobStatus(), obs, CFG)
    assert DeleteJobSet() in d.actions and DeletePools((POOL[0],)) in d.actions
    assert RemoveFinalizer() not in d.actions
    obs = Observed(now=NOW)
    d2 = decide(deleting, None, None, err, d.status, obs, CFG)
    assert d2.actions == [RemoveFinalizer()]


def test_a_slice_without_any_pod_fails_after_the_deadline():
    def obs(pods: dict[int, int]) -> Observed:
        return Observed(
            now=NOW,
            slices=ready(4, 4),
            jobset=JobSetObservation(ready_jobs=1, active_jobs=1),
            admission=OK,
            pods=jobs.running(pods),
        )

    # A first start (Starting): the capacity clock counts.
    old = {"phase": "Starting", "capacityReadyTime": "2026-11-30T11:58:00Z"}  # 120 s ago
    fresh = run(old=old, obs=obs({0: 4}), failurePolicy={"unschedulableTimeoutSeconds": 300})
    assert fresh.status.phase != "Failed" and fresh.requeue_after == 180
    late = run(old=old, obs=obs({0: 4}), failurePolicy={"unschedulableTimeoutSeconds": 100})
    assert (
        late.status.phase == "Failed" and cond(late, "Failed")["reason"] == Reason.PODS_NOT_CREATED
    )
    assert "kubectl describe job job-slice-1" in (late.status.message or "")
    assert DeleteJobSet() in late.actions and DeletePools(tuple(POOL)) in late.actions
    every = run(old=old, obs=obs({0: 4, 1: 4}), failurePolicy={"unschedulableTimeoutSeconds": 100})
    assert every.status.phase != "Failed"


def test_the_clock_does_not_run_while_a_queue_keeps_the_jobset_suspended():
    queued = Observed(
        now=NOW,
        slices=ready(4, 4),
        jobset=JobSetObservation(suspended=True),
        admission=OK,
    )
    d = run(old=RUNNING, obs=queued)
    assert d.status.capacity_ready_time is None


def test_a_slice_of_a_job_that_ran_an_hour_loses_its_pods_a_moment_and_is_not_failed():
    """A drained node's Job fails before JobSet recreates the slices (or a restart's new pods
    come): for that moment a slice has no pod. The deadline counts from that moment, not from
    when the capacity was first ready an hour ago (it failed such a job on real nodes)."""
    policy = {"unschedulableTimeoutSeconds": 600}
    gap = Observed(
        now=NOW,
        slices=ready(4, 4),
        jobset=JobSetObservation(ready_jobs=1, active_jobs=1, replicas=2),
        admission=OK,
        pods=jobs.running({0: 4}),
    )
    first = run(old=RUNNING, obs=gap, failurePolicy=policy)  # capacity ready at 11:00
    assert first.status.phase != "Failed", first.status.message
    assert first.status.scheduling is not None
    assert first.status.scheduling.pods_missing_since == NOW
    later = NOW + timedelta(seconds=601)
    gone = run(old=first.status, obs=dataclasses.replace(gap, now=later), now=later,
               failurePolicy=policy)  # fmt: skip
    assert gone.status.phase == "Failed"
    assert cond(gone, "Failed")["reason"] == Reason.PODS_NOT_CREATED
    back = run(old=first.status, obs=dataclasses.replace(gap, pods=jobs.running({0: 4, 1: 4})),
               failurePolicy=policy)  # fmt: skip
    assert back.status.phase != "Failed"
    assert back.status.scheduling is None or back.status.scheduling.pods_missing_since is None
