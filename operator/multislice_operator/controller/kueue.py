"""Kueue's objects as plain observations, and the loop that keeps our AdmissionChecks Active
(and answers our check on MultiKueue's copies of Workloads whose job is not here yet).

Watched only with --kueue (kueue.x-k8s.io/v1beta2, the version Kueue v0.17 stores): Workloads
(indexed by namespace and owning MultisliceJob: the operator creates them), LocalQueues
(ClusterQueue and pending count) and AdmissionChecks (which of them are ours). The index
functions keep only what decide() reads; the raw admissionChecks list of a Workload is kept
because our write must carry every entry back as Kueue wrote it (merge patches replace lists):
retryCount in particular, which Kueue increments from the value in the object it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.common.names import REPLICATED_JOB
from multislice_operator.controller import observe as ob
from multislice_operator.controller.kube import Conflict, timestamp
from multislice_operator.controller.runtime import JobKey, Runtime
from multislice_operator.reconcile import (
    AdmissionCheckObservation,
    CheckObservation,
    QueueObservation,
    SetAdmissionCheckActive,
    SetAdmissionCheckState,
    WorkloadObservation,
)
from multislice_operator.reconcile.kueue_gate import activate
from multislice_operator.reconcile.multikueue import RemoteWorkload, remote_checks

log = logging.getLogger("multislice_operator")

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
WORKLOADS = (GROUP, VERSION, "workloads")
LOCAL_QUEUES = (GROUP, VERSION, "localqueues")
ADMISSION_CHECKS = (GROUP, VERSION, "admissionchecks")
ACTIVATION_RESYNC_SECONDS = 30.0
# How long the Workload a pass created stands in for the watch's copy: the next pass must not
# create it again while the watch is behind (a second POST, answered 409, under load), and one
# deleted before the watch ever showed it is not believed for longer than this.
WORKLOAD_ECHO_SECONDS = 30.0
# pkg/scheduler/preemption/preemption.go (v0.17.0): "Preempted to accommodate a workload (UID: %s,
# JobUID: %s) due to %s; preemptor path: ...".
PREEMPTOR = re.compile(r"\(UID: (?P<uid>[^,)]+), JobUID: (?P<job>[^,)]+)\)")
CONDITIONS = ("QuotaReserved", "Admitted", "Evicted", "Finished", "Preempted")

# ---------------------------------------------------------------- index summaries


def _owner(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """The MultisliceJob that owns the Workload (its controller), if any: (name, uid)."""
    for o in meta.get("ownerReferences") or []:
        if o.get("kind") == models.KIND and o.get("controller"):
            return str(o.get("name")), str(o.get("uid") or "")
    return None


def _conditions(status: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The conditions decide() reads, by type: status, reason, message and time."""
    out: dict[str, dict[str, Any]] = {}
    for c in status.get("conditions") or []:
        if c.get("type") in CONDITIONS:
            kept = {k: c.get(k, "") for k in ("status", "reason", "message")}
            out[c["type"]] = kept | {"time": c.get("lastTransitionTime")}
    return out


def _reclaimable(status: Mapping[str, Any]) -> int:
    pods = status.get("reclaimablePods") or []
    return sum(int(r.get("count") or 0) for r in pods if r.get("name") == REPLICATED_JOB)


def summarize_workload(body: Mapping[str, Any]) -> dict[Any, Any]:
    """Index entries of one Workload: by (namespace, owning MultisliceJob), and by its uid and
    its job's uid (to name a preemptor). One MultiKueue copied here (label
    kueue.x-k8s.io/multikueue-origin) is also indexed by ("name", namespace, name): its job, when
    it comes, adopts it by name (kueue.x-k8s.io/prebuilt-workload-name, an annotation or a
    label); until then it has no owner."""
    meta = body.get("metadata") or {}
    spec, status = body.get("spec") or {}, body.get("status") or {}
    owner = _owner(meta)
    remote = keys.MULTIKUEUE_ORIGIN in (meta.get("labels") or {})
    if not owner and not remote:
        return {}
    ns = meta.get("namespace", "")
    summary = {
        "name": meta.get("name", ""),
        "namespace": ns,
        "ownerUid": owner[1] if owner else None,
        "resourceVersion": str(meta.get("resourceVersion", "")),
        "created": meta.get("creationTimestamp"),
        "active": spec.get("active") is not False,
        "clusterQueue": (status.get("admission") or {}).get("clusterQueue"),
        "conditions": _conditions(status),
        "admissionChecks": [dict(c) for c in status.get("admissionChecks") or []],
        "reclaimable": _reclaimable(status),
        "quotaKey": (meta.get("labels") or {}).get(keys.QUOTA_KEY),
    }
    out: dict[Any, Any] = {}
    if remote:
        out[("name", ns, summary["name"])] = summary
    if not owner:
        return out
    who = f"{ns}/{owner[0]}"
    out |= {(ns, owner[0]): summary, ("uid", meta.get("uid", "")): who}
    job_uid = (meta.get("labels") or {}).get(keys.KUEUE_JOB_UID)
    if job_uid:
        out[("job-uid", job_uid)] = who
    return out


def summarize_local_queue(body: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "clusterQueue": (body.get("spec") or {}).get("clusterQueue"),
        "pendingWorkloads": (body.get("status") or {}).get("pendingWorkloads"),
    }


def summarize_admission_check(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    conds = list((body.get("status") or {}).get("conditions") or [])
    active: dict[str, Any] = next((c for c in conds if c.get("type") == "Active"), {})
    return {
        "name": meta.get("name", ""),
        "controllerName": (body.get("spec") or {}).get("controllerName"),
        "generation": int(meta.get("generation") or 0),
        "resourceVersion": str(meta.get("resourceVersion", "")),
        "active": active.get("status") == "True",
        "observedGeneration": active.get("observedGeneration"),
        "conditions": conds,
    }


# ---------------------------------------------------------------- observations


def our_checks(rt: Runtime) -> dict[str, dict[str, Any]]:
    """AdmissionChecks whose controllerName is ours, by name."""
    return checks_of(rt, keys.GANG_CHECK_CONTROLLER)


def checks_of(rt: Runtime, controller: str) -> dict[str, dict[str, Any]]:
    """AdmissionChecks whose spec.controllerName is `controller`, by name."""
    found: dict[str, dict[str, Any]] = {}
    for name in list(rt.indexes.admission_checks):
        ac = ob.first(rt.indexes.admission_checks, name)
        if ac is not None and ac["controllerName"] == controller:
            found[str(name)] = ac
    return found


def _check(summary: Mapping[str, Any], names: Mapping[str, Any]) -> CheckObservation | None:
    """The state of the first of these checks the Workload lists, if any."""
    for entry in summary["admissionChecks"]:
        if entry.get("name") in names:
            return CheckObservation(
                name=str(entry["name"]),
                state=str(entry.get("state") or "Pending"),
                message=str(entry.get("message") or ""),
                retry_count=int(entry.get("retryCount") or 0),
            )
    return None


def workload_summary(
    rt: Runtime, namespace: str, job: str, prebuilt: str | None = None
) -> dict[str, Any] | None:
    """The Workload of a job (the newest, should there ever be two); for a job given a
    prebuilt Workload (MultiKueue's), that one, owned or not."""
    if prebuilt:
        named = ob.first(rt.indexes.workloads, ("name", namespace, prebuilt))
        return named if isinstance(named, dict) else None
    found = [w for w in ob.items(rt.indexes.workloads, (namespace, job)) if isinstance(w, dict)]
    if not found:
        return _created(rt, (namespace, job))
    rt.created_workloads.pop((namespace, job), None)  # the watch caught up
    newest: dict[str, Any] = max(found, key=lambda w: (str(w["created"] or ""), w["name"]))
    return newest


def _created(rt: Runtime, key: JobKey) -> dict[str, Any] | None:
    """The Workload a pass created for the job, while the index may not hold it yet."""
    made = rt.created_workloads.get(key)
    if made is None:
        return None
    if time.monotonic() - made[0] > WORKLOAD_ECHO_SECONDS:
        del rt.created_workloads[key]
        return None
    return made[1]


def remember_created(rt: Runtime, key: JobKey, body: Mapping[str, Any]) -> None:
    """A Workload this operator just created (the apiserver's answer), seen as made."""
    summary = summarize_workload(body).get(key)
    if isinstance(summary, dict):
        rt.created_workloads[key] = (time.monotonic(), summary)


def _preemptor(rt: Runtime, message: str) -> str | None:
    match = PREEMPTOR.search(message)
    if match is None:
        return None
    for key in (("uid", match["uid"]), ("job-uid", match["job"])):
        who = ob.first(rt.indexes.workloads, key)
        if who:
            return str(who)
    return None


def workload_observation(
    rt: Runtime, summary: dict[str, Any], ours: Mapping[str, Any], job_uid: str = ""
) -> WorkloadObservation:
    conds = summary["conditions"]

    def cond(t: str) -> dict[str, Any]:
        found: dict[str, Any] = conds.get(t) or {}
        return found

    quota, evicted = cond("QuotaReserved"), cond("Evicted")
    check = _check(summary, ours)
    multikueue = _check(summary, checks_of(rt, keys.MULTIKUEUE_CONTROLLER))
    is_evicted = evicted.get("status") == "True"
    message = str(evicted.get("message") or "")
    preempted = cond("Preempted")
    return WorkloadObservation(
        name=summary["name"],
        resource_version=summary["resourceVersion"],
        active=summary["active"],
        quota_reserved=quota.get("status") == "True",
        admitted=cond("Admitted").get("status") == "True",
        finished=cond("Finished").get("status") == "True",
        cluster_queue=summary["clusterQueue"],
        pending_reason="" if quota.get("status") == "True" else str(quota.get("reason") or ""),
        pending_message="" if quota.get("status") == "True" else str(quota.get("message") or ""),
        evicted=is_evicted,
        reclaimable=int(summary.get("reclaimable") or 0),
        seen_by_kueue=bool(quota),
        created=ob.parse_time(summary["created"]),
        eviction_reason=str(evicted.get("reason") or "") if is_evicted else "",
        eviction_message=message if is_evicted else "",
        eviction_time=ob.parse_time(evicted.get("time")) if is_evicted else None,
        preempted_by=_preemptor(rt, str(preempted.get("message") or message))
        if is_evicted
        else None,
        check=check,
        multikueue_check=multikueue,
        checks_listed=bool(summary["admissionChecks"]),
        adopted=not job_uid or summary.get("ownerUid") == job_uid,
        quota_key=summary.get("quotaKey"),
    )


def queue_observation(
    rt: Runtime, key: JobKey, queue: str, uid: str = "", prebuilt: str | None = None
) -> QueueObservation:
    """What Kueue says about the job `key` (uid: the job's; prebuilt: the Workload MultiKueue
    made for it, label kueue.x-k8s.io/prebuilt-workload-name)."""
    if not rt.settings.kueue:
        return QueueObservation(queue, watching=False)
    lq = ob.first(rt.indexes.local_queues, (key[0], queue))
    summary = workload_summary(rt, *key, prebuilt=prebuilt)
    s = rt.settings
    cluster = (
        f"projects/{s.gke_project}/locations/{s.gke_location}/clusters/{s.gke_cluster}"
        if s.gke_configured
        else None
    )
    return QueueObservation(
        local_queue=queue,
        cluster_queue=lq["clusterQueue"] if lq else None,
        pending_workloads=lq["pendingWorkloads"] if lq else None,
        workload=workload_observation(rt, summary, our_checks(rt), uid) if summary else None,
        cluster=cluster,
    )


# ---------------------------------------------------------------- our check on a Workload


def _check_entry(summary: Mapping[str, Any], a: SetAdmissionCheckState) -> dict[str, Any]:
    checks: list[dict[str, Any]] = summary["admissionChecks"]
    before: dict[str, Any] = next((c for c in checks if c.get("name") == a.check), {})
    moved = before.get("state") != a.state
    entry: dict[str, Any] = {
        "name": a.check,
        "state": a.state,
        "message": a.message,
        "lastTransitionTime": timestamp()
        if moved or not before.get("lastTransitionTime")
        else (before["lastTransitionTime"]),
    }
    if a.pod_set_updates:
        entry["podSetUpdates"] = [
            {
                "name": u.name,
                **({"nodeSelector": dict(u.node_selector)} if u.node_selector else {}),
                **({"labels": dict(u.labels)} if u.labels else {}),
            }
            for u in a.pod_set_updates
        ]
    return entry


async def write_check(
    rt: Runtime, summary: Mapping[str, Any], a: SetAdmissionCheckState, who: str
) -> bool:
    """Our check's state on the Workload decided on: our own entry of status.admissionChecks,
    server-side applied (Kueue's entries and fields stay Kueue's), against the resourceVersion
    decided on: if the Workload moved since (Kueue evicted it, say), nothing is written and the
    watch event of that change brings the next pass. No requeueAfterSeconds: in Kueue v0.17.0 a
    Retry that carries it keeps the quota until requeueAt (reconcile/kueue_gate.py)."""
    ns = str(summary["namespace"])
    if summary["resourceVersion"] != a.resource_version:
        log.info("workload moved, check not written %s", who)
        return False
    try:
        await rt.kube.apply_workload_check(
            ns, a.workload, a.resource_version, _check_entry(summary, a)
        )
    except Conflict:
        log.info("workload changed under us, check not written %s", who)
        return False
    log.info("admission check %s %s %s: %s", a.check, a.state, who, a.message)
    return True


def remote_workloads(rt: Runtime) -> list[RemoteWorkload]:
    """MultiKueue's copies here that no job owns yet, with our check on them."""
    ours = our_checks(rt)
    found = []
    for key in list(rt.indexes.workloads):
        if not (isinstance(key, tuple) and len(key) == 3 and key[0] == "name"):
            continue
        w = ob.first(rt.indexes.workloads, key)
        if not isinstance(w, dict) or w.get("ownerUid"):
            continue
        entry = next((c for c in w["admissionChecks"] if c.get("name") in ours), None)
        if entry is None:
            continue
        quota = (w["conditions"].get("QuotaReserved") or {}).get("status") == "True"
        found.append(
            RemoteWorkload(
                w["namespace"],
                w["name"],
                w["resourceVersion"],
                str(entry["name"]),
                str(entry.get("state") or "Pending"),
                str(entry.get("message") or ""),
                quota,
            )
        )
    return found


async def remote_check_pass(rt: Runtime) -> None:
    """Our check on MultiKueue's jobless copies (reconcile/multikueue.remote_checks)."""
    now = datetime.now(UTC)
    cooldown = rt.settings.multikueue_lost_cooldown_seconds
    for ns, action in remote_checks(remote_workloads(rt), rt.multikueue_lost, now, cooldown):
        summary = ob.first(rt.indexes.workloads, ("name", ns, action.workload))
        if isinstance(summary, dict):
            await write_check(rt, summary, action, f"workload={ns}/{action.workload} (MultiKueue)")
    for key, since in list(rt.multikueue_lost.items()):  # forgotten after the cooldown
        if (now - since).total_seconds() > cooldown:
            rt.multikueue_lost.pop(key, None)


# ---------------------------------------------------------------- our AdmissionChecks: Active


def check_observations(rt: Runtime) -> list[AdmissionCheckObservation]:
    return [
        AdmissionCheckObservation(
            name=name,
            generation=ac["generation"],
            resource_version=ac["resourceVersion"],
            active=ac["active"],
            observed_generation=ac["observedGeneration"],
        )
        for name, ac in our_checks(rt).items()
    ]


async def set_admission_check_active(rt: Runtime, a: SetAdmissionCheckActive) -> None:
    """The activation loop's one write: our AdmissionCheck's Active condition, against the
    resourceVersion activate() looked at (no job's pass decides it, so it is not an applier)."""
    ac = ob.first(rt.indexes.admission_checks, a.check)
    if ac is None or ac["resourceVersion"] != a.resource_version:
        return
    conditions = [dict(c) for c in ac["conditions"] if c.get("type") != "Active"]
    before: dict[str, Any] = next((c for c in ac["conditions"] if c.get("type") == "Active"), {})
    conditions.append(
        {
            "type": "Active",
            "status": "True",
            "reason": "Active",
            "message": a.message,
            "observedGeneration": a.generation,
            "lastTransitionTime": before.get("lastTransitionTime")
            if before.get("status") == "True"
            else timestamp(),
        }
    )
    try:
        await rt.kube.patch_admission_check_conditions(a.check, a.resource_version, conditions)
    except Conflict:
        return
    log.info("admission check %s Active", a.check)


async def activation_loop(rt: Runtime) -> None:
    """Keep every AdmissionCheck of ours Active (leader only: started with the workers)."""
    while True:
        rt.kueue_checks_changed.clear()
        for action in activate(check_observations(rt)):
            try:
                await set_admission_check_active(rt, action)
            except Exception as exc:  # the next change or resync tries again
                log.warning("admission check %s not activated: %s", action.check, exc)
        try:
            await remote_check_pass(rt)
        except Exception as exc:  # the next change or resync tries again
            log.warning("MultiKueue copies' checks not written: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rt.kueue_checks_changed.wait(), ACTIVATION_RESYNC_SECONDS)
