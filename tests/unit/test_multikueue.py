"""MultiKueue (reconcile/multikueue.py): the manager's pass (the Workload and nothing else), the
worker's copy (the prebuilt Workload adopted, never one made), a gang a worker cannot provision
handed back, and our check on a copy whose job is not here yet."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from functools import partial

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multislice_operator.api.models import Phase
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.reconcile import (
    AdoptWorkload,
    CheckObservation,
    CheckState,
    CreateJobSet,
    CreatePools,
    CreateWorkload,
    FinishWorkload,
    JobMeta,
    JobSetObservation,
    QueueObservation,
    ReleaseWorkload,
    SetAdmissionCheckState,
)
from multislice_operator.reconcile.multikueue import (
    READY_MESSAGE,
    RemoteWorkload,
    remote_checks,
)
from multislice_operator.reconcile.reasons import Reason
from tests.unit import jobs
from tests.unit.test_queue import CFG, LQ, NOW, iso, obs, pools, up, wl

MANAGER_LABELS = {keys.KUEUE_QUEUE_NAME: LQ}
# MultiKueue's check, as Kueue lists it on a manager's Workload whose ClusterQueue has one.
MK = CheckObservation("multikueue", CheckState.PENDING)
MANAGER = JobMeta("ns", "job", "uid-m", 1, labels=MANAGER_LABELS)
MANAGED = {"managedBy": keys.MULTIKUEUE_MANAGED_BY}
WORKER_LABELS = {
    keys.KUEUE_QUEUE_NAME: LQ,
    keys.KUEUE_PREBUILT_WORKLOAD: "multislicejob-job",
    keys.MULTIKUEUE_ORIGIN: "multikueue",
}
WORKER = JobMeta("ns", "job", "uid-w", 1, labels=WORKER_LABELS, has_finalizer=True)

manager = partial(jobs.run, cfg=CFG, now=NOW, meta=MANAGER, metadata={"labels": MANAGER_LABELS},
                  **MANAGED)  # fmt: skip
worker = partial(jobs.run, cfg=CFG, now=NOW, meta=WORKER, metadata={"labels": WORKER_LABELS})


# ---------------------------------------------------------------- the manager


def test_the_manager_makes_the_workload_and_nothing_else():
    d = manager(obs=obs(None))
    assert [type(a) for a in d.actions] == [CreateWorkload]
    assert d.keep_status  # the status is the worker's, copied by MultiKueue


@pytest.mark.parametrize(
    "workload",
    [
        wl(None, quota_reserved=False),  # queued on the manager
        wl(None, admitted=True, multikueue_check=replace(MK, state=CheckState.READY)),
        wl(None, admitted=True, finished=True),
    ],
)
def test_the_manager_never_provisions_runs_or_writes_status(workload):
    old = {"phase": "Running", "activeSlices": 2}  # as copied from the worker
    d = manager(old=old, obs=obs(workload, slices=pools(PoolState.ABSENT, PoolState.ABSENT)))
    assert d.actions == [] and d.keep_status
    assert d.status.phase == Phase.RUNNING  # untouched


def test_an_eviction_by_multikueue_gives_the_quota_back_at_once():
    evicted = wl(None, evicted=True, eviction_reason="AdmissionCheck", multikueue_check=MK)
    d = manager(old={"phase": "Running"}, obs=obs(evicted))
    assert d.actions == [ReleaseWorkload("multislicejob-job", "7")]


def test_a_preemption_on_the_manager_waits_for_the_worker_to_stop():
    evicted = wl(None, evicted=True, eviction_reason="Preempted", multikueue_check=MK)
    running = manager(old={"phase": "Running"}, obs=obs(evicted))
    assert running.actions == []  # the worker's pods still run
    stopped = manager(old={"phase": "Queued"}, obs=obs(evicted))
    assert stopped.actions == [ReleaseWorkload("multislicejob-job", "7")]


def test_a_managed_job_without_a_queue_fails_naming_the_label():
    meta = JobMeta("ns", "job", "uid-m", 1)
    d = jobs.run(now=NOW, cfg=CFG, meta=meta, obs=obs(None, queue=None), **MANAGED)
    assert d.status.phase == Phase.FAILED
    failed = next(c for c in d.status.conditions if c.type == "Failed")
    assert keys.KUEUE_QUEUE_NAME in failed.message and "spec.managedBy" in failed.message
    assert not any(isinstance(a, (CreateWorkload, CreatePools, CreateJobSet)) for a in d.actions)


def test_a_managed_job_on_an_operator_without_kueue_says_so_and_holds_nothing():
    """Issue 56: no status at all (no phase, message, condition or event)."""
    queue = QueueObservation(LQ, watching=False)
    d = manager(obs=obs(None, queue=queue, slices=pools(PoolState.ABSENT, PoolState.ABSENT)))
    assert not d.keep_status and d.status.phase == Phase.PENDING
    assert "--kueue" in (d.status.message or ""), d.status.message
    admitted = d.status.condition("Admitted")
    assert admitted is not None and admitted.reason == Reason.NO_KUEUE_WORKLOAD
    assert [e.reason for e in d.events] == [Reason.NO_KUEUE_WORKLOAD]
    assert not any(isinstance(a, (CreateWorkload, CreatePools, CreateJobSet)) for a in d.actions)


def test_a_managed_job_whose_workload_kueue_never_sees_says_so():
    """Kueue not installed: the Workload cannot be created; past the wait the job says why."""
    meta = replace(MANAGER, creation_time=NOW - timedelta(seconds=CFG.kueue_workload_wait_seconds))
    d = manager(obs=obs(None), meta=meta)
    assert d.status.phase == Phase.PENDING and "Kueue is not installed" in (d.status.message or "")
    assert not any(isinstance(a, (CreatePools, CreateJobSet)) for a in d.actions)
    young = manager(obs=obs(None), meta=replace(MANAGER, creation_time=NOW))
    assert young.keep_status and [type(a) for a in young.actions] == [CreateWorkload]


@pytest.mark.parametrize("admitted", [False, True])
def test_quota_without_a_multikueue_check_is_released_and_the_job_fails_naming_it(admitted):
    """Issue 56: Kueue reserved the quota in a ClusterQueue without a MultiKueue check (ours
    only, or none: Kueue admits it then) and nothing would ever run the job: a quota hostage."""
    ours = CheckState.PENDING if not admitted else None
    hostage = wl(ours, admitted=admitted)
    d = manager(obs=obs(hostage))
    assert d.status.phase == Phase.FAILED and not d.keep_status
    failed = d.status.condition("Failed")
    assert failed is not None and failed.reason == Reason.MULTIKUEUE_UNAVAILABLE
    assert "ClusterQueue cq has no MultiKueue admission check" in failed.message
    assert "spec.managedBy" in failed.message
    assert FinishWorkload("multislicejob-job", False, failed.message) in d.actions
    if not admitted:  # our check Pending on it: Rejected, so Kueue deactivates it at once
        (check,) = [a for a in d.actions if isinstance(a, SetAdmissionCheckState)]
        assert check.state == CheckState.REJECTED
    assert not any(isinstance(a, (CreateWorkload, CreatePools, CreateJobSet)) for a in d.actions)
    # Failed it stays, its Workload finished: nothing is made again, and nothing is written.
    after = replace(hostage, finished=True)
    again = manager(old=d.status.to_dict(), obs=obs(after))
    assert again.status.phase == Phase.FAILED and again.actions == []


def test_quota_reserved_before_kueue_listed_the_checks_is_not_judged():
    """Kueue may reserve quota before it lists the ClusterQueue's checks on the Workload (its
    workload controller syncs them, and admits only once they are all there): no check listed
    yet says nothing."""
    d = manager(obs=obs(wl(None)))
    assert d.keep_status and d.actions == []
    listed = manager(obs=obs(wl(None, checks_listed=True)))  # another check, not MultiKueue's
    assert listed.status.phase == Phase.FAILED


def test_a_job_multikueue_rejected_fails_quoting_it():
    rejected = replace(MK, state=CheckState.REJECTED, message='No multikueue adapter found for '
                       'owner kind "multislice.dev/v1alpha1, Kind=MultisliceJob"')  # fmt: skip
    d = manager(obs=obs(wl(None, quota_reserved=False, multikueue_check=rejected)))
    assert d.status.phase == Phase.FAILED
    assert "No multikueue adapter found" in (d.status.message or "")


def test_a_pending_workload_with_a_multikueue_check_is_multikueues():
    d = manager(obs=obs(wl(None, multikueue_check=MK)))
    assert d.keep_status and d.actions == []


# ---------------------------------------------------------------- the worker's copy


def test_the_worker_waits_for_the_prebuilt_workload_and_never_makes_one():
    d = worker(obs=obs(None))
    assert not any(isinstance(a, (CreateWorkload, CreatePools)) for a in d.actions)
    assert d.status.phase == Phase.QUEUED
    assert "multislicejob-job" in (d.status.message or "")


@pytest.mark.parametrize("where", ["annotations", "labels"])
def test_the_prebuilt_workload_is_named_by_an_annotation_or_by_the_older_label(where):
    """Kueue v0.18+ (WorkloadIdentifierAnnotations, on by default) writes an annotation; older
    ones a label: either way the copy waits for that Workload and makes none."""
    labels = {keys.KUEUE_QUEUE_NAME: LQ, keys.MULTIKUEUE_ORIGIN: "multikueue"}
    named = {keys.KUEUE_PREBUILT_WORKLOAD: "multislicejob-job"}
    meta = JobMeta("ns", "job", "uid-w", 1, labels={**labels, **(named if where == "labels"
                   else {})}, annotations=named if where == "annotations" else {},
                   has_finalizer=True)  # fmt: skip
    d = jobs.run(obs=obs(None), now=NOW, cfg=CFG, meta=meta, metadata={"labels": labels})
    assert not any(isinstance(a, CreateWorkload) for a in d.actions)
    assert "multislicejob-job" in (d.status.message or "")


def test_the_worker_adopts_the_prebuilt_workload_then_provisions_once_admitted():
    copy = wl(CheckState.READY, admitted=True, adopted=False)
    d = worker(obs=obs(copy))
    assert d.actions[0] == AdoptWorkload("multislicejob-job", "7")
    assert any(isinstance(a, CreatePools) for a in d.actions)  # admitted: the gang
    adopted = worker(obs=obs(wl(CheckState.READY, admitted=True)))
    assert not any(isinstance(a, AdoptWorkload) for a in adopted.actions)


def test_a_gang_the_worker_cannot_provision_is_handed_back_to_multikueue():
    stockout = PoolError(1, "p1", "GCE_STOCKOUT", "no capacity in zone", False)
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    slices = pools(PoolState.READY, PoolState.FAILED, errors={1: stockout})
    d = worker(old=old, obs=obs(wl(CheckState.READY, admitted=True), slices=slices))
    (retry,) = [a for a in d.actions if isinstance(a, SetAdmissionCheckState)]
    assert retry.state == CheckState.RETRY and "GCE_STOCKOUT" in retry.message
    assert "MultiKueue" in retry.message
    # Kueue evicts it on Retry: the job stops and gives the worker's quota back.
    evicted = wl(CheckState.RETRY, admitted=True, evicted=True, eviction_reason="AdmissionCheck")
    js = JobSetObservation(suspended=True, created=NOW)
    later = worker(old=d.status, obs=obs(evicted, slices=pools(PoolState.ABSENT, PoolState.ABSENT),
                                         jobset=js))  # fmt: skip
    assert ReleaseWorkload("multislicejob-job", "7") in later.actions


def test_a_copy_handed_back_waits_out_the_cooldown_before_its_gang_is_tried_here_again():
    """Kueue gave this worker's quota straight back (the check Pending, retryCount 1) and
    MultiKueue keeps the copy while no other worker admits it: no pool here for the cooldown
    (counted from the eviction), then the gang is tried here again."""
    again = wl(CheckState.PENDING, retry=1)

    def old(ago: float) -> dict:
        evicted = {"reason": "AdmissionCheck", "time": iso(NOW - timedelta(seconds=ago))}
        return {"phase": "Queued", "queue": {"localQueue": LQ, "lastEviction": evicted}}

    d = worker(old=old(30), obs=obs(again))
    assert not any(isinstance(a, CreatePools) for a in d.actions)
    assert d.status.phase == Phase.QUEUED and "MultiKueue" in (d.status.message or "")
    assert "again in 570s" in (d.status.message or "")
    assert d.requeue_after is not None and d.requeue_after <= 570
    later = worker(old=old(CFG.multikueue_lost_cooldown_seconds + 1), obs=obs(again))
    assert any(isinstance(a, CreatePools) for a in later.actions)
    # Never handed back (retryCount 0): the check Pending is the gang's, provisioned here.
    first = worker(old={"phase": "Queued"}, obs=obs(wl(CheckState.PENDING)))
    assert any(isinstance(a, CreatePools) for a in first.actions)


def test_a_single_cluster_job_keeps_its_quota_through_a_rollback_without_our_check():
    """Not from MultiKueue: a rollback while admitted without a check of ours retries here."""
    stockout = PoolError(1, "p1", "GCE_STOCKOUT", "no capacity in zone", False)
    old = {"phase": "Provisioning", "provisioningAttempts": 1, "attemptStartTime": iso(NOW)}
    slices = pools(PoolState.READY, PoolState.FAILED, errors={1: stockout})
    meta = JobMeta("ns", "job", "uid-1", 1, labels={keys.KUEUE_QUEUE_NAME: LQ},
                   has_finalizer=True)  # fmt: skip
    d = jobs.run(old=old, obs=obs(wl(None, admitted=True), slices=slices), now=NOW, cfg=CFG,
                 meta=meta, metadata={"labels": {keys.KUEUE_QUEUE_NAME: LQ}})  # fmt: skip
    assert not any(isinstance(a, SetAdmissionCheckState) for a in d.actions)


def test_a_running_worker_copy_is_an_ordinary_job():
    js = JobSetObservation(replicas=2, created=NOW)
    d = worker(old={"phase": "Starting"}, obs=obs(wl(CheckState.READY, admitted=True), slices=up(),
                                                  jobset=js))  # fmt: skip
    assert not any(isinstance(a, (SetAdmissionCheckState, AdoptWorkload, CreateWorkload))
                   for a in d.actions)  # fmt: skip
    assert d.status.phase in (Phase.STARTING, Phase.RUNNING) and not d.keep_status


# ---------------------------------------------------------------- our check on jobless copies


def remote(state: str = CheckState.PENDING, message: str = "", quota: bool = True, name="w"):
    return RemoteWorkload("ns", name, "5", "multislice-gang", state, message, quota)


def test_a_copy_is_ready_at_once_the_gang_comes_with_the_job():
    ((ns, a),) = remote_checks([remote()], {}, NOW, 600)
    assert ns == "ns" and a.state == CheckState.READY and a.message == READY_MESSAGE
    assert remote_checks([remote(CheckState.READY, READY_MESSAGE)], {}, NOW, 600) == []
    assert remote_checks([remote(quota=False)], {}, NOW, 600) == []  # Kueue reserves first


def test_a_worker_that_lost_the_job_leaves_its_next_copy_to_another_for_the_cooldown():
    lost = {("ns", "w"): NOW - timedelta(seconds=30)}
    ((_, a),) = remote_checks([remote()], lost, NOW, 600)
    assert a.state == CheckState.PENDING and "lost this job 30s ago" in a.message
    said = remote(CheckState.PENDING, a.message)
    assert remote_checks([said], lost, NOW + timedelta(seconds=5), 600) == []  # said once
    ((_, after),) = remote_checks([said], lost, NOW + timedelta(seconds=600), 600)
    assert after.state == CheckState.READY


@settings(max_examples=80, deadline=None)
@given(
    states=st.lists(
        st.tuples(
            st.sampled_from([CheckState.PENDING, CheckState.READY, CheckState.RETRY,
                             CheckState.REJECTED]),
            st.booleans(),
            st.integers(-1, 1200),
        ),
        min_size=1, max_size=6,
    )
)  # fmt: skip
def test_every_copy_is_written_at_most_once_and_never_out_of_retry_or_rejected(states):
    """Whatever the copies: one write each at most; never one without quota; a Retry or Rejected
    (Kueue's or a job's) is never overwritten; Ready exactly when not lost within the cooldown."""
    copies, lost = [], {}
    for i, (state, quota, ago) in enumerate(states):
        copies.append(remote(state, "", quota, name=f"w{i}"))
        if ago >= 0:
            lost[("ns", f"w{i}")] = NOW - timedelta(seconds=ago)
    out = remote_checks(copies, lost, NOW, 600)
    names = [a.workload for _, a in out]
    assert len(names) == len(set(names))
    by_name = {c.name: c for c in copies}
    for _, a in out:
        c = by_name[a.workload]
        assert c.quota_reserved and c.state in (CheckState.PENDING, CheckState.READY)
        since = lost.get(("ns", c.name))
        held = since is not None and (NOW - since).total_seconds() < 600
        assert a.state == (CheckState.PENDING if held else CheckState.READY)


# ---------------------------------------------------------------- the cooldown across a restart


def test_a_restarted_worker_operator_keeps_the_cooldown_of_the_jobs_it_handed_back():
    """The hand-backs ride on the heartbeat Lease: the next operator reads them before its first
    beat, so its check stays Pending on the next copy; an emptied memory clears the annotation."""
    import asyncio

    from multislice_operator.controller.heartbeat import Heartbeat, HeartbeatConfig
    from tests.unit.test_goodput import FakeLeases

    cfg = HeartbeatConfig("ops", "msj-heartbeat", "first")
    kube = FakeLeases()
    handed_back = {("ns", "w"): NOW - timedelta(seconds=30)}
    first = Heartbeat(kube, cfg, handed_back)  # type: ignore[arg-type]
    asyncio.run(first.start())
    assert keys.MULTIKUEUE_LOST in kube.lease["metadata"]["annotations"]

    remembered: dict = {}
    cfg = HeartbeatConfig("ops", "msj-heartbeat", "second")
    second = Heartbeat(kube, cfg, remembered)  # type: ignore[arg-type]
    asyncio.run(second.start())
    assert remembered == handed_back
    ((_, a),) = remote_checks([remote()], remembered, NOW, 600)
    assert a.state == CheckState.PENDING and "lost this job 30s ago" in a.message
    assert kube.lease["metadata"]["annotations"][keys.MULTIKUEUE_LOST]  # its first beat kept it

    remembered.clear()  # the cooldown is over (controller/kueue.py forgets the entry)
    asyncio.run(second.beat())
    assert keys.MULTIKUEUE_LOST not in (kube.lease["metadata"].get("annotations") or {})


_label = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(
    lost=st.dictionaries(
        st.tuples(_label, _label),
        st.datetimes(min_value=NOW.replace(tzinfo=None) - timedelta(days=2),
                     max_value=NOW.replace(tzinfo=None) + timedelta(days=2)).map(
            lambda t: t.replace(tzinfo=NOW.tzinfo)),
        max_size=8,
    )
)  # fmt: skip
def test_the_lease_gives_back_exactly_the_hand_backs_it_was_given(lost):
    from multislice_operator.controller.heartbeat import lost_annotation, lost_from

    lease = {"metadata": {"annotations": lost_annotation(lost)}}
    assert lost_from(lease) == lost
    assert (keys.MULTIKUEUE_LOST in lease["metadata"]["annotations"]) == bool(lost)


@settings(max_examples=60, deadline=None)
@given(raw=st.one_of(st.text(max_size=40), st.recursive(
    st.none() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=3),
    max_leaves=8).map(__import__("json").dumps)))  # fmt: skip
def test_an_unreadable_annotation_is_forgotten_not_raised(raw):
    """Someone edited the Lease: whatever is there, the operator starts (and drops what it
    cannot read)."""
    from multislice_operator.controller.heartbeat import lost_from

    for key, when in lost_from({"metadata": {"annotations": {keys.MULTIKUEUE_LOST: raw}}}).items():
        assert all(key) and when.tzinfo is not None


@pytest.mark.parametrize(
    "raw",
    ['{"ns/w": "2026-12-01T12:00:00"}', '{"ns/w": 5}', '{"/w": "2026-12-01T12:00:00Z"}',
     '{"ns": "2026-12-01T12:00:00Z"}', '["ns/w"]', "{", None],
)  # fmt: skip
def test_entries_a_restarted_operator_could_not_compare_are_dropped(raw):
    """A time without a zone would make the cooldown's arithmetic raise on every pass."""
    from multislice_operator.controller.heartbeat import lost_from

    assert lost_from({"metadata": {"annotations": {keys.MULTIKUEUE_LOST: raw}}}) == {}
    assert lost_from({"metadata": {"annotations": None}}) == lost_from(None) == {}
    ok = lost_from(
        {"metadata": {"annotations": {keys.MULTIKUEUE_LOST: '{"ns/w": "2026-12-01T12:00:00Z"}'}}}
    )
    assert ok == {("ns", "w"): NOW}
