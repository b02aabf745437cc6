"""Capacity: how a job's slices get their nodes, as one interface. Pure.

A `CapacityModel` answers every capacity question of a pass: what "ready", "lost" and "in a
NotReady blip" mean (`slices`, the view facts.derive keeps), what to create and how a lost slice
is replaced (`provide`), what stands before Kueue admits the job (`before_admission`), what of the
job's is present and how it is released (`present`, `release`), and the evidence of the capacity
verdicts (`taken`, `permanent_errors`: verdicts.py words them). One implementation per model:
plugins/nodepools.py (Managed: a GKE node pool per slice, created by the operator, with spares,
flex-start and elastic sizing), plugins/existing.py (Existing: node pools that are there) and
plugins/dynamic.py (DynamicSlicing: GKE Slices over 4x4x4 cubes). What the job holds, for the
goodput, is the model's word too (`chips_held`).
Each model is a plugin (registry.py: plugins/ holds the in-tree ones); `model_of` chooses the
job's once, from its plan's mode; decide() asks `Facts.capacity` and never tests which model it
has. A job without a plan (an invalid spec) has `WITHOUT_PLAN`: no capacity of its own.

Also here: what every model shares (the `Capacity` a pass found, the `Slices` view, a slice's
readiness, releasing the job's strays and a stopped job's pools).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from multislice_operator.api.models import ConditionType, MultisliceJobStatus, Phase
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.planning.plan import DEFAULT_POD_GRACE_SECONDS, Plan
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.types import (
    DecideConfig,
    JobSetObservation,
    Observed,
    SliceObservation,
)
from multislice_operator.registry import REGISTRY

if TYPE_CHECKING:
    from multislice_operator.reconcile.facts import Facts
    from multislice_operator.reconcile.types import Decision

PROVISIONED = ConditionType.PROVISIONED


@dataclass(frozen=True)
class Capacity:
    """What the capacity step found this pass."""

    ready: bool
    phase: Phase | None = None  # the phase of a job that waits for its capacity
    message: str = ""
    rolled_back: str | None = None  # this pass rolled the gang back: why
    repairing: frozenset[int] = frozenset()  # slices whose lost pool is being replaced
    blips: frozenset[int] = frozenset()  # slices NotReady within the grace period
    # Lost pools (`repairing`) whose slices spare pools cover: the job runs meanwhile.
    covered: bool = False
    # The capacity comes once the JobSet's pods ask for it (flex-start: their pending pods make
    # GKE scale the pools up): the JobSet exists while it waits; why it waits.
    with_pods: str | None = None
    # The capacity is there outside the operator (before admission): nothing to provision,
    # the admission check is Ready at once; why.
    preexisting: str | None = None
    # Slices that run on degraded capacity (DynamicSlicing: an ACTIVE_DEGRADED Slice the job
    # keeps running on): their running chip-seconds count as degraded in status.goodput.
    degraded: frozenset[int] = frozenset()

    @property
    def stalled(self) -> bool:
        """A lost slice's pool is being replaced and no spare runs the slice meanwhile."""
        return bool(self.repairing) and not self.covered


NO_CAPACITY = Capacity(False)


@dataclass(frozen=True)
class Size:
    """The slices the job's JobSet should run on now, and why fewer than spec.slices (spec.elastic:
    elastic.py sizes it; every other job runs on spec.slices)."""

    target: int
    full: int
    why: str = ""
    # A loss within waitSeconds: seconds until the job may shrink (a pass is wanted then).
    wait_left: float | None = None

    @property
    def degraded(self) -> bool:
        return self.target < self.full


@dataclass(frozen=True)
class Slices:
    """The slices' capacity, as the lifecycle and the verdicts see it (the model's view)."""

    hosts: int
    ready: frozenset[int] = frozenset()
    # Lost while the gang was up: slice -> why (a repair replaces its pool).
    lost: dict[int, str] = field(default_factory=dict)
    # NotReady with their nodes there, within the grace period (a blip): slice -> seconds.
    blips: dict[int, float] = field(default_factory=dict)
    all_ready: bool = False  # every pool (spares too) ready, or ready but for a blip
    # Flex-start pools up and error-free whose nodes have not come yet: waiting for capacity.
    waiting: frozenset[int] = frozenset()
    up: int = 0  # pools ready or in a blip
    complete: bool = False  # every pool of the plan observed (present or absent)
    # The slices the JobSet runs on: spec.slices, or fewer (spec.elastic, Size.target).
    need: int = 0

    @property
    def enough(self) -> bool:
        """At least `need` pools ready (or in a blip): the JobSet can run; with spec.spares a
        lost pool's slice restarts at once on a spare while the lost pool is replaced."""
        return self.complete and self.up >= self.need


class CapacityModel(Protocol):
    """How a job's slices get their nodes: one implementation per model, chosen once per job
    from its plan (`model_of`)."""

    name: str
    # The job creates capacity that must be released before it goes: the finalizer comes first.
    finalizer_first: bool
    # The apiserver judges the JobSet (a server-side dry run) before the first capacity is made.
    dry_run_first: bool
    # Past the startup deadline, a pool of the job's that no pod got is replaced (startup.py);
    # else every slice restarts.
    replaces_idle_pools: bool

    def slices(self, old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
               now: datetime) -> Slices:  # fmt: skip
        """Which slices are ready, lost, in a NotReady blip or waiting for capacity."""
        ...

    def size(self, plan: Plan, old: MultisliceJobStatus, slices: Slices, obs: Observed,
             js: JobSetObservation | None, now: datetime) -> Size:  # fmt: skip
        """The slices the JobSet should run on now (fewer: spec.elastic, elastic.py)."""
        ...

    def clock_ready(self, slices: Slices) -> bool:
        """The capacity counts as ready for status.capacityReadyTime while the JobSet runs."""
        ...

    def provide(self, f: Facts, b: Builder, started: bool) -> Capacity:
        """What to create this pass, all or none; `started`: the slices were up and the JobSet
        runs on them, so a lost slice is replaced alone."""
        ...

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        """Kueue reserved the quota and waits for our admission check: the gang, all or none."""
        ...

    def held(self, f: Facts, b: Builder, note: Released) -> None:
        """Kueue holds the job (evicted, inadmissible, no quota): what becomes of its capacity."""
        ...

    def present(self, f: Facts) -> list[str]:
        """The pools of the job's own that exist and are not already going away."""
        ...

    def release(self, f: Facts, b: Builder) -> bool:
        """Delete what the job holds; True when nothing is left."""
        ...

    def taken(self, f: Facts) -> list[SliceObservation]:
        """Slices whose pool another, older job holds (verdict PoolNameTaken)."""
        ...

    def permanent_errors(self, f: Facts, started: bool) -> list[PoolError]:
        """Errors retrying cannot fix (verdict ProvisioningFailed), the first one first."""
        ...

    def chips_held(self, f: Facts, b: Builder, plan: Plan, in_use: bool) -> int:
        """The chips of the capacity the job holds after this pass, for status.goodput (goodput.py
        tells the hot spares' apart: those beyond plan.total_chips). What exists and what this
        pass creates (held from now on, as the next pass will see it: no second write); `in_use`:
        the job's JobSet is on its capacity (starting, running, restarting, repairing), when
        capacity the job does not create is held."""
        ...

    def violations(self, f: Facts, d: Decision) -> list[tuple[int, str]]:
        """Its own actions' broken promises (index, why), as invariants.py checks the core's."""
        ...

    def status(self, f: Facts) -> dict[str, Any] | None:
        """Its own part of the status (status.capacity), as of this pass; None: nothing. Keep it
        to what changes with the capacity: a change is a status write."""
        ...

    def ends(self, f: Facts) -> datetime | None:
        """When the capacity the JobSet runs on is taken away, if that is known (flex-start's
        maximum run duration): a checkpoint is asked for ahead of it."""
        ...


# ---------------------------------------------------------------- what every model shares


def slice_ready(s: SliceObservation, hosts: int) -> bool:
    return (
        s.pool_state in (PoolState.READY, PoolState.UPDATING)
        and s.ready_hosts >= hosts
        and not s.foreign
        and not s.taken_by
    )


def stale_note(obs: Observed) -> str:
    """What a waiting message adds for Ready nodes whose kubelet went quiet (not counted)."""
    stale = obs.stale_nodes
    if not stale:
        return ""
    shown = ", ".join(stale[:4]) + (f" and {len(stale) - 4} more" if len(stale) > 4 else "")
    return (
        f"; not counted Ready: {shown}, Ready but their kubelet not heard of since (node Lease "
        "and Ready condition not renewed)"
    )


def live(s: SliceObservation) -> bool:
    """The slice's pool exists and is not already going away."""
    return bool(s.pool) and s.pool_state not in (PoolState.ABSENT, PoolState.DELETING)


def strays(f: Facts) -> list[str]:
    """Pools labelled with the job's uid that no plan of its names: never needed."""
    gone = (PoolState.ABSENT, PoolState.DELETING)
    return [name for name, state in sorted(f.obs.strays.items()) if state not in gone]


def release_pools(f: Facts, b: Builder, slices: list[SliceObservation], names: list[str]) -> bool:
    """Delete `names`; True when none of `slices` (the job's own) and no stray is left."""
    b.delete_pools(names)
    remaining = [s for s in slices if s.pool_state != PoolState.ABSENT and not s.taken_by]
    left = [n for n, state in f.obs.strays.items() if state != PoolState.ABSENT]
    if remaining or left:
        b.requeue_in(f.cfg.resync_seconds / 2)
    return not remaining and not left


class Released(StrEnum):
    """Where a job's pools stand after a releasing pass; the value is said after its message."""

    ALL = ""
    RELEASING = " (releasing node pools)"
    STOPPING = " (stopping the JobSet: its node pools are released once its pods are gone)"


# How long past its grace period a pod of a suspended JobSet may take to go (the Job controller's
# delete, the kubelet's kill): beyond it the pod is stuck (an unreachable node) and holds nothing.
STOP_MARGIN_SECONDS = 30


def stop_wait(f: Facts) -> float | None:
    """Seconds the pools of a job that stops running (Kueue eviction, deactivation,
    spec.suspend) are kept yet: until its JobSet is suspended and no pod of it is left on them;
    None: release them now.

    Kueue's own rule: it takes the quota back only once the JobSet is no longer active
    (jobframework reconciler, step 6). Deleting the pools first would end the pods by node
    shutdown: DisruptionTarget, the Job fails, and JobSet restarts every slice (a restart counted
    for a preemption) instead of the Job's suspension, and the pods would lose their grace period
    (the SIGTERM checkpoint). A pod still there past its grace period is stuck and waited for no
    longer."""
    js = f.js
    on_pools = [p for p in f.live_pods if p.pool is not None]
    if js is None or not on_pools:
        return None
    if not js.suspended or js.suspended_since is None:
        return f.cfg.resync_seconds  # the suspension comes through the watch
    grace = f.plan.pod_grace_seconds if f.plan is not None else DEFAULT_POD_GRACE_SECONDS
    left = grace + STOP_MARGIN_SECONDS - (f.now - js.suspended_since).total_seconds()
    return min(left, f.cfg.resync_seconds) if left > 0 else None


def release_stopped(f: Facts, b: Builder) -> Released:
    """The model's `release` once the job's JobSet is stopped (`stop_wait`)."""
    wait = stop_wait(f)
    if wait is not None:
        b.requeue_in(wait)
        return Released.STOPPING
    return Released.ALL if release(f, b) else Released.RELEASING


def release(f: Facts, b: Builder) -> bool:
    """Delete what the job holds, as its capacity model says; True when nothing is left."""
    return f.capacity.release(f, b)


def pools_present(f: Facts) -> list[str]:
    """The pools of the job's own that exist, as its capacity model says."""
    return f.capacity.present(f)


def model_of(plan: Plan | None) -> CapacityModel:
    """The capacity model of a job's plan (its mode's plugin), or WITHOUT_PLAN. A plan composed
    by another model (plan.composed: Fallback) is that model's, wrapped around its mode's."""
    if plan is None:
        return WITHOUT_PLAN
    own = REGISTRY.model(plan.mode).model
    composer = REGISTRY.model(plan.composed) if plan.composed else None
    if composer is None or composer.wraps is None:
        return own
    return composer.wraps(own)


class HoldsNothing:
    """A model of no capacity of the job's own: only the pools labelled with its uid (strays: an
    earlier spec's) are released. A job without a plan (an invalid spec) has it; a model of
    capacity that is there (plugins/existing.py) builds on it."""

    name = "HoldsNothing"
    finalizer_first = False  # nothing of the job's to release
    dry_run_first = False
    replaces_idle_pools = False  # the pools are not the job's

    def slices(self, old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
               now: datetime) -> Slices:  # fmt: skip
        return Slices(0)

    def size(self, plan: Plan, old: MultisliceJobStatus, slices: Slices, obs: Observed,
             js: JobSetObservation | None, now: datetime) -> Size:  # fmt: skip
        return Size(0, 0)

    def clock_ready(self, slices: Slices) -> bool:
        return False

    def provide(self, f: Facts, b: Builder, started: bool) -> Capacity:
        return NO_CAPACITY

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        return NO_CAPACITY

    def held(self, f: Facts, b: Builder, note: Released) -> None:
        return None  # no pool of the job's: Provisioned says what it said

    def present(self, f: Facts) -> list[str]:
        return []

    def release(self, f: Facts, b: Builder) -> bool:
        """Only the job's strays."""
        return release_pools(f, b, [], strays(f))

    def taken(self, f: Facts) -> list[SliceObservation]:
        return []

    def permanent_errors(self, f: Facts, started: bool) -> list[PoolError]:
        return []

    def chips_held(self, f: Facts, b: Builder, plan: Plan, in_use: bool) -> int:
        return 0

    def violations(self, f: Facts, d: Decision) -> list[tuple[int, str]]:
        return []  # no action of its own

    def status(self, f: Facts) -> dict[str, Any] | None:
        return None

    def ends(self, f: Facts) -> datetime | None:
        return None


WITHOUT_PLAN: CapacityModel = HoldsNothing()
