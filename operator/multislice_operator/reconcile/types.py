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


@dataclass(frozen=True)
class PodFailure:
    pod: str
    slice_index: int | None
    exit_code: int | None
    reason: str = ""
    restart_attempt: int = 0
    # From the workload's termination message (contract section 2), when it wrote one.
    step: int | None = None
    checkpoint_step: int | None = None


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
    # The operator could not watch this job from this time until now: it was not running (the
    # previous operator's last heartbeat, on the first pass after an operator restart). Goodput
    # charges that time to the state seen now. None: the operator was watching all along.
    blind_since: datetime | None = None


@dataclass(frozen=True)
class DecideConfig:
    backoff_base_seconds: float = 30.0
    backoff_max_seconds: float = 600.0
    resync_seconds: float = 10.0


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
