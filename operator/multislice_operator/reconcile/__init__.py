"""The reconcile brain: decide() and the plain data it reads and returns (all pure).

Modules: ``types`` (observations, actions, decision), ``context`` (one decision's scratch),
``flow`` (decide: the job's lifecycle), ``capacity`` (gang provisioning, repair, Existing pools),
``running`` (JobSet-driven phases and restarts), ``slices`` (status.slices).
"""

from multislice_operator.reconcile.context import at_second, backoff_seconds, set_condition
from multislice_operator.reconcile.flow import decide
from multislice_operator.reconcile.types import (
    Action,
    AddFinalizer,
    Admission,
    CreateJobSet,
    CreatePools,
    DecideConfig,
    Decision,
    DeleteJob,
    DeleteJobSet,
    DeletePools,
    Event,
    JobMeta,
    JobSetObservation,
    Observed,
    PodFailure,
    RemoveFinalizer,
    SetJobSetSuspend,
    SliceObservation,
    UnschedulablePod,
    ValidateJobSet,
)

__all__ = [
    "Action",
    "AddFinalizer",
    "Admission",
    "CreateJobSet",
    "CreatePools",
    "DecideConfig",
    "Decision",
    "DeleteJob",
    "DeleteJobSet",
    "DeletePools",
    "Event",
    "JobMeta",
    "JobSetObservation",
    "Observed",
    "PodFailure",
    "RemoveFinalizer",
    "SetJobSetSuspend",
    "SliceObservation",
    "UnschedulablePod",
    "ValidateJobSet",
    "at_second",
    "backoff_seconds",
    "decide",
    "set_condition",
]
