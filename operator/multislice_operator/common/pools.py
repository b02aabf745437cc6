"""Node pool states and errors in the core's own words, whoever provides the capacity.

decide() reasons about these; each provisioner maps its cloud's states and answers onto them (the
GKE adapter: PROVISIONING -> CREATING, RUNNING -> READY, RUNNING_WITH_ERROR -> DEGRADED, RECONCILING
-> UPDATING, STOPPING -> DELETING, ERROR -> FAILED). The core never imports an adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PoolState(StrEnum):
    ABSENT = "Absent"  # does not exist
    CREATING = "Creating"
    READY = "Ready"  # its nodes can run pods (once registered)
    DEGRADED = "Degraded"  # running, but the cloud reports an error on it
    UPDATING = "Updating"  # running while the cloud changes it (upgrade, repair)
    DELETING = "Deleting"
    FAILED = "Failed"


# Codes that say the cloud has no capacity for a pool now (it may later): a stockout, quota, a
# specific reservation without the VMs free (the cluster autoscaler's name for it,
# RESERVATION_CAPACITY_EXCEEDED: kubernetes/autoscaler#7319).
CODE_STOCKOUT = "GCE_STOCKOUT"
CODE_QUOTA = "GCE_QUOTA_EXCEEDED"
CODE_RESERVATION_EXHAUSTED = "RESERVATION_CAPACITY_EXCEEDED"
CAPACITY_CODES = (CODE_STOCKOUT, CODE_QUOTA, CODE_RESERVATION_EXHAUSTED)


@dataclass(frozen=True)
class PoolError:
    """A failure of one slice's pool: names the slice, the cloud's code and message."""

    slice_index: int | None
    pool: str
    code: str  # e.g. GCE_STOCKOUT, GCE_QUOTA_EXCEEDED, INVALID_ARGUMENT, PERMISSION_DENIED
    message: str
    permanent: bool  # True: retrying cannot help (bad machine type, permission); fail the job

    def __str__(self) -> str:
        where = f"slice {self.slice_index} " if self.slice_index is not None else ""
        return f"{where}node pool {self.pool}: {self.code}: {self.message}"
