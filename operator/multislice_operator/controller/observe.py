"""Turn what the watches saw (JobSets, pods, nodes) and the cloud's pools into plain observations.

The index functions here run on every watch event and keep only the few fields the decision needs,
so memory stays small with thousands of jobs; `assemble()` puts them together for one job.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from multislice_operator.common import keys
from multislice_operator.common.names import REPLICATED_JOB
from multislice_operator.common.ownership import Owner, owner_of
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.planning.plan import Plan
from multislice_operator.provisioning.base import GangObservation
from multislice_operator.reconcile import (
    Admission,
    JobSetObservation,
    NodeMaintenance,
    Observed,
    Pod,
    SliceObservation,
    termination,
)
from multislice_operator.reconcile.scheduling import DEFAULT_SCHEDULER
from multislice_operator.reconcile.types import LastExit, PreflightObservation
from multislice_operator.registry import REGISTRY
from multislice_operator.render.inplace import AGENT_CONTAINER, AGENT_EXIT_CODE
from multislice_operator.render.jobset import DISRUPTION_CONDITION

# PodScheduled=False as the apiserver writes it on a pod with schedulingGates.
GATED = "SchedulingGated"
# kube-controller-manager's default --node-monitor-grace-period: a node whose kubelet was not
# heard of for this long is not Ready (pkg/controller/nodelifecycle/config/v1alpha1/defaults.go).
NODE_MONITOR_GRACE_SECONDS = 50.0
# Node lifecycle conditions (Kubernetes 1.37+, KEP-5683, alpha gate NodeLifecycleConditions;
# k8s.io/api core/v1 NodeMaintenancePlanned, NodeMaintenanceInProgress): set and cleared by the
# admin. Planned names no time: "expected to undergo a change in the future... the admin should
# drain the Node first"; InProgress: "actively undergoing maintenance". An older node has neither.
NODE_MAINTENANCE_PLANNED = "MaintenancePlanned"
NODE_MAINTENANCE_IN_PROGRESS = "MaintenanceInProgress"
NODE_MAINTENANCE_CONDITIONS = (NODE_MAINTENANCE_PLANNED, NODE_MAINTENANCE_IN_PROGRESS)

# ---------------------------------------------------------------- index summaries


def _true(conds: Mapping[Any, Any], kind: str) -> bool:
    return (conds.get(kind) or {}).get("status") == "True"


def _by_type(items: Any) -> dict[Any, Any]:
    """Conditions (or any list of objects with a `type`) by their type."""
    return {c.get("type"): c for c in items or []}


def _jobset_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    replicas = next(
        (int(rj.get("replicas") or 0) for rj in spec.get("replicatedJobs") or []
         if rj.get("name") == REPLICATED_JOB),
        0,
    )  # fmt: skip
    policy = spec.get("failurePolicy") or {}
    return {
        "replicas": replicas,
        "suspended": bool(spec.get("suspend")),
        # Unset: JobSet's default, Recreate (jobset_types.go).
        "restartStrategy": policy.get("restartStrategy") or "Recreate",
    }


def _jobset_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    refs = meta.get("ownerReferences") or []
    controller: dict[str, Any] = next((o for o in refs if o.get("controller")), {})
    return {
        "restartBase": _int(annotations.get(keys.RESTARTS_BEFORE)) or 0,
        "countedBase": _int(annotations.get(keys.RESTARTS_COUNTED_BEFORE)) or 0,
        "madeByUs": labels.get(keys.MANAGED_BY) == keys.MANAGED_BY_VALUE,
        "ownerUid": controller.get("uid"),
        "uid": meta.get("uid", ""),
        "jobName": labels.get(keys.JOB_NAME),
        "deleting": bool(meta.get("deletionTimestamp")),
        "created": meta.get("creationTimestamp"),
    }


def _jobset_jobs(status: Mapping[str, Any]) -> dict[str, Any]:
    """The slices' Jobs: ready, active and succeeded (JobSet's replicatedJobsStatus)."""
    found: Mapping[str, Any] = next(
        (rj for rj in status.get("replicatedJobsStatus") or [] if rj.get("name") == REPLICATED_JOB),
        {},
    )
    return {k: int(found.get(k) or 0) for k in ("ready", "active", "succeeded")}


def _jobset_state(status: Mapping[str, Any]) -> dict[str, Any]:
    conds = _by_type(status.get("conditions"))
    failed = conds.get("Failed") or {}
    terminal = status.get("terminalState")
    suspended = conds.get("Suspended") or {}
    return {
        # Since when JobSet has suspended its Jobs (its Suspended condition, set in suspendJobs).
        "suspendedSince": suspended.get("lastTransitionTime")
        if _true(conds, "Suspended")
        else None,
        "restarts": int(status.get("restarts") or 0),
        # omitempty: absent means 0 (JobSet v0.10.1 api/jobset/v1alpha2/jobset_types.go)
        "restartsCounted": int(status.get("restartsCountTowardsMax") or 0),
        # Set only under InPlaceRestart (JobSet >= v0.11, feature gate); absent: none.
        "inPlaceAttempt": _int(status.get("currentInPlaceRestartAttempt")) or 0,
        "completed": _true(conds, "Completed") or terminal == "Completed",
        "failed": _true(conds, "Failed") or terminal == "Failed",
        "failureReason": failed.get("reason", ""),
        "failureMessage": failed.get("message", ""),
    }


def summarize_jobset(body: Mapping[str, Any]) -> dict[str, Any]:
    """The few fields of a JobSet the decision reads (jobset_observation)."""
    status = body.get("status") or {}
    return {
        **_jobset_spec(body.get("spec") or {}),
        **_jobset_meta(body.get("metadata") or {}),
        **_jobset_state(status),
        **_jobset_jobs(status),
    }


def _exit(status: Mapping[str, Any]) -> dict[str, Any]:
    """The first container that exited non-zero: its code, reason, finish and its termination
    message (where the run stood); the pod's reason otherwise."""
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode"):
            return {
                "exitCode": int(term["exitCode"]),
                "reason": term.get("reason") or status.get("reason") or "",
                "termination": termination.parse(term.get("message")),
                "failedAt": term.get("finishedAt"),
            }
    return {"exitCode": None, "reason": status.get("reason") or "", "termination": None,
            "failedAt": None}  # fmt: skip


def _unseen(conds: Mapping[Any, Any], meta: Mapping[str, Any], spec: Mapping[str, Any],
            status: Mapping[str, Any]) -> bool:  # fmt: skip
    """No scheduler looks at it: Pending with no PodScheduled condition at all (a scheduler sets
    one on its first attempt, False or True); a schedulerName nobody runs. It counts against the
    unschedulable deadline from its creation, as the scheduler's "no" would."""
    return (
        "PodScheduled" not in conds
        and status.get("phase", "Pending") == "Pending"
        and not spec.get("nodeName")
        and not meta.get("deletionTimestamp")
    )


def _scheduling(conds: Mapping[Any, Any], meta: Mapping[str, Any], spec: Mapping[str, Any],
                status: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The scheduler's verdict, only while it cannot place the pod (or none looks at it)."""
    scheduled = conds.get("PodScheduled") or {}
    created = meta.get("creationTimestamp") or ""
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        since = scheduled.get("lastTransitionTime") or created
        return {"unschedulable": since, "schedulerMessage": scheduled.get("message") or ""}
    if _unseen(conds, meta, spec, status):
        return {
            "unschedulable": created,
            "schedulerMessage": unseen_message(spec.get("schedulerName")),
        }
    return {"unschedulable": None, "schedulerMessage": ""}


def _looked_at(conds: Mapping[Any, Any], spec: Mapping[str, Any],
               status: Mapping[str, Any]) -> bool:  # fmt: skip
    """A scheduler looked at the pod: its verdict (PodScheduled True or False), a node, or it
    left Pending. SchedulingGated is the apiserver's, for a pod no scheduler may look at yet."""
    scheduled = conds.get("PodScheduled") or {}
    return (
        bool(scheduled and scheduled.get("reason") != GATED)
        or bool(spec.get("nodeName"))
        or status.get("phase", "Pending") != "Pending"
    )


def _pod_attempt(meta: Mapping[str, Any]) -> int:
    """A pod restarted in place keeps its restart-attempt label; its agent's annotation counts
    every restart, as the JobSet's attempt does (jobset_observation)."""
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    return max(
        _int(labels.get(keys.JOBSET_RESTART_ATTEMPT)) or 0,
        _int(annotations.get(keys.IN_PLACE_RESTART_ATTEMPT)) or 0,
    )


def summarize_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """The few fields of a pod the decision reads (kept for every pod of every job: small)."""
    meta = body.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    status, spec = body.get("status") or {}, body.get("spec") or {}
    conds = _by_type(status.get("conditions"))
    disruption = conds.get(DISRUPTION_CONDITION) or {}
    disrupted = disruption.get("status") == "True"
    return {
        "pod": meta.get("name", ""),
        "jobsetUid": labels.get(keys.JOBSET_UID),
        "slice": _int(labels.get(keys.JOBSET_JOB_INDEX)),
        "attempt": _pod_attempt(meta),
        "phase": status.get("phase", "Pending"),
        "ready": _true(conds, "Ready"),
        **_exit(status),
        "deleting": bool(meta.get("deletionTimestamp")),
        **_scheduling(conds, meta, spec, status),
        "node": spec.get("nodeName") or None,
        "lookedAt": _looked_at(conds, spec, status),
        "disruption": (disruption.get("reason") or DISRUPTION_CONDITION) if disrupted else None,
        "checkpointRequest": annotations.get(keys.CHECKPOINT_REQUEST),
        "checkpointSaved": checkpoint_saved(annotations.get(keys.CHECKPOINT_SAVED)),
        "lastExit": restarted_exit(spec, status),
    }


# What a real kubelet leaves in lastState of every container it removed to restart all of a
# pod's containers in place (Kubernetes v1.36.3 pkg/kubelet/kubelet_pods.go: exit 137, this
# reason, whichever exit fired the rule): a removal, not the program's exit, which is seen only
# in the container's state before that.
KUBELET_RESTARTED_ALL = "RestartingAllContainers"


def restarted_exit(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any] | None:
    """The TPU container's previous run when the kubelet restarted the pod's containers in place
    (RestartAllContainers): its exit, reason and termination message, from its lastState. None
    when the pod's own agent asked for that restart (its lastState exit is the agent's restart
    code: JobSet told it to follow another pod's restart), so only the pod whose program failed
    or hung is a failure; the agent itself exits 128 + signal when stopped with its pod
    (jobset v0.12.0 cmd/in-place-restart-agent/main.go). None too when the lastState is the
    kubelet's record of the removal (KUBELET_RESTARTED_ALL): then the program's exit was in its
    state, seen as a failed pod by an earlier pass, or not seen at all."""
    name = ((spec.get("containers") or [{}])[0]).get("name")
    last = _last_terminated(status.get("containerStatuses"), name)
    if not last or not last.get("exitCode") or last.get("reason") == KUBELET_RESTARTED_ALL:
        return None
    agent = _last_terminated(status.get("initContainerStatuses"), AGENT_CONTAINER) or {}
    if agent.get("exitCode") == AGENT_EXIT_CODE:
        return None
    return {
        "exitCode": int(last["exitCode"]),
        "at": last.get("finishedAt"),
        "reason": last.get("reason") or "",
        "termination": termination.parse(last.get("message")),
    }


def _last_terminated(statuses: Any, name: Any) -> dict[str, Any] | None:
    for cs in statuses or []:
        if cs.get("name") == name:
            return ((cs.get("lastState") or {}).get("terminated")) or None
    return None


def unseen_message(scheduler: str | None) -> str:
    """Why a pod that no scheduler has looked at waits, naming the field that chose one."""
    name = scheduler or DEFAULT_SCHEDULER
    return (
        f"nothing: no scheduler has looked at the pod (no PodScheduled condition); "
        f"spec.template.spec.schedulerName is {name!r}: is a scheduler of that name running? "
        "Remove the field for the default scheduler"
    )


def checkpoint_saved(text: str | None) -> tuple[str, int] | None:
    """The workload's multislice.dev/checkpoint-saved annotation (a JSON string)."""
    if not text:
        return None
    try:
        return termination.request(json.loads(text))
    except ValueError:
        return None


def summarize_node(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = body.get("status") or {}
    cond: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
    )
    ready = cond.get("status") == "True"
    spec = body.get("spec") or {}
    return {
        "name": meta.get("name", ""),
        "ready": ready and not spec.get("unschedulable") and not meta.get("deletionTimestamp"),
        "present": not meta.get("deletionTimestamp"),
        # The kubelet's last status heartbeat, Unix seconds (with node Leases it renews its
        # status only every few minutes: its Lease is the heartbeat then).
        "heartbeat": _timestamp(cond.get("lastHeartbeatTime")),
        "accelerator": labels.get(keys.GKE_TPU_ACCELERATOR),
        "topology": labels.get(keys.GKE_TPU_TOPOLOGY),
        "jobKey": labels.get(keys.JOB_KEY),
        "labels": dict(labels),
        **_node_maintenance(labels, status, spec),
    }


def _node_maintenance(
    labels: Mapping[str, str], status: Mapping[str, Any], spec: Mapping[str, Any]
) -> dict[str, Any]:
    """Host maintenance GKE announced (its labels and taint, common/keys.py), and the one the
    node itself announces (Kubernetes 1.37+, KEP-5683: the admin's conditions, True since their
    lastTransitionTime; None: the condition does not say). Times in Unix seconds."""
    terminating = any(
        t.get("key") == keys.GKE_IMPENDING_NODE_TERMINATION for t in spec.get("taints") or []
    )
    lifecycle = {
        c.get("type"): c
        for c in status.get("conditions") or []
        if c.get("type") in NODE_MAINTENANCE_CONDITIONS and c.get("status") == "True"
    }
    since = [_timestamp(c.get("lastTransitionTime")) for c in lifecycle.values()]
    return {
        "maintenanceTime": _int(labels.get(keys.GKE_SCHEDULED_MAINTENANCE_TIME)),
        "maintenanceLatest": _int(labels.get(keys.GKE_SCHEDULED_MAINTENANCE_TIME_LATEST)),
        "maintenanceActive": keys.GKE_ACTIVE_NODE_MAINTENANCE in labels
        or terminating
        or NODE_MAINTENANCE_IN_PROGRESS in lifecycle,
        "maintenancePlanned": bool(lifecycle),
        "maintenancePlannedSince": min((t for t in since if t is not None), default=None),
    }


def listing_behind_nodes(plan: Plan, gang: GangObservation, nodes: Mapping[Any, Any]) -> bool:
    """Whether a pool the listing says is being created already has every node of its slice
    Ready: the listing (shared, up to a resync old) predates the pool's RUNNING."""
    hosts = plan.shape.hosts
    for spec in plan.pools:
        pool = gang.pools.get(spec.name)
        if pool is None or pool.status != PoolState.CREATING:
            continue
        if sum(1 for n in items(nodes, spec.name) if n.get("ready")) >= hosts:
            return True
    return False


def items(index: Mapping[Any, Any], key: Any) -> list[Any]:
    """Everything a kopf index holds under `key` (kopf keeps a store of values per key)."""
    store = index.get(key)
    return list(store) if store is not None else []


def first(index: Mapping[Any, Any], key: Any) -> Any:
    found = items(index, key)
    return found[0] if found else None


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp as the apiserver writes it; None for anything else."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _timestamp(value: Any) -> float | None:
    """An RFC 3339 time as Unix seconds (parsed once, in the index); None for anything else."""
    t = parse_time(value)
    return t.timestamp() if t is not None else None


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _epoch(value: int | None) -> datetime | None:
    if value is None or value <= 0:
        return None
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        return None


# ---------------------------------------------------------------- assembling one observation

Nodes = Mapping[Any, Iterable[dict[str, Any]]]  # node summaries by pool (kopf's index)


def heartbeat_age(node: Mapping[str, Any], leases: Mapping[str, float], now: float) -> float:
    """Seconds since the node's kubelet was last heard of: its Lease's renewTime (every 10 s)
    or its Ready condition's lastHeartbeatTime, whichever is later, as the node lifecycle
    controller probes it (tryUpdateNodeHealth); 0 when neither is known."""
    beat = max(node.get("heartbeat") or 0.0, leases.get(node["name"], 0.0))
    return now - beat if beat else 0.0


def with_heartbeats(
    nodes: Nodes,
    leases: Mapping[str, float] | None,
    now: datetime,
    grace: float = NODE_MONITOR_GRACE_SECONDS,
) -> tuple[Nodes, dict[str, list[str]]]:
    """The node index as decide() may trust it: a node whose Ready condition still says True
    but whose kubelet was not heard of for `grace` (its heartbeats stalled; the node lifecycle
    controller marks it Unknown only at its own pace) is not Ready. And those nodes by pool,
    with their heartbeat's age. `leases` (renewTimes, Unix seconds) None: not known, every Ready
    node is trusted. The index itself is returned when no node is quiet (no copy)."""
    if leases is None:
        return nodes, {}
    t = now.timestamp()
    quiet: dict[Any, list[dict[str, Any]]] = {}
    for pool, members in nodes.items():
        for n in members:
            if n["ready"] and heartbeat_age(n, leases, t) > grace:
                quiet.setdefault(pool, []).append(n)
    if not quiet:
        return nodes, {}
    view: dict[Any, Iterable[dict[str, Any]]] = dict(nodes.items())
    for pool, stale in quiet.items():
        names = {n["name"] for n in stale}
        view[pool] = [{**n, "ready": False} if n["name"] in names else n for n in nodes[pool]]
    ages = {
        str(pool): [f"{n['name']} ({heartbeat_age(n, leases, t):.0f}s)" for n in stale]
        for pool, stale in quiet.items()
    }
    return view, ages


def ready_nodes_by_pool(nodes: Mapping[Any, Iterable[dict[str, Any]]]) -> dict[str, int]:
    return {str(pool): sum(1 for n in items if n["ready"]) for pool, items in nodes.items()}


def present_nodes_by_pool(nodes: Mapping[Any, Iterable[dict[str, Any]]]) -> dict[str, int]:
    """Nodes that exist, Ready or not (a NotReady node is still the slice's VM)."""
    return {
        str(pool): sum(1 for n in items if n.get("present", True)) for pool, items in nodes.items()
    }


@dataclass(frozen=True)
class PoolOwner:
    """The job another pool of one of our pool's names belongs to (from the pool's labels)."""

    job: str  # namespace/name
    older: bool  # that job is live and was created before ours, or that cannot be told
    gone: bool  # that job no longer exists (the sweep would delete the pool; so may we)


def attempt_of(summary: Mapping[str, Any]) -> tuple[int, int]:
    """The JobSet's restarts of every kind, and those charged to maxRestarts: the one home of
    the restart attempt every reader of JobSetObservation.restarts uses.

    JobSet (v0.12.0) counts a recreate in status.restarts and an in-place restart only in
    status.currentInPlaceRestartAttempt. That attempt counts recreates too: every agent writes
    the JobSet's current attempt + 1 on its pod at each start, the new pods of a recreate
    included (cmd/in-place-restart-agent/main.go), and JobSet charges an in-place restart as
    the pods' attempt less the uncharged restarts (pkg/controllers/in_place_restart.go,
    exceededMaxRestarts). So every restart is the larger of the two (status.restarts leads
    while a recreate's agents are not yet on one attempt), and the in-place restarts beyond
    status.restarts are charged, as JobSet charges them."""
    restarts, counted = summary["restarts"], summary.get("restartsCounted", 0)
    in_place = max(0, summary.get("inPlaceAttempt", 0) - restarts)
    return restarts + in_place, counted + in_place


def jobset_observation(
    summary: dict[str, Any] | None, job_key: tuple[str, str] = ("", ""), job_uid: str = ""
) -> JobSetObservation | None:
    """The JobSet of the job's name, with whose it is (common/ownership.py: by its controller
    owner's uid, never by name alone)."""
    if summary is None:
        return None
    owner = owner_of(
        made_by_us=bool(summary.get("madeByUs")),
        claim_uid=summary.get("ownerUid"),
        claim_key=job_key,
        job_key=job_key,
        job_uid=job_uid,
    )
    base = summary.get("restartBase", 0)
    restarts, counted = attempt_of(summary)
    return JobSetObservation(
        suspended=summary["suspended"],
        suspended_since=parse_time(summary.get("suspendedSince")),
        restarts=base + restarts,
        restarts_counted=summary.get("countedBase", 0) + counted,
        replicas=summary.get("replicas", 0),
        restart_base=base,
        restart_strategy=summary.get("restartStrategy") or "Recreate",
        completed=summary["completed"],
        failed=summary["failed"],
        failure_reason=summary["failureReason"],
        failure_message=summary["failureMessage"],
        ready_jobs=summary["ready"],
        active_jobs=summary["active"],
        succeeded_jobs=summary["succeeded"],
        owner=owner,
        uid=summary.get("uid", ""),
        deleting=bool(summary.get("deleting")),
        created=parse_time(summary.get("created")),
    )


def _last_exit(seen: Mapping[str, Any] | None) -> LastExit | None:
    if not seen:
        return None
    at = parse_time(seen.get("at"))
    return LastExit(seen["exitCode"], seen.get("reason") or "", seen.get("termination"), at)


def pod_records(
    summaries: Iterable[dict[str, Any]],
    jobset: JobSetObservation | None,
    pool_of_node: Mapping[str, str] | None = None,
) -> list[Pod]:
    """The pods of the job's own JobSet (by its uid, which JobSet puts on every pod: an earlier
    job's pods of the same name are not this job's). `pool_of_node`: the job's own pools."""
    if jobset is None or jobset.owner != Owner.MINE:
        return []
    pools = pool_of_node or {}
    return [
        Pod(
            name=p["pod"],
            slice_index=p["slice"],
            attempt=jobset.restart_base + p["attempt"],
            phase=p["phase"],
            ready=p["ready"],
            deleting=p["deleting"],
            node=p.get("node"),
            pool=pools.get(p.get("node") or ""),
            exit_code=p["exitCode"],
            failed_at=parse_time(p.get("failedAt")),
            reason=p["reason"],
            termination=p.get("termination"),
            disruption=p.get("disruption"),
            unschedulable_since=parse_time(p.get("unschedulable")),
            scheduler_message=p.get("schedulerMessage") or "",
            looked_at=p.get("lookedAt", True),
            checkpoint_request=p.get("checkpointRequest"),
            checkpoint_saved=p.get("checkpointSaved"),
            last_exit=_last_exit(p.get("lastExit")),
        )
        for p in summaries
        if not jobset.uid or not p.get("jobsetUid") or p["jobsetUid"] == jobset.uid
    ]


def maintenance_observations(
    plan: Plan,
    nodes: Mapping[Any, Iterable[dict[str, Any]]],
    pods: list[Pod],
    attempt: int | None = None,
) -> list[NodeMaintenance]:
    """The job's nodes with maintenance announced: the nodes of its own pools (Managed) or the
    nodes its pods run on (Existing; a model whose pools are not the slices' own), each with the
    slice its pod of the current attempt serves
    (JobSet may place a slice on another of the job's pools after a restart)."""
    hosting = {
        p.node: p.slice_index
        for p in pods
        if p.live and p.node and not p.deleting and (attempt is None or p.attempt == attempt)
    }
    if REGISTRY.model(plan.mode).own_slice_pools:
        pools: Iterable[tuple[Any, int | None]] = [
            (pool.name, pool.slice_index) for pool in plan.pools
        ]
    else:
        pools = [(pool, None) for pool in nodes]
    out = []
    for pool, index in pools:
        for n in items(nodes, pool):
            if index is None and n["name"] not in hosting:
                continue  # an existing pool's node that runs nothing of this job
            when, latest = n.get("maintenanceTime"), n.get("maintenanceLatest")
            active = bool(n.get("maintenanceActive"))
            planned = bool(n.get("maintenancePlanned"))
            if when is None and latest is None and not active and not planned:
                continue
            since = n.get("maintenancePlannedSince")
            out.append(
                NodeMaintenance(
                    node=n["name"],
                    pool=str(pool),
                    slice_index=hosting.get(n["name"], index),
                    time=_epoch(when),
                    latest=_epoch(latest),
                    active=active,
                    planned=planned,
                    planned_since=datetime.fromtimestamp(since, UTC) if since else None,
                )
            )
    return out


def managed_slices(
    plan: Plan,
    gang: GangObservation,
    ready_by_pool: Mapping[str, int],
    uid: str,
    present_by_pool: Mapping[str, int] | None = None,
    owners: Mapping[str, PoolOwner] | None = None,
) -> list[SliceObservation]:
    out = []
    for spec in plan.pools:
        pool = gang.pools.get(spec.name)
        if pool is None:
            out.append(SliceObservation(spec.slice_index, spec.name, PoolState.ABSENT))
            continue
        if pool.status == PoolState.ABSENT:  # a refused or failed create is still worth knowing
            out.append(
                SliceObservation(
                    spec.slice_index,
                    spec.name,
                    PoolState.ABSENT,
                    error=pool.error,
                    operation_pending=pool.operation_pending,
                )
            )
            continue
        foreign = bool(pool.owner_uid and uid and pool.owner_uid != uid)
        # A foreign pool of our name is ours to replace only when it is a previous incarnation of
        # this job, or its job is gone; another live job's pool is never touched (a collision).
        owner = (owners or {}).get(spec.name) if foreign else None
        taken_by = owner.job if owner is not None and not owner.gone else None
        out.append(
            SliceObservation(
                index=spec.slice_index,
                pool=spec.name,
                pool_state=pool.status,
                ready_hosts=ready_by_pool.get(spec.name, 0),
                error=pool.error,
                foreign=foreign and taken_by is None,
                operation_pending=pool.operation_pending,
                present_hosts=(present_by_pool or {}).get(spec.name, 0),
                taken_by=taken_by,
                taken_by_older=owner.older if owner is not None else True,
            )
        )
    return out


# The Job controller labels its pods with the Job's uid (Kubernetes 1.27+).
JOB_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
PREFLIGHT_GENERATION = f"{keys.PREFIX}/preflight-generation"  # render/preflight.py sets it
PREFLIGHT_SHAPE = f"{keys.PREFIX}/preflight-shape"  # and this one for a job of several shapes


def _last_words(pods: Iterable[Mapping[str, Any]]) -> tuple[int | None, str]:
    """The exit code and termination message of the (last) container that terminated."""
    exit_code, message = None, ""
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if term:
                exit_code, message = term.get("exitCode"), term.get("message") or ""
    return (int(exit_code) if isinstance(exit_code, int) else None), message


def preflight_observation(
    job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], uid: str
) -> PreflightObservation:
    """The compile Job of spec.preflight and its pod's last words (termination message)."""
    meta = job.get("metadata") or {}
    conds = _by_type((job.get("status") or {}).get("conditions"))
    complete, failed = _true(conds, "Complete"), _true(conds, "Failed")
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    exit_code, message = _last_words(pods)
    return PreflightObservation(
        name=str(meta.get("name", "")),
        owned=any(o.get("uid") == uid for o in owners),
        generation=_int((meta.get("labels") or {}).get(PREFLIGHT_GENERATION)) or 0,
        shape=(meta.get("labels") or {}).get(PREFLIGHT_SHAPE),
        finished=complete or failed,
        succeeded=complete,
        exit_code=exit_code,
        message=message,
        reason=str((conds.get("Failed") or {}).get("reason") or "") if failed else "",
        deleting=bool(meta.get("deletionTimestamp")),
    )


@dataclass(frozen=True)
class ObserveInputs:
    """What a capacity model's `observe` reads (registry.CapacityPlugin): the plan, the nodes by
    pool (kopf's index; a node whose kubelet went quiet is not Ready there: with_heartbeats),
    the plan's pools as the cloud lists them (None: none were listed, no GKE cluster configured
    or no pool of its own), the owners of pools of its names, the template's nodeSelector, and
    the indexes of the kinds it watches (by watch name)."""

    plan: Plan
    uid: str
    nodes: Mapping[Any, Iterable[dict[str, Any]]]
    gang: GangObservation | None = None
    owners: Mapping[str, PoolOwner] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    indexes: Mapping[str, Mapping[Any, Any]] = field(default_factory=dict)


def pool_slices(i: ObserveInputs) -> list[SliceObservation]:
    """The plan's own pools (plan.pools), each as listed with its nodes; none when nothing was
    listed."""
    if i.gang is None:
        return []
    nodes = i.nodes
    return managed_slices(
        i.plan, i.gang, ready_nodes_by_pool(nodes), i.uid, present_nodes_by_pool(nodes), i.owners
    )


def assemble(
    inputs: ObserveInputs,
    now: datetime,
    jobset: dict[str, Any] | None,
    pods: Iterable[dict[str, Any]],
    provisioner_configured: bool = True,
    offered_error: PoolError | None = None,
    admission: Admission | None = None,
    strays: Mapping[str, PoolState] | None = None,
    blind_since: datetime | None = None,
) -> Observed:
    """One job's observation: its JobSet and pods, and its capacity as its model observes it
    (registry.CapacityPlugin.observe)."""
    plan, nodes = inputs.plan, inputs.nodes
    js = jobset_observation(jobset, (plan.namespace, plan.name), inputs.uid)
    own = {n["name"]: pool.name for pool in plan.pools for n in items(nodes, pool.name)}
    records = pod_records(pods, js, own)
    attempt = js.restarts if js is not None and js.owned else None
    model = REGISTRY.model(plan.mode)
    slices, capacity = model.observe(inputs) if model.observe else ([], None)
    return Observed(
        now=now,
        blind_since=blind_since,
        jobset=js,
        pods=records,
        maintenance=maintenance_observations(plan, nodes, records, attempt),
        slices=slices,
        capacity=capacity,  # the model's own
        provisioner_configured=provisioner_configured,
        offered_error=offered_error,
        strays=dict(strays or {}),
        admission=admission,
    )


__all__ = ["assemble"]
