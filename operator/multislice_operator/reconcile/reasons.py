"""Every reason the operator gives, in one registry: conditions, events, metrics and the docs
table (docs/failures.md, `make docs`) all read it.

A reason is one CamelCase word. Its `Info` says how it is announced (event type), whether it ends
the job (`terminal`: the reason of the Failed or Completed condition), the slice-failure metric
label it counts under (`multislice_slice_failures_total{reason}`) and the restart cause it is
charged to (`RestartCause`, whose budget the model says: models.BUDGET_OF_CAUSE). Adding a failure
cause means: a line here, a verdict in verdicts.py, and its tests (among them its crash worlds in
tests/unit/test_sticky_verdicts.py, which fails until they are there).

A terminal failure sticks (`Info.sticky`): the shell writes the status before it acts, so a crash
in between (or a refused delete) leaves the Failed status beside a JobSet that still runs and
pools that are still there, and the verdict's evidence may be gone by the next pass (the pod
scheduled after all, the pool error cleared). The operator's own Failed condition (one it wrote:
it carries observedGeneration) with a sticky reason is then believed whatever the world shows:
the JobSet is stopped, the pools go, nothing is created again. A terminal reason that does not
stick says why (`not_sticky`); so does every reason this registry does not know, JobSet's own
(ReachedMaxRestarts, FailedJobs, ...) copied as the Failed condition's reason: a failed JobSet is
its own evidence and stays failed until it is deleted, so a status with it beside a running
JobSet was not derived from that JobSet, and the world wins (StatusIgnored).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from multislice_operator.api.models import BUDGET_OF_CAUSE, Budget, RestartCause

NORMAL, WARNING = "Normal", "Warning"
CAUSE_PROVISIONING = "provisioning"  # a gang rollback: not a restart, no budget


@dataclass(frozen=True)
class Info:
    type: str  # the event type: Normal | Warning
    doc: str
    terminal: bool = False  # ends the job: Failed (Warning) or Completed (Normal)
    condition: str | None = None  # the condition it is a reason of, when not Failed/Completed
    event: bool = True  # posted as an event (besides the phase transition's)
    metric: str | None = None  # multislice_slice_failures_total's `reason` label
    causes: tuple[str, ...] = ()  # the `cause` labels it may carry; the first is the default
    # A terminal reason that does not stick: why (the docs table says it). Empty: it sticks.
    not_sticky: str = ""

    @property
    def sticky(self) -> bool:
        """The job's Failed condition with this reason holds on every later pass, whatever the
        world shows then (its evidence gone, its JobSet still running): the module's docstring."""
        return self.terminal and not self.not_sticky


class Reason(StrEnum):
    # ---- verdicts that end the job (verdicts.py, in the order they are checked)
    INVALID_SPEC = "InvalidSpec"
    JOBSET_CONFLICT = "JobSetConflict"
    COMPLETED = "Completed"
    JOBSET_FAILED = "JobSetFailed"
    ADMISSION_CHECK_REJECTED = "AdmissionCheckRejected"
    MULTIKUEUE_UNAVAILABLE = "MultiKueueUnavailable"
    POD_SECURITY_REFUSED = "PodSecurityRefused"
    PRIORITY_CLASS_NOT_FOUND = "PriorityClassNotFound"
    SCHEDULER_NOT_RUNNING = "SchedulerNotRunning"
    JOBSET_REFUSED = "JobSetRefused"
    PREFLIGHT_FAILED = "PreflightFailed"
    POOL_NAME_TAKEN = "PoolNameTaken"
    PROVISIONING_FAILED = "ProvisioningFailed"
    MAX_DISRUPTION_RESTARTS = "MaxDisruptionRestarts"
    UNSCHEDULABLE = "Unschedulable"
    PODS_NOT_CREATED = "PodsNotCreated"
    # ---- slice failures and restarts
    RESTARTING_ALL_SLICES = "RestartingAllSlices"
    SLICE_LOST = "SliceLost"
    SLICE_FINALIZER_REMOVED = "SliceFinalizerRemoved"
    SLICE_NOT_READY = "SliceNotReady"
    SLICE_READY = "SliceReady"
    GANG_ROLLED_BACK = "GangRolledBack"
    GANG_PROVISIONED = "GangProvisioned"
    FALLBACK_MOVED = "FallbackMoved"
    STARTUP_DEADLINE_EXCEEDED = "StartupDeadlineExceeded"
    SHRINKING_SLICES = "ShrinkingSlices"
    GROWING_SLICES = "GrowingSlices"
    # ---- the job's own memory and the world disagree
    STATUS_IGNORED = "StatusIgnored"
    ORPHAN_JOBSET = "OrphanJobSet"
    # ---- checkpoints and maintenance
    CHECKPOINT_REQUESTED = "CheckpointRequested"
    CHECKPOINT_SAVED = "CheckpointSaved"
    CHECKPOINT_REQUEST_INVALID = "CheckpointRequestInvalid"
    NO_CHECKPOINT = "NoCheckpoint"
    MAINTENANCE_SCHEDULED = "MaintenanceScheduled"
    MAINTENANCE_IN_PROGRESS = "MaintenanceInProgress"
    # ---- Kueue
    PREEMPTED = "Preempted"
    EVICTED = "Evicted"
    NO_KUEUE_WORKLOAD = "NoKueueWorkload"
    KUEUE_UNSUPPORTED = "KueueUnsupported"
    # ---- how the JobSet restarts (restart_strategy.py; condition RestartInPlace)
    IN_PLACE_RESTART = "InPlaceRestart"
    IN_PLACE_UNAVAILABLE = "InPlaceRestartUnavailable"
    # ---- reasons of the other conditions
    VALID = "Valid"
    BATCH_LARGE_ENOUGH = "BatchLargeEnough"
    BATCH_TOO_SMALL = "BatchTooSmall"
    NO_BATCH_HINT = "NoBatchHint"
    EXISTING_NODE_POOLS = "ExistingNodePools"
    WAITING_FOR_NODE_POOLS = "WaitingForNodePools"
    PROVISIONER_NOT_CONFIGURED = "ProvisionerNotConfigured"
    PROVISIONING = "Provisioning"
    GANG_READY = "GangReady"
    GANG_SLICE_FAILED = "GangSliceFailed"
    GANG_TIMEOUT = "GangTimeout"
    REPAIRING = "Repairing"
    REPAIRING_SPARE = "RepairingSpare"
    REPAIRING_DEGRADED = "RepairingDegraded"
    FEWER_SLICES = "FewerSlices"
    ALL_SLICES = "AllSlices"
    QUEUED = "Queued"
    SUSPENDED = "Suspended"
    ALL_SLICES_RUNNING = "AllSlicesRunning"
    SLICES_STARTING = "SlicesStarting"
    NO_MAINTENANCE_SCHEDULED = "NoMaintenanceScheduled"
    ADMITTED = "Admitted"
    WAITING_FOR_WORKLOAD = "WaitingForWorkload"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    GANG_PROVISIONING = "GangProvisioning"
    DEACTIVATED = "Deactivated"
    CHECK_RETRY = "CheckRetry"
    QUOTA_PENDING = "QuotaPending"
    INADMISSIBLE = "Inadmissible"
    REJECTED = "Rejected"
    WAITING_FOR_FLEX_START_CAPACITY = "WaitingForFlexStartCapacity"
    PREFLIGHT_RUNNING = "PreflightRunning"
    PREFLIGHT_PASSED = "PreflightPassed"
    LEAVING_OPTION = "LeavingOption"

    @property
    def info(self) -> Info:
        return REGISTRY[self]

    @property
    def event_type(self) -> str:
        return REGISTRY[self].type


# A pod failure restarts all slices for any cause charged to a budget (not the operator's own
# choice, a resize).
_ALL_CAUSES = tuple(c.value for c in RestartCause if BUDGET_OF_CAUSE[c] != Budget.NONE)

REGISTRY: dict[Reason, Info] = {
    Reason.INVALID_SPEC: Info(
        WARNING,
        "The spec fails validation; the field and the fix are named.",
        terminal=True,
        event=False,
        not_sticky="a fixed spec runs again (Validated=False); while it stays invalid the "
        "verdict is decided again on every pass",
    ),
    Reason.JOBSET_CONFLICT: Info(
        WARNING,
        "A JobSet of the job's name exists that this operator did not make.",
        terminal=True,
        event=False,
    ),
    Reason.COMPLETED: Info(
        NORMAL,
        "Every slice finished.",
        terminal=True,
        event=False,
        not_sticky="a success is believed only while no JobSet of the job runs: a Succeeded "
        "phase written by hand over a running JobSet is recomputed (StatusIgnored)",
    ),
    Reason.JOBSET_FAILED: Info(
        WARNING,
        "The JobSet failed (a non-retryable exit code, or maxRestarts reached); JobSet's own "
        "reason is kept when it gives one.",
        terminal=True,
        event=False,
        not_sticky="the failed JobSet is the evidence and stays failed until deleted; beside a "
        "running JobSet this status (or JobSet's own reason copied) was not derived from it and "
        "is recomputed (StatusIgnored)",
    ),
    Reason.ADMISSION_CHECK_REJECTED: Info(
        WARNING,
        "The operator's Kueue admission check rejected the Workload (a permanent provisioning "
        "error).",
        terminal=True,
        event=False,
    ),
    Reason.MULTIKUEUE_UNAVAILABLE: Info(
        WARNING,
        "A job with spec.managedBy kueue.x-k8s.io/multikueue whose Workload holds quota in a "
        "ClusterQueue without a MultiKueue admission check, or that MultiKueue rejected: nothing "
        "would dispatch it; its quota is released.",
        terminal=True,
        event=False,
    ),
    Reason.POD_SECURITY_REFUSED: Info(
        WARNING,
        "The namespace's Pod Security level refuses the job's host-network pods; found before any "
        "node pool.",
        terminal=True,
        event=False,
    ),
    Reason.PRIORITY_CLASS_NOT_FOUND: Info(
        WARNING,
        "The PriorityClass spec.template.spec.priorityClassName names does not exist, so the "
        "apiserver refuses every pod; found before any node pool.",
        terminal=True,
        event=False,
    ),
    Reason.SCHEDULER_NOT_RUNNING: Info(
        WARNING,
        "No scheduler looked at any pod of the job (no PodScheduled condition) within "
        "--scheduler-grace-seconds of the first one's creation: spec.template.spec.schedulerName "
        "names a scheduler that is not running (one seen at work on another job's pod within "
        "the grace is behind, not absent); before any node pool when it is known not to run.",
        terminal=True,
        event=False,
    ),
    Reason.JOBSET_REFUSED: Info(
        WARNING,
        "The apiserver (JobSet webhook included) refuses the JobSet or its Jobs; found by a dry "
        "run before the first pool.",
        terminal=True,
        event=False,
    ),
    Reason.PREFLIGHT_FAILED: Info(
        WARNING,
        "The compile command of spec.preflight failed (the program does not fit in the TPUs' "
        "HBM, does not compile for their topology, or timed out); found before any node pool, "
        "its message quoted; charged to no restart budget.",
        terminal=True,
        event=False,
    ),
    Reason.POOL_NAME_TAKEN: Info(
        WARNING,
        "A node pool of this job's names belongs to another live job, created first.",
        terminal=True,
        event=False,
    ),
    Reason.PROVISIONING_FAILED: Info(
        WARNING,
        "GKE refuses the node pools for a reason retrying cannot fix (machine type, permission, "
        "type not offered).",
        terminal=True,
        event=False,
    ),
    Reason.MAX_DISRUPTION_RESTARTS: Info(
        WARNING,
        "More restarts for disruptions and startup deadlines than "
        "failurePolicy.maxDisruptionRestarts.",
        terminal=True,
    ),
    Reason.UNSCHEDULABLE: Info(
        WARNING,
        "A pod stayed unschedulable for failurePolicy.unschedulableTimeoutSeconds while every "
        "slice's capacity was ready.",
        terminal=True,
        event=False,
    ),
    Reason.PODS_NOT_CREATED: Info(
        WARNING,
        "No pod of a slice was created within failurePolicy.unschedulableTimeoutSeconds of its "
        "capacity (Pod Security, quota, a pod webhook).",
        terminal=True,
        event=False,
    ),
    Reason.RESTARTING_ALL_SLICES: Info(
        WARNING,
        "The JobSet restarts every slice; the cause and the budget charged are named.",
        metric="pod_failure",
        causes=_ALL_CAUSES,
    ),
    Reason.SLICE_LOST: Info(
        WARNING,
        "A running slice lost its node pool or nodes; its pool is replaced alone.",
        metric="capacity_lost",
        causes=(RestartCause.DISRUPTION.value,),
    ),
    Reason.SLICE_FINALIZER_REMOVED: Info(
        WARNING,
        "A GKE Slice the job deleted was still there past "
        "dynamicSlicing.sliceDeletionTimeoutSeconds (stuck in DEACTIVATING): its finalizer was "
        "removed, as GKE's guide deletes a Slice.",
    ),
    Reason.SHRINKING_SLICES: Info(
        WARNING,
        "spec.elastic: a lost slice's pool was not back within waitSeconds (or GKE answered "
        "stockout or quota): the JobSet is recreated on fewer slices.",
    ),
    Reason.GROWING_SLICES: Info(
        NORMAL,
        "spec.elastic: pools for more slices are Ready again: after a checkpoint on demand the "
        "JobSet is recreated on more slices.",
    ),
    Reason.SLICE_NOT_READY: Info(
        WARNING,
        "A slice's nodes are there but NotReady; replaced after --node-not-ready-grace-seconds.",
    ),
    Reason.SLICE_READY: Info(NORMAL, "A NotReady slice is Ready again; nothing was replaced."),
    Reason.GANG_ROLLED_BACK: Info(
        WARNING,
        "A stockout, quota error or timeout on one slice: every pool of the gang is deleted and "
        "retried with backoff.",
        metric="gang_rollback",
        causes=(CAUSE_PROVISIONING,),
    ),
    Reason.GANG_PROVISIONED: Info(NORMAL, "Every node pool of the gang is running and ready."),
    Reason.FALLBACK_MOVED: Info(
        WARNING,
        "provisioning.mode Fallback: the option tried is left (stockout, quota, an exhausted "
        "reservation, its trySeconds, or its shape refused by the compiler) for the next one; "
        "both are named.",
        metric="fallback_move",
        causes=(CAUSE_PROVISIONING,),
    ),
    Reason.STARTUP_DEADLINE_EXCEEDED: Info(
        WARNING,
        "Not every pod runs failurePolicy.startupTimeoutSeconds after the capacity was ready: a "
        "pool is replaced or all slices restart (cause startup).",
        metric="startup_deadline",
        causes=(RestartCause.STARTUP.value,),
    ),
    Reason.STATUS_IGNORED: Info(
        WARNING,
        "status.phase was terminal but the JobSet still runs: the phase is recomputed from the "
        "world.",
    ),
    Reason.ORPHAN_JOBSET: Info(
        WARNING,
        "A JobSet of this job's name belongs to an earlier job of the same name: it is deleted and"
        " waited for, never adopted.",
    ),
    Reason.CHECKPOINT_REQUESTED: Info(
        NORMAL,
        "A checkpoint was requested on demand (a user's annotation or ahead of maintenance).",
    ),
    Reason.CHECKPOINT_SAVED: Info(NORMAL, "The workload saved the requested checkpoint."),
    Reason.CHECKPOINT_REQUEST_INVALID: Info(
        WARNING, "The job's checkpoint-request annotation is not a valid id."
    ),
    Reason.NO_CHECKPOINT: Info(
        WARNING, "The job has no persistent checkpoint: every restart starts from step 0."
    ),
    Reason.MAINTENANCE_SCHEDULED: Info(
        WARNING, "GKE or the node announced host maintenance on a node of the job."
    ),
    Reason.MAINTENANCE_IN_PROGRESS: Info(WARNING, "Host maintenance runs on a node of the job."),
    Reason.PREEMPTED: Info(
        WARNING, "Kueue preempted the job's Workload; its pools are released and it queues again."
    ),
    Reason.EVICTED: Info(
        WARNING, "Kueue evicted the job's Workload; its pools are released and it queues again."
    ),
    Reason.NO_KUEUE_WORKLOAD: Info(
        WARNING,
        "The job names a queue but its Kueue Workload cannot be made (the operator does not "
        "watch Kueue, or the WorkloadPriorityClass it names does not exist).",
    ),
    Reason.KUEUE_UNSUPPORTED: Info(
        WARNING, "The cluster's Kueue serves no API version this operator speaks."
    ),
    # A fact about the cluster, not about the job: the operator logs it once and exports it
    # (its log); each job holds it in its condition, not in an event (57).
    Reason.IN_PLACE_UNAVAILABLE: Info(
        NORMAL,
        "The cluster cannot restart pods in place (JobSet >= v0.11 with its InPlaceRestart "
        "gate, Kubernetes >= 1.35): every restart recreates the pods (docs/restarts.md).",
        event=False,
    ),
}

_CONDITION_REASONS = {
    Reason.VALID: ("Validated", "The spec is valid: slices x accelerator."),
    Reason.BATCH_LARGE_ENOUGH: ("DCNBound", "training.globalBatchTokens is large enough for DCN."),
    Reason.BATCH_TOO_SMALL: (
        "DCNBound",
        "The per-slice batch is too small: DCN-bound (docs/dcn-advisor.md).",
    ),
    Reason.NO_BATCH_HINT: ("DCNBound", "No training.globalBatchTokens: the advisor cannot tell."),
    Reason.EXISTING_NODE_POOLS: (
        "Provisioned",
        "Existing mode: enough matching node pools are Ready.",
    ),
    Reason.WAITING_FOR_NODE_POOLS: (
        "Provisioned",
        "Existing mode: waiting for matching node pools.",
    ),
    Reason.PROVISIONER_NOT_CONFIGURED: (
        "Provisioned",
        "Managed mode without a GKE cluster configured.",
    ),
    Reason.PROVISIONING: ("Provisioned", "The gang's node pools are being created."),
    Reason.GANG_READY: ("Provisioned", "Every node pool of the gang is ready."),
    Reason.GANG_SLICE_FAILED: (
        "Provisioned",
        "A slice's pool failed (stockout, quota): the gang was rolled back.",
    ),
    Reason.GANG_TIMEOUT: (
        "Provisioned",
        "Not every pool was ready within provisioning.timeoutSeconds: rolled back.",
    ),
    Reason.REPAIRING: ("Provisioned", "A lost slice's pool is being replaced."),
    Reason.REPAIRING_SPARE: (
        "Provisioned",
        "A lost pool is replaced while a spare (spec.spares) runs its slice.",
    ),
    Reason.REPAIRING_DEGRADED: (
        "Provisioned",
        "spec.elastic: the job runs on fewer slices while the lost pools are replaced.",
    ),
    Reason.FEWER_SLICES: ("Degraded", "spec.elastic: the job runs on fewer than spec.slices."),
    Reason.ALL_SLICES: ("Degraded", "spec.elastic: the job runs on all spec.slices."),
    Reason.QUEUED: ("Provisioned", "Kueue reserved no quota: no node pools."),
    Reason.SUSPENDED: ("Provisioned", "spec.suspend: capacity released (also SlicesReady)."),
    Reason.ALL_SLICES_RUNNING: ("SlicesReady", "Every slice runs."),
    Reason.SLICES_STARTING: ("SlicesReady", "Not every slice runs yet."),
    Reason.NO_MAINTENANCE_SCHEDULED: (
        "MaintenanceScheduled",
        "No node announces maintenance any more.",
    ),
    Reason.ADMITTED: ("Admitted", "Kueue admitted the job."),
    Reason.WAITING_FOR_WORKLOAD: ("Admitted", "The operator creates the job's Kueue Workload."),
    Reason.WAITING_FOR_ADMISSION: (
        "Admitted",
        "Quota (and capacity) ready: Kueue admits the Workload, then the JobSet is resumed.",
    ),
    Reason.GANG_PROVISIONING: (
        "Admitted",
        "Quota reserved: the operator provisions the gang (check Pending).",
    ),
    Reason.DEACTIVATED: ("Admitted", "Kueue's Workload is deactivated (spec.active: false)."),
    Reason.CHECK_RETRY: ("Admitted", "The admission check is Retry: Kueue takes the quota back."),
    Reason.QUOTA_PENDING: ("Admitted", "Waiting in the queue for quota."),
    Reason.INADMISSIBLE: (
        "Admitted",
        "Kueue cannot admit the Workload (e.g. no such ClusterQueue).",
    ),
    Reason.REJECTED: ("Admitted", "The admission check rejected the Workload."),
    Reason.IN_PLACE_RESTART: (
        "RestartInPlace",
        "The program's failures, hangs and asked restarts restart the pods in place.",
    ),
    Reason.WAITING_FOR_FLEX_START_CAPACITY: (
        "Provisioned",
        "Flex-start pools wait for capacity (Dynamic Workload Scheduler): not a failure, no "
        "rollback or timeout while they wait.",
    ),
    Reason.PREFLIGHT_RUNNING: (
        "Provisioned",
        "The compile command of spec.preflight runs as a CPU Job; no node pool until it passes.",
    ),
    Reason.LEAVING_OPTION: (
        "Provisioned",
        "provisioning.mode Fallback: the option tried is rolled back; its capacity is released, "
        "then the next option is tried.",
    ),
}
for _reason, (_condition, _doc) in _CONDITION_REASONS.items():
    REGISTRY[_reason] = Info(NORMAL, _doc, condition=_condition, event=False)
# Reasons that are both an event and another condition's reason.
for _reason, _condition in (
    (Reason.MAINTENANCE_SCHEDULED, "MaintenanceScheduled"),
    (Reason.MAINTENANCE_IN_PROGRESS, "MaintenanceScheduled"),
    (Reason.NO_KUEUE_WORKLOAD, "Admitted"),
    (Reason.KUEUE_UNSUPPORTED, "Admitted"),
    (Reason.MULTIKUEUE_UNAVAILABLE, "Admitted"),
    (Reason.IN_PLACE_UNAVAILABLE, "RestartInPlace"),
    (Reason.PREEMPTED, "Admitted"),
    (Reason.EVICTED, "Admitted"),
    (Reason.POOL_NAME_TAKEN, "Provisioned"),
    (Reason.PROVISIONING_FAILED, "Provisioned"),
):
    REGISTRY[_reason] = dataclasses.replace(REGISTRY[_reason], condition=_condition)

REGISTRY[Reason.PREFLIGHT_PASSED] = Info(
    NORMAL,
    "The compile command of spec.preflight passed: the program fits (HBM per device in "
    "status.preflight); the node pools are created next.",
)

SLICE_FAILURE_REASONS = {r: i for r, i in REGISTRY.items() if i.metric is not None}


def metric_of(reason: str, cause: str) -> tuple[str, str] | None:
    """The slice-failure metric's (reason, cause) labels for an event, or None."""
    try:
        info = REGISTRY[Reason(reason)]
    except ValueError:
        return None
    if info.metric is None:
        return None
    return info.metric, cause if cause in info.causes else info.causes[0]


def sticky(reason: str) -> bool:
    """A Failed condition with this reason sticks (`Info.sticky`); a reason the registry does not
    know (JobSet's own, copied; one written by hand) does not."""
    try:
        return REGISTRY[Reason(reason)].sticky
    except ValueError:
        return False


def _sticks(info: Info) -> str:
    """The docs table's Sticks column: for terminal reasons only."""
    if not info.terminal:
        return ""
    return "yes" if info.sticky else f"no: {info.not_sticky}"


def table() -> str:
    """The reasons table of docs/failures.md (`make docs`; tests keep it fresh)."""
    rows = [
        "| Reason | Where | Event type | Metric (cause) | Sticks | Meaning |",
        "|---|---|---|---|---|---|",
    ]
    for reason in Reason:
        info = REGISTRY[reason]
        where = [info.condition] if info.condition else []
        if info.terminal:
            where.insert(0, "Completed" if reason == Reason.COMPLETED else "Failed")
        if info.event:
            where.append("event")
        metric = f"`{info.metric}` ({', '.join(info.causes)})" if info.metric else ""
        rows.append(
            f"| `{reason.value}` | {', '.join(where)} | {info.type} | {metric} "
            f"| {_sticks(info)} | {info.doc} |"
        )
    return "\n".join(rows) + "\n"


def write_table(path: str) -> None:
    """`make docs`: rewrite the reasons table in docs/failures.md."""
    import re
    from pathlib import Path

    file = Path(path)
    begin, end = "(make docs) -->\n", "<!-- end of reasons table -->"
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    text = file.read_text()
    if not pattern.search(text):
        raise SystemExit(f"{path}: no reasons table markers")
    file.write_text(pattern.sub(lambda _: begin + table() + end, text))
