"""The plain data decide() reads and returns: observations, actions, events, the decision."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.provisioning.base import PoolError, PoolState

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
class PodFailure:
    pod: str
    slice_index: int | None
    exit_code: int | None
    reason: str = ""
    restart_attempt: int = 0


@dataclass(frozen=True)
class JobSetObservation:
    suspended: bool = False
    restarts: int = 0
    completed: bool = False
    failed: bool = False
    failure_reason: str = ""
    failure_message: str = ""
    ready_jobs: int = 0
    active_jobs: int = 0
    succeeded_jobs: int = 0
    owned: bool = True  # labelled/owned by this job; a stranger of the same name is not touched
    deleting: bool = False  # being deleted (metadata.deletionTimestamp, or our own delete)


@dataclass(frozen=True)
class Admission:
    """The apiserver's verdict (JobSet webhook included) on the JobSet this job renders and the
    Job it would make: a server-side dry run before the first pool, or the create itself."""

    refused: str = ""  # the apiserver's message; empty: accepted


@dataclass(frozen=True)
class UnschedulablePod:
    """A pod of the current attempt the scheduler cannot place (PodScheduled False)."""

    pod: str
    slice_index: int | None
    since: datetime  # the condition's lastTransitionTime (else the pod's creation)
    message: str  # the scheduler's own words


@dataclass(frozen=True)
class JobMeta:
    namespace: str
    name: str
    uid: str
    generation: int
    creation_time: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    deleting: bool = False  # metadata.deletionTimestamp is set
    has_finalizer: bool = False  # our finalizer is on the object


@dataclass
class Observed:
    now: datetime
    slices: list[SliceObservation] = field(default_factory=list)
    jobset: JobSetObservation | None = None
    pod_failures: list[PodFailure] = field(default_factory=list)
    running_pods: dict[int, int] = field(default_factory=dict)  # slice index -> running pods
    succeeded_pods: dict[int, int] = field(default_factory=dict)
    # The accelerator type is not offered where pools would go (None: offered, or not known).
    offered_error: PoolError | None = None
    provisioner_configured: bool = True  # Managed mode needs a GKE cluster configured
    existing_pools_found: int = 0  # Existing mode: matching pools seen, ready or not
    # None: the rendered JobSet was not judged yet for this spec generation.
    admission: Admission | None = None
    unschedulable: list[UnschedulablePod] = field(default_factory=list)
    # Pods of the current attempt per slice index, in any phase (None: not observed).
    pods_by_slice: dict[int, int] | None = None
    # Pools labelled with this job's uid that its plan does not name (any other mode or shape,
    # an older naming): never used, always released. Name -> state.
    strays: dict[str, PoolState] = field(default_factory=dict)


@dataclass(frozen=True)
class DecideConfig:
    backoff_base_seconds: float = 30.0
    backoff_max_seconds: float = 600.0
    resync_seconds: float = 10.0
    not_ready_grace_seconds: float = 300.0  # a slice NotReady this long (nodes there) is lost


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
class CreateJobSet:
    pass


@dataclass(frozen=True)
class ValidateJobSet:
    """Ask the apiserver (dry run) whether it accepts the JobSet and its Jobs, before any pool."""


@dataclass(frozen=True)
class DeleteJobSet:
    """The job failed for a reason of ours while its JobSet runs: stop its pods."""


@dataclass(frozen=True)
class SetJobSetSuspend:
    suspend: bool


@dataclass(frozen=True)
class DeleteJob:
    """The MultisliceJob itself (ttlSecondsAfterFinished)."""


Action = (
    AddFinalizer
    | RemoveFinalizer
    | CreatePools
    | DeletePools
    | CreateJobSet
    | ValidateJobSet
    | DeleteJobSet
    | SetJobSetSuspend
    | DeleteJob
)


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Decision:
    status: MultisliceJobStatus
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
