"""The reconcile brain: decide() and the plain data it reads and returns (all pure).

Modules: ``types`` (observations, actions, decision), ``context`` (one decision's scratch),
``flow`` (decide: the job's lifecycle), ``capacity`` (gang provisioning, repair, Existing pools),
``running`` (JobSet-driven phases and restarts), ``slices`` (status.slices), ``queue`` (Kueue:
quota first, then the gang, through this operator's AdmissionCheck), ``restarts`` (restarts by
cause, the disruption budget), ``maintenance`` (GKE's announced host maintenance), ``checkpoint``
(checkpoints on demand), ``startup`` (the startup deadline).
"""

from multislice_operator.reconcile.context import at_second, backoff_seconds, set_condition
from multislice_operator.reconcile.flow import decide
from multislice_operator.reconcile.types import (
    Action,
    AddFinalizer,
    AdmissionCheckObservation,
    AnnotatePods,
    CheckObservation,
    CheckState,
    CreateJobSet,
    CreatePools,
    DecideConfig,
    Decision,
    DeleteJob,
    DeleteJobSet,
    DeletePools,
    Event,
    EvictPods,
    JobMeta,
    JobSetObservation,
    NodeMaintenance,
    Observed,
    PodFailure,
    PodObservation,
    PodSetUpdate,
    QueueObservation,
    RemoveFinalizer,
    SetAdmissionCheckActive,
    SetAdmissionCheckState,
    SetJobSetSuspend,
    SliceObservation,
    WorkloadObservation,
)

__all__ = [
    "Action",
    "AddFinalizer",
    "AdmissionCheckObservation",
    "AnnotatePods",
    "CheckObservation",
    "CheckState",
    "CreateJobSet",
    "CreatePools",
    "DecideConfig",
    "Decision",
    "DeleteJob",
    "DeleteJobSet",
    "DeletePools",
    "Event",
    "EvictPods",
    "JobMeta",
    "JobSetObservation",
    "NodeMaintenance",
    "Observed",
    "PodFailure",
    "PodObservation",
    "PodSetUpdate",
    "QueueObservation",
    "RemoveFinalizer",
    "SetAdmissionCheckActive",
    "SetAdmissionCheckState",
    "SetJobSetSuspend",
    "SliceObservation",
    "WorkloadObservation",
    "at_second",
    "backoff_seconds",
    "decide",
    "set_condition",
]
