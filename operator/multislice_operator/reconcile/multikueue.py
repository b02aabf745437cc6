"""MultiKueue: one queue in front of several clusters. Pure, like the rest.

Kueue's MultiKueue (v0.15+, external frameworks, `MultiKueueAdaptersForCustomJobs`) admits a
Workload on a manager cluster and dispatches it to a worker cluster. For a MultisliceJob
(pkg/controller/admissionchecks/multikueue/externalframeworks/adapter.go, v0.19.2):

* on the manager the job says `spec.managedBy: kueue.x-k8s.io/multikueue`; the operator there
  makes its Workload (as for any queued job: the adapter finds the job through the Workload's
  owner) and nothing else: no JobSet, no node pool, no status write, since the adapter copies the
  worker's whole `.status` onto it (`manager`);
* once a worker's copy of the Workload is admitted, the adapter creates the job there without
  managedBy, labelled with that Workload's name (kueue.x-k8s.io/prebuilt-workload-name) and the
  manager's origin: that cluster's operator adopts the Workload instead of making one
  (kueue_gate) and runs the job, its gang provisioned by that cluster's operator in that
  cluster's GKE location;
* the worker's copy comes before the job (the job comes only with admission), so our gang
  check on it cannot wait for the gang: it is Ready at once (`remote_checks`), and a gang that
  cannot be provisioned on that worker (a stockout past spec.provisioning.timeoutSeconds) sets the
  check Retry (`lost`): the worker's Kueue evicts the Workload, the operator there stops the job
  and gives the quota back, and MultiKueue dispatches the job again. The worker that lost it keeps
  its check Pending on the next copy for a while, so another worker takes the job.

At most one cluster runs the job: a worker's copy is deleted by MultiKueue only after the
manager's Workload lost its quota, which a worker eviction causes only once that worker's JobSet
is suspended and its pods gone (kueue_gate.stop).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from multislice_operator.api.models import ConditionType, Phase
from multislice_operator.common import keys
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    Action,
    CheckState,
    CreateWorkload,
    Decision,
    ReleaseWorkload,
    RemoveFinalizer,
    SetAdmissionCheckState,
    WorkloadObservation,
)

MANAGED_BY = keys.MULTIKUEUE_MANAGED_BY
# Kueue's eviction reason when an admission check (MultiKueue's own) said Retry: the worker
# evicted its copy, or MultiKueue lost the worker.
EVICTED_BY_CHECK = "AdmissionCheck"
# The phases in which a worker's copy may hold capacity or run pods (mirrored on the manager).
ACTIVE = (Phase.PROVISIONING, Phase.STARTING, Phase.RUNNING, Phase.RESTARTING)
READY_MESSAGE = (
    "dispatched by MultiKueue: the operator provisions the gang once MultiKueue creates the job "
    "in this cluster"
)


def managed_elsewhere(f: Facts) -> bool:
    """A job on a MultiKueue manager, which a worker cluster runs."""
    return f.spec is not None and f.spec.managed_by == MANAGED_BY


def runs_elsewhere(f: Facts) -> bool:
    """A manager's job MultiKueue may dispatch: its pass is `manager`'s (no JobSet, no pool,
    no status). Not one MultiKueue can never dispatch (`undispatchable`), nor one failed here
    for that: the ordinary verdicts say so and release its quota."""
    if not (managed_elsewhere(f) and f.queue and f.error is None):
        return False
    failed = f.old.condition(ConditionType.FAILED)
    here = failed is not None and failed.reason == Reason.MULTIKUEUE_UNAVAILABLE
    return not here and undispatchable(f) is None


def undispatchable(f: Facts) -> str | None:
    """Why MultiKueue can never dispatch this manager's job: its Workload holds quota in a
    ClusterQueue that lists no MultiKueue admission check (Kueue would admit the job here, where
    nothing runs it, and keep the quota), or MultiKueue rejected it (Kueue deactivates it then).
    None: it may be dispatched, or that is not known yet.

    Kueue lists a ClusterQueue's checks on its Workloads (status.admissionChecks) in one write,
    and a MultiKueue check always (one per flavor leaves the ClusterQueue inactive:
    pkg/cache/scheduler/clusterqueue.go), but possibly only after it reserved quota; it admits
    only once every check is listed and Ready. So a Workload with quota and some check listed, or
    admitted, without MultiKueue's, is in a ClusterQueue without one."""
    if not (managed_elsewhere(f) and f.queue) or f.obs.queue is None:
        return None
    wl = f.obs.queue.workload
    if wl is None or wl.finished:
        return None
    mk = wl.multikueue_check
    if mk is not None and mk.state == CheckState.REJECTED:
        return (
            f"MultiKueue's admission check {mk.name} rejected the Workload: {mk.message}; "
            "nothing dispatches the job to a worker cluster"
        )
    listed = wl.checks_listed or wl.check is not None or wl.admitted
    if mk is not None or not wl.quota_reserved or not listed:
        return None
    cq = wl.cluster_queue or f.obs.queue.cluster_queue or "?"
    return (
        f"spec.managedBy is {MANAGED_BY}, but ClusterQueue {cq} has no MultiKueue admission "
        f"check (an AdmissionCheck with controllerName {keys.MULTIKUEUE_CONTROLLER}): nothing "
        "would dispatch the job to a worker cluster, and Kueue would hold its quota here, where "
        "nothing runs it; the quota is released. Add a MultiKueue admission check to the "
        "ClusterQueue, or remove spec.managedBy to run the job in this cluster, and recreate it"
    )


def from_manager(f: Facts) -> bool:
    """A worker's copy of a job a MultiKueue manager dispatched."""
    return keys.MULTIKUEUE_ORIGIN in f.meta.labels


def prebuilt_name(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """The name of the Workload MultiKueue made for this job: an annotation since Kueue v0.18
    (feature WorkloadIdentifierAnnotations, beta, on by default), a label before; read as
    jobframework.PrebuiltWorkloadNameFor does, annotation first."""
    key = keys.KUEUE_PREBUILT_WORKLOAD
    return annotations.get(key) or labels.get(key) or None


def prebuilt(f: Facts) -> str | None:
    """The Workload made for this job elsewhere (MultiKueue's), which the job adopts."""
    return prebuilt_name(f.meta.labels, f.meta.annotations)


# ---------------------------------------------------------------- the manager


def manager(f: Facts) -> Decision:
    """The manager's pass: the Workload exists (owned by the job), and an evicted one gives its
    quota back once the worker stopped. The status is the worker's: never written here."""
    q = f.obs.queue
    wl = q.workload if q is not None else None
    actions: list[Action] = []
    if f.deleting and f.meta.has_finalizer:  # not added here; one from before is let go
        actions.append(RemoveFinalizer())
    elif f.deleting:
        pass
    elif q is not None and q.watching and wl is None and not q.missing_priority_class:
        if not (f.old.phase and Phase(f.old.phase).terminal):
            actions.append(CreateWorkload(q.priority))
    elif wl is not None and wl.evicted and wl.quota_reserved and _stopped(f, wl.eviction_reason):
        actions.append(ReleaseWorkload(wl.name, wl.resource_version))
    return Decision(f.old, actions, requeue_after=f.cfg.resync_seconds * 3, keep_status=True)


def _stopped(f: Facts, reason: str) -> bool:
    """Whether the evicted job holds nothing on its worker: MultiKueue's own Retry comes after
    the worker evicted its copy (or lost the worker); any other eviction (a preemption on the
    manager) reaches the worker first, whose stop shows in the status copied back."""
    if reason == EVICTED_BY_CHECK:
        return True
    return f.old.phase is None or Phase(f.old.phase) not in ACTIVE


def unqueued(f: Facts) -> str | None:
    """A managed job that names no queue: nothing would ever dispatch it."""
    if managed_elsewhere(f) and not f.queue:
        return (
            f"spec.managedBy is {MANAGED_BY} but the job names no queue: add the label "
            f"{keys.KUEUE_QUEUE_NAME} (a LocalQueue whose ClusterQueue has a MultiKueue "
            "admission check), or remove spec.managedBy to run the job in this cluster"
        )
    return None


# ---------------------------------------------------------------- the worker


def lost(f: Facts, b: Builder, check_name: str | None, rolled_back: str | None) -> bool:
    """A worker's copy whose gang was rolled back: this cluster cannot get the capacity now.
    Our check Retry hands the job back to MultiKueue (which dispatches it again)."""
    wl = f.obs.queue.workload if f.obs.queue is not None else None
    if not from_manager(f) or rolled_back is None or wl is None or check_name is None:
        return False
    if wl.check is None or wl.check.state == CheckState.RETRY:
        return wl.check is not None
    message = (
        f"this cluster could not provision the gang ({rolled_back}): handed back to MultiKueue, "
        "which dispatches the job again"
    )[:1024]
    b.add(SetAdmissionCheckState(wl.name, wl.resource_version, check_name, CheckState.RETRY,
                                 message))  # fmt: skip
    return True


def handed_back(f: Facts, b: Builder, wl: WorkloadObservation) -> str | None:
    """A worker's copy this cluster handed back (our check said Retry, which Kueue counted and
    evicted it for): MultiKueue's to move, so no gang is tried here again for the cooldown
    (--multikueue-lost-cooldown-seconds, from that eviction). Kueue may hand this cluster's quota
    straight back and MultiKueue keep this copy while no other worker admits the job: after the
    cooldown the gang is tried here again, as the copy on another worker would be."""
    if not from_manager(f) or wl.check is None or wl.check.retry_count < 1:
        return None
    last = b.status.queue.last_eviction if b.status.queue is not None else None
    cooldown = f.cfg.multikueue_lost_cooldown_seconds
    if last is None or last.reason != EVICTED_BY_CHECK or last.time is None:
        return None
    left = cooldown - (f.now - last.time).total_seconds()
    if left <= 0:
        return None
    b.requeue_in(left)
    return (
        f"handed back to MultiKueue after this cluster could not provision the gang (admission "
        f"check {wl.check.name} retried {wl.check.retry_count}x): waiting for MultiKueue to "
        f"dispatch the job to another worker; tried here again in {left:.0f}s"
    )


@dataclass(frozen=True)
class RemoteWorkload:
    """A Workload MultiKueue copied to this cluster whose job is not here yet (it comes with
    admission), with our check on it."""

    namespace: str
    name: str
    resource_version: str
    check: str
    state: str
    message: str
    quota_reserved: bool


def remote_checks(
    remotes: Iterable[RemoteWorkload],
    lost_at: Mapping[tuple[str, str], datetime],
    now: datetime,
    cooldown_seconds: float,
) -> list[tuple[str, SetAdmissionCheckState]]:
    """Our check on each remote Workload: Ready at once (the gang comes after the job), unless
    this cluster lost that job within `cooldown_seconds`: then Pending, saying so, so that another
    worker admits it first. (namespace, action) pairs."""
    out: list[tuple[str, SetAdmissionCheckState]] = []
    for r in sorted(remotes, key=lambda r: (r.namespace, r.name)):
        if not r.quota_reserved or r.state not in (CheckState.PENDING, CheckState.READY):
            continue
        since = lost_at.get((r.namespace, r.name))
        held = since is not None and (now - since).total_seconds() < cooldown_seconds
        if held:
            assert since is not None
            ago = int((now - since).total_seconds())
            state, message = (
                CheckState.PENDING,
                (
                    f"this cluster lost this job {ago}s ago (its gang could not be provisioned): "
                    f"left to another worker for up to {cooldown_seconds:.0f}s"
                ),
            )
        else:
            state, message = CheckState.READY, READY_MESSAGE
        said = r.message == message or (held and r.message.startswith("this cluster lost"))
        if r.state == state and said:
            continue
        action = SetAdmissionCheckState(r.name, r.resource_version, r.check, state, message)
        out.append((r.namespace, action))
    return out
