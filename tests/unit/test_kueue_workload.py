"""The Workload a MultisliceJob owns (render/kueue_workload.py): the quota Kueue counts for every
shape (slices and spares), and the owner's status writes after an eviction or at the end."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from multislice_operator.common import keys
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.render import kueue_workload as kw
from multislice_operator.render.jobset import render_pod_template
from tests.unit import jobs

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
BLOCK = "ironwood/reservationBlocks/block-1"


def _kueue_usage(workload: dict[str, Any]) -> dict[str, int]:
    """google.com/tpu per pod set as Kueue counts it: count x the pod's requests (a worker pod
    has one TPU container)."""
    usage: dict[str, int] = {}
    for ps in workload["spec"]["podSets"]:
        per_pod = sum(
            int((c.get("resources") or {}).get("requests", {}).get(keys.TPU_RESOURCE, 0))
            for c in ps["template"]["spec"]["containers"]
        )
        usage[ps["name"]] = ps["count"] * per_pod
    return usage


def _rendered(**spec: Any) -> tuple[Any, dict[str, Any]]:
    job_spec, plan = jobs.spec_and_plan(**spec)
    template = render_pod_template(plan, job_spec)
    return plan, kw.render_workload(plan, template, uid="u-1", queue="lq")


SHAPES = [
    {"accelerator": a, "slices": s}
    for a in ("v5litepod-16", "v5litepod-8", "v5p-64", "v6e-256", "v4-32")
    for s in (1, 2, 4)
] + [
    {"accelerator": a, "slices": s, "capacity": {"type": "Reserved", "reservation": BLOCK},
     "provisioning": {"mode": "DynamicSlicing"}}
    for a in ("tpu7x-128", "tpu7x-256") for s in (1, 2)
]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(SHAPES), spares=st.integers(0, 3))
def test_the_quota_is_every_chip_the_job_holds_its_slices_and_its_spares(shape, spares):
    plan, wl = _rendered(**shape, spares=spares)
    usage = _kueue_usage(wl)
    assert usage["slice"] == plan.shape.chips * plan.slices
    # A spare pool holds a slice's chips, or a cube's with dynamic slicing (4x4x4 = 64).
    pool = 64 if plan.dynamic else plan.shape.chips
    assert usage.get("spare", 0) == spares * pool
    assert sum(usage.values()) == kw.quota_chips(plan)
    assert len(wl["spec"]["podSets"]) == (2 if spares else 1) <= 18  # Kueue's MaxItems
    # Each pod set's pod is the JobSet's worker pod: Kueue's flavor assignment reads its
    # nodeSelector (the ResourceFlavor's nodeLabels must agree with it).
    for ps in wl["spec"]["podSets"]:
        sel = ps["template"]["spec"]["nodeSelector"]
        assert sel[keys.GKE_TPU_ACCELERATOR] == plan.shape.generation.gke_accelerator


def test_the_workload_is_owned_by_the_job_and_names_its_queue_and_priority():
    job_spec, plan = jobs.spec_and_plan(spares=1)
    wl = kw.render_workload(plan, render_pod_template(plan, job_spec), uid="u-9", queue="lq",
                            priority_class="production", priority=1000)  # fmt: skip
    meta, spec = wl["metadata"], wl["spec"]
    assert meta["name"] == "multislicejob-job" and meta["namespace"] == "ns"
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "MultisliceJob", "job", "u-9", True)  # fmt: skip
    assert meta["labels"][keys.KUEUE_JOB_UID] == "u-9"
    assert spec["queueName"] == "lq" and spec["priority"] == 1000
    ref = spec["priorityClassRef"]
    assert ref == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "production"}
    assert [(p["name"], p["count"]) for p in spec["podSets"]] == [("slice", 8), ("spare", 4)]
    no_class = kw.render_workload(plan, {}, uid="u", queue="lq")["spec"]
    assert "priorityClassRef" not in no_class and "priority" not in no_class


def _cond(kind: str, status: str, reason: str = "R", at: str = "2026-12-04T11:00:00Z",
          message: str = "m") -> dict[str, Any]:  # fmt: skip
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": at}  # fmt: skip


REASONS = ["Preempted", "NodeFailures", "AdmissionCheck", "InactiveWorkload",
           "PodsReadyTimeout", "ClusterQueueStopped"]  # fmt: skip


@given(reason=st.sampled_from(REASONS), admitted=st.booleans(),
       checks_ready=st.booleans())  # fmt: skip
def test_after_an_eviction_the_owner_unsets_the_reservation_as_kueues_job_reconciler_does(
    reason, admitted, checks_ready
):
    conditions = [
        _cond("QuotaReserved", "True", "QuotaReserved"),
        _cond("Evicted", "True", reason, message="why"),
        _cond("PodsReady", "True", "PodsReady"),
    ]
    if admitted:
        conditions.append(_cond("Admitted", "True", "Admitted"))
    checks = [{"name": "c", "state": "Ready" if checks_ready else "Pending"}]
    out = kw.released_status(conditions, checks, 3, NOW)
    assert out is not None and out["admission"] is None
    by = {c["type"]: c for c in out["conditions"]}
    assert by["QuotaReserved"]["status"] == "False" and by["QuotaReserved"]["reason"] == "Pending"
    assert by["QuotaReserved"]["message"] == "why"
    # Requeued=True only after a preemption or node failures (jobframework, "handle eviction").
    assert by["Requeued"]["status"] == ("True" if reason in kw.REQUEUED_REASONS else "False")
    assert by["Requeued"]["reason"] == reason
    assert by["Evicted"] == conditions[1] and by["PodsReady"] == conditions[2]  # untouched
    if admitted:
        assert by["Admitted"]["status"] == "False"
        assert by["Admitted"]["reason"] == (
            "NoReservation" if checks_ready else "NoReservationUnsatisfiedChecks")  # fmt: skip
        assert by["Admitted"]["lastTransitionTime"] == "2026-12-04T12:00:00Z"
    else:
        assert "Admitted" not in by
    assert all(c["observedGeneration"] == 3 for t, c in by.items()
               if t in ("QuotaReserved", "Requeued"))  # fmt: skip


def test_no_release_while_the_workload_is_not_evicted_and_times_kept_when_unchanged():
    held = [_cond("QuotaReserved", "True"), _cond("Evicted", "False")]
    assert kw.released_status(held, [], 1, NOW) is None
    again = [_cond("QuotaReserved", "False", "Pending"), _cond("Evicted", "True", "Preempted"),
             _cond("Requeued", "True", "Preempted")]  # fmt: skip
    out = kw.released_status(again, [], 1, NOW)
    assert out is not None
    by = {c["type"]: c for c in out["conditions"]}
    # SetStatusCondition keeps lastTransitionTime when the status does not change.
    assert by["QuotaReserved"]["lastTransitionTime"] == "2026-12-04T11:00:00Z"
    assert by["Requeued"]["lastTransitionTime"] == "2026-12-04T11:00:00Z"


def test_the_end_of_the_job_finishes_the_workload():
    out = kw.finished_status([_cond("QuotaReserved", "True")], False, "x" * 40_000, 2, NOW)
    fin = next(c for c in out["conditions"] if c["type"] == "Finished")
    assert (fin["status"], fin["reason"], len(fin["message"])) == ("True", "Failed", 32 * 1024)
    assert len(out["conditions"]) == 2
    ok = kw.finished_status([], True, "done", 2, NOW)["conditions"][0]
    assert ok["reason"] == "Succeeded"


def test_a_queued_elastic_job_with_spares_is_planned_and_counted_at_its_full_size():
    """Issue 43: spec.elastic and spec.spares with a queue label. The Workload is the job's: a
    resize recreates the JobSet, not the Workload, so the quota stays spec.slices' (and the
    spares') while the job runs degraded."""
    labels = {keys.KUEUE_QUEUE_NAME: "team-a"}
    obj = jobs.body(metadata={"labels": labels}, slices=4, spares=1,
                    elastic={"minSlices": 2, "waitSeconds": 60})  # fmt: skip
    job = load_job(obj)
    plan = plan_job(job)
    wl = kw.render_workload(plan, render_pod_template(plan, job.spec), uid="u", queue="team-a")
    assert _kueue_usage(wl) == {"slice": 4 * 16, "spare": 16}
    degraded = plan.running_on(2)  # the JobSet's size while two slices are lost
    assert degraded.slices == 2 and kw.quota_chips(plan) == 80


def test_the_job_s_workload_is_indexed_under_the_job_with_what_decide_reads():
    """controller/kueue.py: the rendered Workload, as Kueue returns it with a status, is found
    under (namespace, job) and by uids; one owned by a JobSet (Kueue's JobSet integration) is not
    this operator's."""
    from multislice_operator.controller.kueue import summarize_workload

    job_spec, plan = jobs.spec_and_plan(spares=1)
    wl = kw.render_workload(plan, render_pod_template(plan, job_spec), uid="u-7", queue="lq")
    wl["metadata"] |= {"uid": "w-1", "resourceVersion": "12"}
    wl["status"] = {
        "conditions": [_cond("QuotaReserved", "True", "QuotaReserved"), _cond("Foo", "True")],
        "reclaimablePods": [{"name": "slice", "count": 4}, {"name": "spare", "count": 4}],
        "admission": {"clusterQueue": "cq"},
    }
    out = summarize_workload(wl)
    summary = out[("ns", "job")]
    assert (summary["name"], summary["resourceVersion"], summary["clusterQueue"]) == (
        "multislicejob-job", "12", "cq")  # fmt: skip
    assert summary["reclaimable"] == 4  # the slices' pod set only
    assert set(summary["conditions"]) == {"QuotaReserved"}
    assert out[("uid", "w-1")] == out[("job-uid", "u-7")] == "ns/job"
    wl["metadata"]["ownerReferences"][0]["kind"] = "JobSet"
    assert summarize_workload(wl) == {}


def test_multikueues_check_on_a_workload_is_told_apart_by_its_controller_name():
    """A manager's Workload lists every check of its ClusterQueue (with quota reserved): ours
    and MultiKueue's, each known by its AdmissionCheck's spec.controllerName."""
    from multislice_operator.controller.kueue import (
        summarize_admission_check,
        summarize_workload,
        workload_observation,
    )
    from multislice_operator.controller.runtime import Indexes, Runtime
    from multislice_operator.reconcile import DecideConfig
    from multislice_operator.settings import Settings

    def ac(name: str, controller: str) -> dict[str, Any]:
        return summarize_admission_check(
            {"metadata": {"name": name}, "spec": {"controllerName": controller}}
        )

    checks = {"gang": [ac("gang", keys.GANG_CHECK_CONTROLLER)],
              "mk": [ac("mk", keys.MULTIKUEUE_CONTROLLER)]}  # fmt: skip
    rt = Runtime(
        settings=Settings(),
        kube=None,  # type: ignore[arg-type]
        provisioner=None,
        cfg=DecideConfig.from_settings(),
        indexes=Indexes(jobsets={}, pods={}, nodes={}, admission_checks=checks),
    )
    job_spec, plan = jobs.spec_and_plan()
    wl = kw.render_workload(plan, render_pod_template(plan, job_spec), uid="u-7", queue="lq")
    wl["metadata"] |= {"uid": "w-1", "resourceVersion": "12"}
    listed = [{"name": "gang", "state": "Pending"}, {"name": "mk", "state": "Rejected",
              "message": "No multikueue adapter found"}]  # fmt: skip
    wl["status"] = {"conditions": [_cond("QuotaReserved", "True", "QuotaReserved")],
                    "admissionChecks": listed}  # fmt: skip
    seen = workload_observation(rt, summarize_workload(wl)[("ns", "job")], {"gang": {}})
    assert seen.check is not None and seen.check.name == "gang"
    mk = seen.multikueue_check
    assert mk is not None and (mk.name, mk.state) == ("mk", "Rejected")
    assert mk.message == "No multikueue adapter found"
    wl["status"]["admissionChecks"] = listed[:1]
    alone = workload_observation(rt, summarize_workload(wl)[("ns", "job")], {"gang": {}})
    assert alone.multikueue_check is None and alone.quota_reserved and alone.checks_listed
    wl["status"]["admissionChecks"] = []  # quota reserved before Kueue listed any
    bare = workload_observation(rt, summarize_workload(wl)[("ns", "job")], {"gang": {}})
    assert not bare.checks_listed and bare.check is None


def test_the_workload_a_pass_created_stands_in_until_the_watch_brings_it(monkeypatch: Any) -> None:
    """The write budget under a CPU burner saw 5 Workload creates for 4 queued jobs: a pass ran
    before the watch brought the Workload the last one created, saw none, and created it again
    (a 409, still a write). The created copy stands in until the index holds the Workload, for
    WORKLOAD_ECHO_SECONDS at most (one deleted before the watch showed it is not believed
    forever)."""
    from multislice_operator.controller import kueue
    from multislice_operator.controller.runtime import Indexes, Runtime
    from multislice_operator.reconcile import DecideConfig
    from multislice_operator.settings import Settings

    workloads: dict[Any, Any] = {}
    rt = Runtime(
        settings=Settings(),
        kube=None,  # type: ignore[arg-type]
        provisioner=None,
        cfg=DecideConfig.from_settings(),
        indexes=Indexes(jobsets={}, pods={}, nodes={}, workloads=workloads),
    )
    job_spec, plan = jobs.spec_and_plan()
    wl = kw.render_workload(plan, render_pod_template(plan, job_spec), uid="u-7", queue="lq")
    wl["metadata"] |= {"uid": "w-1", "resourceVersion": "12"}
    assert kueue.workload_summary(rt, "ns", "job") is None
    now = [1000.0]
    monkeypatch.setattr(kueue.time, "monotonic", lambda: now[0])
    kueue.remember_created(rt, ("ns", "job"), wl)
    made = kueue.workload_summary(rt, "ns", "job")
    assert made is not None
    assert (made["name"], made["resourceVersion"]) == ("multislicejob-job", "12")
    # The watch caught up: the index's copy, and the created one is dropped.
    indexed = {**made, "resourceVersion": "13"}
    workloads[("ns", "job")] = [indexed]
    assert kueue.workload_summary(rt, "ns", "job") == indexed and not rt.created_workloads
    # A created one the watch never showed is believed for WORKLOAD_ECHO_SECONDS only.
    del workloads[("ns", "job")]
    kueue.remember_created(rt, ("ns", "job"), wl)
    now[0] += kueue.WORKLOAD_ECHO_SECONDS + 1
    assert kueue.workload_summary(rt, "ns", "job") is None and not rt.created_workloads
