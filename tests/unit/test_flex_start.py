"""Flex-start capacity (GKE's Dynamic Workload Scheduler) in decide(): a pool waiting for
capacity is not a failure, the JobSet exists meanwhile (its pending pods are what scales the
pools up), and the end of the run is a disruption the workload checkpoints ahead of."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from multislice_operator.api.models import Phase
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolState
from multislice_operator.plugins.nodepools import FlexStartPools
from multislice_operator.reconcile import (
    AnnotatePods,
    CreateJobSet,
    CreatePools,
    DeletePools,
    JobMeta,
    JobSetObservation,
    Pod,
    QueueObservation,
    SetJobSetSuspend,
    SliceObservation,
    WorkloadObservation,
)
from multislice_operator.reconcile.reasons import Reason
from tests.unit import jobs
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
FLEX = {
    "accelerator": "v6e-16",
    "parallelism": {"ici": {"fsdp": 16}, "dcn": {"data": 2}},
    "capacity": {"type": "FlexStart", "maxRunDurationSeconds": 3600},
    "provisioning": {"timeoutSeconds": 600},
    "maintenance": {"checkpointAheadSeconds": 300},
}
SPEC, PLAN = spec_and_plan(**FLEX)


def flex(ready: int = 0) -> list[SliceObservation]:
    return [
        SliceObservation(
            i, p.name, PoolState.READY, ready, present_hosts=ready
        )
        for i, p in enumerate(PLAN.node_pools)
    ]  # fmt: skip


# NodePools' own observation: both pools are flex-start pools of a 3600 s run.
FLEX_POOLS = FlexStartPools({i: 3600 for i in range(len(PLAN.node_pools))})


def FlexObserved(**fields: Any) -> Observed:
    return Observed(capacity=FLEX_POOLS, **fields)


run = partial(jobs.run, plan=(SPEC, PLAN))


def reason(d, ctype="Provisioned"):
    cond = d.status.condition(ctype)
    return cond.reason if cond else None


def test_pools_waiting_for_flex_start_capacity_are_no_failure_and_get_their_jobset():
    started = NOW - timedelta(hours=2)  # far past provisioning.timeoutSeconds
    old = {
        "phase": "Provisioning",
        "attemptStartTime": started.isoformat(),
        "provisioningAttempts": 1,
    }
    d = run(old, FlexObserved(now=NOW, slices=flex()))
    assert d.status.phase == Phase.PROVISIONING
    assert reason(d) == Reason.WAITING_FOR_FLEX_START_CAPACITY
    assert "since 2026-12-01T10:00:00Z" in (d.status.message or "")
    assert Reason.GANG_ROLLED_BACK not in [e.reason for e in d.events]
    assert d.actions == [CreateJobSet()]  # pending pods make GKE scale the pools up
    # The JobSet exists, its pods pending: still waiting; no repair, no deadline runs.
    pending = [Pod(f"job-slice-{i}-0", i) for i in range(2)]
    again = run(d.status, FlexObserved(now=NOW + timedelta(minutes=20), slices=flex(),
                                   jobset=JobSetObservation(), pods=pending))  # fmt: skip
    assert again.status.phase == Phase.PROVISIONING
    assert not [a for a in again.actions if isinstance(a, CreatePools | DeletePools)]
    assert again.status.capacity_ready_time is None
    assert again.status.to_dict().get("message") == d.status.to_dict().get("message")


def test_once_the_capacity_comes_the_job_runs_and_checkpoints_before_the_run_ends():
    ready = flex(ready=4)
    js = JobSetObservation(ready_jobs=2)
    up = run({"phase": "Provisioning"}, FlexObserved(now=NOW, slices=ready, jobset=js,
                                                 pods=jobs.running({0: 4, 1: 4})))  # fmt: skip
    assert up.status.phase == Phase.RUNNING and up.status.capacity_ready_time == NOW
    assert not [a for a in up.actions if isinstance(a, AnnotatePods)]
    assert up.requeue_after is not None and up.requeue_after <= 3600 - 300
    # 3600 s of run minus 300 s ahead: the workload is asked for a checkpoint.
    late = NOW + timedelta(seconds=3300)
    pods = jobs.running({0: 4, 1: 4})
    d = run(up.status, FlexObserved(now=late, slices=ready, jobset=js, pods=pods))
    (ann,) = [a for a in d.actions if isinstance(a, AnnotatePods)]
    assert ann.value.startswith("flexend-") and len(ann.pods) == 8
    assert d.status.checkpoint is not None and d.status.checkpoint.source == "flex-start"
    # Once asked, not again.
    acked = [Pod(p.name, p.slice_index, 0, "Running", ready=True,
                      checkpoint_request=ann.value) for p in pods]  # fmt: skip
    d2 = run(d.status, FlexObserved(now=late + timedelta(seconds=5), slices=ready, jobset=js,
                                pods=acked))  # fmt: skip
    assert Reason.CHECKPOINT_REQUESTED not in [e.reason for e in d2.events]


def test_the_nodes_going_at_the_end_of_the_run_are_a_lost_slice():
    seen = {
        "slices": [{"index": i, "hosts": 4, "seenReady": True} for i in range(2)],
        "phase": "Running",
        "conditions": [{"type": "Provisioned", "status": "True"}],
    }
    gone = flex(ready=0)
    d = run(
        seen,
        FlexObserved(now=NOW, slices=gone, jobset=JobSetObservation(ready_jobs=0)),
    )
    assert d.status.phase == Phase.RESTARTING
    assert Reason.SLICE_LOST in [e.reason for e in d.events]
    assert any(isinstance(a, DeletePools) for a in d.actions)


def test_a_queued_flex_start_job_is_resumed_once_admitted_so_its_pods_scale_the_pools_up():
    """Kueue admitted the job's Workload with its pools up but empty: the operator resumes the
    suspended JobSet (nothing else will: the Workload is the job's), its pending pods are what
    makes GKE scale the pools up."""
    labels = {keys.KUEUE_QUEUE_NAME: "team-a"}
    spec, plan = spec_and_plan(jobs.body(metadata={"labels": labels}, **FLEX))
    admitted = WorkloadObservation("w", "3", quota_reserved=True, admitted=True, cluster_queue="cq")
    obs = FlexObserved(now=NOW, slices=flex(), jobset=JobSetObservation(suspended=True),
                   queue=QueueObservation("team-a", workload=admitted))  # fmt: skip
    meta = JobMeta("ns", "job", "uid-1", 1, labels=labels, has_finalizer=True)
    old = {"phase": "Starting", "provisioningAttempts": 1,
           "attemptStartTime": (NOW - timedelta(minutes=5)).isoformat()}  # fmt: skip
    d = jobs.run(old, obs, plan=(spec, plan), meta=meta)
    assert d.actions == [SetJobSetSuspend(False)]
    assert d.status.phase == Phase.PROVISIONING
    assert reason(d) == Reason.WAITING_FOR_FLEX_START_CAPACITY


def test_nodepools_observes_which_of_its_pools_are_flex_start_and_their_run_durations():
    """The flex-start facts are NodePools' own observation (`Observed.capacity`), read from the
    cloud's listing of the plan's pools: a pool of another job's name or not listed is none."""
    from multislice_operator.controller import observe as ob
    from multislice_operator.plugins import nodepools
    from multislice_operator.provisioning.base import GangObservation, PoolObservation

    first, second = (p.name for p in PLAN.node_pools)
    gang = GangObservation(
        pools={
            first: PoolObservation(first, 0, PoolState.READY, waits_for_capacity=True,
                                   max_run_duration_s=3600),
            second: PoolObservation(second, 1, PoolState.READY),
            "other": PoolObservation("other", 0, PoolState.READY, waits_for_capacity=True),
        }
    )  # fmt: skip
    slices, own = nodepools.observe(ob.ObserveInputs(PLAN, "uid-1", {}, gang))
    assert [s.index for s in slices] == [0, 1]
    assert own == FlexStartPools({0: 3600})
    assert nodepools.observe(ob.ObserveInputs(PLAN, "uid-1", {}, GangObservation()))[1] is None
    assert nodepools.observe(ob.ObserveInputs(PLAN, "uid-1", {}))[1] is None  # nothing listed
