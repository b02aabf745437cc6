"""The shape of decide(): ordered verdicts that end a pass with their own actions only, and the
invariants every decision keeps (reconcile/verdicts.py, reconcile/invariants.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from multislice_operator.api.models import MultisliceJobStatus, Phase
from multislice_operator.common.pools import PoolState
from multislice_operator.reconcile import (
    AddFinalizer,
    CreateJobSet,
    CreatePools,
    DecideConfig,
    Decision,
    DeleteJobSet,
    DeletePools,
    JobMeta,
    JobSetObservation,
    SliceObservation,
    invariants,
    verdicts,
)
from multislice_operator.reconcile.facts import derive
from multislice_operator.reconcile.reasons import REGISTRY, Reason
from tests.unit import jobs
from tests.unit.jobs import Observed, run, spec_and_plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings()
_, PLAN = spec_and_plan()
POOLS = [p.name for p in PLAN.node_pools]
RUNNING = {
    "phase": "Running",
    "runningTime": "2026-12-01T11:00:00Z",
    "capacityReadyTime": "2026-12-01T11:00:00Z",
    "conditions": [{"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY}],
    "slices": [{"index": i, "phase": "Running", "hosts": 4, "seenReady": True} for i in range(2)],
}


def slices(*states: PoolState) -> list[SliceObservation]:
    return [
        SliceObservation(i, POOLS[i], s, 4 if s == PoolState.READY else 0, present_hosts=None)
        for i, s in enumerate(states)
    ]


def test_a_late_verdict_does_not_leave_an_earlier_steps_create_behind():
    # Reproduction 1 of issue 22: a spot pool preempted (slice 1 absent) while the JobSet's
    # uncharged restarts (2, none charged) pass maxDisruptionRestarts (1). Before the verdicts
    # were ordered, one pass failed the job AND created the replacement pool.
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.READY, PoolState.ABSENT),
        jobset=JobSetObservation(restarts=2, restarts_counted=0, ready_jobs=1),
        pods=[
            *jobs.running({0: 4}, attempt=2),
            jobs.failed("job-slice-1-0", 1, 143, attempt=1, disruption="TerminationByKubelet"),
        ],
    )
    d = run(RUNNING, obs, failurePolicy={"maxDisruptionRestarts": 1})
    assert d.status.phase == Phase.FAILED
    assert d.status.condition("Failed").reason == Reason.MAX_DISRUPTION_RESTARTS  # type: ignore[union-attr]
    assert d.actions == [DeleteJobSet(), DeletePools((POOLS[0],))]
    assert [e.reason for e in d.events] == [
        Reason.RESTARTING_ALL_SLICES,
        Reason.MAX_DISRUPTION_RESTARTS,
        "Failed",
    ]


def test_a_pool_is_never_created_without_the_finalizer():
    # Reproduction 2 of issue 22: a Succeeded status written by hand while the JobSet runs and a
    # pool is absent, on a job without the finalizer: the status is ignored, the lifecycle runs
    # as for any job, and the finalizer comes before the pool.
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.READY, PoolState.ABSENT),
        jobset=JobSetObservation(ready_jobs=2),
        pods=jobs.running({0: 4, 1: 4}),
    )
    meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=False)
    d = run({**RUNNING, "phase": "Succeeded"}, obs, meta=meta)
    assert d.actions == [AddFinalizer(), CreatePools((1,))]
    assert Reason.STATUS_IGNORED in [e.reason for e in d.events]
    assert d.status.phase == Phase.RESTARTING


def test_verdicts_are_checked_in_one_order_and_the_first_wins():
    # A JobSet that completed while a pool was lost: success wins, and nothing is repaired.
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.READY, PoolState.ABSENT),
        jobset=JobSetObservation(completed=True, succeeded_jobs=2, restarts=5),
    )
    d = run(RUNNING, obs, failurePolicy={"maxDisruptionRestarts": 1})
    assert d.status.phase == Phase.SUCCEEDED
    assert not [a for a in d.actions if isinstance(a, (CreatePools, CreateJobSet))]
    f = derive(
        JobMeta("ns", "job", "uid-1", 1, has_finalizer=True),
        *spec_and_plan(failurePolicy={"maxDisruptionRestarts": 1}),
        None,
        MultisliceJobStatus.from_dict(RUNNING),
        obs,
        CFG,
    )
    fired = [rule.__name__ for rule in verdicts.VERDICTS if rule(f) is not None]
    assert fired[0] == "completed" and "disruption_budget" in fired


def test_every_failing_verdict_gives_a_registered_terminal_reason():
    # Each rule's reasons, as they appear in its source: a registered reason ends the job.
    import inspect

    given = set()
    for rule in verdicts.VERDICTS:
        given |= {Reason[m] for m in re.findall(r"Reason\.([A-Z_]+)", inspect.getsource(rule))}
    given |= {reason for _, reason in verdicts.DEADLINES}  # the time-based ones, by table
    assert Reason.PODS_NOT_CREATED in given
    failing = {r for r in given if REGISTRY[r].condition is None or REGISTRY[r].terminal}
    assert Reason.MAX_DISRUPTION_RESTARTS in failing and Reason.POD_SECURITY_REFUSED in failing
    for reason in failing - {Reason.SUSPENDED, Reason.ORPHAN_JOBSET}:
        assert REGISTRY[reason].terminal, reason


def _decision(*actions, phase=Phase.RUNNING) -> Decision:
    return Decision(MultisliceJobStatus(phase=phase), list(actions))


def _facts(has_finalizer=True, taken=False):
    s = slices(PoolState.READY, PoolState.READY)
    if taken:
        s[1] = SliceObservation(1, POOLS[1], PoolState.READY, 4, taken_by="ns/other")
    meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=has_finalizer)
    spec, plan = spec_and_plan()
    return derive(meta, spec, plan, None, MultisliceJobStatus(), Observed(now=NOW, slices=s), CFG)


@pytest.mark.parametrize(
    ("facts", "decision", "broken"),
    [
        (_facts(), _decision(CreatePools((0,)), phase=Phase.FAILED), "on a job that is Failed"),
        (_facts(False), _decision(CreatePools((0,))), "before the finalizer"),
        (_facts(), _decision(DeletePools((POOLS[0],)), DeletePools((POOLS[0],))), "twice"),
        (_facts(taken=True), _decision(DeletePools((POOLS[1],))), "not the job's"),
        (_facts(), _decision(CreatePools((0,)), DeletePools((POOLS[0],))), "created"),
    ],
)
def test_a_broken_promise_raises_in_tests_and_is_dropped_in_production(facts, decision, broken):
    with pytest.raises(invariants.InvariantViolation, match=broken):
        invariants.enforce(facts, decision)
    invariants.STRICT = False
    before = len(decision.actions)
    kept = invariants.enforce(facts, decision)
    assert kept.violations and broken in kept.violations[0]
    assert len(kept.actions) == before - len(kept.violations)


def test_a_kept_promise_passes():
    d = _decision(AddFinalizer(), CreatePools((0,)))
    assert invariants.violations(_facts(False), d) == []


def test_a_namespace_that_refuses_the_pods_fails_the_job_before_any_pool():
    refused = "namespace ns enforces Pod Security level baseline (...)"
    obs = Observed(now=NOW, slices=slices(PoolState.ABSENT, PoolState.ABSENT), admission=None)
    obs.pod_security = refused
    d = run({}, obs, meta=JobMeta("ns", "job", "uid-1", 1))
    assert d.status.phase == Phase.FAILED and d.actions == []  # no dry run, no finalizer, no pool
    assert d.status.condition("Failed").reason == Reason.POD_SECURITY_REFUSED  # type: ignore[union-attr]
    # Once pools exist (the namespace changed under a running job), it is not this verdict's.
    later = Observed(now=NOW, slices=slices(PoolState.READY, PoolState.READY))
    later.pod_security = refused
    assert run({}, later).status.phase != Phase.FAILED


def test_a_job_without_a_checkpoint_says_so_once():
    s, p = spec_and_plan(checkpoint={})
    meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
    obs = Observed(now=NOW, slices=slices(PoolState.ABSENT, PoolState.ABSENT))
    first = run(None, obs, meta=meta, plan=(s, p))
    (warned,) = [e for e in first.events if e.reason == Reason.NO_CHECKPOINT]
    assert "spec.checkpoint.directory" in warned.message and warned.type == "Warning"
    again = run(first.status, obs, meta=meta, plan=(s, p))
    assert Reason.NO_CHECKPOINT not in [e.reason for e in again.events]
