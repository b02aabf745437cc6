"""Issue 45, section 2: no gang held for a mistake the operator could see (pure tests).

A scheduler that is not running, a sidecar port that becomes a duplicate host port, a
PriorityClass that does not exist: each fails before the first pool or within a deadline that is
on by default, naming the field. And two false alarms: a deletion's pod losses are no restart, a
Kueue resume is no restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common import keys
from multislice_operator.common.errors import SpecError
from multislice_operator.common.pools import PoolState
from multislice_operator.controller import observe as ob
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.reconcile import (
    DecideConfig,
    DeleteJobSet,
    DeletePools,
    JobMeta,
    JobSetObservation,
    SliceObservation,
)
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.render.jobset import render_jobset
from tests.unit import jobs

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10, not_ready_grace_seconds=60)

SIDECAR_8080 = {"name": "metrics", "image": "m", "ports": [{"containerPort": 8080}]}


def errors(body: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        plan_job(load_job(body))
    return {e.path: e.message for e in exc.value.errors}


def template(**pod: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "image": "i"}], **pod}}


# ---------------------------------------------------------------- a duplicate host port


def test_a_sidecar_on_the_operators_port_is_refused_naming_the_field_and_the_fix():
    found = errors(jobs.body(template=template(containers=[{"name": "c", "image": "i"},
                                                           SIDECAR_8080])))  # fmt: skip
    path = "spec.template.spec.containers[1].ports[0].containerPort"
    assert set(found) == {path}
    message = found[path]
    assert '"TCP//8080"' in message and "megascale" in message and "containers[0]" in message
    assert "hostNetwork: false" in message and "another port" in message


def test_the_coordinator_port_and_two_sidecars_on_one_port_are_refused_too():
    sidecars = [
        {"name": "a", "image": "a", "ports": [{"containerPort": 8476}]},
        {"name": "b", "image": "b", "ports": [{"containerPort": 9090, "protocol": "UDP"}]},
        {"name": "d", "image": "d", "ports": [{"containerPort": 9090, "protocol": "UDP"}]},
    ]
    found = errors(jobs.body(template=template(containers=[{"name": "c", "image": "i"},
                                                           *sidecars])))  # fmt: skip
    assert "jax-coord" in found["spec.template.spec.containers[1].ports[0].containerPort"]
    assert (
        "containers[2].ports[0]" in found["spec.template.spec.containers[3].ports[0].containerPort"]
    )


@pytest.mark.parametrize(
    "pod",
    [
        # Off the host network a container port is no host port.
        {"hostNetwork": False, "containers": [{"name": "c", "image": "i"}, SIDECAR_8080]},
        # The TPU container declaring the port itself: the render adds nothing.
        {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 8080}]}]},
        # Another protocol is another host port.
        {"containers": [{"name": "c", "image": "i"},
                        {"name": "m", "image": "m",
                         "ports": [{"containerPort": 8080, "protocol": "UDP"}]}]},
        # Init containers run one by one: each is checked alone (validateInitContainers).
        {"containers": [{"name": "c", "image": "i"}], "initContainers": [SIDECAR_8080]},
    ],
)  # fmt: skip
def test_ports_kubernetes_accepts_pass(pod):
    spec, plan = jobs.spec_and_plan(template={"spec": pod})
    render_jobset(plan, spec)


def test_explicit_host_ports_off_the_host_network_are_checked_as_kubernetes_does():
    pod = {
        "hostNetwork": False,
        "containers": [
            {"name": "c", "image": "i", "ports": [{"containerPort": 1, "hostPort": 7000}]},
            {"name": "m", "image": "m", "ports": [{"containerPort": 2, "hostPort": 7000}]},
        ],
    }
    found = errors(jobs.body(template={"spec": pod}))
    assert "TCP//7000" in found["spec.template.spec.containers[1].ports[0].hostPort"]
    one_init = {"initContainers": [{"name": "x", "image": "x", "ports": [
        {"containerPort": 5000}, {"containerPort": 5000}]}]}  # fmt: skip
    found = errors(jobs.body(template=template(**one_init)))
    assert "spec.template.spec.initContainers[0].ports[1].containerPort" in found


# ---------------------------------------------------------------- a scheduler nobody runs


def pod_body(index: int, *, conditions: list[dict[str, Any]] | None = None,
             node: str | None = None, created: datetime = NOW) -> dict[str, Any]:  # fmt: skip
    """A pod of slice `index` as the apiserver has it; schedulerName volcano."""
    spec: dict[str, Any] = {"schedulerName": "volcano", "containers": [{"name": "c"}]}
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": f"job-slice-{index}-0-x",
            "creationTimestamp": created.isoformat().replace("+00:00", "Z"),
            "labels": {keys.JOBSET_JOB_INDEX: str(index), keys.JOBSET_RESTART_ATTEMPT: "0"},
        },
        "spec": spec,
        "status": {"phase": "Pending", "conditions": conditions or []},
    }


def test_a_pod_no_scheduler_looks_at_counts_as_unschedulable_from_its_creation():
    created = NOW - timedelta(seconds=5)
    (pod,) = ob.pod_records([ob.summarize_pod(pod_body(0, created=created))], JobSetObservation())
    assert pod.unschedulable_since == created
    assert "spec.template.spec.schedulerName is 'volcano'" in pod.scheduler_message
    # A scheduler that looked at it, a pod bound to a node, a deleted one: not this case.
    scheduled = [{"type": "PodScheduled", "status": "True"}]
    gated = [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]
    deleted = pod_body(0)
    deleted["metadata"]["deletionTimestamp"] = "2026-12-04T12:00:00Z"
    others = [pod_body(0, conditions=scheduled), pod_body(0, conditions=gated),
              pod_body(0, node="n-1"), deleted]  # fmt: skip
    views = ob.pod_records([ob.summarize_pod(b) for b in others], JobSetObservation())
    assert [p.unschedulable_since for p in views] == [None] * 4


def test_pods_no_scheduler_looks_at_fail_the_job_after_the_scheduler_grace():
    spec, plan = jobs.spec_and_plan(
        template={"spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "i"}]}}
    )
    assert spec.failure_policy.unschedulable_timeout_seconds == 600  # not what ends it
    grace = CFG.scheduler_grace_seconds
    pools = [p.name for p in plan.node_pools]
    slices = [SliceObservation(i, pools[i], PoolState.READY, 4, present_hosts=4) for i in (0, 1)]
    created = NOW - timedelta(seconds=grace)
    pods = ob.pod_records(
        [ob.summarize_pod(pod_body(i, created=created)) for i in (0, 1)], JobSetObservation()
    )
    old = MultisliceJobStatus.from_dict(
        {"phase": "Starting", "capacityReadyTime": created.isoformat()}
    )
    obs = jobs.Observed(now=NOW, slices=slices, jobset=JobSetObservation(replicas=2), pods=pods)
    d = jobs.run(old, obs, cfg=CFG, plan=(spec, plan))
    assert d.status.phase == "Failed", d.status.message
    assert d.status.condition("Failed").reason == Reason.SCHEDULER_NOT_RUNNING
    assert "spec.template.spec.schedulerName is 'volcano'" in (d.status.message or "")
    assert DeleteJobSet() in d.actions and DeletePools(tuple(pools)) in d.actions
    # Before the grace: a pass is asked for when it falls due.
    young = ob.pod_records(
        [ob.summarize_pod(pod_body(i, created=NOW - timedelta(seconds=20))) for i in (0, 1)],
        JobSetObservation(),
    )
    early = jobs.Observed(now=NOW, slices=slices, jobset=JobSetObservation(replicas=2), pods=young)
    fresh = jobs.run(old, early, cfg=CFG, plan=(spec, plan))
    assert fresh.status.phase != "Failed" and fresh.requeue_after == grace - 20


# ---------------------------------------------------------------- a PriorityClass that is not there


def test_a_missing_priority_class_fails_the_job_before_any_pool_naming_the_field():
    spec, plan = jobs.spec_and_plan(
        template={"spec": {"priorityClassName": "hi", "containers": [{"name": "c", "image": "i"}]}}
    )
    absent = [SliceObservation(i, p.name, PoolState.ABSENT) for i, p in enumerate(plan.pools)]
    obs = jobs.Observed(now=NOW, slices=absent, admission=None)
    obs.missing_priority_class = "hi"
    meta = JobMeta("ns", "job", "uid-1", 1)
    d = jobs.run(None, obs, cfg=CFG, meta=meta, plan=(spec, plan))
    assert d.status.phase == "Failed" and d.actions == []  # no dry run, finalizer or pool
    failed = d.status.condition("Failed")
    assert failed is not None and failed.reason == Reason.PRIORITY_CLASS_NOT_FOUND
    assert "spec.template.spec.priorityClassName" in (d.status.message or "")
    assert "'hi'" in (d.status.message or "")
    # Once pools exist (the class deleted under a running job), it is not this verdict's.
    up = [SliceObservation(i, p.name, PoolState.READY, 4) for i, p in enumerate(plan.pools)]
    later = jobs.Observed(now=NOW, slices=up)
    later.missing_priority_class = "hi"
    assert jobs.run(None, later, cfg=CFG, plan=(spec, plan)).status.phase != "Failed"


class Classes:
    """The PriorityClasses an apiserver has; counts the reads."""

    def __init__(self, *names: str) -> None:
        self.names, self.reads = set(names), 0

    async def get_priority_class(self, name: str) -> dict[str, Any] | None:
        self.reads += 1
        return {"metadata": {"name": name}} if name in self.names else None


def test_the_priority_class_is_read_before_the_first_pool_once_per_name():
    import asyncio

    from multislice_operator.controller import reconciler
    from tests.unit.test_forget import Apiserver, runtime

    class Api(Apiserver, Classes):
        def __init__(self) -> None:
            Apiserver.__init__(self)
            Classes.__init__(self, "there")

    api = Api()
    rt = runtime(api)
    rt.provisioner = None
    body: dict[str, Any] = {"metadata": {"name": "job", "namespace": "ns", "uid": "u"}}

    def observe(name: str | None) -> str | None:
        pod: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
        if name:
            pod["priorityClassName"] = name
        spec, plan = jobs.spec_and_plan(template={"spec": pod}, provisioning={"mode": "Existing"})
        obs = asyncio.run(reconciler.observe_job(rt, ("ns", "job"), body, plan, spec))
        return obs.missing_priority_class

    assert observe("gone") == "gone" and observe("gone") == "gone"
    assert observe("there") is None and observe("there") is None
    assert observe(None) is None
    assert api.reads == 2  # one read per name, whatever the passes


# ---------------------------------------------------------------- false alarms

RUNNING = {
    "phase": "Running",
    "runningTime": "2026-12-04T11:00:00Z",
    "capacityReadyTime": "2026-12-04T11:00:00Z",
    "restarts": 0,
}


def test_the_pod_losses_of_a_deletion_are_no_restart():
    """Deleting a running job kills its pods (DisruptionTarget); JobSet may count a restart
    before it goes. The pass that releases the pools and lifts the finalizer says nothing of it."""
    spec, plan = jobs.spec_and_plan()
    up = [SliceObservation(i, p.name, PoolState.READY, 4) for i, p in enumerate(plan.pools)]
    killed = [jobs.failed(f"job-slice-{i}-0-a", i, 143, disruption="DeletionByPodGC")
              for i in (0, 1)]  # fmt: skip
    js = JobSetObservation(restarts=1, restarts_counted=0, replicas=2)
    deleting = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True, deleting=True)
    old = MultisliceJobStatus.from_dict(RUNNING)
    for slices in (up, [SliceObservation(i, p.name, PoolState.ABSENT)
                        for i, p in enumerate(plan.pools)]):  # fmt: skip
        obs = jobs.Observed(now=NOW, slices=slices, jobset=js, pods=killed)
        d = jobs.run(old, obs, cfg=CFG, meta=deleting, plan=(spec, plan))
        assert Reason.RESTARTING_ALL_SLICES not in [e.reason for e in d.events], d.events
        assert d.status.restarts == 0 and not d.metrics.restarts, d.metrics


def test_a_kueue_resume_after_a_preemption_is_a_start_not_a_restart():
    from multislice_operator.reconcile import CheckState
    from tests.unit.test_queue import iso, obs, run, up, wl

    ran = datetime(2026, 12, 1, 11, 0, 0, tzinfo=UTC)
    # Ran once, was preempted and queued again; the gang is back and Kueue admitted the job.
    waiting = {
        "phase": "Provisioning",
        "restarts": 0,
        "runningTime": iso(ran),
        "conditions": [{"type": "Provisioned", "status": "True", "reason": "GangReady"}],
    }
    admitted = wl(CheckState.READY, admitted=True)
    resumed = obs(admitted, slices=up(), jobset=JobSetObservation(ready_jobs=0, replicas=2))
    d = run(old=waiting, obs=resumed)
    assert d.status.phase == "Starting", d.status.message
    assert d.status.restarts == 0
    # A slice that stops while the job runs is still a restart of every slice.
    running = {**waiting, "phase": "Running"}
    one_up = obs(admitted, slices=up(), jobset=JobSetObservation(ready_jobs=1, replicas=2))
    assert run(old=running, obs=one_up).status.phase == "Restarting"
