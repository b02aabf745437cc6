"""The plain data decide() reads and returns: observations, actions, events, the decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common.ownership import Owner
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.settings import Settings

# ---------------------------------------------------------------- observed state


@dataclass(frozen=True)
class SliceObservation:
    """One slice's capacity: its pool in Managed mode, a matching node pool in Existing mode."""

    index: int
    pool: str | None
    pool_state: PoolState = PoolState.ABSENT
    ready_hosts: int = 0
    error: PoolError | None = None
    foreign: bool = False  # a pool with our name but another owner uid (a previous incarnation)
    operation_pending: bool = False
    # Nodes of the pool that exist (Ready or not); None: the same as ready_hosts.
    present_hosts: int | None = None
    # Another live job ("namespace/name") whose pool has our pool's name (a name collision): never
    # deleted by us. `taken_by_older`: that job was created first (or we cannot tell), so this one
    # yields and fails; otherwise this job waits for the younger one to fail and release it.
    taken_by: str | None = None
    taken_by_older: bool = True

    @property
    def hosts_present(self) -> int:
        return self.ready_hosts if self.present_hosts is None else self.present_hosts


@dataclass(frozen=True)
class Termination:
    """What the workload wrote in its termination message (docs/environment.md section 2)."""

    step: int | None = None  # the last step it reached
    checkpoint_step: int | None = None  # the step of its last checkpoint
    reason: str | None = None  # e.g. hang (exit code 75)
    checkpoint_request: tuple[str, int] | None = None  # a checkpoint request served: (id, step)


@dataclass(frozen=True)
class LastExit:
    """The TPU container's previous run in a pod restarted in place, when its program's exit (not
    its agent's) made the kubelet restart the pod's containers."""

    exit_code: int
    reason: str = ""
    termination: Termination | None = None
    at: datetime | None = None  # when it finished


@dataclass(frozen=True)
class Pod:
    """One pod of the job's JobSet (every attempt, every phase): the one record decide() reads.
    Views of it (failures, running per slice, unschedulable, ...) are derived in facts.py."""

    name: str
    slice_index: int | None
    attempt: int = 0  # jobset.sigs.k8s.io/restart-attempt
    phase: str = "Pending"  # Pending | Running | Succeeded | Failed
    ready: bool = False
    deleting: bool = False
    node: str | None = None
    pool: str | None = None  # the node's pool, when it is one of the job's own (Managed)
    exit_code: int | None = None  # of the first container that exited non-zero
    failed_at: datetime | None = None  # when that container finished (its terminated state)
    reason: str = ""
    termination: Termination | None = None
    # The reason of the pod's DisruptionTarget condition (preemption, node shutdown, eviction,
    # PodGC of a vanished node): the failure is a disruption, whatever the exit code.
    disruption: str | None = None
    # PodScheduled=False, reason Unschedulable: since when (else None) and the scheduler's words.
    unschedulable_since: datetime | None = None
    scheduler_message: str = ""
    # A scheduler has looked at it: it has a PodScheduled condition (True or False) or a node.
    # False: Pending with neither, which a scheduler serving its schedulerName never leaves it.
    looked_at: bool = True
    checkpoint_request: str | None = None  # its multislice.dev/checkpoint-request annotation
    checkpoint_saved: tuple[str, int] | None = None  # its checkpoint-saved annotation (id, step)
    last_exit: LastExit | None = None  # restarted in place after its program's exit

    def previous_run(self) -> Pod | None:
        """The failure an in-place restart left of this pod (the pod itself runs again on the
        next attempt): a failed record of the attempt before, as a failed pod would be."""
        e = self.last_exit
        if e is None or self.failed or self.attempt == 0:
            return None
        return replace(
            self,
            attempt=self.attempt - 1,
            phase="Failed",
            ready=False,
            exit_code=e.exit_code,
            failed_at=e.at,
            reason=e.reason,
            termination=e.termination,
            last_exit=None,
        )

    @property
    def failed(self) -> bool:
        return self.phase == "Failed" or (self.exit_code is not None and self.phase != "Succeeded")

    @property
    def running(self) -> bool:
        return self.phase == "Running" and self.ready and not self.deleting

    @property
    def live(self) -> bool:
        """Not finished: what checkpoint requests and the startup deadline look at."""
        return self.phase in ("Pending", "Running")


@dataclass(frozen=True)
class NodeMaintenance:
    """A node of the job with host maintenance announced by GKE (its labels) or by the node
    itself (its conditions MaintenancePlanned, MaintenanceInProgress: Kubernetes 1.37+)."""

    node: str
    pool: str
    slice_index: int | None
    time: datetime | None = None  # scheduled-maintenance-time
    latest: datetime | None = None  # scheduled-maintenance-time-latest
    # active-node-maintenance, the impending-node-termination taint, or MaintenanceInProgress=True
    active: bool = False
    # Condition MaintenancePlanned or MaintenanceInProgress is True: no time, due at once.
    planned: bool = False
    planned_since: datetime | None = None  # the earliest such condition's lastTransitionTime


@dataclass(frozen=True)
class JobSetObservation:
    suspended: bool = False
    # Since when JobSet says its Jobs are suspended (condition Suspended=True); None: not (yet).
    suspended_since: datetime | None = None
    restarts: int = 0
    # status.restartsCountTowardsMax: the restarts JobSet charged to maxRestarts (a disruption's
    # RestartJobSetAndIgnoreMaxRestarts is not).
    restarts_counted: int = 0
    completed: bool = False
    failed: bool = False
    failure_reason: str = ""
    failure_message: str = ""
    ready_jobs: int = 0
    active_jobs: int = 0
    succeeded_jobs: int = 0
    # Whose JobSet of the job's name this is (common/ownership.py): only MINE is this job's; an
    # ORPHAN (an earlier job of this name) is deleted and waited for; a STRANGER is never touched.
    owner: Owner = Owner.MINE
    uid: str = ""
    created: datetime | None = None  # metadata.creationTimestamp
    deleting: bool = False  # being deleted (metadata.deletionTimestamp, or our own delete)
    replicas: int = 0  # spec.replicatedJobs[slice].replicas: the slices it runs (0: unknown)
    # keys.RESTARTS_BEFORE on a JobSet recreated for a resize: `restarts` (and its pods'
    # attempts) and `restarts_counted` include the job's restarts before it.
    restart_base: int = 0
    # Its spec.failurePolicy.restartStrategy (JobSet's default when unset: Recreate): which
    # registered strategies it carries out (restart_strategy.py).
    restart_strategy: str = "Recreate"

    @property
    def owned(self) -> bool:
        return self.owner == Owner.MINE

    @property
    def up(self) -> int:
        """The slices whose Job JobSet counts ready or done (a slice that finished counts)."""
        return self.ready_jobs + self.succeeded_jobs


@dataclass(frozen=True)
class Admission:
    """The apiserver's verdict (JobSet webhook included) on the JobSet this job renders and the
    Job it would make: a server-side dry run before the first pool, or the create itself."""

    refused: str = ""  # the apiserver's message; empty: accepted


@dataclass(frozen=True)
class PreflightObservation:
    """The job's compile Job (spec.preflight; batch/v1, named by names.preflight_job)."""

    name: str
    owned: bool = True  # its controller ownerReference is this job's uid
    generation: int = 0  # the job's spec generation it compiles (its label)
    finished: bool = False  # Complete or Failed
    succeeded: bool = False  # Complete
    exit_code: int | None = None  # of its container, once terminated
    # Its container's termination message: what the command wrote to /dev/termination-log, or
    # (FallbackToLogsOnError) the tail of its log when it failed without writing one.
    message: str = ""
    reason: str = ""  # the Job's Failed condition's reason (DeadlineExceeded, BackoffLimit...)
    deleting: bool = False
    # The shape it compiles when the job has several (provisioning.mode Fallback: a shape's
    # name, "" the job's own; its label); None: the job has one.
    shape: str | None = None


@dataclass(frozen=True)
class JobMeta:
    namespace: str
    name: str
    uid: str
    generation: int
    creation_time: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    deleting: bool = False  # metadata.deletionTimestamp is set
    has_finalizer: bool = False  # our finalizer is on the object


class CheckState:
    """AdmissionCheckState.state values (kueue.x-k8s.io/v1beta2)."""

    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


@dataclass(frozen=True)
class CheckObservation:
    """This operator's AdmissionCheck on a Workload (the CheckState entry)."""

    name: str
    state: str = CheckState.PENDING
    message: str = ""
    retry_count: int = 0


@dataclass(frozen=True)
class WorkloadObservation:
    """The job's Kueue Workload (the job owns it), reduced to what the decision needs."""

    name: str
    resource_version: str = ""
    active: bool = True  # spec.active
    quota_reserved: bool = False  # QuotaReserved=True
    admitted: bool = False  # Admitted=True
    finished: bool = False  # Finished=True
    cluster_queue: str | None = None  # status.admission.clusterQueue (with quota)
    pending_reason: str = ""  # QuotaReserved=False: reason and message
    pending_message: str = ""
    evicted: bool = False  # Evicted=True
    reclaimable: int = 0  # status.reclaimablePods of pod set "slice": pods whose quota is freed
    # Kueue wrote a QuotaReserved condition (True or False): its controller looked at it.
    seen_by_kueue: bool = True
    created: datetime | None = None  # metadata.creationTimestamp
    eviction_reason: str = ""
    eviction_message: str = ""
    eviction_time: datetime | None = None
    preempted_by: str | None = None  # namespace/name of the preemptor's job, when Kueue names it
    check: CheckObservation | None = None  # None: the ClusterQueue lists no check of ours
    # MultiKueue's check on it (an AdmissionCheck with controllerName kueue.x-k8s.io/multikueue);
    # None: none listed.
    multikueue_check: CheckObservation | None = None
    # Kueue listed its ClusterQueue's checks on it (status.admissionChecks not empty).
    checks_listed: bool = False
    # Controlled by this job; False: a prebuilt Workload (MultiKueue's) not adopted yet.
    adopted: bool = True
    # What it asks for when that may change (its label, Plan.quota_key); None: not labelled.
    quota_key: str | None = None


@dataclass(frozen=True)
class QueueObservation:
    """For a job that names a queue: what Kueue says about it."""

    local_queue: str
    watching: bool = True  # the operator watches Kueue's objects (--kueue)
    cluster_queue: str | None = None  # the LocalQueue's spec.clusterQueue, if it exists
    pending_workloads: int | None = None  # the LocalQueue's status.pendingWorkloads
    workload: WorkloadObservation | None = None
    # Read while the job has no Workload yet (label kueue.x-k8s.io/priority-class): the
    # WorkloadPriorityClass's value, or its name when there is no such class.
    priority: int | None = None
    missing_priority_class: str | None = None
    # The GKE cluster this operator provisions in (projects/P/locations/L/clusters/C), if known.
    cluster: str | None = None


@dataclass(frozen=True)
class AdmissionCheckObservation:
    """An AdmissionCheck object whose spec.controllerName is this operator's."""

    name: str
    generation: int = 0
    resource_version: str = ""
    active: bool = False  # its Active condition is True
    observed_generation: int | None = None  # of that condition


@dataclass(frozen=True)
class StrategySupport:
    """Whether this cluster can carry out a restart strategy, and why, as the strategy's own
    check (its `probe`, run by controller/versions.py at start-up and while checks repeat)
    found it: e.g. JobSet's InPlaceRestart with the kubelet's RestartAllContainers action."""

    usable: bool
    why: str


@dataclass
class Observed:
    now: datetime
    slices: list[SliceObservation] = field(default_factory=list)
    jobset: JobSetObservation | None = None  # the JobSet of the job's name, whoever owns it
    pods: list[Pod] = field(default_factory=list)  # of the job's own JobSet, every attempt
    # The accelerator type is not offered where pools would go (None: offered, or not known).
    offered_error: PoolError | None = None
    provisioner_configured: bool = True  # Managed mode needs a GKE cluster configured
    # The capacity model's own observation (its plugin's `observe`: registry.CapacityPlugin),
    # read by that model only.
    capacity: Any = None
    # None: the rendered JobSet was not judged yet for this spec generation.
    admission: Admission | None = None
    # Pools labelled with this job's uid that its plan does not name (any other mode or shape,
    # an older naming): never used, always released. Name -> state.
    strays: dict[str, PoolState] = field(default_factory=dict)
    # The operator could not watch this job from this time until now: it was not running (the
    # previous operator's last heartbeat, on the first pass after an operator restart). Goodput
    # charges that time to the state seen now. None: the operator was watching all along.
    blind_since: datetime | None = None
    queue: QueueObservation | None = None  # only for a job with the queue-name label
    maintenance: list[NodeMaintenance] = field(default_factory=list)  # the job's nodes only
    # The namespace's Pod Security `enforce` level refuses the job's pods (host network): the
    # apiserver's words for it (render/podsecurity.py); None: allowed or not known.
    pod_security: str | None = None
    # The PriorityClass spec.template.spec.priorityClassName names, read before the first pool
    # and found not to exist (the apiserver's Priority admission refuses every pod); None: it
    # exists, none is named, or it is not known.
    missing_priority_class: str | None = None
    # The scheduler spec.template.spec.schedulerName names is known not to run, read before the
    # first pool: why (no scheduler looked at another job's pods naming it within the grace,
    # and none has looked at any pod naming it since); None: it runs, or it is not known.
    scheduler_absent: str | None = None
    # A pod naming that scheduler (another job's, or an earlier attempt's) was looked at within
    # the scheduler grace: it runs, and this job's pods it has not looked at yet are its backlog.
    scheduler_working: bool = False
    # Nodes of the job's slices whose Ready condition says True but whose kubelet was not heard
    # of for the node monitor grace (Lease and status not renewed): not counted Ready. "name
    # (age)" texts, for the status message.
    stale_nodes: tuple[str, ...] = ()
    # Kueue cannot be served (its served API version is not one this operator speaks): why.
    kueue_problem: str | None = None
    # The compile Job of spec.preflight, read while the job holds no capacity; None: none.
    preflight: PreflightObservation | None = None
    # What the restart strategies' own checks (their `probe`) found about this cluster, by
    # strategy name; a strategy not named has no check, or was not checked yet.
    support: Mapping[str, StrategySupport] = field(default_factory=dict)
    # The cluster serves Kubernetes PodGroups (scheduling.k8s.io/v1beta1; controller/versions.py):
    # a JobSet's pods join the job's gang, and its slices claim their pools all or none.
    pod_groups: bool = False


@dataclass(frozen=True)
class DecideConfig:
    """The settings decide() reads; built from Settings (`from_settings`), whose defaults these
    are: one home for each default."""

    backoff_base_seconds: float
    backoff_max_seconds: float
    resync_seconds: float
    not_ready_grace_seconds: float  # a slice NotReady this long (nodes there) is lost
    # A queued job's JobSet without a Kueue Workload after this long: say that none exists.
    kueue_workload_wait_seconds: float
    # A MultiKueue worker that handed a job back tries it again only after this long.
    multikueue_lost_cooldown_seconds: float = 600.0
    # Pods that no scheduler has looked at this long after their creation fail the job.
    scheduler_grace_seconds: float = 60.0

    @classmethod
    def from_settings(cls, s: Settings | None = None, **override: float) -> DecideConfig:
        s = s or Settings()
        values = {
            "backoff_base_seconds": s.backoff_base_seconds,
            "backoff_max_seconds": s.backoff_max_seconds,
            "resync_seconds": s.resync_seconds,
            "not_ready_grace_seconds": s.node_not_ready_grace_seconds,
            "kueue_workload_wait_seconds": s.kueue_workload_wait_seconds,
            "multikueue_lost_cooldown_seconds": s.multikueue_lost_cooldown_seconds,
            "scheduler_grace_seconds": s.scheduler_grace_seconds,
        }
        values.update(override)
        return cls(**values)


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class AddFinalizer:
    """Before any pool exists: deletion must wait until the pools are released."""


@dataclass(frozen=True)
class RemoveFinalizer:
    """Deleting, and every pool is gone: let the job go."""


@dataclass(frozen=True)
class CreatePools:
    slices: tuple[int, ...]


@dataclass(frozen=True)
class DeletePools:
    pools: tuple[str, ...]


@dataclass(frozen=True)
class OwnAction:
    """An action a capacity model or an optional step defines for what it alone makes
    (`OwnAction` subclasses: plugins/dynamic.py's GKE Slices, reconcile/preflight.py's compile
    Job): a model registers its applier with it (registry.CapacityPlugin.appliers). `creates`:
    it makes something, so it is refused on a job that is ending (invariants.py)."""

    creates: ClassVar[bool] = False


@dataclass(frozen=True)
class CreateJobSet:
    """Create the job's JobSet. `slices`: on fewer slices than spec.slices (spec.elastic; None:
    spec.slices); `restarts_before`/`counted_before`: the job's restarts so far (all, and those
    charged to maxRestarts), which a JobSet recreated for a resize continues."""

    slices: int | None = None
    restarts_before: int = 0
    counted_before: int = 0
    # Its failurePolicy.restartStrategy: the job's chosen strategies' (restart_strategy.py).
    restart_strategy: str = "Recreate"
    # Its slices claim their pools as one gang: the job's PodGroup goes first (the cluster serves
    # PodGroups: render/podgroup.py).
    gang: bool = False


@dataclass(frozen=True)
class ValidateJobSet:
    """Ask the apiserver (dry run) whether it accepts the JobSet and its Jobs, before any pool."""

    restart_strategy: str = "Recreate"  # the JobSet judged is the one CreateJobSet renders


@dataclass(frozen=True)
class DeleteJobSet:
    """The job failed for a reason of ours while its JobSet runs: stop its pods (JobSet would
    keep them waiting for released capacity, or, for a spent maxDisruptionRestarts, restart them
    forever: it does not bound RestartJobSetAndIgnoreMaxRestarts). With `uid`: an orphan JobSet
    of an earlier job of this name, deleted only if it is still that object (a precondition).
    `foreground`: deleted in the foreground, so the JobSet stays (deleting) until its Jobs and
    pods are gone and a new one cannot meet them (an elastic job's resize)."""

    uid: str = ""
    foreground: bool = False


@dataclass(frozen=True)
class SetJobSetSuspend:
    suspend: bool


@dataclass(frozen=True)
class SetWorkloadActive:
    """A queued job suspended or resumed: its Workload's spec.active (false: Kueue evicts it and
    frees the quota once the job is stopped, true: it queues again)."""

    workload: str
    active: bool


@dataclass(frozen=True)
class CreateWorkload:
    """A queued job's Kueue Workload, owned by the job (render/kueue_workload.py): its slices'
    and spares' pods, in the job's LocalQueue, at `priority` (its WorkloadPriorityClass's value;
    None: no class named)."""

    priority: int | None = None


@dataclass(frozen=True)
class DeleteWorkload:
    """The job's Workload asks for the quota of what the job no longer tries (a Fallback job
    moved to another option): deleted, which frees any quota it holds, as Kueue's jobframework
    deletes a Workload that no longer matches its job ("Deleted not matching Workload",
    reconciler.go ensureOneWorkload); the next pass creates the option's own. Only that object
    (a resourceVersion precondition)."""

    workload: str
    resource_version: str


@dataclass(frozen=True)
class AdoptWorkload:
    """A prebuilt Workload (MultiKueue made it for this job) becomes the job's: its controller
    owner reference and job-uid label, as Kueue's jobframework does
    (EnsurePrebuiltWorkloadOwnership); its spec is left as MultiKueue wrote it."""

    workload: str
    resource_version: str


@dataclass(frozen=True)
class ReleaseWorkload:
    """The job stopped after Kueue evicted its Workload: unset the quota reservation (Kueue's job
    reconciler does this for a Go job), as of the resourceVersion decided on."""

    workload: str
    resource_version: str


@dataclass(frozen=True)
class ReclaimPods:
    """Pods of the Workload's pod set "slice" whose quota Kueue may free before the job ends:
    the hosts of its succeeded slices (status.reclaimablePods; never lowered: Kueue refuses)."""

    workload: str
    resource_version: str
    count: int


@dataclass(frozen=True)
class FinishWorkload:
    """The job ended: its Workload Finished (Kueue frees the quota)."""

    workload: str
    succeeded: bool
    message: str


@dataclass(frozen=True)
class DeleteJob:
    """The MultisliceJob itself (ttlSecondsAfterFinished)."""


@dataclass(frozen=True)
class AnnotatePods:
    """Set one annotation on these pods of the job (a checkpoint request)."""

    pods: tuple[str, ...]
    key: str
    value: str


@dataclass(frozen=True)
class EvictPods:
    """Evict these pods (Eviction API: the DisruptionTarget condition, so that the JobSet
    restarts every slice without charging maxRestarts)."""

    pods: tuple[str, ...]


@dataclass(frozen=True)
class PodSetUpdate:
    """Applied by Kueue to a pod set's template at admission (AdmissionCheckState.podSetUpdates)."""

    name: str
    node_selector: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SetAdmissionCheckState:
    """Write this operator's check on the Workload, as of the resourceVersion decided on (the
    other checks, retryCount and requeueAfterSeconds are kept as Kueue wrote them)."""

    workload: str
    resource_version: str
    check: str
    state: str
    message: str
    pod_set_updates: tuple[PodSetUpdate, ...] = ()


@dataclass(frozen=True)
class SetAdmissionCheckActive:
    """The AdmissionCheck's Active condition: this operator runs its controllerName."""

    check: str
    resource_version: str
    generation: int
    message: str


Action = (
    AddFinalizer
    | RemoveFinalizer
    | CreatePools
    | DeletePools
    | OwnAction
    | CreateJobSet
    | ValidateJobSet
    | DeleteJobSet
    | SetJobSetSuspend
    | DeleteJob
    | SetAdmissionCheckState
    | SetWorkloadActive
    | CreateWorkload
    | DeleteWorkload
    | ReleaseWorkload
    | AdoptWorkload
    | ReclaimPods
    | FinishWorkload
    | AnnotatePods
    | EvictPods
)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning (reasons.py says which, per reason)
    reason: str
    message: str
    cause: str = ""  # a slice failure's cause (the metric's label); "" for other events


@dataclass
class MetricDeltas:
    """What this decision adds to the operator's counters and histograms, computed in the core
    from the old and new status; the shell only applies them (controller/metrics.py)."""

    restarts: dict[str, int] = field(default_factory=dict)  # cause -> restarts added
    slice_failures: list[tuple[str, str]] = field(default_factory=list)  # (reason label, cause)
    gang_attempts: int = 0
    checkpoint_requests: list[str] = field(default_factory=list)  # sources
    lost_steps: list[int] = field(default_factory=list)
    recovery_seconds: list[int] = field(default_factory=list)
    provisioning_seconds: list[float] = field(default_factory=list)
    time_to_running_seconds: list[float] = field(default_factory=list)


@dataclass
class Decision:
    status: MultisliceJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None  # seconds until the next pass; None: no job left
    metrics: MetricDeltas = field(default_factory=MetricDeltas)
    # Actions the invariant check dropped (invariants.py): a bug, logged by the shell.
    violations: list[str] = field(default_factory=list)
    # Nothing to write this pass: the status is the stored one (the dry-run pass).
    keep_status: bool = False
