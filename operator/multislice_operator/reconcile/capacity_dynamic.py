"""Capacity model `DynamicSlices` (spec.provisioning.mode DynamicSlicing): GKE `Slice` objects
over Ironwood 4x4x4 cubes. Pure.

Capacity comes as cubes (reservation sub-blocks, one node pool of 16 tpu7x VMs each): the
operator creates the job's cube pools (dynamicSlicing.cubes Managed) or uses the cubes that are
there (Existing), then forms one `Slice` (accelerator.gke.io/v1beta1) per slice of the job from
healthy free cubes, all or none: the JobSet is created once every Slice is ACTIVE. A Slice that
goes ACTIVE_DEGRADED, FAILED or SliceCreationFailed is a lost slice: it is deleted (its unhealthy
cube is not used again: only HEALTHY cubes are) and formed again from free healthy cubes (the
spare cubes, spec.spares), and the running slices are restarted (their pods evicted: JobSet
restarts every slice, charged as a disruption). Everything is released when the job ends.
Before the JobSet exists the Slices are a gang as node pools are: Slices not all ACTIVE within
spec.provisioning.timeoutSeconds are rolled back (the Slices and the job's cube pools deleted, never
held for a job that cannot run) and the next attempt waits out a backoff.

Sources: GKE "Use dynamic slicing with a custom scheduler" (create Slices, watch their state,
delete them), https://docs.cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices;
the Slice reference (states), https://docs.cloud.google.com/kubernetes-engine/docs/reference/crds/slice;
docs/dynamic-slicing-contract.md of the simulator. xpk's slice controller (slice-main, slice/)
evicts and requeues a whole workload on any failed slice; this model re-forms only the lost one.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from multislice_operator.api.models import CubeSource, MultisliceJobStatus, Phase
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.planning import cubes
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.capacity import (
    PROVISIONED,
    Capacity,
    Released,
    Slices,
    live,
    release_pools,
    strays,
)
from multislice_operator.reconcile.capacity_nodepools import (
    NO_PROVISIONER,
    NODE_POOLS,
    create_absent,
    retry_message,
    roll_back,
)
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.elastic import Size
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    CreateSlice,
    CubeObservation,
    DecideConfig,
    DeleteSlices,
    EvictPods,
    JobSetObservation,
    Observed,
    SliceObjectObservation,
    SliceObservation,
)

if TYPE_CHECKING:
    from multislice_operator.reconcile.facts import Facts

ACTIVE = "ACTIVE"
# States of a formed or forming Slice that make it a lost slice (the Slice reference; xpk's
# controller counts FAILED and SliceCreationFailed as errors; ACTIVE_DEGRADED runs on a degraded
# cube, which the issue counts as lost: the job is moved to healthy cubes).
BROKEN = frozenset({"ACTIVE_DEGRADED", "FAILED", "SliceCreationFailed"})
HEALTHY = "HEALTHY"  # cloud.google.com/gke-tpu-partition-4x4x4-state
UNHEALTHY = "UNHEALTHY"


class DynamicSlices:
    """GKE Slices over 4x4x4 cubes (DynamicSlicing)."""

    name = "DynamicSlices"
    finalizer_first = True  # Slices (and cube pools) must be released before the job goes
    dry_run_first = True  # the JobSet is judged before cubes are paid for

    def slices(self, old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
               now: datetime) -> Slices:  # fmt: skip
        """Slice i is ready when its Slice is ACTIVE, lost when it is broken."""
        current = _current(obs)
        ready = frozenset(i for i, o in current.items() if o.state == ACTIVE)
        lost = {o.index: f"Slice {o.name} {o.state}" for o in _broken(obs)}
        free = len(_free(obs, plan))
        return Slices(
            plan.shape.hosts,
            ready,
            lost,
            all_ready=len(ready) >= plan.slices and free >= plan.spares,
            up=len(ready),
            complete=True,
            need=plan.slices,
        )

    def size(self, plan: Plan, old: MultisliceJobStatus, slices: Slices, obs: Observed,
             js: JobSetObservation | None, now: datetime) -> Size:  # fmt: skip
        return Size(plan.slices, plan.slices)  # spec.elastic is Managed only

    def clock_ready(self, slices: Slices) -> bool:
        return slices.enough

    def provide(self, f: Facts, b: Builder, started: bool) -> Capacity:
        assert f.plan is not None
        plan = f.plan
        if _managed_cubes(plan) and not f.obs.provisioner_configured:
            b.cond(PROVISIONED, "False", Reason.PROVISIONER_NOT_CONFIGURED, NO_PROVISIONER)
            b.requeue_in(f.cfg.resync_seconds * 3)
            return Capacity(False, Phase.PENDING, NO_PROVISIONER)
        if not started:
            gang = _gang_clock(f, b, plan)
            if gang is not None:
                return gang
        _create_cubes(f, b, plan)
        broken = _broken(f.obs)
        if broken:
            b.add(DeleteSlices(tuple(o.name for o in broken)))
        formed = _form(f, b, plan)
        lost = frozenset(f.slices.lost)
        if started and lost:
            _restart(f, b, plan, lost, formed)
        capacity = _report(f, b, plan, started, lost, formed)
        if not started:
            _attempt(f, b, capacity.ready)
        return capacity

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        return self.provide(f, b, started=False)

    def held(self, f: Facts, b: Builder, note: Released) -> None:
        NODE_POOLS.held(f, b, note)

    def present(self, f: Facts) -> list[str]:
        """The job's Slices and cube pools that exist and are not already going away."""
        pools = [str(s.pool) for s in f.obs.slices if live(s) and not s.taken_by]
        names = [o.name for o in f.obs.slice_objects if not o.deleting]
        return names + pools + strays(f)

    def release(self, f: Facts, b: Builder) -> bool:
        """The Slices first, then the cubes the job created (Existing cubes stay)."""
        names = tuple(o.name for o in f.obs.slice_objects if not o.deleting)
        if names:
            b.add(DeleteSlices(names))
        pools = [str(s.pool) for s in f.obs.slices if live(s) and not s.taken_by]
        done = release_pools(f, b, list(f.obs.slices), pools + strays(f))
        if f.obs.slice_objects:
            b.requeue_in(f.cfg.resync_seconds / 2)
        return done and not f.obs.slice_objects

    def taken(self, f: Facts) -> list[SliceObservation]:
        return [s for s in f.obs.slices if s.taken_by and s.taken_by_older]

    def permanent_errors(self, f: Facts, started: bool) -> list[PoolError]:
        return [s.error for s in f.obs.slices if s.error and s.error.permanent]

    def chips_held(self, f: Facts, b: Builder, plan: Plan, in_use: bool) -> int:
        """Whole 4x4x4 cubes. Managed cubes: every cube pool of the job's that exists or that
        this pass creates, spare cubes included (held and billed whether or not a Slice uses
        them). Existing cubes are not the job's: it holds those its Slices hold, from the pass
        that creates a Slice until the Slice is gone (no other Slice may use them meanwhile); a
        free healthy cube it could re-form on is anyone's and not charged."""
        cube = cubes.cube_shape(plan.shape.generation)
        assert cube is not None  # DynamicSlicing is validated to be on a generation of cubes
        if _managed_cubes(plan):
            return NODE_POOLS.pools_held(f, b) * cube.chips
        held = {p for o in f.obs.slice_objects for p in o.partitions}
        held |= {p for a in b.actions if isinstance(a, CreateSlice) for p in a.partitions}
        return len(held) * cube.chips


# ---------------------------------------------------------------- the gang: all or none, in time


def _gang_clock(f: Facts, b: Builder, plan: Plan) -> Capacity | None:
    """Before the JobSet: an attempt's backoff is waited out with nothing held, and an attempt
    whose Slices are not all ACTIVE within spec.provisioning.timeoutSeconds is rolled back."""
    next_at = f.old.next_attempt_time
    if next_at is not None and f.now < next_at:
        DYNAMIC_SLICES.release(f, b)
        b.requeue_in((next_at - f.now).total_seconds())
        return Capacity(False, Phase.PROVISIONING, retry_message(b))
    started = f.old.attempt_start_time
    timeout = f.spec.provisioning.timeout_seconds if f.spec else 0
    if started is None or (f.now - started).total_seconds() <= timeout:
        return None
    active = sum(1 for o in _current(f.obs).values() if o.state == ACTIVE)
    if active >= plan.slices:
        return None
    return _rollback(f, b, plan, f"{active}/{plan.slices} Slices ACTIVE within "
                     f"spec.provisioning.timeoutSeconds ({timeout}s)")  # fmt: skip


def _attempt(f: Facts, b: Builder, ready: bool) -> None:
    """The attempt's clock: it starts at the first pass that is not ready, stops when ready."""
    if ready:
        b.status.attempt_start_time = None
        b.status.next_attempt_time = None
    elif f.old.attempt_start_time is None:
        b.status.attempt_start_time = f.now
        b.status.provisioning_attempts = (f.old.provisioning_attempts or 0) + 1
        b.status.next_attempt_time = None


def _rollback(f: Facts, b: Builder, plan: Plan, why: str) -> Capacity:
    """Everything the attempt made goes (Existing cubes stay); the next waits out a backoff."""
    made = "the Slices and cube pools" if _managed_cubes(plan) else "the Slices"
    full = f"{why}; deleting {made} of the gang"
    return roll_back(f, b, DYNAMIC_SLICES.release, Reason.GANG_TIMEOUT, full)


# ---------------------------------------------------------------- cubes and Slices


def _managed_cubes(plan: Plan) -> bool:
    return plan.cubes_source == CubeSource.MANAGED.value


def _create_cubes(f: Facts, b: Builder, plan: Plan) -> None:
    """Managed cubes: every cube pool of the plan that is absent is created (incrementally: a
    cube pool is one sub-block, created on its own), a failed one deleted to be made again, and
    so is one on an unhealthy cube while the spares are short (`_replaced`)."""
    if not _managed_cubes(plan):
        return
    b.delete_pools(str(s.pool) for s in f.obs.slices if s.pool_state == PoolState.FAILED)
    b.delete_pools(_replaced(f.obs, plan))
    create_absent(f, b)


def _replaced(obs: Observed, plan: Plan) -> list[str]:
    """The job's cube pools on an UNHEALTHY cube ("cannot be used", GKE's partition state) that
    no Slice holds, while fewer healthy cubes are free than spec.spares: deleted, to be made again
    on a healthy sub-block of the block (GKE places a pool on a free sub-block), so that after a
    spare took a failed cube's place the job has its spares back without waiting for a repair.
    A DEGRADED cube stays: it may still form a slice."""
    if len(_free(obs, plan)) >= plan.spares:
        return []
    held = {p for o in obs.slice_objects for p in o.partitions} | obs.cubes_taken
    going = {
        str(s.pool) for s in obs.slices if s.pool_state in (PoolState.DELETING, PoolState.ABSENT)
    }
    return sorted(
        c.pool
        for c in obs.cubes
        if c.ours and c.state == UNHEALTHY and c.partition not in held and c.pool not in going
    )


def _broken(obs: Observed) -> list[SliceObjectObservation]:
    return [o for o in obs.slice_objects if o.state in BROKEN and not o.deleting]


def _current(obs: Observed) -> dict[int, SliceObjectObservation]:
    """The Slice that forms each slice now: not broken, not going away."""
    return {o.index: o for o in obs.slice_objects if o.state not in BROKEN and not o.deleting}


def _cube_hosts(plan: Plan) -> int:
    cube = cubes.cube_shape(plan.shape.generation)
    return cube.hosts if cube is not None else plan.shape.hosts


def _usable(c: CubeObservation, plan: Plan) -> bool:
    return c.state == HEALTHY and c.ready_hosts >= _cube_hosts(plan)


def _free(obs: Observed, plan: Plan) -> list[str]:
    """Healthy cubes no Slice holds (the job's own, or another's), in a stable order."""
    held = {p for o in obs.slice_objects for p in o.partitions} | obs.cubes_taken
    return sorted(c.partition for c in obs.cubes if _usable(c, plan) and c.partition not in held)


def _next_name(obs: Observed, plan: Plan, index: int) -> str | None:
    """The name of slice `index`'s pair no Slice has now (None: both still exist)."""
    taken = {o.name for o in obs.slice_objects}
    free = [n for n in cubes.slice_names(plan.job_key, index) if n not in taken]
    return free[0] if free else None


def _form(f: Facts, b: Builder, plan: Plan) -> bool:
    """A Slice for every slice that has none, from free healthy cubes, all together or none
    (a Slice formed alone would hold cubes the others may never get). True: nothing missing."""
    current = _current(f.obs)
    missing = [i for i in range(plan.slices) if i not in current]
    if not missing:
        return True
    free = _free(f.obs, plan)
    per = plan.cubes_per_slice
    names = [_next_name(f.obs, plan, i) for i in missing]
    if len(free) < per * len(missing) or None in names:
        return False
    for k, (i, name) in enumerate(zip(missing, names, strict=True)):
        assert name is not None
        parts = tuple(free[k * per : (k + 1) * per])
        b.add(CreateSlice(name, i, plan.shape.topology, parts))
    return True


def _restart(f: Facts, b: Builder, plan: Plan, lost: frozenset[int], formed: bool) -> None:
    """A lost slice while the JobSet runs: its pods go (evicted: a disruption, so JobSet restarts
    every slice without charging maxRestarts), and the new Slice takes them when ACTIVE."""
    pods = tuple(sorted(p.name for p in f.live_pods if p.slice_index in lost and not p.deleting))
    if pods:
        b.add(EvictPods(pods))
    for i in sorted(lost):
        old = f.old.slice(i)
        if not (old and old.lost_time):
            then = (
                "re-formed at once from spare cubes; all slices restart"
                if formed
                else "all slices restart once enough healthy cubes are free"
            )
            b.event(Reason.SLICE_LOST, f"slice {i} lost its Slice ({f.slices.lost[i]}); {then}")


def _report(f: Facts, b: Builder, plan: Plan, started: bool, lost: frozenset[int],
            formed: bool) -> Capacity:  # fmt: skip
    """The Provisioned condition and what the pass found."""
    current = _current(f.obs)
    active = sum(1 for o in current.values() if o.state == ACTIVE)
    free = len(_free(f.obs, plan))
    slices = f"{active}/{plan.slices} Slices ACTIVE ({plan.shape.topology}, {plan.cubes_per_slice} "
    slices += f"cubes each); {free} free healthy cubes for {plan.spares} spares"
    if active >= plan.slices and not lost:
        b.cond(PROVISIONED, "True", Reason.GANG_READY, slices)
        return Capacity(True)
    b.requeue_in(f.cfg.resync_seconds)
    if not formed:
        wanting = plan.cubes_per_slice * (plan.slices - len(current))
        message = f"{slices}; waiting for {wanting} free healthy cubes to form the missing Slices"
    else:
        message = f"{slices}; forming"
    reason = Reason.REPAIRING if started else Reason.PROVISIONING
    b.cond(PROVISIONED, "False", reason, message)
    if started:
        return Capacity(False, repairing=lost or frozenset(range(plan.slices)) - current.keys(),
                        covered=False, message=message)  # fmt: skip
    return Capacity(False, Phase.PROVISIONING, message)


DYNAMIC_SLICES = DynamicSlices()
