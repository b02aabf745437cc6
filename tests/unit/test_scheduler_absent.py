"""Issue 56, part 1, in decide(): no TPU held for pods that no scheduler binds.

A small world answers every action decide() returns (pools created and deleted, the JobSet and
its pods created, evictions restarting it) on a clock of 5 s steps, so the deadlines are tested
as they interact over a job's whole life, not one pass at a time: the startup deadline's pool
replacements and restarts must not reset the unschedulable clock, and pods that no scheduler
ever looks at fail the job after the scheduler grace whatever its timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common.pools import PoolState
from multislice_operator.controller import observe as ob
from multislice_operator.controller import reconciler
from multislice_operator.controller.runtime import Indexes, Runtime
from multislice_operator.reconcile import (
    AddFinalizer,
    CreateJobSet,
    CreatePools,
    DecideConfig,
    Decision,
    DeleteJobSet,
    DeletePools,
    EvictPods,
    JobMeta,
    JobSetObservation,
    Pod,
    SliceObservation,
)
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.settings import Settings
from tests.unit import jobs

T0 = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10)
STEP = 5  # seconds between passes
POOL_SECONDS = 20  # a pool is created (or created again) this long after it is asked for
HOSTS = 4
SAYS_NO = "0/8 nodes are available: 8 node(s) didn't match Pod's node affinity/selector."


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass
class World:
    """What the cloud, JobSet, the Job controller and the scheduler do with decide()'s actions.
    `scheduler`: "none" (no scheduler looks at the pods) or "no" (one says Unschedulable)."""

    scheduler: str
    pools: dict[int, float] = field(default_factory=dict)  # slice -> when it is ready
    jobset: int | None = None  # the JobSet's restarts; None: no JobSet
    pods_at: float = 0.0  # when the current attempt's pods were created
    finalizer: bool = False
    creates: int = 0
    deletes: int = 0

    def slices(self, names: list[str], t: float) -> list[SliceObservation]:
        out = []
        for i, name in enumerate(names):
            ready = self.pools.get(i)
            if ready is None:
                out.append(SliceObservation(i, name, PoolState.ABSENT))
            elif t < ready:
                out.append(SliceObservation(i, name, PoolState.CREATING))
            else:
                out.append(SliceObservation(i, name, PoolState.READY, HOSTS))
        return out

    def pods(self, t: float) -> list[Pod]:
        if self.jobset is None or t < self.pods_at:
            return []
        if self.scheduler == "none":
            summaries = [
                ob.summarize_pod(_unseen(i, h, self.jobset, at(self.pods_at)))
                for i in range(2)
                for h in range(HOSTS)
            ]
            return ob.pod_records(summaries, JobSetObservation(restarts=self.jobset))
        since = at(self.pods_at + 1)  # the scheduler's first "no" a moment after the create
        return [
            Pod(
                f"job-slice-{i}-{h}",
                i,
                self.jobset,
                "Pending",
                unschedulable_since=since,
                scheduler_message=SAYS_NO,
            )
            for i in range(2)
            for h in range(HOSTS)
        ]

    def apply(self, d: Decision, names: list[str], t: float) -> None:
        for a in d.actions:
            if isinstance(a, AddFinalizer):
                self.finalizer = True
            elif isinstance(a, CreatePools):
                self.creates += len(a.slices)
                self.pools.update({i: t + POOL_SECONDS for i in a.slices})
            elif isinstance(a, DeletePools):
                self.deletes += len(a.pools)
                for pool in a.pools:
                    self.pools.pop(names.index(pool), None)
            elif isinstance(a, CreateJobSet):
                self.jobset, self.pods_at = 0, t + 1
            elif isinstance(a, EvictPods) and self.jobset is not None:
                self.jobset, self.pods_at = self.jobset + 1, t + STEP + 1  # JobSet recreates
            elif isinstance(a, DeleteJobSet):
                self.jobset = None


def _unseen(index: int, host: int, attempt: int, created: datetime) -> dict[str, Any]:
    """A pod as the apiserver has it when no scheduler has looked at it: no PodScheduled."""
    return {
        "metadata": {
            "name": f"job-slice-{index}-{host}-a{attempt}",
            "creationTimestamp": created.isoformat().replace("+00:00", "Z"),
            "labels": {
                "jobset.sigs.k8s.io/job-index": str(index),
                "jobset.sigs.k8s.io/restart-attempt": str(attempt),
            },
        },
        "spec": {"schedulerName": "volcano", "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


def live(
    world: World, failure_policy: dict[str, Any], horizon: float = 1800
) -> tuple[float, Decision]:
    """Passes every STEP seconds from a new job until it fails (or the horizon): when, and the
    failing pass."""
    template = {"spec": {"containers": [{"name": "c", "image": "i"}]}}
    if world.scheduler == "none":
        template["spec"]["schedulerName"] = "volcano"
    spec, plan = jobs.spec_and_plan(
        provisioning={"mode": "Managed"}, failurePolicy=failure_policy, template=template
    )
    names = [p.name for p in plan.node_pools]
    status: MultisliceJobStatus | None = None
    t = 0.0
    while t <= horizon:
        js = None if world.jobset is None else JobSetObservation(replicas=2, restarts=world.jobset)
        obs = jobs.Observed(now=at(t), slices=world.slices(names, t), jobset=js, pods=world.pods(t))
        meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=world.finalizer)
        d = jobs.run(status, obs, cfg=CFG, meta=meta, plan=(spec, plan))
        world.apply(d, names, t)
        if d.status.phase == "Failed":
            return t, d
        status = d.status
        t += STEP
    raise AssertionError(
        f"still {status.phase if status else None} after {horizon}s: {world.creates} pool "
        f"creates, {world.deletes} deletes; {status.message if status else ''}"
    )


def reason(d: Decision) -> str:
    failed = d.status.condition("Failed")
    assert failed is not None
    return failed.reason


@pytest.mark.parametrize("scheduler", ["no", "none"])
def test_the_startup_deadline_does_not_reset_the_unschedulable_clock(scheduler):
    """startupTimeoutSeconds 30 and unschedulableTimeoutSeconds 60 (issue 56: every ~80 s the
    startup deadline replaced both pools and restarted the job, and each restart reset the
    unschedulable clock: it never failed)."""
    world = World(scheduler)
    fp = {"startupTimeoutSeconds": 30, "unschedulableTimeoutSeconds": 60, "maxRestarts": 5}
    t, d = live(world, fp)
    ready = POOL_SECONDS  # the first capacity is ready then
    # At most one replacement of the pools (the startup deadline's), and failed within the
    # unschedulable timeout of the first capacity plus that one replacement.
    assert world.creates <= 4 and world.deletes <= 2 + 2, (world.creates, world.deletes)
    assert t <= ready + 60 + POOL_SECONDS + STEP, t
    assert reason(d) in (Reason.UNSCHEDULABLE, Reason.SCHEDULER_NOT_RUNNING), d.status.message
    assert not world.pools  # every pool released


@pytest.mark.parametrize("timeout", [600, 7 * 24 * 3600])
def test_pods_no_scheduler_looks_at_fail_after_the_scheduler_grace_whatever_the_timeouts(timeout):
    """schedulerName volcano, nothing runs it: failed once the grace passed since the pods were
    created, not after unschedulableTimeoutSeconds (600 s by default, or a week)."""
    world = World("none")
    fp = {"unschedulableTimeoutSeconds": timeout, "startupTimeoutSeconds": 20}
    t, d = live(world, fp)
    grace = CFG.scheduler_grace_seconds
    first_pods = POOL_SECONDS + 1  # the JobSet is created on the ready capacity, pods a moment on
    assert t <= first_pods + grace + 2 * STEP, t
    assert reason(d) == Reason.SCHEDULER_NOT_RUNNING
    message = d.status.message or ""
    assert "spec.template.spec.schedulerName is 'volcano'" in message, message
    assert f"{grace:.0f}s" in message, message
    assert world.creates == 2 and not world.pools


@dataclass(frozen=True)
class Started:
    """A job of volcano pods whose capacity was ready at 0, its 8 pods created then, and no
    scheduler has looked at them."""

    spec: Any
    plan: Any
    slices: list[SliceObservation]
    unseen: list[Pod]
    old: MultisliceJobStatus

    def observed(self, t: float, pods: list[Pod]) -> Any:
        js = JobSetObservation(replicas=2)
        return jobs.Observed(now=at(t), slices=self.slices, jobset=js, pods=pods)

    def run(self, t: float, pods: list[Pod]) -> Decision:
        return jobs.run(self.old, self.observed(t, pods), cfg=CFG, plan=(self.spec, self.plan))


def started() -> Started:
    template = {"spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "i"}]}}
    spec, plan = jobs.spec_and_plan(provisioning={"mode": "Managed"}, template=template)
    slices = [SliceObservation(i, p.name, PoolState.READY, HOSTS) for i, p in enumerate(plan.pools)]
    unseen = ob.pod_records(
        [ob.summarize_pod(_unseen(i, h, 0, at(0))) for i in range(2) for h in range(HOSTS)],
        JobSetObservation(),
    )
    old = MultisliceJobStatus.from_dict({"phase": "Starting", "capacityReadyTime": at(0)})
    return Started(spec, plan, slices, unseen, old)


def test_a_scheduler_that_looked_at_one_pod_is_there():
    """One pod got the scheduler's verdict (PodScheduled=False): a scheduler runs; the others,
    not looked at yet, are its backlog, judged by the unschedulable deadline alone."""
    job = started()
    seen = replace(job.unseen[0], looked_at=True, scheduler_message=SAYS_NO)
    d = job.run(300, [seen, *job.unseen[1:]])
    assert d.status.phase != "Failed", d.status.message
    assert job.run(300, job.unseen).status.phase == "Failed"


def test_a_gated_pod_is_not_one_a_scheduler_looked_at():
    """The apiserver writes PodScheduled=False (SchedulingGated) on a pod with schedulingGates:
    that is no scheduler's look, and the gated pod waits for its gate, not for a scheduler."""
    job = started()
    body = _unseen(0, 0, 0, at(0))
    body["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
    ]
    (gated,) = ob.pod_records([ob.summarize_pod(body)], JobSetObservation())
    assert not gated.looked_at and gated.unschedulable_since is None
    assert job.run(61, [gated, *job.unseen[1:]]).status.phase == "Failed"  # the others: none


def test_a_scheduler_known_not_to_run_fails_the_job_before_the_first_pool():
    spec, plan = jobs.spec_and_plan(
        provisioning={"mode": "Managed"},
        template={
            "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "i"}]}
        },
    )
    absent = [SliceObservation(i, p.name, PoolState.ABSENT) for i, p in enumerate(plan.pools)]
    obs = jobs.Observed(now=at(0), slices=absent)
    obs.scheduler_absent = "no scheduler looked at the pods of job ns/other"
    meta = JobMeta("ns", "job", "uid-1", 1)
    d = jobs.run(None, obs, cfg=CFG, meta=meta, plan=(spec, plan))
    assert d.status.phase == "Failed" and d.actions == []  # no dry run, finalizer or pool
    assert reason(d) == Reason.SCHEDULER_NOT_RUNNING
    assert "spec.template.spec.schedulerName is 'volcano'" in (d.status.message or "")
    assert "no scheduler looked at the pods of job ns/other" in (d.status.message or "")
    # Once pools exist, it is the grace's to judge, not this verdict's.
    up = [SliceObservation(i, p.name, PoolState.READY, HOSTS) for i, p in enumerate(plan.pools)]
    later = jobs.Observed(now=at(0), slices=up)
    later.scheduler_absent = "no scheduler looked at the pods of job ns/other"
    assert jobs.run(None, later, cfg=CFG, plan=(spec, plan)).status.phase != "Failed"


# ---------------------------------------------------------------- the shell's memory


def test_the_operator_remembers_a_scheduler_no_pod_was_looked_at_by_until_one_is():
    """One job's SchedulerNotRunning (its own pods' evidence) makes the scheduler known not to
    run for the next job naming it; a pod naming it looked at since makes it known to run."""
    rt = Runtime(
        settings=Settings(),
        kube=None,  # type: ignore[arg-type]
        provisioner=None,
        cfg=CFG,
        indexes=Indexes(jobsets={}, pods={}, nodes={}),
    )
    job = started()
    spec, old = job.spec, job.old
    obs = job.observed(61, job.unseen)
    d = job.run(61, job.unseen)
    assert reason(d) == Reason.SCHEDULER_NOT_RUNNING
    assert rt.scheduler_absent("volcano") is None
    reconciler._learn_scheduler(rt, ("ns", "job"), spec, old, obs, d)
    said = rt.scheduler_absent("volcano")
    assert said is not None and "job ns/job" in said
    assert rt.scheduler_absent("default-scheduler") is None
    # The failed job's later passes add nothing; a pod naming it looked at: it runs.
    reconciler._learn_scheduler(rt, ("ns", "job"), spec, d.status, obs, d)
    later = job.observed(90, [replace(job.unseen[0], looked_at=True)])
    reconciler._learn_scheduler(rt, ("ns", "other"), spec, old, later, d)
    assert rt.scheduler_absent("volcano") is None
    # The cluster's own scheduler down for the grace fails that job, but is not remembered:
    # its outage passes, and no job would be left to show that it did.
    default, _ = jobs.spec_and_plan(provisioning={"mode": "Managed"})
    reconciler._learn_scheduler(rt, ("ns", "job"), default, old, obs, d)
    assert rt.scheduler_absent("default-scheduler") is None


# ---------------------------------------------------------------- a scheduler behind, not absent


def test_a_scheduler_seen_at_work_is_behind_and_its_backlog_waits_for_the_unschedulable_deadline():
    """A scheduler that looked at another job's pod within the grace runs: this job's pods not
    looked at yet are its backlog (a 200-job load on a starved machine failed a default-scheduler
    job SchedulerNotRunning while kube-scheduler bound the others' pods). They wait for the
    unschedulable deadline, as pods the scheduler said no to do, and no longer than it."""
    job = started()
    grace = CFG.scheduler_grace_seconds
    behind = job.observed(grace + 30, job.unseen)
    behind.scheduler_working = True
    d = jobs.run(job.old, behind, cfg=CFG, plan=(job.spec, job.plan))
    assert d.status.phase == "Starting", d.status.message
    assert not any(isinstance(a, DeletePools) for a in d.actions)
    # Not seen at work: the grace's verdict, as before.
    assert reason(job.run(grace + 30, job.unseen)) == Reason.SCHEDULER_NOT_RUNNING
    # The unschedulable deadline (600 s by default) ends the wait all the same.
    timeout = job.spec.failure_policy.unschedulable_timeout_seconds
    late = job.observed(timeout + 1, job.unseen)
    late.scheduler_working = True
    d = jobs.run(job.old, late, cfg=CFG, plan=(job.spec, job.plan))
    assert reason(d) == Reason.UNSCHEDULABLE, d.status.message


def test_the_operator_remembers_a_scheduler_at_work_for_the_grace(monkeypatch):
    """A pass that sees a pod naming the scheduler looked at (bound, or given a verdict) makes it
    known to work, for every job naming it, for --scheduler-grace-seconds; then it is forgotten."""
    from multislice_operator.controller import runtime as runtime_module
    from tests.unit.test_forget import Apiserver, runtime

    clock = [1000.0]
    monkeypatch.setattr(runtime_module.time, "monotonic", lambda: clock[0])
    rt = runtime(Apiserver())
    job = started()
    assert not rt.scheduler_working("volcano")
    unseen_pass = job.observed(10, job.unseen)
    reconciler._learn_scheduler(rt, ("ns", "a"), job.spec, job.old, unseen_pass, job.run(10, []))
    assert not rt.scheduler_working("volcano")  # its pods not looked at: no evidence
    seen = job.observed(10, [replace(job.unseen[0], looked_at=True)])
    reconciler._learn_scheduler(rt, ("ns", "a"), job.spec, job.old, seen, job.run(10, []))
    assert rt.scheduler_working("volcano") and not rt.scheduler_working("default-scheduler")
    clock[0] += CFG.scheduler_grace_seconds - 1
    assert rt.scheduler_working("volcano")
    clock[0] += 2
    assert not rt.scheduler_working("volcano")
    rt.expire()
    assert not rt._working_schedulers  # nothing kept past its time (issue 56 part 3)
    # Bounded like the absent ones: a stream of names keeps SCHEDULERS_KEPT at most.
    for i in range(runtime_module.SCHEDULERS_KEPT + 10):
        rt.remember_scheduler(f"s-{i}", None)
    assert len(rt._working_schedulers) == runtime_module.SCHEDULERS_KEPT


def test_every_pass_observes_whether_the_jobs_scheduler_was_seen_at_work():
    import asyncio

    from tests.unit.test_forget import Apiserver, runtime

    rt = runtime(Apiserver())
    rt.provisioner = None
    body: dict[str, Any] = {"metadata": {"name": "job", "namespace": "ns", "uid": "u"}}
    job = started()
    obs = asyncio.run(reconciler.observe_job(rt, ("ns", "job"), body, job.plan, job.spec))
    assert obs.scheduler_working is False
    rt.remember_scheduler("volcano", None)
    obs = asyncio.run(reconciler.observe_job(rt, ("ns", "job"), body, job.plan, job.spec))
    assert obs.scheduler_working is True
