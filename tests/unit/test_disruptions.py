"""Table tests for issue 15 in decide(): restarts by cause and their budgets, maintenance ahead
of time, checkpoints on demand, the startup deadline. Plain observed data in, status out."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolState
from multislice_operator.controller.observe import (
    checkpoint_saved,
    jobset_observation,
    maintenance_observations,
    pod_records,
    summarize_jobset,
    summarize_node,
    summarize_pod,
)
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.reconcile import (
    AnnotatePods,
    DecideConfig,
    DeleteJobSet,
    DeletePools,
    EvictPods,
    JobMeta,
    JobSetObservation,
    NodeMaintenance,
    Observed,
    Pod,
    SliceObservation,
)
from multislice_operator.reconcile.reasons import Reason
from tests.unit import jobs
from tests.unit.jobs import failed, succeeded

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10)


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def job(mode: str = "Existing", annotations: dict[str, str] | None = None, **spec):
    body = {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": "job", "namespace": "ns", "annotations": annotations or {}},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "provisioning": {"mode": mode},
            "template": {"spec": {"containers": [{"name": "train", "image": "i"}]}},
            **spec,
        },
    }
    j = load_job(body)
    return j.spec, plan_job(j)


def meta(annotations: dict[str, str] | None = None) -> JobMeta:
    return JobMeta("ns", "job", "uid-1", 1, has_finalizer=True, annotations=annotations or {})


EXISTING = [SliceObservation(i, f"pool-{i}", PoolState.READY, 4) for i in range(2)]


def run(old, js, failures=(), t=0.0, pods=(), maint=(), annotations=None, slices=None, **spec):
    """One pass of `job(**spec)` (on existing pools) at `t` seconds, its JobSet `js`."""
    # Not a copy of jobs.run: it builds this file's observation (pools, JobSet, failed pods,
    # maintenance) and job (provisioning mode, annotations), then hands them to jobs.run.
    mode = spec.pop("mode", "Existing")
    obs = Observed(
        now=at(t),
        slices=list(EXISTING if slices is None else slices),
        jobset=js,
        pods=[*failures, *pods],
        maintenance=list(maint),
    )
    return jobs.run(old, obs, cfg=CFG, meta=meta(annotations), plan=job(mode, **spec))


def by_cause(d) -> dict[str, int]:
    return d.status.to_dict().get("restartsByCause", {})


def reasons(d) -> list[str]:
    return [e.reason for e in d.events]


def preempted(attempt: int, pod: str = "job-slice-1-0-a") -> Pod:
    return failed(pod, 1, 143, "Terminated", attempt, disruption="TerminationByKubelet")


def crashed(attempt: int, code: int = 1, reason: str | None = None) -> Pod:
    return failed("job-slice-0-2-b", 0, code, "Error", attempt, termination_reason=reason)


# ---------------------------------------------------------------- restarts by cause


def test_three_preemptions_are_disruptions_not_charged_to_max_restarts():
    status: MultisliceJobStatus | dict = {"phase": "Running"}
    for n in range(1, 4):
        js = JobSetObservation(restarts=n, restarts_counted=0)
        d = run(status, js, [preempted(n - 1)], failurePolicy={"maxRestarts": 1})
        status = d.status
        (event,) = [e for e in d.events if e.reason == Reason.RESTARTING_ALL_SLICES]
        assert event.cause == "disruption"
        assert "not charged to maxRestarts" in event.message
        assert f"{n}/30 of spec.failurePolicy.maxDisruptionRestarts" in event.message
        assert "DisruptionTarget: TerminationByKubelet" in event.message
    assert status.restarts == 3
    assert by_cause(d) == {"disruption": 3, "workload": 0, "hang": 0, "startup": 0, "resize": 0}
    assert d.status.last_failure is not None
    assert (d.status.last_failure.cause, d.status.last_failure.disruption) == (
        "disruption",
        "TerminationByKubelet",
    )
    assert d.status.last_restart is not None and d.status.last_restart.cause == "disruption"
    assert d.status.phase == "Restarting"


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        (crashed(0), "workload"),
        (crashed(0, 42), "workload"),  # restart requested (xpk's convention)
        (crashed(0, 75), "hang"),
        (crashed(0, 1, "hang"), "hang"),  # the termination message says so
    ],
)
def test_charged_restarts_are_the_programs_own(failure, cause):
    d = run({"phase": "Running"}, JobSetObservation(restarts=1, restarts_counted=1), [failure])
    assert by_cause(d)[cause] == 1 and sum(by_cause(d).values()) == 1
    assert d.status.last_failure is not None and d.status.last_failure.cause == cause
    (event,) = [e for e in d.events if e.reason == Reason.RESTARTING_ALL_SLICES]
    assert event.cause == cause and "1/10 of spec.failurePolicy.maxRestarts" in event.message


def stopped(name: str, slice_index: int, t: float, attempt: int = 0) -> Pod:
    """A pod the restart stopped: a kubelet reports it Failed (SIGTERM, 143) before it goes,
    and the workload says where the run stood on its way out."""
    p = failed(name, slice_index, 143, "Error", attempt, step=120, checkpoint_step=100)
    return replace(p, failed_at=at(t), deleting=True)


def test_last_failure_is_the_pod_that_failed_not_those_the_restart_stopped():
    """The program of job-slice-1-0 exits 13 at t=0; JobSet restarts every slice, so the other
    pods are stopped (Failed, 143) a few seconds later and linger until the Job controller lets
    them go. Seen together, or after the failed pod is gone, lastFailure stays job-slice-1-0."""
    victim = replace(failed("job-slice-1-0", 1, 13, step=120, checkpoint_step=100), failed_at=at(0))
    others = [stopped("job-slice-0-0", 0, 3), stopped("job-slice-0-3", 0, 4)]
    js = JobSetObservation(restarts=1, restarts_counted=1)
    first = run({"phase": "Running"}, js, [*others, victim], t=5)
    failure = first.status.last_failure
    assert failure is not None and (failure.pod, failure.exit_code) == ("job-slice-1-0", 13)
    (event,) = [e for e in first.events if e.reason == Reason.RESTARTING_ALL_SLICES]
    assert "job-slice-1-0" in event.message and "exit code 13" in event.message
    # The failed pod is gone; the stopped ones are still there: the record stays.
    later = run(first.status, js, others, t=8)
    assert later.status.last_failure == failure
    # A failure of the next attempt replaces it.
    again = run(later.status, JobSetObservation(restarts=2, restarts_counted=2),
                [*others, crashed(1)], t=60)  # fmt: skip
    assert again.status.last_failure is not None
    assert (again.status.last_failure.pod, again.status.last_failure.restart_attempt) == (
        "job-slice-0-2-b", 1
    )  # fmt: skip


def test_within_one_second_the_pod_not_stopped_is_the_failure():
    victim = replace(failed("job-slice-1-0", 1, 13), failed_at=at(0))
    d = run({"phase": "Running"}, JobSetObservation(restarts=1, restarts_counted=1),
            [stopped("job-slice-0-0", 0, 0), victim])  # fmt: skip
    assert d.status.last_failure is not None and d.status.last_failure.pod == "job-slice-1-0"


def test_jobset_counters_decide_what_was_charged_even_without_the_pod():
    old = {"phase": "Running", "restarts": 3, "restartsByCause": {"disruption": 3}}
    d = run(old, JobSetObservation(restarts=5, restarts_counted=1))  # two more: one charged
    assert by_cause(d) == {"disruption": 4, "workload": 1, "hang": 0, "startup": 0, "resize": 0}


def test_a_status_from_before_the_split_is_seeded_from_the_jobset():
    d = run({"phase": "Running", "restarts": 3}, JobSetObservation(restarts=4, restarts_counted=2))
    # What JobSet charged is the program's (2), the rest disruptions: the new one too.
    assert by_cause(d) == {"disruption": 2, "workload": 2, "hang": 0, "startup": 0, "resize": 0}


def test_no_restart_no_split_written():
    d = run({"phase": "Starting"}, JobSetObservation(ready_jobs=2))
    assert "restartsByCause" not in d.status.to_dict()


def test_max_restarts_message_counts_only_the_programs_failures():
    old = {
        "phase": "Restarting",
        "restarts": 4,
        "restartsByCause": {"disruption": 3, "workload": 1},
    }
    js = JobSetObservation(
        failed=True, restarts=4, restarts_counted=1, failure_reason="ReachedMaxRestarts"
    )
    d = run(old, js, [crashed(4, 13)], failurePolicy={"maxRestarts": 1})
    message = d.status.message or ""
    assert d.status.phase == "Failed"
    assert "restarted 1 times for the program's own failures (workload 1, hang 0)" in message
    assert "maxRestarts (1)" in message and "3 disruption/startup restarts not counted" in message


def test_fatal_message_names_the_policy_field():
    js = JobSetObservation(failed=True, failure_reason="FailJobSetFailurePolicyAction")
    d = run({"phase": "Running"}, js, [crashed(0, 78)])
    assert "non-retryable code 78 (spec.failurePolicy.nonRetryableExitCodes)" in (
        d.status.message or ""
    )
    xpk = run(
        {"phase": "Running"},
        js,
        [crashed(0, 1)],
        failurePolicy={"exitCodePolicy": "RestartIfListed"},
    )
    assert "non-retryable code 1 (not in spec.failurePolicy.restartExitCodes)" in (
        xpk.status.message or ""
    )


def test_disruption_budget_fails_the_job_then_its_jobset_is_deleted():
    old = {"phase": "Running", "restarts": 2, "restartsByCause": {"disruption": 2}}
    js = JobSetObservation(restarts=3, ready_jobs=0)
    d = run(old, js, [preempted(2)], failurePolicy={"maxDisruptionRestarts": 2})
    assert d.status.phase == "Failed"
    cond = d.status.condition("Failed")
    assert cond is not None and cond.reason == Reason.MAX_DISRUPTION_RESTARTS
    assert "more than spec.failurePolicy.maxDisruptionRestarts (2)" in cond.message
    assert Reason.MAX_DISRUPTION_RESTARTS in reasons(d)
    # The verdict's own actions in the same pass (the shell writes the status, which says why,
    # before it applies them): the JobSet would restart the slices forever.
    assert d.actions == [DeleteJobSet()]
    after = run(d.status, js, failurePolicy={"maxDisruptionRestarts": 2})
    assert DeleteJobSet() in after.actions and after.status.phase == "Failed"
    gone = run(after.status, None, failurePolicy={"maxDisruptionRestarts": 2})
    assert DeleteJobSet() not in gone.actions and gone.status.phase == "Failed"


def test_within_the_disruption_budget_the_job_goes_on():
    old = {"phase": "Running", "restarts": 1, "restartsByCause": {"disruption": 1}}
    d = run(
        old,
        JobSetObservation(restarts=2),
        [preempted(1)],
        failurePolicy={"maxDisruptionRestarts": 2},
    )
    assert d.status.phase == "Restarting"


def test_a_jobset_that_failed_on_its_own_is_not_deleted():
    js = JobSetObservation(failed=True, failure_reason="ReachedMaxRestarts")
    d = run({"phase": "Failed", "conditions": [{"type": "Failed", "status": "True"}]}, js)
    assert DeleteJobSet() not in d.actions


# ---------------------------------------------------------------- observation


def test_pod_summary_carries_disruption_schedule_and_checkpoint_fields():
    pod = {
        "metadata": {
            "name": "job-slice-1-0-a",
            "labels": {keys.JOBSET_JOB_INDEX: "1", keys.JOBSET_RESTART_ATTEMPT: "2"},
            "annotations": {
                keys.CHECKPOINT_REQUEST: "1733050000",
                keys.CHECKPOINT_SAVED: '{"id": "1733050000", "step": 120}',
            },
        },
        "spec": {"nodeName": "node-a"},
        "status": {
            "phase": "Failed",
            "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}
            ],
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": 75,
                            "reason": "Error",
                            "message": '{"v": 1, "reason": "hang", "exitCode": 75, '
                            '"step": 123, "checkpointStep": 120, '
                            '"checkpointRequest": {"id": "7", "step": 120}}',
                        }
                    }
                }
            ],
        },
    }
    s = summarize_pod(pod)
    assert (s["node"], s["disruption"], s["termination"].reason) == (
        "node-a",
        "PreemptionByScheduler",
        "hang",
    )
    assert s["termination"].checkpoint_request == ("7", 120)
    assert s["checkpointRequest"] == "1733050000"
    assert s["checkpointSaved"] == ("1733050000", 120)
    pending = summarize_pod(
        {
            "metadata": {"name": "p", "labels": {keys.JOBSET_JOB_INDEX: "0"}},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
                ],
            },
        }
    )
    (view,) = [p for p in pod_records([pending, s], JobSetObservation()) if p.live]
    assert view == Pod("p", 0, 0, "Pending", unschedulable_since=None)  # no time: creation


@pytest.mark.parametrize(
    "text",
    [None, "", "not json", '{"id": 1, "step": 2}', '{"id": "a"}', '{"id": "a", "step": true}'],
)
def test_a_malformed_acknowledgement_says_nothing(text):
    assert checkpoint_saved(text) is None


def test_jobset_summary_reads_the_charged_restarts():
    body = {"status": {"restarts": 4, "restartsCountTowardsMax": 1}, "metadata": {}}
    js = jobset_observation(summarize_jobset(body))
    assert js is not None and (js.restarts, js.restarts_counted) == (4, 1)
    zero = jobset_observation(summarize_jobset({"status": {"restarts": 2}, "metadata": {}}))
    assert zero is not None and zero.restarts_counted == 0  # omitempty: absent is 0


def node(name: str, pool: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": {keys.GKE_NODEPOOL: pool, **labels}}}


def test_maintenance_is_read_from_the_jobs_nodes_only():
    epoch = int(at(3600).timestamp())
    nodes = {
        "pool-a": [
            summarize_node(
                node("a-0", "pool-a", **{keys.GKE_SCHEDULED_MAINTENANCE_TIME: str(epoch)})
            ),
            summarize_node(node("a-1", "pool-a")),
        ],
        "pool-x": [  # another job's pool: its maintenance is not ours
            summarize_node(node("x-0", "pool-x", **{keys.GKE_SCHEDULED_MAINTENANCE_TIME: "5"})),
        ],
        "pool-b": [
            summarize_node(node("b-0", "pool-b", **{keys.GKE_ACTIVE_NODE_MAINTENANCE: "ONGOING"})),
        ],
    }
    _, plan = job("Existing")
    pods = [
        Pod("p0", 0, 0, "Running", True, node="a-0"),
        Pod("p1", 1, 0, "Running", True, node="b-0"),
    ]
    found = maintenance_observations(plan, nodes, pods)
    assert found == [
        NodeMaintenance("a-0", "pool-a", 0, time=datetime.fromtimestamp(epoch, UTC)),
        NodeMaintenance("b-0", "pool-b", 1, active=True),
    ]
    tainted = summarize_node(
        {
            "metadata": {"name": "t", "labels": {keys.GKE_NODEPOOL: "p"}},
            "spec": {
                "taints": [{"key": keys.GKE_IMPENDING_NODE_TERMINATION, "effect": "NoSchedule"}]
            },
        }
    )
    assert tainted["maintenanceActive"] is True


def test_managed_maintenance_maps_pools_to_slices():
    _, plan = job("Managed")
    pool = plan.node_pools[1].name
    nodes = {
        pool: [
            summarize_node(node("n", pool, **{keys.GKE_SCHEDULED_MAINTENANCE_TIME: "1900000000"}))
        ]
    }
    (m,) = maintenance_observations(plan, nodes, [])
    assert (m.slice_index, m.pool) == (1, pool)
    # A pod of an attempt that ended does not say which slice the node serves now.
    old = [Pod("p", 0, 0, "Running", True, node="n")]
    (m,) = maintenance_observations(plan, nodes, old, attempt=1)
    assert m.slice_index == 1
    (m,) = maintenance_observations(plan, nodes, old, attempt=0)
    assert m.slice_index == 0


def conditioned(name: str, pool: str, *conds: tuple[str, str, str | None]) -> dict:
    """A node of `pool` with these (type, status, lastTransitionTime) conditions."""
    body = node(name, pool)
    body["status"] = {
        "conditions": [
            {"type": t, "status": s, **({"lastTransitionTime": since} if since else {})}
            for t, s, since in conds
        ]
    }
    return body


def test_maintenance_planned_condition_is_announced_maintenance():
    # Kubernetes 1.37 (KEP-5683, gate NodeLifecycleConditions): the admin sets MaintenancePlanned
    # (no time: read as due since it turned True) and MaintenanceInProgress (runs now).
    nodes = {
        "pool-a": [
            summarize_node(
                conditioned(
                    "a-0",
                    "pool-a",
                    ("Ready", "True", None),
                    ("MaintenancePlanned", "True", "2026-11-30T11:00:00Z"),
                )
            ),
            summarize_node(
                conditioned(
                    "a-1", "pool-a", ("MaintenancePlanned", "False", "2026-11-30T10:00:00Z")
                )
            ),
        ],
        "pool-b": [
            summarize_node(
                conditioned(
                    "b-0",
                    "pool-b",
                    ("MaintenancePlanned", "True", "2026-11-30T11:30:00Z"),
                    ("MaintenanceInProgress", "True", "2026-11-30T11:50:00Z"),
                )
            ),
            summarize_node(conditioned("b-1", "pool-b", ("MaintenancePlanned", "True", None))),
        ],
    }
    _, plan = job("Existing")
    pods = [
        Pod("p0", 0, 0, "Running", True, node="a-0"),
        Pod("p1", 0, 0, "Running", True, node="a-1"),
        Pod("p2", 1, 0, "Running", True, node="b-0"),
        Pod("p3", 1, 0, "Running", True, node="b-1"),
    ]
    found = maintenance_observations(plan, nodes, pods)
    assert [m.node for m in found] == ["a-0", "b-0", "b-1"]
    assert found == [
        NodeMaintenance("a-0", "pool-a", 0, planned=True, planned_since=at(-3600)),
        NodeMaintenance("b-0", "pool-b", 1, active=True, planned=True, planned_since=at(-1800)),
        NodeMaintenance("b-1", "pool-b", 1, planned=True),
    ]


# ---------------------------------------------------------------- maintenance


def maint(seconds: float, slice_index: int = 1, active: bool = False) -> NodeMaintenance:
    return NodeMaintenance(
        f"n-{slice_index}", f"pool-{slice_index}", slice_index, at(seconds), None, active
    )


RUNNING = JobSetObservation(ready_jobs=2)


def pods_of(attempt: int = 0, annotated: str | None = None) -> list[Pod]:
    return [
        Pod(f"job-slice-{s}-{h}", s, attempt, "Running", True, checkpoint_request=annotated)
        for s in range(2)
        for h in range(4)
    ]


def test_maintenance_shows_the_earliest_time_and_slices_and_announces_once():
    d = run({"phase": "Running"}, RUNNING, maint=[maint(7200, 1), maint(3600, 0)], pods=pods_of())
    cond = d.status.condition("MaintenanceScheduled")
    assert cond is not None and (cond.status, cond.reason) == ("True", Reason.MAINTENANCE_SCHEDULED)
    assert "2026-11-30T13:00:00Z" in cond.message and "slices 0, 1" in cond.message
    assert d.status.maintenance is not None
    assert (d.status.maintenance.time, d.status.maintenance.slices) == (at(3600), [0, 1])
    assert reasons(d).count(Reason.MAINTENANCE_SCHEDULED) == 1
    assert not [a for a in d.actions if isinstance(a, AnnotatePods)]  # no checkpointAheadSeconds
    again = run(d.status, RUNNING, maint=[maint(7200, 1), maint(3600, 0)], pods=pods_of(), t=5)
    assert Reason.MAINTENANCE_SCHEDULED not in reasons(again)
    over = run(again.status, RUNNING, pods=pods_of(), t=10)
    cond = over.status.condition("MaintenanceScheduled")
    assert cond is not None and (cond.status, cond.reason) == (
        "False",
        Reason.NO_MAINTENANCE_SCHEDULED,
    )
    assert over.status.maintenance is None


def test_a_job_that_never_saw_maintenance_has_no_such_condition():
    d = run({"phase": "Running"}, RUNNING, pods=pods_of())
    assert d.status.condition("MaintenanceScheduled") is None


def test_maintenance_in_progress():
    d = run({"phase": "Running"}, RUNNING, maint=[maint(-5, 1, active=True)], pods=pods_of())
    cond = d.status.condition("MaintenanceScheduled")
    assert cond is not None and cond.reason == Reason.MAINTENANCE_IN_PROGRESS


def test_checkpoint_requested_ahead_of_maintenance_on_every_pod():
    spec = {"maintenance": {"checkpointAheadSeconds": 600}}
    early = run({"phase": "Running"}, RUNNING, maint=[maint(3600)], pods=pods_of(), **spec)
    assert not [a for a in early.actions if isinstance(a, AnnotatePods)]
    assert early.requeue_after is not None and early.requeue_after <= 3000
    due = run(early.status, RUNNING, maint=[maint(3600)], pods=pods_of(), t=3000, **spec)
    (ann,) = [a for a in due.actions if isinstance(a, AnnotatePods)]
    rid = f"maint-{int(at(3600).timestamp())}"
    assert (ann.key, ann.value, len(ann.pods)) == (keys.CHECKPOINT_REQUEST, rid, 8)
    cp = due.status.checkpoint
    assert cp is not None and (cp.request_id, cp.source, cp.request_time) == (
        rid,
        "maintenance",
        at(3000),
    )
    assert Reason.CHECKPOINT_REQUESTED in reasons(due)
    # Annotated: nothing more to do, and the same window is not asked twice.
    done = run(due.status, RUNNING, maint=[maint(3600)], pods=pods_of(0, rid), t=3010, **spec)
    assert not [a for a in done.actions if isinstance(a, AnnotatePods)]
    assert Reason.CHECKPOINT_REQUESTED not in reasons(done)
    assert done.status.checkpoint is not None and done.status.checkpoint.pods_annotated == 8


def test_maintenance_seen_late_asks_at_once():
    spec = {"maintenance": {"checkpointAheadSeconds": 600}}
    d = run({"phase": "Running"}, RUNNING, maint=[maint(60)], pods=pods_of(), **spec)
    assert [a for a in d.actions if isinstance(a, AnnotatePods)]


def planned(since: float | None, slice_index: int = 1, active: bool = False) -> NodeMaintenance:
    """A node whose condition MaintenancePlanned is True since `since` (None: not said)."""
    return NodeMaintenance(
        f"n-{slice_index}",
        f"pool-{slice_index}",
        slice_index,
        active=active,
        planned=True,
        planned_since=None if since is None else at(since),
    )


def test_maintenance_planned_is_due_since_it_was_set_and_asks_a_checkpoint_at_once():
    spec = {"maintenance": {"checkpointAheadSeconds": 600}}
    d = run({"phase": "Running"}, RUNNING, maint=[planned(-60)], pods=pods_of(), **spec)
    cond = d.status.condition("MaintenanceScheduled")
    assert cond is not None and (cond.status, cond.reason) == ("True", Reason.MAINTENANCE_SCHEDULED)
    assert "MaintenancePlanned" in cond.message and "2026-11-30T11:59:00Z" in cond.message
    assert "GKE" not in cond.message
    assert d.status.maintenance is not None
    assert (d.status.maintenance.time, d.status.maintenance.slices) == (at(-60), [1])
    rid = f"maint-{int(at(-60).timestamp())}"
    (ann,) = [a for a in d.actions if isinstance(a, AnnotatePods)]
    assert (ann.key, ann.value) == (keys.CHECKPOINT_REQUEST, rid)
    # GKE's later window on another node does not hide it: the earliest wins.
    both = run({"phase": "Running"}, RUNNING, maint=[maint(3600, 0), planned(-60)], pods=pods_of())
    assert both.status.maintenance is not None and both.status.maintenance.time == at(-60)


def test_a_node_reporting_maintenance_planned_asks_the_checkpoint():
    # From the node as the apiserver serves it to the decision: no GKE label at all.
    body = conditioned("b-0", "pool-1", ("MaintenancePlanned", "True", "2026-11-30T11:59:00Z"))
    _, plan = job("Existing")
    pods = [Pod("p", 1, 0, "Running", True, node="b-0")]
    found = maintenance_observations(plan, {"pool-1": [summarize_node(body)]}, pods)
    spec = {"maintenance": {"checkpointAheadSeconds": 600}}
    d = run({"phase": "Running"}, RUNNING, maint=found, pods=pods_of(), **spec)
    cond = d.status.condition("MaintenanceScheduled")
    assert cond is not None and cond.status == "True"
    (ann,) = [a for a in d.actions if isinstance(a, AnnotatePods)]
    assert ann.value == f"maint-{int(at(-60).timestamp())}"


def test_maintenance_planned_without_a_time_is_due_from_first_sight_and_stays_so():
    spec = {"maintenance": {"checkpointAheadSeconds": 600}}
    d = run({"phase": "Running"}, RUNNING, maint=[planned(None)], pods=pods_of(), **spec)
    assert d.status.maintenance is not None and d.status.maintenance.time == at(0)
    rid = f"maint-{int(at(0).timestamp())}"
    (ann,) = [a for a in d.actions if isinstance(a, AnnotatePods)]
    assert ann.value == rid
    again = run(d.status, RUNNING, maint=[planned(None)], pods=pods_of(0, rid), t=30, **spec)
    assert again.status.maintenance is not None and again.status.maintenance.time == at(0)
    assert not [a for a in again.actions if isinstance(a, AnnotatePods)]
    assert Reason.MAINTENANCE_SCHEDULED not in reasons(again)


def test_maintenance_in_progress_condition():
    d = run({"phase": "Running"}, RUNNING, maint=[planned(-5, active=True)], pods=pods_of())
    cond = d.status.condition("MaintenanceScheduled")
    assert cond is not None and cond.reason == Reason.MAINTENANCE_IN_PROGRESS
    assert "MaintenanceInProgress" in cond.message and "hosts stop" not in cond.message


# ---------------------------------------------------------------- checkpoint on demand

USER = {keys.CHECKPOINT_REQUEST: "1733050000"}


def test_a_users_request_reaches_every_pod_including_later_ones():
    some = pods_of()[:5]
    d = run({"phase": "Running"}, RUNNING, pods=some, annotations=USER)
    (ann,) = [a for a in d.actions if isinstance(a, AnnotatePods)]
    assert ann.value == "1733050000" and len(ann.pods) == 5
    cp = d.status.checkpoint
    assert cp is not None and (cp.source, cp.user_request, cp.restart_attempt) == (
        "user",
        "1733050000",
        0,
    )
    annotated = [
        Pod(p.name, p.slice_index, 0, "Running", True, checkpoint_request="1733050000")
        for p in some
    ]
    later = [*annotated, Pod("job-slice-1-9", 1, 0, "Pending")]
    again = run(d.status, RUNNING, pods=later, annotations=USER, t=5)
    (ann,) = [a for a in again.actions if isinstance(a, AnnotatePods)]
    assert ann.pods == ("job-slice-1-9",)
    assert Reason.CHECKPOINT_REQUESTED not in reasons(again)


def test_the_saved_step_comes_from_the_acknowledgement():
    d = run({"phase": "Running"}, RUNNING, pods=pods_of(), annotations=USER)
    acked = pods_of(0, "1733050000")
    acked[0] = Pod(
        acked[0].name,
        0,
        0,
        "Running",
        True,
        checkpoint_request="1733050000",
        checkpoint_saved=("1733050000", 240),
    )
    saved = run(d.status, RUNNING, pods=acked, annotations=USER, t=30)
    cp = saved.status.checkpoint
    assert cp is not None and (cp.saved_step, cp.saved_time) == (240, at(30))
    assert Reason.CHECKPOINT_SAVED in reasons(saved)
    idle = run(saved.status, RUNNING, pods=acked, annotations=USER, t=40)
    assert (
        idle.status.to_dict() == saved.status.to_dict()
        and Reason.CHECKPOINT_SAVED not in reasons(idle)
    )


def test_the_saved_step_also_comes_from_a_termination_message():
    d = run({"phase": "Running"}, RUNNING, pods=pods_of(), annotations=USER)
    f = failed("job-slice-0-0", 0, 143, "Error", 0, checkpoint_request=("1733050000", 90))
    js = JobSetObservation(ready_jobs=0, restarts=1)
    saved = run(d.status, js, [f], annotations=USER, t=30)
    assert saved.status.checkpoint is not None and saved.status.checkpoint.saved_step == 90


def test_a_restart_ends_the_request():
    d = run({"phase": "Running"}, RUNNING, pods=pods_of(), annotations=USER)
    js = JobSetObservation(ready_jobs=0, restarts=1)
    after = run(d.status, js, pods=pods_of(1), annotations=USER, t=30)
    assert not [a for a in after.actions if isinstance(a, AnnotatePods)]


def test_a_new_user_value_is_a_new_request_and_an_invalid_one_is_refused():
    d = run({"phase": "Running"}, RUNNING, pods=pods_of(), annotations=USER)
    newer = run(
        d.status,
        RUNNING,
        pods=pods_of(0, "1733050000"),
        annotations={keys.CHECKPOINT_REQUEST: "2"},
        t=9,
    )
    assert newer.status.checkpoint is not None and newer.status.checkpoint.request_id == "2"
    bad = run(
        newer.status,
        RUNNING,
        pods=pods_of(0, "2"),
        annotations={keys.CHECKPOINT_REQUEST: "x" * 64},
        t=10,
    )
    assert Reason.CHECKPOINT_REQUEST_INVALID in reasons(bad)
    assert bad.status.checkpoint is not None and bad.status.checkpoint.request_id == "2"
    assert not [a for a in bad.actions if isinstance(a, AnnotatePods)]
    quiet = run(
        bad.status,
        RUNNING,
        pods=pods_of(0, "2"),
        annotations={keys.CHECKPOINT_REQUEST: "x" * 64},
        t=11,
    )
    assert Reason.CHECKPOINT_REQUEST_INVALID not in reasons(quiet)


def test_no_request_while_the_jobset_is_suspended_or_absent():
    d = run({"phase": "Provisioning"}, None, annotations=USER)
    assert d.status.checkpoint is None
    s = run(
        {"phase": "Suspended"}, JobSetObservation(suspended=True), annotations=USER, suspend=True
    )
    assert s.status.checkpoint is None


# ---------------------------------------------------------------- the startup deadline

STARTUP = {"failurePolicy": {"startupTimeoutSeconds": 60}}


def slow_pods(unschedulable: bool = True, attempt: int = 0, pool: str | None = None) -> list[Pod]:
    """Slice 0 runs (on `pool`, when given), slice 1's pods do not."""
    stuck = unschedulable
    up = [
        Pod(f"job-slice-0-{h}", 0, attempt, "Running", True, node=f"n{h}", pool=pool)
        for h in range(4)
    ]
    down = [
        Pod(
            f"job-slice-1-{h}",
            1,
            attempt,
            "Pending",
            unschedulable_since=at(-600) if stuck else None,
        )
        for h in range(4)
    ]
    return up + down


STARTING = JobSetObservation(ready_jobs=1)


def test_no_deadline_without_the_setting():
    d = run({"phase": "Starting"}, STARTING, pods=slow_pods(), t=10_000)
    assert d.status.startup is None and not [a for a in d.actions if isinstance(a, EvictPods)]


def test_startup_deadline_restarts_all_slices_naming_the_slow_one():
    first = run({"phase": "Starting"}, STARTING, pods=slow_pods(), **STARTUP)
    assert first.status.startup is not None and first.status.startup.since == NOW
    assert first.requeue_after == 60
    before = run(first.status, STARTING, pods=slow_pods(), t=59, **STARTUP)
    assert not [a for a in before.actions if isinstance(a, EvictPods)]
    fired = run(before.status, STARTING, pods=slow_pods(), t=60, **STARTUP)
    (evict,) = [a for a in fired.actions if isinstance(a, EvictPods)]
    assert evict.pods == tuple(f"job-slice-1-{h}" for h in range(4))
    (event,) = [e for e in fired.events if e.reason == Reason.STARTUP_DEADLINE_EXCEEDED]
    assert "slice 1: 0/4 pods running (unschedulable)" in event.message
    assert event.cause == "startup"
    assert fired.status.startup is not None and fired.status.startup.evicted
    # The JobSet restarts without charging maxRestarts: cause startup.
    js = JobSetObservation(restarts=1, restarts_counted=0)
    evicted = failed("job-slice-1-0", 1, None, "", 0, disruption="EvictionByEvictionAPI")
    restarted = run(fired.status, js, [evicted], pods=slow_pods(attempt=1), t=80, **STARTUP)
    assert by_cause(restarted)["startup"] == 1 and by_cause(restarted)["disruption"] == 0
    assert restarted.status.last_restart is not None
    assert restarted.status.last_restart.cause == "startup"
    assert restarted.status.startup is not None
    assert (restarted.status.startup.attempt, restarted.status.startup.since) == (1, at(80))
    assert not restarted.status.startup.evicted


def test_startup_deadline_waits_again_if_no_restart_follows():
    fired = run(
        {
            "phase": "Starting",
            "capacityReadyTime": "2026-11-30T11:59:00Z",
            "startup": {"attempt": 0, "since": "2026-11-30T11:59:00Z"},
        },
        STARTING,
        pods=slow_pods(),
        **STARTUP,
    )
    assert [a for a in fired.actions if isinstance(a, EvictPods)]
    quiet = run(fired.status, STARTING, pods=slow_pods(), t=30, **STARTUP)
    assert not [a for a in quiet.actions if isinstance(a, EvictPods)]
    again = run(quiet.status, STARTING, pods=slow_pods(), t=60, **STARTUP)
    assert [a for a in again.actions if isinstance(a, EvictPods)]


def test_running_clears_the_timing():
    d = run(
        {"phase": "Starting", "startup": {"attempt": 0, "since": "2026-11-30T11:59:30Z"}},
        RUNNING,
        pods=pods_of(),
        **STARTUP,
    )
    assert d.status.phase == "Running" and d.status.startup is None


def managed_slices() -> list[SliceObservation]:
    _, plan = job("Managed")
    return [SliceObservation(i, plan.node_pools[i].name, PoolState.READY, 4) for i in range(2)]


def test_managed_slice_whose_pods_cannot_schedule_gets_a_new_pool_once():
    slices = managed_slices()
    old = {
        "phase": "Starting",
        "capacityReadyTime": "2026-11-30T11:58:00Z",
        "startup": {"attempt": 0, "since": "2026-11-30T11:58:00Z"},
        "conditions": [{"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}],
        "slices": [{"index": i, "hosts": 4, "seenReady": True} for i in range(2)],
    }
    # JobSet put slice 0 on the pool of status.slices[1]: the free one, pool 0, is replaced.
    pods = slow_pods(pool=slices[1].pool)
    d = run(old, STARTING, pods=pods, slices=slices, mode="Managed", **STARTUP)
    assert d.actions == [DeletePools((slices[0].pool,))]
    (event,) = [e for e in d.events if e.reason == Reason.STARTUP_DEADLINE_EXCEEDED]
    assert "slice 1: 0/4 pods running (unschedulable)" in event.message
    assert f"replacing node pool {slices[0].pool}, on which no pod" in event.message
    assert d.status.startup is not None and d.status.startup.repaired == [0]
    # Still stuck after the new pool: every slice restarts instead.
    later = d.status.model_copy(deep=True)
    assert later.startup is not None
    later.startup.since = later.capacity_ready_time = at(-120)
    again = run(later, STARTING, pods=pods, slices=slices, mode="Managed", t=5, **STARTUP)
    assert [a for a in again.actions if isinstance(a, EvictPods)]
    assert not [a for a in again.actions if isinstance(a, DeletePools)]


def test_pods_that_schedule_but_do_not_run_are_evicted_in_managed_mode_too():
    slices = managed_slices()
    old = {
        "phase": "Starting",
        "capacityReadyTime": "2026-11-30T11:58:00Z",
        "startup": {"attempt": 0, "since": "2026-11-30T11:58:00Z"},
        "conditions": [{"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}],
        "slices": [{"index": i, "hosts": 4, "seenReady": True} for i in range(2)],
    }
    d = run(
        old, STARTING, pods=slow_pods(unschedulable=False), slices=slices, mode="Managed", **STARTUP
    )
    assert [a for a in d.actions if isinstance(a, EvictPods)]
    assert not [a for a in d.actions if isinstance(a, DeletePools)]


def test_the_clock_stops_while_capacity_is_not_ready():
    slices = managed_slices()
    lost = [slices[0], SliceObservation(1, slices[1].pool, PoolState.ABSENT)]
    old = {
        "phase": "Restarting",
        "capacityReadyTime": "2026-11-30T11:50:00Z",
        "startup": {"attempt": 0, "since": "2026-11-30T11:50:00Z"},
        "conditions": [{"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}],
        "slices": [{"index": i, "hosts": 4, "seenReady": True} for i in range(2)],
    }
    d = run(old, STARTING, pods=slow_pods(), slices=lost, mode="Managed", **STARTUP)
    assert not [a for a in d.actions if isinstance(a, EvictPods)]
    # The one clock stops: the capacity is not ready (the attempt's own start is kept).
    assert d.status.capacity_ready_time is None
    assert d.status.startup is not None and d.status.startup.since == at(-600)


def test_a_pods_pool_is_known_for_the_jobs_own_nodes():
    running = summarize_pod(
        {
            "metadata": {"name": "p", "labels": {keys.JOBSET_JOB_INDEX: "1"}},
            "spec": {"nodeName": "n-3"},
            "status": {"phase": "Running"},
        }
    )
    (view,) = pod_records([running], JobSetObservation(), {"n-3": "msj-job-1"})
    assert (view.node, view.pool) == ("n-3", "msj-job-1")
    (view,) = pod_records([running], JobSetObservation())
    assert view.pool is None


def test_a_slice_that_already_finished_is_not_slow():
    # Slice 1 ran and succeeded; slice 0 still starts: only slice 0 is named and evicted.
    pods = [Pod(f"job-slice-0-{h}", 0, 0, "Pending") for h in range(4)]
    s, p = job("Existing", **STARTUP)
    obs = Observed(
        now=NOW,
        slices=list(EXISTING),
        jobset=STARTING,
        pods=[*pods, *succeeded({1: 4})],
    )
    old = MultisliceJobStatus.from_dict(
        {
            "phase": "Starting",
            "capacityReadyTime": "2026-11-30T11:58:00Z",
            "startup": {"attempt": 0, "since": "2026-11-30T11:58:00Z"},
        }
    )
    d = jobs.run(old, obs, cfg=CFG, meta=meta(), plan=(s, p))
    (event,) = [e for e in d.events if e.reason == Reason.STARTUP_DEADLINE_EXCEEDED]
    assert "slice 0: 0/4 pods running" in event.message and "slice 1" not in event.message


def test_a_disruption_budget_verdict_the_jobset_does_not_back_is_ignored():
    # Written by hand (or left by an older spec): the running JobSet's uncharged restarts (1) are
    # within maxDisruptionRestarts (2), so the job is not failed and its JobSet is kept.
    old = {
        "phase": "Failed",
        "restarts": 1,
        "conditions": [
            {"type": "Failed", "status": "True", "reason": Reason.MAX_DISRUPTION_RESTARTS},
        ],
    }
    d = run(
        old, JobSetObservation(restarts=1, ready_jobs=2), failurePolicy={"maxDisruptionRestarts": 2}
    )
    assert DeleteJobSet() not in d.actions
    assert d.status.phase != "Failed" and Reason.STATUS_IGNORED in reasons(d)
