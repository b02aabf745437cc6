"""Kueue's objects as plain observations, and the loop that keeps our AdmissionChecks Active.

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
from collections.abc import Mapping
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
    WorkloadObservation,
)
from multislice_operator.reconcile.kueue_gate import activate

log = logging.getLogger("multislice_operator")

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
WORKLOADS = (GROUP, VERSION, "workloads")
LOCAL_QUEUES = (GROUP, VERSION, "localqueues")
ADMISSION_CHECKS = (GROUP, VERSION, "admissionchecks")
ACTIVATION_RESYNC_SECONDS = 30.0
# pkg/scheduler/preemption/preemption.go (v0.17.0): "Preempted to accommodate a workload (UID: %s,
# JobUID: %s) due to %s; preemptor path: ...".
PREEMPTOR = re.compile(r"\(UID: (?P<uid>[^,)]+), JobUID: (?P<job>[^,)]+)\)")
CONDITIONS = ("QuotaReserved", "Admitted", "Evicted", "Finished", "Preempted")

# ---------------------------------------------------------------- index summaries


def _owner(meta: Mapping[str, Any]) -> str | None:
    """The MultisliceJob that owns the Workload (its controller), if any."""
    for o in meta.get("ownerReferences") or []:
        if o.get("kind") == models.KIND and o.get("controller"):
            return str(o.get("name"))
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
    its job's uid (to name a preemptor)."""
    meta = body.get("metadata") or {}
    spec, status = body.get("spec") or {}, body.get("status") or {}
    owner = _owner(meta)
    if not owner:
        return {}
    ns = meta.get("namespace", "")
    summary = {
        "name": meta.get("name", ""),
        "resourceVersion": str(meta.get("resourceVersion", "")),
        "created": meta.get("creationTimestamp"),
        "active": spec.get("active") is not False,
        "clusterQueue": (status.get("admission") or {}).get("clusterQueue"),
        "conditions": _conditions(status),
        "admissionChecks": [dict(c) for c in status.get("admissionChecks") or []],
        "reclaimable": _reclaimable(status),
    }
    who = f"{ns}/{owner}"
    out: dict[Any, Any] = {(ns, owner): summary, ("uid", meta.get("uid", "")): who}
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
    found: dict[str, dict[str, Any]] = {}
    for name in list(rt.indexes.admission_checks):
        ac = ob.first(rt.indexes.admission_checks, name)
        if ac is not None and ac["controllerName"] == keys.GANG_CHECK_CONTROLLER:
            found[str(name)] = ac
    return found


def workload_summary(rt: Runtime, namespace: str, job: str) -> dict[str, Any] | None:
    """The Workload of a job (the newest, should there ever be two)."""
    found = [w for w in ob.items(rt.indexes.workloads, (namespace, job)) if isinstance(w, dict)]
    if not found:
        return None
    newest: dict[str, Any] = max(found, key=lambda w: (str(w["created"] or ""), w["name"]))
    return newest


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
    rt: Runtime, summary: dict[str, Any], ours: Mapping[str, Any]
) -> WorkloadObservation:
    conds = summary["conditions"]

    def cond(t: str) -> dict[str, Any]:
        found: dict[str, Any] = conds.get(t) or {}
        return found

    quota, evicted = cond("QuotaReserved"), cond("Evicted")
    check = None
    for entry in summary["admissionChecks"]:
        if entry.get("name") in ours:
            check = CheckObservation(
                name=str(entry["name"]),
                state=str(entry.get("state") or "Pending"),
                message=str(entry.get("message") or ""),
                retry_count=int(entry.get("retryCount") or 0),
            )
            break
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
    )


def queue_observation(rt: Runtime, key: JobKey, queue: str) -> QueueObservation:
    """What Kueue says about the job `key`."""
    if not rt.settings.kueue:
        return QueueObservation(queue, watching=False)
    lq = ob.first(rt.indexes.local_queues, (key[0], queue))
    summary = workload_summary(rt, *key)
    return QueueObservation(
        local_queue=queue,
        cluster_queue=lq["clusterQueue"] if lq else None,
        pending_workloads=lq["pendingWorkloads"] if lq else None,
        workload=workload_observation(rt, summary, our_checks(rt)) if summary else None,
    )


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
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rt.kueue_checks_changed.wait(), ACTIVATION_RESYNC_SECONDS)
