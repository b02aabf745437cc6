"""The reconcile brain: decide() and the plain data it reads and returns (all pure).

Modules: ``types`` (observations, actions, decision), ``facts`` (what one pass knows, derived
once), ``verdicts`` (the ordered verdicts that end a pass), ``kueue_gate`` (Kueue: what a
queued job may do), ``multikueue`` (MultiKueue: the manager's pass, a worker's lost gang),
``flow`` (decide: verdicts, then the lifecycle); capacity: ``capacity`` (the
``CapacityModel`` interface: how a job's slices get their nodes), ``capacity_models`` (its
registry, one model per provisioning mode), ``capacity_nodepools`` (Managed: a node pool per
slice, gang provisioning, repair, spares, flex-start), ``capacity_existing`` (Existing pools),
``elastic`` (spec.elastic: the slice count); restarts: ``restart_strategy`` (the
``RestartStrategy`` interface and its registry, one per cause), ``restart_recreate`` (JobSet's
own), ``restart_resize`` (the JobSet recreated on a new slice count), ``restarts`` (restarts by
cause, the disruption budget), ``running`` (JobSet-driven phases and restarts); ``slices``
(status.slices), ``maintenance`` (GKE's announced host maintenance), ``checkpoint`` (checkpoints
on demand), ``startup`` (the startup deadline), ``goodput`` (where the time went), ``reasons``
(every reason, its event type and metric), ``invariants`` (the promises every decision keeps),
``deltas`` (metric increments), ``termination`` (the workload's termination message),
``context`` (the decision being built).
"""

from multislice_operator.reconcile.context import at_second, backoff_seconds, set_condition
from multislice_operator.reconcile.flow import decide
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    Action,
    AddFinalizer,
    Admission,
    AdmissionCheckObservation,
    AdoptWorkload,
    AnnotatePods,
    CheckObservation,
    CheckState,
    CreateJobSet,
    CreatePools,
    CreateSlice,
    CreateWorkload,
    CubeObservation,
    DecideConfig,
    Decision,
    DeleteJob,
    DeleteJobSet,
    DeletePools,
    DeleteSlices,
    Event,
    EvictPods,
    FinishWorkload,
    InPlaceSupport,
    JobMeta,
    JobSetObservation,
    MetricDeltas,
    NodeMaintenance,
    Observed,
    Pod,
    PodSetUpdate,
    QueueObservation,
    ReclaimPods,
    ReleaseWorkload,
    RemoveFinalizer,
    SetAdmissionCheckActive,
    SetAdmissionCheckState,
    SetJobSetSuspend,
    SetWorkloadActive,
    SliceObjectObservation,
    SliceObservation,
    Termination,
    ValidateJobSet,
    WorkloadObservation,
)

__all__ = [
    "Action",
    "AddFinalizer",
    "Admission",
    "AdmissionCheckObservation",
    "AdoptWorkload",
    "AnnotatePods",
    "CheckObservation",
    "CheckState",
    "CreateJobSet",
    "CreatePools",
    "CreateSlice",
    "CreateWorkload",
    "CubeObservation",
    "DecideConfig",
    "Decision",
    "DeleteJob",
    "DeleteJobSet",
    "DeletePools",
    "DeleteSlices",
    "Event",
    "EvictPods",
    "FinishWorkload",
    "InPlaceSupport",
    "JobMeta",
    "JobSetObservation",
    "MetricDeltas",
    "NodeMaintenance",
    "Observed",
    "Pod",
    "PodSetUpdate",
    "QueueObservation",
    "Reason",
    "ReclaimPods",
    "ReleaseWorkload",
    "RemoveFinalizer",
    "SetAdmissionCheckActive",
    "SetAdmissionCheckState",
    "SetJobSetSuspend",
    "SetWorkloadActive",
    "SliceObjectObservation",
    "SliceObservation",
    "Termination",
    "ValidateJobSet",
    "WorkloadObservation",
    "at_second",
    "backoff_seconds",
    "decide",
    "set_condition",
]
