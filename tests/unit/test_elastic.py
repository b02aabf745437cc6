"""Elastic slice count (spec.elastic) in decide() and around it: a lost slice whose replacement
does not come back in time (or is stocked out) restarts the job on fewer slices, by recreating
its JobSet; the job grows back after a checkpoint on demand once the pools are Ready again."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from multislice_operator.api.models import MultisliceJobStatus, RestartCause
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.controller.observe import jobset_observation, pod_records
from multislice_operator.plugins.resize import RESIZE
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.restarts import attribute
from multislice_operator.reconcile.types import (
    AnnotatePods,
    CreateJobSet,
    CreatePools,
    DecideConfig,
    DeleteJobSet,
    JobSetObservation,
    Pod,
    SliceObservation,
)
from multislice_operator.render.jobset import render_jobset
from tests.unit import jobs
from tests.unit.jobs import Observed, spec_and_plan

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10)
HOSTS = 4  # v5litepod-16: 4 hosts per slice
WAIT = 60
ELASTIC = {"slices": 4, "elastic": {"minSlices": 3, "waitSeconds": WAIT}}


def plan_of(**extra: Any):
    return spec_and_plan(**{**ELASTIC, **extra})


run = partial(jobs.run, cfg=CFG, **ELASTIC)  # run(old, obs, **extra): ELASTIC with `extra`


def pools(*states: PoolState, error: dict[int, str] | None = None) -> list[SliceObservation]:
    _, plan = plan_of()
    out = []
    for i, state in enumerate(states):
        hosts = HOSTS if state == PoolState.READY else 0
        err = None
        if error and i in error:
            err = PoolError(i, plan.pools[i].name, error[i], "no capacity in the zone", False)
        out.append(SliceObservation(i, plan.pools[i].name, state, hosts, error=err))
    return out


def pods(slices: int, attempt: int, saved: tuple[str, int] | None = None) -> list[Pod]:
    """Every slice's pods Running on pool i (slice i), of this attempt."""
    _, plan = plan_of()
    return [
        Pod(
            f"job-slice-{s}-{h}",
            s,
            attempt,
            phase="Running",
            ready=True,
            node=f"n-{s}-{h}",
            pool=plan.pools[s].name,
            checkpoint_saved=saved if (s, h) == (0, 0) else None,
        )
        for s in range(slices)
        for h in range(HOSTS)
    ]


def running_on_four() -> dict:
    return {
        "phase": "Running",
        "activeSlices": 4,
        "runningTime": "2026-12-03T11:00:00Z",
        "startTime": "2026-12-03T10:50:00Z",
        "jobSet": "job",
        "slices": [
            {"index": i, "phase": "Running", "hosts": HOSTS, "seenReady": True} for i in range(4)
        ],
    }


def js(replicas: int, restarts: int = 0, ready: int | None = None, base: int = 0,
       deleting: bool = False) -> JobSetObservation:  # fmt: skip
    return JobSetObservation(
        replicas=replicas,
        restarts=restarts,
        ready_jobs=replicas if ready is None else ready,
        restart_base=base,
        deleting=deleting,
    )


def events(d) -> list[str]:
    return [e.reason for e in d.events]


def cond(d, type_: str) -> dict | None:
    return next((c for c in d.status.to_dict()["conditions"] if c["type"] == type_), None)


def test_a_lost_slice_shrinks_the_job_after_wait_seconds_and_it_grows_back_after_a_checkpoint():
    lost = pools(PoolState.READY, PoolState.READY, PoolState.READY, PoolState.ABSENT)
    # The loss: slice 3's pool is gone, the JobSet restarted (a disruption); within waitSeconds
    # the job waits for the replacement, as a job that is not elastic does.
    d = run(running_on_four(), Observed(now=T0, slices=lost, jobset=js(4, 1, ready=3)))
    assert CreatePools((3,)) in d.actions
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions)
    assert d.status.phase == "Restarting"
    assert "or on fewer slices (spec.elastic) if it is not ready within 60s" in next(
        e.message for e in d.events if e.reason == Reason.SLICE_LOST
    )
    assert d.requeue_after is not None and d.requeue_after <= WAIT
    assert cond(d, "Degraded")["status"] == "False"
    # Past waitSeconds, the replacement still creating: the JobSet is deleted for the resize.
    creating = pools(PoolState.READY, PoolState.READY, PoolState.READY, PoolState.CREATING)
    later = T0 + timedelta(seconds=WAIT + 1)
    d = run(d.status, Observed(now=later, slices=creating, jobset=js(4, 1, ready=3)))
    assert d.actions == [DeleteJobSet(foreground=True)]
    assert Reason.SHRINKING_SLICES in events(d)
    shrink = next(e.message for e in d.events if e.reason == Reason.SHRINKING_SLICES)
    assert "restarting on 3 of 4 slices (dcn.data 3)" in shrink
    assert d.status.phase == "Restarting"
    # Being deleted (foreground): nothing is created until it is gone.
    d = run(d.status, Observed(now=later, slices=creating, jobset=js(4, 1, 0, deleting=True)))
    assert not any(isinstance(a, CreateJobSet) for a in d.actions)
    assert d.status.phase == "Restarting"
    # Gone: created on 3 slices, continuing the job's restarts (1 so far, the resize is 2).
    d = run(d.status, Observed(now=later, slices=creating))
    assert CreateJobSet(3, 2, 0) in d.actions
    assert d.status.active_slices == 3
    assert cond(d, "Degraded")["status"] == "True"
    assert cond(d, "Degraded")["reason"] == Reason.FEWER_SLICES
    # The new JobSet runs on 3 slices: the job is Running, degraded; the resize is a restart
    # charged to no budget.
    d = run(d.status, Observed(now=later, slices=creating, jobset=js(3, 2, base=2),
                                pods=pods(3, 2)))  # fmt: skip
    assert d.status.phase == "Running"
    assert d.status.restarts == 2
    assert d.status.restarts_by_cause is not None
    assert d.status.restarts_by_cause.resize == 1 and d.status.restarts_by_cause.disruption == 1
    assert cond(d, "Provisioned")["reason"] == Reason.REPAIRING_DEGRADED
    assert d.status.goodput is not None and d.status.goodput.state == "running"
    assert d.status.goodput.degraded
    assert Reason.RESTARTING_ALL_SLICES not in events(d)  # the resize has its own event
    # Recovered: from the loss (not from the new JobSet) to training on 3 slices again.
    last = d.status.last_restart
    assert last is not None and last.cause == "resize" and last.time == T0
    assert last.recovery_seconds == WAIT + 1
    # The replacement is Ready: a checkpoint is asked before growing back.
    ready = pools(*[PoolState.READY] * 4)
    grow_at = later + timedelta(seconds=120)
    d = run(d.status, Observed(now=grow_at, slices=ready, jobset=js(3, 2, base=2),
                                pods=pods(3, 2)))  # fmt: skip
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions)
    assert d.status.checkpoint is not None and d.status.checkpoint.request_id == "grow-4-2"
    assert d.status.checkpoint.source == "elastic"
    annotate = [a for a in d.actions if isinstance(a, AnnotatePods)]
    assert annotate and len(annotate[0].pods) == 3 * HOSTS
    assert d.status.phase == "Running"
    # The workload saved it: the pass that sees it records it and deletes the JobSet for the
    # grow (test_the_pass_that_sees_the_grow_checkpoint_saved_grows_at_once); so does the next.
    d = run(d.status, Observed(now=grow_at, slices=ready, jobset=js(3, 2, base=2),
                                pods=pods(3, 2, saved=("grow-4-2", 500))))  # fmt: skip
    assert d.status.checkpoint is not None and d.status.checkpoint.saved_step == 500
    d = run(d.status, Observed(now=grow_at, slices=ready, jobset=js(3, 2, base=2),
                                pods=pods(3, 2, saved=("grow-4-2", 500))))  # fmt: skip
    assert d.actions == [DeleteJobSet(foreground=True)]
    grow = next(e.message for e in d.events if e.reason == Reason.GROWING_SLICES)
    assert "checkpoint grow-4-2 saved at step 500" in grow
    d = run(d.status, Observed(now=grow_at, slices=ready))
    assert CreateJobSet(None, 3, 0) in d.actions
    d = run(d.status, Observed(now=grow_at, slices=ready, jobset=js(4, 3, base=3),
                                pods=pods(4, 3)))  # fmt: skip
    assert d.status.phase == "Running" and d.status.active_slices == 4
    assert cond(d, "Degraded")["status"] == "False"
    assert d.status.restarts_by_cause is not None and d.status.restarts_by_cause.resize == 2
    assert d.status.goodput is not None and not d.status.goodput.degraded
    assert d.status.goodput.degraded_chip_seconds == 120 * 4 * 16  # 120 s on 4 held pools


def test_a_stockout_for_the_replacement_shrinks_at_once():
    stocked = pools(PoolState.READY, PoolState.READY, PoolState.READY, PoolState.ABSENT,
                    error={3: "GCE_STOCKOUT"})  # fmt: skip
    d = run(running_on_four(), Observed(now=T0, slices=stocked, jobset=js(4, 1, ready=3)))
    assert DeleteJobSet(foreground=True) in d.actions
    shrink = next(e.message for e in d.events if e.reason == Reason.SHRINKING_SLICES)
    assert "GCE_STOCKOUT" in shrink


def test_never_below_min_slices_the_job_waits_as_today():
    two_lost = pools(PoolState.READY, PoolState.READY, PoolState.ABSENT, PoolState.ABSENT)
    old = run(running_on_four(), Observed(now=T0, slices=two_lost, jobset=js(4, 1, ready=2)))
    later = T0 + timedelta(seconds=WAIT * 10)
    d = run(old.status, Observed(now=later, slices=two_lost, jobset=js(4, 1, ready=2)))
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions)
    assert d.status.phase == "Restarting"
    assert cond(d, "Provisioned")["reason"] == Reason.REPAIRING


def test_the_first_gang_is_all_or_none_even_when_elastic():
    three = pools(PoolState.READY, PoolState.READY, PoolState.READY, PoolState.CREATING)
    d = run(None, Observed(now=T0, slices=three))
    d = run(d.status, Observed(now=T0 + timedelta(seconds=WAIT * 5), slices=three))
    assert not any(isinstance(a, CreateJobSet) for a in d.actions)
    assert d.status.phase == "Provisioning"


def test_a_job_that_is_not_elastic_never_resizes():
    stocked = pools(PoolState.READY, PoolState.READY, PoolState.READY, PoolState.ABSENT,
                    error={3: "GCE_STOCKOUT"})  # fmt: skip
    old = running_on_four()
    d = run(old, Observed(now=T0 + timedelta(hours=5), slices=stocked, jobset=js(4, 1, ready=3)),
            elastic=None)  # fmt: skip
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions)
    assert cond(d, "Degraded") is None


def test_a_grow_goes_without_the_checkpoint_when_the_workload_never_answers():
    ready = pools(*[PoolState.READY] * 4)
    old = running_on_four() | {"activeSlices": 3}
    d = run(old, Observed(now=T0, slices=ready, jobset=js(3, 2, base=2), pods=pods(3, 2)))
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions)
    d = run(d.status, Observed(now=T0 + timedelta(seconds=299), slices=ready,
                               jobset=js(3, 2, base=2), pods=pods(3, 2)))  # fmt: skip
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions)
    d = run(d.status, Observed(now=T0 + timedelta(seconds=300), slices=ready,
                               jobset=js(3, 2, base=2), pods=pods(3, 2)))  # fmt: skip
    assert d.actions == [DeleteJobSet(foreground=True)]
    assert "not saved within 300s" in next(
        e.message for e in d.events if e.reason == Reason.GROWING_SLICES
    )


def test_the_resized_jobset_says_the_new_count_and_continues_the_restarts():
    spec, plan = plan_of(failurePolicy={"maxRestarts": 5})
    jobset = render_jobset(plan.running_on(3), spec, None, restarts_before=4, counted_before=2)
    rjob = jobset["spec"]["replicatedJobs"][0]
    assert rjob["replicas"] == 3
    env = {e["name"]: e.get("value") for e in rjob["template"]["spec"]["template"]["spec"][
        "containers"][0]["env"]}  # fmt: skip
    assert env["MEGASCALE_NUM_SLICES"] == "3"
    assert env["JAX_PROCESS_COUNT"] == str(3 * HOSTS)
    assert env["MULTISLICE_DCN_DATA"] == "3"
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 3  # 5 - the 2 already charged
    notes = jobset["metadata"]["annotations"]
    assert notes[keys.RESTARTS_BEFORE] == "4" and notes[keys.RESTARTS_COUNTED_BEFORE] == "2"
    with pytest.raises(ValueError, match="cannot run on 2 slices: 4, 3"):
        plan.running_on(2)
    # Observed back: its counters and its pods' attempts continue the job's.
    summary = {
        "suspended": False, "restarts": 1, "restartsCounted": 1, "completed": False,
        "failed": False, "failureReason": "", "failureMessage": "", "ready": 3, "active": 3,
        "succeeded": 0, "madeByUs": True, "ownerUid": "uid-1", "uid": "js-2", "replicas": 3,
        "restartBase": 4, "countedBase": 2,
    }  # fmt: skip
    seen = jobset_observation(summary, ("ns", "job"), "uid-1")
    assert seen is not None
    assert (seen.restarts, seen.restarts_counted, seen.replicas) == (5, 3, 3)
    pod = {"pod": "job-slice-0-0", "slice": 0, "attempt": 1, "phase": "Running", "ready": True,
           "deleting": False, "exitCode": None, "reason": "", "jobsetUid": "js-2"}  # fmt: skip
    assert [p.attempt for p in pod_records([pod], seen)] == [5]


RESIZES = {RestartCause.RESIZE: RESIZE}


def test_a_resize_is_counted_once_charged_to_no_budget():
    old = MultisliceJobStatus.from_dict({"restarts": 3, "restartsByCause": {"disruption": 3}})
    recreated = JobSetObservation(restarts=4, restart_base=4, replicas=3)
    a = attribute(old, recreated, [], RESIZES)
    assert a.new == 1 and a.cause is not None and a.cause.value == "resize"
    assert a.by_cause is not None and a.by_cause.resize == 1 and a.by_cause.not_program() == 3
    # The same JobSet restarting on its own later (a disruption) is not a resize again.
    old2 = MultisliceJobStatus.from_dict(
        {"restarts": 4, "restartsByCause": {"disruption": 3, "resize": 1}}
    )
    b = attribute(old2, JobSetObservation(restarts=5, restart_base=4, replicas=3), [], RESIZES)
    assert b.by_cause is not None and b.by_cause.resize == 1 and b.by_cause.disruption == 4


def test_a_shrunk_job_whose_three_slices_run_is_not_judged_slow_for_the_fourth():
    """The startup deadline counts the JobSet's slices, not spec.slices: on 3 of 4 slices with
    every pod running, nothing is evicted or replaced."""
    ready = pools(PoolState.READY, PoolState.READY, PoolState.READY, PoolState.CREATING)
    old = running_on_four() | {
        "activeSlices": 3,
        "restarts": 2,
        "capacityReadyTime": "2026-12-03T11:00:00Z",
        "startup": {"attempt": 2, "since": "2026-12-03T11:00:00Z"},
    }
    old["conditions"] = [{"type": "Degraded", "status": "True", "reason": Reason.FEWER_SLICES,
                          "message": "", "lastTransitionTime": "2026-12-03T11:00:00Z"}]  # fmt: skip
    obs = Observed(now=T0, slices=ready, jobset=js(3, 2, ready=2, base=2), pods=pods(3, 2))
    d = run(old, obs, failurePolicy={"startupTimeoutSeconds": 60})
    assert Reason.STARTUP_DEADLINE_EXCEEDED not in events(d), [e.message for e in d.events]
    assert not any(type(a).__name__ in ("EvictPods", "DeletePools") for a in d.actions)


def test_a_shrunk_jobset_that_is_finishing_is_not_restarted_to_grow():
    """Its slices are done (a slice's Job succeeded, no pod runs): growing back would rerun a
    finished job; it finishes on the slices it has."""
    ready = pools(*[PoolState.READY] * 4)
    old = running_on_four() | {"activeSlices": 3}
    finishing = JobSetObservation(replicas=3, restarts=2, restart_base=2, succeeded_jobs=1,
                                  ready_jobs=2)  # fmt: skip
    d = run(old, Observed(now=T0, slices=ready, jobset=finishing))
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions)
    assert Reason.GROWING_SLICES not in events(d)


def test_a_shrunk_job_below_min_slices_waits_on_the_slices_it_has():
    """Found by the decide() state machine (tests/unit/test_decide_machine.py, ElasticJob): a
    job shrunk to 3 of 4 loses another pool (2 up: below minSlices 3). It waits for the pools on
    its 3-slice JobSet; it is not 'grown back' to 4 (deleted, GrowingSlices: 'node pools for 4
    of 4 slices are Ready again') with half its pools gone."""
    lost = pools(PoolState.READY, PoolState.READY, PoolState.ABSENT, PoolState.CREATING)
    old = running_on_four() | {"activeSlices": 3, "restarts": 2}
    old["conditions"] = [{"type": "Degraded", "status": "True", "reason": Reason.FEWER_SLICES,
                          "message": "", "lastTransitionTime": "2026-12-03T11:00:00Z"}]  # fmt: skip
    old["slices"][3] |= {"phase": "Provisioning", "hosts": 0,
                         "lostTime": "2026-12-03T11:00:00Z"}  # fmt: skip
    # Slice 2's pods failed with their pool (PodGC): the JobSet restarted, nothing runs.
    d = run(old, Observed(now=T0, slices=lost, jobset=js(3, 3, ready=0, base=2)))
    assert not any(isinstance(a, DeleteJobSet) for a in d.actions), d.actions
    assert Reason.GROWING_SLICES not in events(d)
    assert CreatePools((2,)) in d.actions
    assert d.status.active_slices == 3
    assert cond(d, "Degraded")["status"] == "True"
    assert "Ready again" not in cond(d, "Degraded")["message"]


def test_the_pass_that_sees_the_grow_checkpoint_saved_grows_at_once():
    """Found by the decide() state machine (its fixpoint check): the pass that first saw the
    workload's ack of the grow checkpoint only recorded it, and the grow waited for the next
    pass (up to GROW_SAVE_SECONDS later, the job training on past the step it saved); deciding
    again on the same world then deleted the JobSet. The grow goes in the pass that sees it."""
    ready = pools(*[PoolState.READY] * 4)
    old = running_on_four() | {"activeSlices": 3, "restarts": 2}
    asked = run(old, Observed(now=T0, slices=ready, jobset=js(3, 2, base=2), pods=pods(3, 2)))
    assert asked.status.checkpoint is not None
    assert asked.status.checkpoint.request_id == "grow-4-2"
    later = T0 + timedelta(seconds=20)
    saved = [
        dataclasses.replace(p, checkpoint_request="grow-4-2")
        for p in pods(3, 2, saved=("grow-4-2", 500))
    ]
    d = run(asked.status, Observed(now=later, slices=ready, jobset=js(3, 2, base=2), pods=saved))
    assert d.actions == [DeleteJobSet(foreground=True)]
    assert d.status.checkpoint is not None and d.status.checkpoint.saved_step == 500
    assert Reason.CHECKPOINT_SAVED in events(d)
    grow = next(e.message for e in d.events if e.reason == Reason.GROWING_SLICES)
    assert "checkpoint grow-4-2 saved at step 500" in grow


def test_a_shrunk_job_between_its_jobsets_does_not_rewrite_its_goodput_every_pass():
    """Found by the decide() state machine (its fixpoint check, after an operator restart):
    goodput compared the pass's `degraded` (activeSlices < slices) with the stored one, which is
    only ever true while running; so while a shrunk job restarted (its JobSet deleted for a
    resize) every pass closed the period and opened it again: status.goodput.since moved each
    pass (a status write per pass)."""
    ready = pools(*[PoolState.READY] * 4)
    old = running_on_four() | {"activeSlices": 3, "restarts": 2}
    before = T0 - timedelta(seconds=10)
    on_three = run(old, Observed(now=before, slices=ready, jobset=js(3, 2, base=2),
                                 pods=pods(3, 2)))  # fmt: skip
    assert on_three.status.goodput is not None and on_three.status.goodput.degraded
    deleting = Observed(now=T0, slices=ready, jobset=js(3, 2, base=2, deleting=True))
    d = run(on_three.status, deleting)
    assert d.status.phase == "Restarting"
    assert d.status.goodput is not None and d.status.goodput.state == "restarting"
    later = run(d.status, dataclasses.replace(deleting, now=T0 + timedelta(seconds=10)))
    assert later.status.goodput is not None
    assert later.status.goodput.since == d.status.goodput.since
    assert later.status.to_dict() == d.status.to_dict()


def test_a_suspended_jobset_runs_no_slices():
    """activeSlices counts a JobSet that runs: a suspended one (a queued job's, before Kueue
    admits it) leaves it unset, so it costs no status write of its own."""
    ready = pools(*[PoolState.READY] * 4)
    held = JobSetObservation(replicas=4, suspended=True)
    d = run(None, Observed(now=T0, slices=ready, jobset=held), elastic=None)
    assert d.status.active_slices is None
