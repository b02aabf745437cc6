"""The provisioning interface: what the reconcile loop needs from whoever makes node pools exist.

The operator observes pools, then decides (pure, in `reconcile`) and asks a Provisioner to act.
Every method is idempotent and safe to repeat after a crash: create of an existing pool adopts it,
delete of a missing pool is success. Methods never block on long cloud operations; they start them
and return, and the next observation shows the progress.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.planning.plan import NodePoolSpec, Plan


@dataclass(frozen=True)
class PoolObservation:
    """What the cloud says about one pool right now."""

    name: str
    slice_index: int | None
    status: PoolState
    node_count: int = 0
    owner_uid: str | None = None  # from the pool's labels; None when absent
    error: PoolError | None = None  # set when the pool (or its create operation) failed
    operation_pending: bool = False  # a create/delete/repair operation is still running
    # The pool gets its nodes when the cloud finds capacity for the whole slice (GKE flex-start,
    # Dynamic Workload Scheduler): READY with fewer nodes than the slice needs is waiting for
    # capacity, not failing; and the nodes go when the run reaches max_run_duration_s.
    waits_for_capacity: bool = False
    max_run_duration_s: int | None = None


@dataclass
class GangObservation:
    """Every pool of one job, by name, plus errors met while looking (transient ones included)."""

    pools: dict[str, PoolObservation] = field(default_factory=dict)
    errors: list[PoolError] = field(default_factory=list)
    # False when the cloud could not be read: the state is unknown, not "every pool absent".
    complete: bool = True


@dataclass(frozen=True)
class ActionResult:
    """Outcome of create/delete calls: errors by pool; transient ones are simply retried later."""

    errors: list[PoolError] = field(default_factory=list)

    @property
    def permanent(self) -> list[PoolError]:
        return [e for e in self.errors if e.permanent]


class Provisioner(Protocol):
    """Makes a plan's node pools exist or not. Implemented by provisioning.gke (Managed)."""

    async def observe_gang(self, plan: Plan, max_age: float = 0.0) -> GangObservation:
        """State of every pool the plan names (ABSENT ones included), from a listing of the
        cloud at most `max_age` seconds old (shared by every job) and asked after this
        provisioner's own last create or delete was answered."""
        ...

    async def create(self, plan: Plan, pools: list[NodePoolSpec], owner_uid: str) -> ActionResult:
        """Start creating these pools concurrently; adopt any that already exist."""
        ...

    async def delete(self, plan: Plan, pool_names: list[str]) -> ActionResult:
        """Start deleting these pools concurrently; missing pools are success."""
        ...

    async def check_offered(self, plan: Plan) -> PoolError | None:
        """A permanent error when the accelerator type is not offered where pools would go."""
        ...

    async def delete_named(self, pool_names: list[str]) -> ActionResult:
        """Delete pools known only by name (orphans found by the garbage collector)."""
        ...

    async def list_owned(self, max_age: float = 0.0) -> list[PoolObservation]:
        """Every pool labelled as created by this operator (for the garbage collector)."""
        ...
