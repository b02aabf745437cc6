"""The Kueue `Workload` a MultisliceJob owns, and the status writes its owner makes. Pure.

Kueue's job integrations are Go (`jobframework.GenericJob`); a Python operator that wants Kueue
to queue the MultisliceJob itself, rather than its JobSet, builds the Workload and makes the
writes `jobframework.JobReconciler` makes for a Go job (kueue v0.19.2,
pkg/controller/jobframework/reconciler.go). This is also what MultiKueue's generic adapter for
external frameworks needs: the Workload is owned by the custom resource, not by a JobSet.

What Kueue counts (kueue.x-k8s.io/v1beta2):

* pod set `slice`: one pod per host of every slice (count = hosts x slices), each pod as the
  JobSet runs it, so `google.com/tpu` = chips per host x hosts x slices, exactly what Kueue's
  JobSet integration counts for the same JobSet;
* pod set `spare` (spec.spares > 0): the hosts of the hot spares' pools (a spare slice, or a spare
  cube with dynamic slicing), each requesting what a worker pod requests. A spare pool holds its
  chips whether or not a pod runs there, so the quota counts them.

An elastic job (spec.elastic) is counted at its full size (spec.slices) and keeps that quota
while it runs degraded: Kueue's webhook refuses to lower `status.reclaimablePods` while quota is
reserved (pkg/webhooks/workload_webhook.go, validateReclaimablePodsUpdate: "cannot be less
than"), so quota given back for a lost slice could not be taken again for the regrown one without
queueing the whole job anew; and Kueue's workload slices (ElasticJobsViaWorkloadSlices) admit a
resized job as a new Workload, which is for its built-in job integrations.
"""

from __future__ import annotations

import copy
from datetime import datetime
from typing import Any

from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.common.names import REPLICATED_JOB
from multislice_operator.planning.plan import Plan

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KIND = "Workload"
SPARE_POD_SET = "spare"
# Kueue's finalizer on Workloads (kueue.ResourceInUseFinalizerName): the owner removes it once
# the job no longer uses the quota (finished, or the Workload deleted).
RESOURCE_IN_USE = "kueue.x-k8s.io/resource-in-use"
# kueue.WorkloadEvictedByPreemption, kueue.WorkloadEvictedDueToNodeFailures: the eviction reasons
# after which jobframework marks the Workload Requeued=True.
REQUEUED_REASONS = frozenset({"Preempted", "NodeFailures"})
# kueue.WorkloadFinishedReasonSucceeded / Failed.
FINISHED_SUCCEEDED, FINISHED_FAILED = "Succeeded", "Failed"
MAX_MESSAGE = 32 * 1024  # metav1.Condition.message's limit (api.TruncateConditionMessage)


def workload_name(job: str) -> str:
    """One Workload per job, named after it (a job's name is at most 63 characters)."""
    return f"multislicejob-{job}"


def spare_hosts(plan: Plan) -> int:
    """Hosts of the hot spares' pools: spares x hosts of one pool (a slice's, or a cube's)."""
    return plan.spares * (plan.pool_chips // plan.shape.chips_per_host)


def quota_chips(plan: Plan) -> int:
    """The google.com/tpu the Workload asks for: the slices' chips and the spares'."""
    return plan.total_chips + plan.spare_chips


def pod_sets(plan: Plan, pod_template: dict[str, Any]) -> list[dict[str, Any]]:
    """`slice` (every worker pod) and, with spares, `spare`: each pod as the JobSet runs it."""
    counts = [(REPLICATED_JOB, plan.total_hosts)]
    if plan.spares:
        counts.append((SPARE_POD_SET, spare_hosts(plan)))
    return [
        {"name": name, "count": count, "template": copy.deepcopy(pod_template)}
        for name, count in counts
    ]


def render_workload(
    plan: Plan,
    pod_template: dict[str, Any],
    *,
    uid: str,
    queue: str,
    priority_class: str | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The Workload of the MultisliceJob `plan` is for (uid: the job's), in LocalQueue `queue`.

    `priority`: the WorkloadPriorityClass's value, which the owner resolves (jobframework does,
    ExtractPriority): Kueue orders and preempts by spec.priority, not by the class name."""
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": pod_sets(plan, pod_template),
        "active": True,
    }
    if priority_class:
        spec["priorityClassRef"] = {
            "group": KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
        spec["priority"] = priority or 0
    labels = {
        keys.JOB_NAME: plan.name,
        keys.MANAGED_BY: keys.MANAGED_BY_VALUE,
        keys.KUEUE_JOB_UID: uid,
    }
    if plan.quota_key is not None:  # what it asks for may change (a Fallback job's option)
        labels[keys.QUOTA_KEY] = plan.quota_key
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": KIND,
        "metadata": {
            "name": workload_name(plan.name),
            "namespace": plan.namespace,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": models.API_VERSION,
                    "kind": models.KIND,
                    "name": plan.name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


# ---------------------------------------------------------------- the owner's status writes


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")


def _set(conditions: list[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """apimeta.SetStatusCondition: replace the condition of new's type; keep its transition
    time when the status did not change."""
    old = next((c for c in conditions if c.get("type") == new["type"]), None)
    if old is not None and old.get("status") == new["status"]:
        new = {**new, "lastTransitionTime": old.get("lastTransitionTime")}
    return [*(c for c in conditions if c.get("type") != new["type"]), new]


def _condition(kind: str, status: bool, reason: str, message: str, generation: int,
               now: datetime) -> dict[str, Any]:  # fmt: skip
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "observedGeneration": generation,
        "lastTransitionTime": _stamp(now),
    }


def released_status(
    conditions: list[dict[str, Any]], checks: list[dict[str, Any]], generation: int,
    now: datetime,
) -> dict[str, Any] | None:  # fmt: skip
    """The status write after an eviction, once the job no longer runs (its JobSet stopped):
    quota reservation unset, Admitted false, Requeued (true after a preemption or node failures,
    which Kueue then queues again at once). jobframework's step 6, "handle eviction". None while
    the Workload is not evicted."""
    evicted = next(
        (c for c in conditions if c.get("type") == "Evicted" and c.get("status") == "True"), None
    )
    if evicted is None:
        return None
    reason, message = str(evicted.get("reason") or ""), str(evicted.get("message") or "")
    out = _set(conditions, _condition("Requeued", reason in REQUEUED_REASONS, reason, message,
                                      generation, now))  # fmt: skip
    # UnsetQuotaReservationWithCondition with Kueue's default gates (reason Pending), then
    # SyncAdmittedCondition (no reservation: NoReservation, or NoReservationUnsatisfiedChecks
    # while a check is not Ready, as after an eviction that reset them).
    out = _set(out, _condition("QuotaReserved", False, "Pending", message, generation, now))
    if any(c.get("type") == "Admitted" for c in out):
        ready = all(c.get("state") == "Ready" for c in checks)
        reason, text = (
            ("NoReservation", "The workload has no reservation")
            if ready
            else ("NoReservationUnsatisfiedChecks",
                  "The workload has no reservation and not all checks ready")
        )  # fmt: skip
        out = _set(out, _condition("Admitted", False, reason, text, generation, now))
    return {"admission": None, "conditions": out}


def finished_status(
    conditions: list[dict[str, Any]], succeeded: bool, message: str, generation: int,
    now: datetime,
) -> dict[str, Any]:  # fmt: skip
    """The job ended: Finished, which releases the quota (workloadfinish.Finish)."""
    reason = FINISHED_SUCCEEDED if succeeded else FINISHED_FAILED
    return {"conditions": _set(conditions, _condition("Finished", True, reason, message,
                                                      generation, now))}  # fmt: skip
