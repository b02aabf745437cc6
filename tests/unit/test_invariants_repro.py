"""Plain decide() calls that break the invariants of issue 22 on the code of the issue: the two
reproductions it names, and what tests/unit/test_decide_machine.py found besides. Each is the
machine's shrunk counterexample written out, checked with the machine's own `violations`."""

from __future__ import annotations

from datetime import UTC, datetime

from multislice_operator.api.models import MultisliceJobStatus, Phase
from multislice_operator.common.pools import PoolState
from multislice_operator.reconcile import (
    AddFinalizer,
    Admission,
    CreatePools,
    Decision,
    DeletePools,
    JobMeta,
    JobSetObservation,
    SliceObservation,
)
from multislice_operator.reconcile import Observed as _Observed
from multislice_operator.reconcile.reasons import Reason
from tests.unit.jobs import Observed, run, spec_and_plan
from tests.unit.test_decide_machine import violations

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
UP = [{"index": i, "phase": "Running", "hosts": 4, "seenReady": True} for i in range(2)]
RUNNING = {
    "phase": "Running",
    "slices": UP,
    "conditions": [
        {"type": "Provisioned", "status": "True", "reason": Reason.GANG_READY, "message": "ready"}
    ],
}


def meta(finalizer: bool = True) -> JobMeta:
    return JobMeta("ns", "job", "uid-1", 1, has_finalizer=finalizer)


def slices(*states: PoolState) -> list[SliceObservation]:
    _, plan = spec_and_plan()
    return [
        SliceObservation(i, plan.node_pools[i].name, s, 4 if s == PoolState.READY else 0)
        for i, s in enumerate(states)
    ]


def creating(obs: _Observed, d: Decision) -> _Observed:
    """The world after `d`'s CreatePools: those pools exist, being created."""
    created = {i for a in d.actions if isinstance(a, CreatePools) for i in a.slices}
    obs.slices = [
        SliceObservation(s.index, s.pool, PoolState.CREATING, operation_pending=True)
        if s.index in created
        else s
        for s in obs.slices
    ]
    return obs


def test_a_late_verdict_does_not_create_what_it_fails():
    """Issue 22, reproduction 1: a spot slice preempted (its pool gone), the JobSet restarted
    twice meanwhile (no restart charged), maxDisruptionRestarts 1: the job fails for its
    disruption budget, and that same pass must not recreate the lost pool."""
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.READY, PoolState.ABSENT),
        jobset=JobSetObservation(restarts=2, restarts_counted=0, ready_jobs=1),
    )
    spec = {"capacity": {"type": "Spot"}, "failurePolicy": {"maxDisruptionRestarts": 1}}
    d = run(RUNNING, obs, meta=meta(), **spec)
    assert d.status.phase == Phase.FAILED
    assert violations(meta(), d, obs) == []
    assert not any(isinstance(a, CreatePools) for a in d.actions)


def test_the_pass_after_a_create_does_not_delete_it_unprovoked():
    """Reproduction 1, one pass on: what the failing pass created, the next pass (nothing
    changed but that pass's own actions) deletes."""
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.READY, PoolState.ABSENT),
        jobset=JobSetObservation(restarts=2, restarts_counted=0, ready_jobs=1),
    )
    spec = {"capacity": {"type": "Spot"}, "failurePolicy": {"maxDisruptionRestarts": 1}}
    first = run(RUNNING, obs, meta=meta(), **spec)
    created = {
        obs.slices[i].pool for a in first.actions if isinstance(a, CreatePools) for i in a.slices
    }
    second = run(first.status, creating(obs, first), meta=meta(), **spec)
    deleted = {n for a in second.actions if isinstance(a, DeletePools) for n in a.pools}
    assert not created & deleted


def test_no_pool_is_created_without_the_finalizer():
    """Issue 22, reproduction 2: a Succeeded status written by hand while the JobSet still runs
    and one pool is absent, the job without our finalizer: the StatusIgnored branch recreates
    the pool, and nothing then guarantees its release."""
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.READY, PoolState.ABSENT),
        jobset=JobSetObservation(ready_jobs=1),
    )
    d = run({"phase": "Succeeded"}, obs, meta=meta(finalizer=False))
    assert violations(meta(finalizer=False), d, obs) == []
    creates = [i for i, a in enumerate(d.actions) if isinstance(a, CreatePools)]
    adds = [i for i, a in enumerate(d.actions) if isinstance(a, AddFinalizer)]
    assert not creates or (adds and adds[0] < creates[0])


# ---------------------------------------------------------------- what the machine found besides


def test_a_hand_written_terminal_phase_does_not_bypass_suspend():
    """Machine, LateVerdict: a suspended job whose status someone set to Failed by hand while
    its JobSet still runs: the StatusIgnored branch provisions (spec.suspend is not read
    there), and the next pass, Suspended, deletes the pools it just created."""
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.ABSENT, PoolState.ABSENT),
        jobset=JobSetObservation(restarts=2),
    )
    d = run({"phase": "Failed"}, obs, meta=meta(), suspend=True)
    assert not any(isinstance(a, CreatePools) for a in d.actions), d.actions


def test_a_refused_jobset_releases_a_stray_pool_once():
    """Machine, DuplicateDelete: the stray pool is deleted by _active and again by the refused
    verdict's release, in one decision."""
    obs = Observed(now=NOW, slices=slices(PoolState.ABSENT, PoolState.ABSENT))
    obs.strays = {"old-naming-pool": PoolState.READY}
    obs.admission = Admission(refused="spec.replicatedJobs: Invalid value")
    d = run({"phase": "Pending"}, obs, meta=meta())
    assert violations(meta(), d, obs) == []


def test_completion_is_one_status_write():
    """Machine, Fixpoint: the pass that sees the JobSet completed writes Succeeded without
    releasing the pools; the next pass, on the same world, releases them and writes another
    message. The verdict's actions belong to the pass that reaches it."""
    obs = Observed(
        now=NOW,
        slices=slices(PoolState.READY, PoolState.READY),
        jobset=JobSetObservation(completed=True, succeeded_jobs=2),
    )
    first = run(RUNNING, obs, meta=meta())
    again = run(MultisliceJobStatus.from_dict(first.status.to_dict()), obs, meta=meta())
    assert first.actions or (again.actions == [] and again.events == [])
    assert again.status.to_dict() == first.status.to_dict()
