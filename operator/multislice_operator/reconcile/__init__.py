"""The reconcile brain: decide() and the plain data it reads and returns (all pure).

Modules: ``types`` (observations, actions, decision), ``facts`` (what one pass knows, derived
once), ``verdicts`` (the ordered verdicts that end a pass), ``steps`` (the optional steps a
job's spec selects), ``kueue_gate`` (Kueue: what a queued job may do), ``multikueue``
(MultiKueue: the manager's pass, a worker's lost gang), ``preflight`` (the compile first),
``flow`` (decide: verdicts, then the lifecycle); capacity: ``capacity`` (the
``CapacityModel`` interface: how a job's slices get their nodes, chosen from the registry by
the plan's mode), ``elastic`` (spec.elastic: the slice count); restarts: ``restart_strategy``
(the ``RestartStrategy`` interface and `choose`, each cause's strategy from the registry),
``restarts`` (restarts by cause, the disruption budget), ``running`` (JobSet-driven phases and
restarts); the models and strategies themselves are plugins (multislice_operator/plugins/,
registry.py); ``slices``
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
    CreateWorkload,
    DecideConfig,
    Decision,
    DeleteJob,
    DeleteJobSet,
    DeletePools,
    DeleteWorkload,
    Event,
    EvictPods,
    FinishWorkload,
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
    SliceObservation,
    StrategySupport,
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
    "CreateWorkload",
    "DecideConfig",
    "Decision",
    "DeleteJob",
    "DeleteJobSet",
    "DeletePools",
    "DeleteWorkload",
    "Event",
    "EvictPods",
    "FinishWorkload",
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
    "SliceObservation",
    "StrategySupport",
    "Termination",
    "ValidateJobSet",
    "WorkloadObservation",
    "at_second",
    "backoff_seconds",
    "decide",
    "set_condition",
]
