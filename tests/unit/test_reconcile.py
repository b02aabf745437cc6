"""Table tests for decide(): every phase transition from plain observed data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common.errors import FieldError, SpecError
from multislice_operator.common.ownership import Owner
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.plugins.existing import Found
from multislice_operator.reconcile import (
    AddFinalizer,
    CreateJobSet,
    CreatePools,
    CreateWorkload,
    DecideConfig,
    DeleteJob,
    DeletePools,
    JobMeta,
    JobSetObservation,
    Pod,
    QueueObservation,
    RemoveFinalizer,
    SetJobSetSuspend,
    SliceObservation,
    WorkloadObservation,
    backoff_seconds,
    decide,
)
from multislice_operator.reconcile.reasons import Reason
from tests.unit import jobs
from tests.unit.jobs import Observed, failed, spec_and_plan

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


CFG = DecideConfig.from_settings(
    None, backoff_base_seconds=30, backoff_max_seconds=600, resync_seconds=10
)
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def st(decision):
    """The status as written to the apiserver (camelCase, no nulls)."""
    return decision.status.to_dict()


run = partial(jobs.run, cfg=CFG, now=NOW, meta=META)


def pools(*states, ready=None, errors=None):
    """Slice observations for the Managed plan of `job` in `ns`."""
    _, p = spec_and_plan()
    out = []
    for i, state in enumerate(states):
        hosts = ready[i] if ready else (4 if state == PoolState.READY else 0)
        err = (errors or {}).get(i)
        out.append(SliceObservation(i, p.node_pools[i].name, state, hosts, err))
    return out


def existing(ready_pools: int):
    return [SliceObservation(i, f"pool-{i}", PoolState.READY, 4) for i in range(ready_pools)]


def kinds(decision):
    return [type(a).__name__ for a in decision.actions]


def reasons(decision):
    return [e.reason for e in decision.events]


# ---------------------------------------------------------------- validation


def test_invalid_spec_fails_with_field_path():
    err = SpecError([FieldError("spec.parallelism.ici", "product 2 != 16")])
    d = decide(META, None, None, err, None, Observed(now=NOW), CFG)
    assert st(d)["phase"] == "Failed"
    cond = {c["type"]: c for c in st(d)["conditions"]}
    assert cond["Validated"]["status"] == "False"
    assert "spec.parallelism.ici" in cond["Validated"]["message"]
    assert d.actions == []


def test_dcn_advice_condition():
    d = run(
        obs=Observed(now=NOW),
        provisioning={"mode": "Existing"},
        training={"globalBatchTokens": 1000},
    )
    cond = {c["type"]: c for c in st(d)["conditions"]}
    assert cond["DCNBound"]["status"] == "True"
    assert cond["DCNBound"]["reason"] == Reason.BATCH_TOO_SMALL


# ---------------------------------------------------------------- Existing mode


def test_existing_waits_for_pools():
    d = run(
        obs=Observed(now=NOW, slices=existing(1), capacity=Found(1)),
        provisioning={"mode": "Existing"},
    )
    assert st(d)["phase"] == "Pending"
    assert "1 ready of 1 found" in st(d)["message"]
    assert d.actions == []
    assert d.requeue_after == CFG.resync_seconds


def test_existing_ready_creates_jobset():
    d = run(obs=Observed(now=NOW, slices=existing(2)), provisioning={"mode": "Existing"})
    assert kinds(d) == ["CreateJobSet"]
    assert st(d)["phase"] == "Starting"
    assert st(d)["jobSet"] == "job"
    assert reasons(d) == []  # a new job's first phase is its status, not an event


@pytest.mark.parametrize(
    ("js", "phase"),
    [
        (JobSetObservation(ready_jobs=0), "Starting"),
        (JobSetObservation(ready_jobs=2), "Running"),
        (JobSetObservation(ready_jobs=1, restarts=1), "Restarting"),
        (JobSetObservation(completed=True), "Succeeded"),
        (JobSetObservation(failed=True, failure_reason="FailedJobs"), "Failed"),
    ],
)
def test_jobset_drives_phase(js, phase):
    d = run(
        obs=Observed(now=NOW, slices=existing(2), jobset=js),
        old={"phase": "Starting"},
        provisioning={"mode": "Existing"},
    )
    assert st(d)["phase"] == phase
    assert CreateJobSet() not in d.actions


def test_restart_counted_once_with_cause():
    obs = Observed(
        now=NOW,
        slices=existing(2),
        jobset=JobSetObservation(ready_jobs=0, restarts=2),
        pods=[failed("job-slice-1-0-abc", 1, 17, "Error", 1)],
    )
    d = run(old={"phase": "Running", "restarts": 1}, obs=obs, provisioning={"mode": "Existing"})
    assert st(d)["restarts"] == 2
    restart = [e for e in d.events if e.reason == Reason.RESTARTING_ALL_SLICES]
    assert len(restart) == 1
    assert "job-slice-1-0-abc" in restart[0].message and "17" in restart[0].message
    again = run(old=d.status, obs=obs, provisioning={"mode": "Existing"})
    assert Reason.RESTARTING_ALL_SLICES not in reasons(again)


def test_non_retryable_failure_names_pod_and_code():
    obs = Observed(
        now=NOW,
        slices=existing(2),
        jobset=JobSetObservation(failed=True, failure_reason="FailJobSet"),
        pods=[failed("job-slice-0-1-x", 0, 42, "Error", 0)],
    )
    d = run(old={"phase": "Running"}, obs=obs, provisioning={"mode": "Existing"})
    assert st(d)["phase"] == "Failed"
    assert "job-slice-0-1-x" in st(d)["message"] and "42" in st(d)["message"]
    assert st(d)["completionTime"] == iso(NOW)


def test_max_restarts_message():
    obs = Observed(
        now=NOW,
        slices=existing(2),
        jobset=JobSetObservation(failed=True, restarts=3, failure_reason="ReachedMaxRestarts"),
    )
    d = run(
        old={"phase": "Restarting"},
        obs=obs,
        provisioning={"mode": "Existing"},
        failurePolicy={"maxRestarts": 3},
    )
    assert "maxRestarts" in st(d)["message"]


def test_suspend_and_resume_existing():
    obs = Observed(now=NOW, slices=existing(2), jobset=JobSetObservation(ready_jobs=2))
    d = run(old={"phase": "Running"}, obs=obs, provisioning={"mode": "Existing"}, suspend=True)
    assert st(d)["phase"] == "Suspended"
    assert d.actions == [SetJobSetSuspend(True)]
    obs.jobset = JobSetObservation(suspended=True)
    d = run(old=d.status, obs=obs, provisioning={"mode": "Existing"})
    assert d.actions == [SetJobSetSuspend(False)]
    assert st(d)["phase"] == "Starting"


def test_stranger_jobset_is_not_touched():
    obs = Observed(now=NOW, slices=existing(2), jobset=JobSetObservation(owner=Owner.STRANGER))
    d = run(obs=obs, provisioning={"mode": "Existing"})
    assert st(d)["phase"] == "Failed"
    assert "not owned" in st(d)["message"]
    assert d.actions == []


# ---------------------------------------------------------------- Managed mode: the gang


def test_managed_without_provisioner_waits_with_reason():
    d = run(obs=Observed(now=NOW, provisioner_configured=False))
    assert st(d)["phase"] == "Pending"
    cond = {c["type"]: c for c in st(d)["conditions"]}
    assert cond["Provisioned"]["reason"] == Reason.PROVISIONER_NOT_CONFIGURED
    assert "--gke-cluster" in st(d)["message"] and "mode: Existing" in st(d)["message"]


def test_gang_creates_every_pool_together():
    d = run(obs=Observed(now=NOW, slices=pools(PoolState.ABSENT, PoolState.ABSENT)))
    assert d.actions == [CreatePools((0, 1))]
    assert st(d)["phase"] == "Provisioning"
    assert st(d)["provisioningAttempts"] == 1
    assert st(d)["attemptStartTime"] == iso(NOW)


def test_gang_waits_while_provisioning():
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    d = run(
        old=old,
        obs=Observed(
            now=NOW + timedelta(seconds=5), slices=pools(PoolState.READY, PoolState.CREATING)
        ),
    )
    assert d.actions == []
    assert st(d)["provisioningAttempts"] == 1
    assert "1/2 ready" in st(d)["message"]
    assert st(d)["slices"][0]["phase"] == "Ready"
    assert st(d)["slices"][1]["phase"] == "Provisioning"


def test_gang_ready_creates_jobset():
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    d = run(old=old, obs=Observed(now=NOW, slices=pools(PoolState.READY, PoolState.READY)))
    assert d.actions == [CreateJobSet()]
    assert "attemptStartTime" not in d.status
    assert Reason.GANG_PROVISIONED in reasons(d)
    assert st(d)["readySlices"] == "2/2"


def test_running_pool_without_ready_nodes_is_not_ready():
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    d = run(
        old=old, obs=Observed(now=NOW, slices=pools(PoolState.READY, PoolState.READY, ready=[4, 2]))
    )
    assert CreateJobSet() not in d.actions


def test_stockout_rolls_back_the_whole_gang():
    stockout = PoolError(1, "p1", "GCE_STOCKOUT", "no capacity in zone", False)
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    d = run(
        old=old,
        obs=Observed(
            now=NOW, slices=pools(PoolState.READY, PoolState.FAILED, errors={1: stockout})
        ),
    )
    (delete,) = d.actions
    assert isinstance(delete, DeletePools) and len(delete.pools) == 2
    assert Reason.GANG_ROLLED_BACK in reasons(d)
    msg = next(e.message for e in d.events if e.reason == Reason.GANG_ROLLED_BACK)
    assert "slice 1" in msg and "GCE_STOCKOUT" in msg
    wait = backoff_seconds("uid-1", 1, CFG)
    assert st(d)["nextAttemptTime"] == iso(NOW + timedelta(seconds=wait))
    assert 24 <= wait <= 36
    cond = {c["type"]: c for c in st(d)["conditions"]}
    assert cond["Provisioned"]["reason"] == Reason.GANG_SLICE_FAILED
    # During the backoff nothing is created; leftovers are deleted.
    later = run(
        old=d.status,
        obs=Observed(
            now=NOW + timedelta(seconds=5), slices=pools(PoolState.DELETING, PoolState.ABSENT)
        ),
    )
    assert later.actions == []
    assert st(later)["phase"] == "Provisioning"
    # After the backoff, a new attempt creates the whole gang again.
    retry = run(
        old=later.status,
        obs=Observed(
            now=NOW + timedelta(seconds=wait + 1), slices=pools(PoolState.ABSENT, PoolState.ABSENT)
        ),
    )
    assert retry.actions == [CreatePools((0, 1))]
    assert st(retry)["provisioningAttempts"] == 2


def test_backoff_grows_and_is_capped():
    waits = [backoff_seconds("u", n, CFG) for n in range(1, 10)]
    assert waits[1] > waits[0] and waits[2] > waits[1]
    assert max(waits) <= 600 * 1.2


def test_timeout_rolls_back():
    old = {
        "phase": "Provisioning",
        "provisioningAttempts": 1,
        "attemptStartTime": iso(NOW - timedelta(seconds=1801)),
    }
    d = run(old=old, obs=Observed(now=NOW, slices=pools(PoolState.READY, PoolState.CREATING)))
    assert isinstance(d.actions[0], DeletePools)
    cond = {c["type"]: c for c in st(d)["conditions"]}
    assert cond["Provisioned"]["reason"] == Reason.GANG_TIMEOUT
    assert "slices 1 not ready" in cond["Provisioned"]["message"]


def test_permanent_error_fails_job_and_releases():
    bad = PoolError(0, "p0", "INVALID_ARGUMENT", "unknown machine type", True)
    d = run(
        old={"phase": "Provisioning"},
        obs=Observed(now=NOW, slices=pools(PoolState.FAILED, PoolState.READY, errors={0: bad})),
    )
    assert st(d)["phase"] == "Failed"
    assert isinstance(d.actions[0], DeletePools)
    assert "INVALID_ARGUMENT" in st(d)["message"]


def test_accelerator_not_offered_fails_fast():
    offered = PoolError(None, "-", "NOT_OFFERED", "v5litepod-16 is not offered in zone z", True)
    d = run(
        obs=Observed(
            now=NOW, slices=pools(PoolState.ABSENT, PoolState.ABSENT), offered_error=offered
        )
    )
    assert st(d)["phase"] == "Failed"
    assert CreatePools((0, 1)) not in d.actions


def test_foreign_pool_deleted_before_create():
    _, p = spec_and_plan()
    obs = Observed(
        now=NOW,
        slices=[
            SliceObservation(0, p.node_pools[0].name, PoolState.READY, 4, foreign=True),
            SliceObservation(1, p.node_pools[1].name, PoolState.ABSENT),
        ],
    )
    d = run(obs=obs)
    assert d.actions[0] == DeletePools((p.node_pools[0].name,))
    assert d.actions[1] == CreatePools((1,))


# ---------------------------------------------------------------- Managed mode: running


def test_lost_slice_replaced_alone():
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.READY, ready=[4, 0]),
        jobset=JobSetObservation(ready_jobs=1, restarts=1),
    )
    before = [{"index": i, "phase": "Running", "hosts": 4, "seenReady": True} for i in range(2)]
    d = run(old={"phase": "Running", "restarts": 1, "slices": before}, obs=obs)
    _, p = spec_and_plan()
    assert d.actions == [DeletePools((p.node_pools[1].name,))]
    assert st(d)["phase"] == "Restarting"
    assert st(d)["slices"][1]["phase"] == "Repairing"
    assert reasons(d).count(Reason.SLICE_LOST) == 1
    obs.slices = pools(PoolState.READY, PoolState.ABSENT)
    d2 = run(old=d.status, obs=obs)
    assert d2.actions == [CreatePools((1,))]
    assert Reason.SLICE_LOST not in reasons(d2)  # announced once per loss


def test_fresh_pool_without_nodes_yet_is_not_lost():
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.READY, ready=[4, 0]),
        jobset=JobSetObservation(ready_jobs=1, restarts=1),
    )
    before = [{"index": 0, "phase": "Running"}, {"index": 1, "phase": "Provisioning"}]
    d = run(old={"phase": "Restarting", "restarts": 1, "slices": before}, obs=obs)
    assert d.actions == []
    assert Reason.SLICE_LOST not in reasons(d)


def test_finished_releases_pools_unless_kept():
    obs = Observed(now=NOW, slices=pools(PoolState.READY, PoolState.READY))
    d = run(old={"phase": "Succeeded", "completionTime": iso(NOW)}, obs=obs)
    assert isinstance(d.actions[0], DeletePools)
    kept = run(
        old={"phase": "Succeeded", "completionTime": iso(NOW)},
        obs=obs,
        provisioning={"keepNodePools": True},
    )
    assert kept.actions == []
    failed = run(
        old={"phase": "Failed", "completionTime": iso(NOW)},
        obs=obs,
        provisioning={"keepNodePools": True},
    )
    assert isinstance(failed.actions[0], DeletePools)


def test_suspend_releases_capacity():
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.READY),
        jobset=JobSetObservation(ready_jobs=2),
    )
    d = run(old={"phase": "Running"}, obs=obs, suspend=True)
    assert d.actions[0] == SetJobSetSuspend(True)
    assert isinstance(d.actions[1], DeletePools)
    assert st(d)["phase"] == "Suspended"


def test_suspend_keeps_the_pools_until_the_jobsets_pods_are_gone():
    """spec.suspend: the JobSet is suspended first; its pods end by the Job's suspension (their
    grace period: the SIGTERM checkpoint), not by node shutdown, which JobSet would count as a
    disruption and restart every slice for."""
    _, p = spec_and_plan()
    names = [pool.name for pool in p.node_pools]
    live = [
        Pod(f"job-slice-{s}-0", s, 0, "Running", True, s == 0, f"n-{s}", names[s]) for s in (0, 1)
    ]
    up = pools(PoolState.READY, PoolState.READY)
    first = run(
        old={"phase": "Running"},
        obs=Observed(now=NOW, slices=up, jobset=JobSetObservation(ready_jobs=2), pods=live),
        suspend=True,
    )
    assert first.actions == [SetJobSetSuspend(True)]
    assert st(first)["phase"] == "Suspended" and "once its pods are gone" in st(first)["message"]
    stopping = JobSetObservation(suspended=True, suspended_since=NOW)
    later = NOW + timedelta(seconds=3)
    d = run(old=first.status, obs=Observed(now=later, slices=up, jobset=stopping, pods=live),
            suspend=True)  # fmt: skip
    assert d.actions == []
    d = run(old=d.status, obs=Observed(now=later, slices=up, jobset=stopping), suspend=True)
    assert d.actions == [DeletePools(tuple(names))]
    assert st(d)["message"].startswith("suspended (releasing node pools)")
    # A template's own terminationGracePeriodSeconds is waited for (plus the margin).
    grace = {"spec": {"terminationGracePeriodSeconds": 120, "containers": [
        {"name": "train", "image": "python:3.11"}]}}  # fmt: skip
    at = NOW + timedelta(seconds=100)
    d = run(old=first.status, obs=Observed(now=at, slices=up, jobset=stopping, pods=live),
            suspend=True, template=grace)  # fmt: skip
    assert d.actions == []


def test_ttl_deletes_after_delay():
    obs = Observed(now=NOW, slices=pools(PoolState.ABSENT, PoolState.ABSENT))
    done = iso(NOW - timedelta(seconds=30))
    early = run(
        old={"phase": "Succeeded", "completionTime": done}, obs=obs, ttlSecondsAfterFinished=60
    )
    assert early.actions == [] and early.requeue_after == pytest.approx(30, abs=1)
    late = run(
        old={"phase": "Succeeded", "completionTime": done}, obs=obs, ttlSecondsAfterFinished=10
    )
    assert late.actions == [DeleteJob()]


def test_decide_is_deterministic():
    obs = Observed(now=NOW, slices=pools(PoolState.READY, PoolState.FAILED))
    old = {"phase": "Provisioning", "provisioningAttempts": 2, "attemptStartTime": iso(NOW)}
    assert run(old=old, obs=obs).status == run(old=old, obs=obs).status


def test_a_queued_jobset_waits_suspended_until_its_workload_is_admitted():
    meta = JobMeta("ns", "job", "uid-1", 1, labels={"kueue.x-k8s.io/queue-name": "tpu-queue"})
    s, p = spec_and_plan(provisioning={"mode": "Existing"})
    queue = QueueObservation("tpu-queue")
    obs = Observed(now=NOW, slices=existing(2), jobset=JobSetObservation(suspended=True),
                   queue=queue)  # fmt: skip
    d = run(old={"phase": "Starting"}, obs=obs, meta=meta, plan=(s, p))
    assert d.actions == [CreateWorkload()]  # its Workload first; the JobSet stays suspended
    assert st(d)["phase"] == "Queued"
    assert "tpu-queue" in st(d)["message"]
    admitted = WorkloadObservation("w", "1", quota_reserved=True, admitted=True)
    obs = Observed(now=NOW, slices=existing(2), jobset=JobSetObservation(suspended=True),
                   queue=QueueObservation("tpu-queue", workload=admitted))  # fmt: skip
    d = run(old={"phase": "Starting"}, obs=obs, meta=meta, plan=(s, p))
    assert d.actions == [SetJobSetSuspend(False)]  # admitted: the operator resumes it


# ---------------------------------------------------------------- the shell's old decisions


def test_a_managed_job_gets_its_finalizer_before_any_pool():
    fresh = JobMeta("ns", "job", "uid-1", 1)  # no finalizer yet
    d = run(obs=Observed(now=NOW, slices=pools(PoolState.ABSENT, PoolState.ABSENT)), meta=fresh)
    assert d.actions == [AddFinalizer(), CreatePools((0, 1))]


def test_an_existing_mode_job_needs_no_finalizer():
    fresh = JobMeta("ns", "job", "uid-1", 1)
    d = run(
        obs=Observed(now=NOW, slices=existing(2)), provisioning={"mode": "Existing"}, meta=fresh
    )
    assert d.actions == [CreateJobSet()]


def test_deleting_releases_every_pool_then_removes_the_finalizer():
    deleting = JobMeta("ns", "job", "uid-1", 1, deleting=True, has_finalizer=True)
    _, p = spec_and_plan()
    obs = Observed(now=NOW, slices=pools(PoolState.READY, PoolState.DELETING))
    d = run(old={"phase": "Running"}, obs=obs, meta=deleting)
    assert d.actions == [DeletePools((p.node_pools[0].name,))]
    assert "releasing the node pools" in st(d)["message"]
    gone = run(
        old=d.status,
        obs=Observed(now=NOW, slices=pools(PoolState.ABSENT, PoolState.ABSENT)),
        meta=deleting,
    )
    assert gone.actions == [RemoveFinalizer()]


def test_releasing_the_pools_writes_the_status_once_whatever_states_they_pass():
    """Found by the write budget under load: each pool state seen while releasing rewrote
    status.slices, one more write per job deleted."""
    deleting = JobMeta("ns", "job", "uid-1", 1, deleting=True, has_finalizer=True)
    creating = Observed(now=NOW, slices=pools(PoolState.CREATING, PoolState.CREATING))
    first = run(old={"phase": "Provisioning"}, obs=creating, meta=deleting)
    for states in [(PoolState.READY, PoolState.CREATING), (PoolState.DELETING, PoolState.READY)]:
        later = Observed(now=NOW + timedelta(seconds=5), slices=pools(*states))
        again = run(old=first.status, obs=later, meta=deleting)
        assert st(again) == st(first), states


@pytest.mark.parametrize("before", ["Provisioning", "Running", "Starting"])
def test_every_pass_of_a_deletion_writes_what_the_first_wrote(before):
    """Whatever the pools do while they are released (states, retryable errors, time passing),
    the status stays as the deletion's first pass wrote it: one write per deletion."""
    from hypothesis import given, settings
    from hypothesis import strategies as hs

    deleting = JobMeta("ns", "job", "uid-1", 1, deleting=True, has_finalizer=True)
    busy = PoolError(1, "p", "CLUSTER_BUSY", "another operation is running", permanent=False)
    state = hs.sampled_from(
        [PoolState.CREATING, PoolState.READY, PoolState.DELETING, PoolState.ABSENT]
    )
    first = run(
        old={"phase": before},
        obs=Observed(now=NOW, slices=pools(PoolState.READY, PoolState.READY)),
        meta=deleting,
    )

    @settings(max_examples=60, deadline=None)
    @given(hs.lists(hs.tuples(state, state, hs.booleans(), hs.integers(1, 600)), max_size=5))
    def passes(seq):
        old, t = first.status, NOW
        for s0, s1, err, dt in seq:
            if s0 == s1 == PoolState.ABSENT:
                continue  # every pool released: the finalizer comes off, no status is written
            t += timedelta(seconds=dt)
            slices = pools(s0, s1, errors={1: busy} if err else None)
            d = run(old=old, obs=Observed(now=t, slices=slices), meta=deleting)
            assert st(d) == st(first), (seq, st(d), st(first))
            old = d.status

    passes()


def test_creating_the_jobset_costs_one_status_write():
    """The pass that creates the JobSet writes the status the next pass (JobSet seen, nothing
    running yet) computes, so that pass writes nothing."""
    first = run(obs=Observed(now=NOW, slices=existing(2)), provisioning={"mode": "Existing"})
    assert kinds(first) == ["CreateJobSet"]
    seen = Observed(now=NOW + timedelta(seconds=1), slices=existing(2), jobset=JobSetObservation())
    second = run(old=first.status, obs=seen, provisioning={"mode": "Existing"})
    assert second.actions == [] and second.events == []
    assert st(second) == st(first)


def test_terminal_message_comes_from_the_condition_not_the_old_message():
    failed = run(
        obs=Observed(now=NOW, slices=existing(2), jobset=JobSetObservation(failed=True)),
        old={"phase": "Running"},
        provisioning={"mode": "Existing"},
    )
    tampered = failed.status.model_copy(deep=True)
    tampered.message = "something else entirely (releasing node pools)"
    again = run(old=tampered, obs=Observed(now=NOW), provisioning={"mode": "Existing"})
    assert st(again)["message"] == st(failed)["message"]


def test_offered_error_only_matters_before_the_first_pool():
    not_offered = PoolError(None, "", "ACCELERATOR_NOT_OFFERED", "v5litepod-16 not offered", True)
    before = run(
        obs=Observed(
            now=NOW, slices=pools(PoolState.ABSENT, PoolState.ABSENT), offered_error=not_offered
        )
    )
    assert st(before)["phase"] == "Failed"
    running = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.READY),
        jobset=JobSetObservation(ready_jobs=2),
        offered_error=not_offered,
    )
    assert st(run(old={"phase": "Running"}, obs=running))["phase"] == "Running"


def test_a_refused_create_of_an_absent_pool_belongs_to_its_attempt():
    quota = PoolError(0, "p", "GCE_QUOTA_EXCEEDED", "Insufficient regional quota", False)
    obs = Observed(now=NOW, slices=pools(PoolState.ABSENT, PoolState.ABSENT, errors={0: quota}))
    during = run(
        old={"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)},
        obs=obs,
    )
    assert reasons(during) == [Reason.GANG_ROLLED_BACK]
    after_backoff = run(old={"phase": "Provisioning", "provisioningAttempts": 1}, obs=obs)
    assert after_backoff.actions == [CreatePools((0, 1))]
    assert st(after_backoff)["provisioningAttempts"] == 2


def test_status_with_unreadable_fields_is_read_leniently():
    status = MultisliceJobStatus.from_dict(
        {"phase": "Running", "restarts": "many", "startTime": "yesterday", "future": 1}
    )
    assert status.phase == "Running" and status.restarts == 0 and status.start_time is None
