"""Capacity model `DynamicSlices` (spec.provisioning.mode DynamicSlicing): GKE `Slice` objects
over Ironwood 4x4x4 cubes. Pure.

Capacity comes as cubes (reservation sub-blocks, one node pool of 16 tpu7x VMs each): the
operator creates the job's cube pools (dynamicSlicing.cubes Managed) or uses the cubes that are
there (Existing), then forms one `Slice` (accelerator.gke.io/v1beta1) per slice of the job from
free usable cubes (HEALTHY first, DEGRADED ones being "still usable to form a slice"), each
Slice from the cubes of one reservation block (GKE fails a Slice over two), all or none: the
JobSet is created once every Slice is Ready (ACTIVE, or ACTIVE_DEGRADED). A Slice that goes
FAILED or SliceCreationFailed is a lost slice: it is deleted (its unusable cube is not used
again) and formed again from free cubes (the spare cubes, spec.spares), and the running slices
are restarted (their pods evicted: JobSet restarts every slice, charged as a disruption). An
ACTIVE_DEGRADED Slice keeps running (dynamicSlicing.degraded KeepRunning, GKE's and xpk's
default), or with ReplaceWhenSpare is replaced so when free healthy cubes can re-form it; its
running chip-seconds count as degraded in the goodput. A deleted Slice that stays past
dynamicSlicing.sliceDeletionTimeoutSeconds (GKE names Slices stuck in DEACTIVATING) loses its
finalizer, as GKE's guide deletes one, with a Warning event. Everything is released when the
job ends.
Before the JobSet exists the Slices are a gang as node pools are: Slices not all ACTIVE within
spec.provisioning.timeoutSeconds are rolled back (the Slices and the job's cube pools deleted, never
held for a job that cannot run) and the next attempt waits out a backoff.

Sources: GKE "Use dynamic slicing with a custom scheduler" (create Slices, watch their state,
delete them), https://docs.cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices;
the Slice reference (states), https://docs.cloud.google.com/kubernetes-engine/docs/reference/crds/slice;
docs/dynamic-slicing-contract.md of the simulator. xpk's slice controller (slice-main, slice/)
evicts and requeues a whole workload on any failed slice; this model re-forms only the lost one.

Registered (`register`) with its own spec rules (tpu7x, a reservation for Managed cubes,
provisioning.dynamicSlicing only with this mode), its plan (the cube pools, planning/cubes.py),
what the controller watches for it (GKE Slices) and how it observes cubes and Slices, its
actions (`CreateSlice`, `DeleteSlices`, `ReleaseSlices`, applied by plugins/dynamic_shell.py),
their invariants (`violations`) and its part of the pod template (`place`: the job's Slices,
usable cubes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from multislice_operator.api.models import (
    CEL_MODE,
    CapacityType,
    CubeSource,
    DegradedPolicy,
    DynamicSlicing,
    MultisliceJobSpec,
    MultisliceJobStatus,
    Phase,
    Rule,
)
from multislice_operator.common import keys
from multislice_operator.common.errors import FieldError
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.controller.observe import ObserveInputs, first, parse_time, pool_slices
from multislice_operator.planning import cubes
from multislice_operator.planning.plan import NodePoolSpec, Plan, node_pools_of
from multislice_operator.plugins.nodepools import (
    NO_PROVISIONER,
    NODE_POOLS,
    create_absent,
    retry_message,
    roll_back,
)
from multislice_operator.reconcile import capacity
from multislice_operator.reconcile.capacity import PROVISIONED, Capacity, Size, Slices
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    Action,
    AddFinalizer,
    DecideConfig,
    Decision,
    EvictPods,
    JobSetObservation,
    Observed,
    OwnAction,
    Pod,
    SliceObservation,
)
from multislice_operator.registry import CapacityPlugin, Feature, Registry, Watch
from multislice_operator.tpu import catalog

if TYPE_CHECKING:
    from multislice_operator.reconcile.facts import Facts

MODE = cubes.MODE

ACTIVE = "ACTIVE"
ACTIVE_DEGRADED = "ACTIVE_DEGRADED"
# Ready=True: the slice's pods can run (the Slice reference; xpk's controller counts
# ACTIVE_DEGRADED as active unless the pods asked for healthy partitions only).
READY = frozenset({ACTIVE, ACTIVE_DEGRADED})
# States of a formed or forming Slice that make it a lost slice (the Slice reference; xpk's
# controller counts FAILED and SliceCreationFailed as errors). ACTIVE_DEGRADED is lost only as
# the job's degraded policy says (`_lost_objects`).
BROKEN = frozenset({"FAILED", "SliceCreationFailed"})
HEALTHY = "HEALTHY"  # cloud.google.com/gke-tpu-partition-4x4x4-state
DEGRADED = "DEGRADED"  # "impaired, still usable to form a slice" (GKE)
UNHEALTHY = "UNHEALTHY"
# The cubes a Slice may be formed from, healthy ones first; the pods' node affinity takes the
# same (xpk's webhook default, HEALTHY_AND_DEGRADED).
USABLE = (HEALTHY, DEGRADED)
# A pass waiting for a going Slice's name to leave its nodes looks again this soon (a node's
# labels changing wakes the job too; this is for a missed event).
STALE_LABEL_RECHECK_S = 2.0


# ---------------------------------------------------------------- what it observes and does


@dataclass(frozen=True)
class CubeObservation:
    """One 4x4x4 cube (a reservation sub-block, one node pool) a dynamic-slicing job may use:
    its nodes' partition labels (GKE: cloud.google.com/gke-tpu-partition-4x4x4-id and -state)."""

    partition: str
    pool: str
    state: str = "HEALTHY"  # HEALTHY, DEGRADED, UNHEALTHY, UNSET, INCOMPLETE
    ready_hosts: int = 0
    ours: bool = False  # a pool the job created (Managed cubes)
    block: str = ""  # its reservation block (cloud.google.com/gce-topology-block)
    nodes: frozenset[str] = frozenset()  # its nodes' names
    slices: frozenset[str] = frozenset()  # the Slice names its nodes carry (gke-tpu-slice)


@dataclass(frozen=True)
class SliceObjectObservation:
    """A GKE `Slice` (accelerator.gke.io/v1beta1, cluster-scoped) named as the job's: its cubes
    and its state, the reason of its Ready condition ("" before the controller wrote one)."""

    name: str
    index: int  # the job's slice it forms
    partitions: tuple[str, ...]
    state: str = ""
    deleting: bool = False
    deleting_since: datetime | None = None  # its metadata.deletionTimestamp


@dataclass(frozen=True)
class DynamicObservation:
    """What this model observes besides the cube pools (`Observed.capacity`): the cubes the job
    may use (its own pools', or the cluster's with Existing cubes), the partitions any other
    Slice holds, and the job's own Slices."""

    cubes: list[CubeObservation] = field(default_factory=list)
    cubes_taken: frozenset[str] = frozenset()
    slice_objects: list[SliceObjectObservation] = field(default_factory=list)


NOTHING = DynamicObservation()


def _dyn(obs: Observed) -> DynamicObservation:
    found = obs.capacity
    return found if isinstance(found, DynamicObservation) else NOTHING


@dataclass(frozen=True)
class CreateSlice(OwnAction):
    """A GKE `Slice` of `topology` over these cubes' partition ids."""

    creates: ClassVar[bool] = True
    name: str
    index: int
    topology: str
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class DeleteSlices(OwnAction):
    names: tuple[str, ...]


@dataclass(frozen=True)
class ReleaseSlices(OwnAction):
    """Remove the finalizer of these deleted Slices, stuck past the deadline: GKE's guide
    deletes a Slice so (kubectl patch ... remove /metadata/finalizers)."""

    names: tuple[str, ...]


class DynamicSlices:
    """GKE Slices over 4x4x4 cubes (DynamicSlicing)."""

    name = "DynamicSlices"
    finalizer_first = True  # Slices (and cube pools) must be released before the job goes
    dry_run_first = True  # the JobSet is judged before cubes are paid for
    replaces_idle_pools = False  # a slow start restarts every slice (startup.py)

    def slices(self, old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
               now: datetime) -> Slices:  # fmt: skip
        """Slice i is ready when its Slice is Ready (ACTIVE, ACTIVE_DEGRADED), lost when it is
        broken (or degraded, and the job replaces it)."""
        current = _current(obs, plan)
        ready = frozenset(i for i, o in current.items() if o.state in READY)
        lost = {o.index: f"Slice {o.name} {o.state}" for o in _lost_objects(obs, plan)}
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
        broken = _lost_objects(f.obs, plan)
        if broken:
            b.add(DeleteSlices(tuple(o.name for o in broken)))
        _release_stuck(f, b, plan)
        formed = _form(f, b, plan)
        lost = frozenset(f.slices.lost)
        if started:
            _restart(f, b, plan, lost, formed)
        capacity = _report(f, b, plan, started, lost, formed)
        if not started:
            _attempt(f, b, capacity.ready)
        return capacity

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        return self.provide(f, b, started=False)

    def held(self, f: Facts, b: Builder, note: capacity.Released) -> None:
        NODE_POOLS.held(f, b, note)

    def present(self, f: Facts) -> list[str]:
        """The job's Slices and cube pools that exist and are not already going away."""
        pools = [str(s.pool) for s in f.obs.slices if capacity.live(s) and not s.taken_by]
        names = [o.name for o in _dyn(f.obs).slice_objects if not o.deleting]
        return names + pools + capacity.strays(f)

    def release(self, f: Facts, b: Builder) -> bool:
        """The Slices first, then the cubes the job created (Existing cubes stay)."""
        names = tuple(o.name for o in _dyn(f.obs).slice_objects if not o.deleting)
        if names:
            b.add(DeleteSlices(names))
        if f.plan is not None:
            _release_stuck(f, b, f.plan)
        pools = [str(s.pool) for s in f.obs.slices if capacity.live(s) and not s.taken_by]
        done = capacity.release_pools(f, b, list(f.obs.slices), pools + capacity.strays(f))
        if _dyn(f.obs).slice_objects:
            b.requeue_in(f.cfg.resync_seconds / 2)
        return done and not _dyn(f.obs).slice_objects

    def taken(self, f: Facts) -> list[SliceObservation]:
        return [s for s in f.obs.slices if s.taken_by and s.taken_by_older]

    def permanent_errors(self, f: Facts, started: bool) -> list[PoolError]:
        return [s.error for s in f.obs.slices if s.error and s.error.permanent]

    def status(self, f: Facts) -> dict[str, Any] | None:
        return None  # status.slices and the conditions say it all

    def ends(self, f: Facts) -> datetime | None:
        return None  # reserved cubes stay

    def violations(self, f: Facts, d: Decision) -> list[tuple[int, str]]:
        return _violations(f, d)

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
        held = {p for o in _dyn(f.obs).slice_objects for p in o.partitions}
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
    active = sum(1 for o in _current(f.obs, plan).values() if o.state in READY)
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
    held = {p for o in _dyn(obs).slice_objects for p in o.partitions} | _dyn(obs).cubes_taken
    going = {
        str(s.pool) for s in obs.slices if s.pool_state in (PoolState.DELETING, PoolState.ABSENT)
    }
    return sorted(
        c.pool
        for c in _dyn(obs).cubes
        if c.ours and c.state == UNHEALTHY and c.partition not in held and c.pool not in going
    )


def _options(plan: Plan) -> DynamicSlicing:
    return plan.dynamic_slicing or DynamicSlicing()


def _lost_objects(obs: Observed, plan: Plan) -> list[SliceObjectObservation]:
    """The job's Slices to delete and form again: the broken ones; with degraded: ReplaceWhenSpare
    also as many ACTIVE_DEGRADED ones (lowest slice first) as free healthy cubes can re-form
    once the broken ones have theirs (without a healthy spare a degraded Slice keeps running)."""
    live = [o for o in _dyn(obs).slice_objects if not o.deleting]
    broken = [o for o in live if o.state in BROKEN]
    if _options(plan).degraded != DegradedPolicy.REPLACE_WHEN_SPARE:
        return broken
    degraded = sorted((o for o in live if o.state == ACTIVE_DEGRADED), key=lambda o: o.index)
    if not degraded:
        return broken
    healthy = [c for c in _free_cubes(obs, plan) if c.state == HEALTHY]
    spare = len(_groups(healthy, plan.cubes_per_slice, len(broken) + len(degraded)))
    return broken + degraded[: max(0, spare - len(broken))]


def _current(obs: Observed, plan: Plan) -> dict[int, SliceObjectObservation]:
    """The Slice that forms each slice now: not lost, not going away."""
    lost = {o.name for o in _lost_objects(obs, plan)}
    return {o.index: o for o in _dyn(obs).slice_objects if o.name not in lost and not o.deleting}


def _release_stuck(f: Facts, b: Builder, plan: Plan) -> None:
    """Deleted Slices still there past dynamicSlicing.sliceDeletionTimeoutSeconds lose their
    finalizer (GKE's guide deletes a Slice so; its troubleshooting page names Slices stuck in
    DEACTIVATING); a pass is wanted when the next one's deadline comes."""
    deadline = _options(plan).slice_deletion_timeout_seconds
    stuck: list[tuple[SliceObjectObservation, float]] = []
    waits: list[float] = []
    for o in _dyn(f.obs).slice_objects:
        if not o.deleting or o.deleting_since is None:
            continue
        waited = (f.now - o.deleting_since).total_seconds()
        if waited > deadline:
            stuck.append((o, waited))
        else:
            waits.append(deadline - waited)
    if waits:
        b.requeue_in(min(waits) + 1)
    if not stuck:
        return
    b.add(ReleaseSlices(tuple(o.name for o, _ in stuck)))
    for o, waited in stuck:
        b.event(
            Reason.SLICE_FINALIZER_REMOVED,
            f"Slice {o.name} ({o.state or 'no state'}) was still there "
            f"{int(waited)}s after its deletion (more than "
            f"spec.provisioning.dynamicSlicing.sliceDeletionTimeoutSeconds, {deadline}s): its "
            f"finalizer {keys.SLICE_FINALIZER} is removed, as GKE's guide deletes a Slice; its "
            "cubes may need GKE's attention before another Slice forms on them",
        )


def _cube_hosts(plan: Plan) -> int:
    cube = cubes.cube_shape(plan.shape.generation)
    return cube.hosts if cube is not None else plan.shape.hosts


def _usable(c: CubeObservation, plan: Plan) -> bool:
    return c.state in USABLE and c.ready_hosts >= _cube_hosts(plan)


def _free_cubes(obs: Observed, plan: Plan) -> list[CubeObservation]:
    """Usable cubes no Slice holds (the job's own, or another's): healthy ones first, then by
    block and partition (a stable order)."""
    seen = _dyn(obs)
    held = {p for o in seen.slice_objects for p in o.partitions} | seen.cubes_taken
    free = [c for c in seen.cubes if _usable(c, plan) and c.partition not in held]
    return sorted(free, key=lambda c: (c.state != HEALTHY, c.block, c.partition))


def _free(obs: Observed, plan: Plan) -> list[str]:
    return [c.partition for c in _free_cubes(obs, plan)]


def _groups(free: list[CubeObservation], per: int, count: int) -> list[tuple[str, ...]]:
    """Up to `count` Slices' cubes, `per` each, every group from one reservation block (GKE
    fails a Slice whose cubes are in two: "Use dynamic slicing with a custom scheduler"), the
    groups with the fewest degraded cubes first. Greedy is enough: a block holds
    len // per groups whatever the order."""
    by_block: dict[str, list[CubeObservation]] = {}
    for c in free:  # healthy first within each block, as `free` is ordered
        by_block.setdefault(c.block, []).append(c)
    out: list[tuple[str, ...]] = []
    while per > 0 and len(out) < count:
        fits = [(block, cs) for block, cs in by_block.items() if len(cs) >= per]
        if not fits:
            break
        _, cubes_ = min(fits, key=lambda bc: (sum(c.state != HEALTHY for c in bc[1][:per]), bc[0]))
        out.append(tuple(sorted(c.partition for c in cubes_[:per])))
        del cubes_[:per]
    return out


def _next_name(obs: Observed, plan: Plan, index: int) -> str | None:
    """The name of slice `index`'s pair no Slice has now (None: both still exist)."""
    taken = {o.name for o in _dyn(obs).slice_objects}
    free = [n for n in cubes.slice_names(plan.job_key, index) if n not in taken]
    return free[0] if free else None


def _form(f: Facts, b: Builder, plan: Plan) -> bool:
    """A Slice for every slice that has none, from free usable cubes of one block each, all
    together or none (a Slice formed alone would hold cubes the others may never get). True:
    nothing missing."""
    current = _current(f.obs, plan)
    missing = [i for i in range(plan.slices) if i not in current]
    if not missing:
        return True
    groups = _groups(_free_cubes(f.obs, plan), plan.cubes_per_slice, len(missing))
    names = [_next_name(f.obs, plan, i) for i in missing]
    if len(groups) < len(missing) or None in names:
        return False
    for i, name, parts in zip(missing, names, groups, strict=True):
        assert name is not None
        b.add(CreateSlice(name, i, plan.shape.topology, parts))
    return True


def _restart(f: Facts, b: Builder, plan: Plan, lost: frozenset[int], formed: bool) -> None:
    """While the JobSet runs: the pods left on cubes no current Slice holds (a lost Slice's) go,
    evicted (a disruption: JobSet restarts every slice without charging maxRestarts), but only
    once no usable cube still carries the name of one of the job's Slices that is going: the
    pod template accepts every name of the job's (`place`), so a pod restarted earlier could
    land on the old Slice's nodes, which the slice controller unlabels in its own time, instead
    of on the new Slice. The new attempt's pods, unbound or on a current Slice's cubes, stay."""
    current = _current(f.obs, plan)
    pods = _stranded(f, current)
    if pods and _stale(f.obs, current):
        b.requeue_in(STALE_LABEL_RECHECK_S)
    elif pods:
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


def _stranded(f: Facts, current: dict[int, SliceObjectObservation]) -> tuple[str, ...]:
    """The job's placed pods on cubes no current Slice holds, whatever their JobSet slice index
    (JobSet's exclusive placement puts replicated Job i on any of the job's Slices, not on
    Slice i): by their node's pool (Managed cubes) or their node (Existing cubes)."""
    held = {p for o in current.values() for p in o.partitions}
    away = [c for c in _dyn(f.obs).cubes if c.partition not in held]
    pools = {c.pool for c in away}
    nodes = {n for c in away for n in c.nodes}
    return tuple(sorted(p.name for p in f.live_pods if not p.deleting and _on(p, pools, nodes)))


def _on(pod: Pod, pools: set[str], nodes: set[str]) -> bool:
    if pod.pool is not None:
        return pod.pool in pools
    return pod.node is not None and pod.node in nodes


def _stale(obs: Observed, current: dict[int, SliceObjectObservation]) -> bool:
    """A usable cube's nodes still carry the name of a job's Slice that is lost or going away
    (one already gone waits for nothing: no controller would take its name off)."""
    going = {o.name for o in _dyn(obs).slice_objects} - {o.name for o in current.values()}
    return any(c.slices & going for c in _dyn(obs).cubes if c.state in USABLE)


def _report(f: Facts, b: Builder, plan: Plan, started: bool, lost: frozenset[int],
            formed: bool) -> Capacity:  # fmt: skip
    """The Provisioned condition and what the pass found."""
    current = _current(f.obs, plan)
    active = sum(1 for o in current.values() if o.state in READY)
    degraded = frozenset(i for i, o in current.items() if o.state == ACTIVE_DEGRADED)
    free = len(_free(f.obs, plan))
    slices = f"{active}/{plan.slices} Slices ACTIVE ({plan.shape.topology}, {plan.cubes_per_slice} "
    slices += f"cubes each); {free} free usable cubes for {plan.spares} spares"
    if degraded:
        slices += (
            f"; slice {', '.join(map(str, sorted(degraded)))} on an ACTIVE_DEGRADED Slice "
            f"(dynamicSlicing.degraded {_options(plan).degraded}: it keeps running"
            + (" until free healthy cubes can form it again)" if
               _options(plan).degraded == DegradedPolicy.REPLACE_WHEN_SPARE else ")")
        )  # fmt: skip
    if active >= plan.slices and not lost:
        b.cond(PROVISIONED, "True", Reason.GANG_READY, slices)
        return Capacity(True, degraded=degraded)
    b.requeue_in(f.cfg.resync_seconds)
    if not formed:
        wanting = plan.cubes_per_slice * (plan.slices - len(current))
        message = (
            f"{slices}; waiting for {wanting} free usable cubes (of one reservation block per "
            "Slice) to form the missing Slices"
        )
    else:
        message = f"{slices}; forming"
    reason = Reason.REPAIRING if started else Reason.PROVISIONING
    b.cond(PROVISIONED, "False", reason, message)
    if started:
        return Capacity(False, repairing=lost or frozenset(range(plan.slices)) - current.keys(),
                        covered=False, message=message)  # fmt: skip
    return Capacity(False, Phase.PROVISIONING, message)


DYNAMIC_SLICES = DynamicSlices()


# ---------------------------------------------------------------- its promises (invariants.py)


def _violations(f: Facts, d: Decision) -> list[tuple[int, str]]:
    """A Slice is created after the finalizer, under one of the job's Slice names, on cubes no
    Slice holds; only the job's Slices are deleted (or released), never one created in the same
    pass."""
    plan = f.plan
    names = set(cubes.all_slice_names(plan.job_key, plan.slices)) if plan else set()
    obs = _dyn(f.obs)
    held = {p for o in obs.slice_objects for p in o.partitions} | obs.cubes_taken
    finalizer, created, out = f.meta.has_finalizer, set[str](), list[tuple[int, str]]()
    for i, a in enumerate(d.actions):
        finalizer = finalizer or isinstance(a, AddFinalizer)
        why = _broken_promise(a, names, held, created, finalizer)
        if why is not None:
            out.append((i, why))
    return out


def _broken_promise(a: Action, names: set[str], held: set[str], created: set[str],
                    finalizer: bool) -> str | None:  # fmt: skip
    if isinstance(a, CreateSlice):
        created.add(a.name)
        twice = sorted(set(a.partitions) & held)
        held |= set(a.partitions)
        if not finalizer:
            return f"create-without-finalizer: CreateSlice {a.name} before the finalizer"
        if a.name not in names:
            return f"not-ours: CreateSlice {a.name}, not one of the job's Slice names"
        return f"cube-twice: CreateSlice {a.name} on cubes {twice} a Slice holds" if twice else None
    if isinstance(a, DeleteSlices | ReleaseSlices):
        kind = type(a).__name__
        foreign, again = sorted(set(a.names) - names), sorted(set(a.names) & created)
        if foreign:
            return f"not-ours: {kind} {foreign}, not the job's"
        if again:
            return f"create-and-delete: {kind} {again} created in the same pass"
    return None


# ---------------------------------------------------------------- its other parts


def summarize_slice(body: Mapping[str, Any]) -> dict[str, Any]:
    """A GKE `Slice` (accelerator.gke.io/v1beta1): its cubes and its state, the reason of its
    Ready condition (GKE "Slice" reference; docs/provisioning.md, dynamic slicing)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    conditions = (body.get("status") or {}).get("conditions") or []
    ready: dict[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    return {
        "name": meta.get("name", ""),
        "partitions": tuple(spec.get("partitionIds") or ()),
        "state": str(ready.get("reason") or ""),
        "deleting": bool(meta.get("deletionTimestamp")),
        "deletingSince": meta.get("deletionTimestamp"),
    }


def _cubes_seen(plan: Plan, nodes: Mapping[Any, Iterable[dict[str, Any]]]
                ) -> list[CubeObservation]:  # fmt: skip
    """The cubes the job may use: its own cube pools, or with Existing cubes the cluster's
    unclaimed pools of its generation that carry a partition id."""
    own = {p.name for p in plan.pools}
    found = []
    for pool, members in sorted(nodes.items(), key=lambda kv: str(kv[0])):
        members = [n for n in members if n["labels"].get(keys.GKE_TPU_PARTITION_ID)]
        if not members or (own and str(pool) not in own) or (not own and members[0]["jobKey"]):
            continue
        if members[0]["accelerator"] != plan.shape.generation.gke_accelerator:
            continue
        labels = members[0]["labels"]
        carried = {n["labels"].get(keys.GKE_TPU_SLICE) for n in members}
        found.append(
            CubeObservation(
                labels[keys.GKE_TPU_PARTITION_ID],
                str(pool),
                labels.get(keys.GKE_TPU_PARTITION_STATE, ""),
                sum(1 for n in members if n["ready"]),
                str(pool) in own,
                labels.get(keys.GCE_TOPOLOGY_BLOCK, ""),
                frozenset(n.get("name", "") for n in members),
                frozenset(s for s in carried if s),
            )
        )
    return found


def dynamic_observation(
    plan: Plan, nodes: Mapping[Any, Iterable[dict[str, Any]]], slices: Mapping[Any, Any]
) -> DynamicObservation:
    """The cubes the job may use, the partitions other Slices hold, and the job's own Slices
    (named as cubes.slice_names says)."""
    names = {n: i for i in range(plan.slices) for n in cubes.slice_names(plan.job_key, i)}
    mine, taken = [], set()
    for name in sorted(slices):
        s = first(slices, name)
        if name in names:
            index = names[name]
            since = parse_time(s.get("deletingSince"))
            mine.append(
                SliceObjectObservation(
                    name, index, s["partitions"], s["state"], s["deleting"], since
                )
            )
        else:
            taken.update(s["partitions"])
    return DynamicObservation(_cubes_seen(plan, nodes), frozenset(taken), mine)


def observe(i: ObserveInputs) -> tuple[list[SliceObservation], DynamicObservation]:
    """Its cube pools (Managed cubes) as listed, and its cubes and Slices."""
    slices = pool_slices(i) if i.plan.pools else []
    return slices, dynamic_observation(i.plan, i.nodes, i.indexes.get(SLICE_WATCH.name, {}))


def plan_pools(spec: MultisliceJobSpec, shape: catalog.SliceShape, namespace: str,
               name: str) -> dict[str, Any]:  # fmt: skip
    """One pool per 4x4x4 cube (a sub-block: GKE "Configure TPUs with GKE dynamic slicing"),
    the slices' cubes then the spare cubes (spec.spares counts cubes) with Managed cubes; with
    Existing cubes none. The cube pools' workload policy carries the topology, in
    PROVISION_ONLY mode; no tpuTopology on the pool (docs/provisioning.md, dynamic slicing)."""
    per = cubes.cubes_per_slice(shape)
    cube = cubes.cube_shape(shape.generation)
    source = _cubes_source(spec)
    if cube is None or source != CubeSource.MANAGED.value:
        return {
            "cubes_per_slice": per,
            "cubes_source": source,
            "dynamic_slicing": spec.provisioning.dynamic_slicing,
        }
    used, policy = spec.slices * per, cubes.cube_policy_name(cube)

    def as_cubes(indexes: range) -> list[NodePoolSpec]:
        return [
            dataclasses.replace(p, tpu_topology=None, workload_policy=policy, cube=True)
            for p in node_pools_of(spec, cube, namespace, name, indexes)
        ]

    return {
        "node_pools": as_cubes(range(used)),
        "spare_pools": as_cubes(range(used, used + spec.spares)),
        "cubes_per_slice": per,
        "cubes_source": source,
        "dynamic_slicing": spec.provisioning.dynamic_slicing,
    }


def _cubes_source(spec: MultisliceJobSpec) -> str:
    ds = spec.provisioning.dynamic_slicing
    return str(ds.cubes) if ds is not None else CubeSource.MANAGED.value


def check(spec: MultisliceJobSpec, shape: catalog.SliceShape) -> list[FieldError]:
    return cubes.dynamic_slicing_errors(spec, shape)


def place(template: dict[str, Any], plan: Plan) -> None:
    """The pods run on the job's GKE Slices only (their nodes carry the Slice's name,
    cloud.google.com/gke-tpu-slice), annotated with the slice topology as GKE's custom-scheduler
    guide shows; the JobSet's exclusive topology puts each slice on one Slice."""
    meta = template["metadata"]
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        keys.GKE_TPU_SLICE_TOPOLOGY: plan.shape.topology,
    }
    ours = {
        "key": keys.GKE_TPU_SLICE,
        "operator": "In",
        "values": cubes.all_slice_names(plan.job_key, plan.slices),
    }
    # Usable cubes only, as xpk's slice controller's webhook asks by default (slice-main
    # cmd/main.go --default-slice-health-node-affinity HEALTHY_AND_DEGRADED): a DEGRADED cube
    # is "still usable", and a restarted pod never lands on the unusable cube of a Slice that
    # is still going away.
    healthy = {"key": keys.GKE_TPU_PARTITION_STATE, "operator": "In", "values": list(USABLE)}
    pod = template["spec"]
    affinity = pod.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", []) or [{}]
    required["nodeSelectorTerms"] = [
        {**t, "matchExpressions": [*(t.get("matchExpressions") or []), ours, healthy]}
        for t in terms
    ]


_CEL_CUBES = (
    "(has(self.provisioning) && has(self.provisioning.dynamicSlicing) && "
    "has(self.provisioning.dynamicSlicing.cubes) ? self.provisioning.dynamicSlicing.cubes : "
    f"'{CubeSource.MANAGED.value}')"
)
RULES: tuple[Rule, ...] = (
    # GKE's Slice is Ironwood's ("Use Ironwood (TPU7x) version",
    # https://docs.cloud.google.com/kubernetes-engine/docs/how-to/create-dynamic-slices).
    Rule(
        ("provisioning",),
        "spec.provisioning.dynamicSlicing",
        f"!has(self.dynamicSlicing) || (has(self.mode) && self.mode == '{MODE}')",
        f"spec.provisioning.dynamicSlicing is only read with mode: {MODE}; set the mode or "
        "remove dynamicSlicing",
        lambda s: s.provisioning.dynamic_slicing is None or s.provisioning.mode == MODE,
    ),
    Rule(
        (),
        "spec.accelerator",
        f"{CEL_MODE} != '{MODE}' || self.accelerator.startsWith('tpu7x-')",
        f"spec.accelerator: provisioning.mode {MODE} forms GKE Slices from Ironwood 4x4x4 cubes "
        "only; use a tpu7x accelerator or mode Managed",
        lambda s: s.provisioning.mode != MODE or s.accelerator.startswith("tpu7x-"),
    ),
    # Incremental provisioning of cubes takes an All Capacity mode reservation (GKE "Use dynamic
    # slicing with a custom scheduler", requirements).
    Rule(
        (),
        "spec.capacity.type",
        f"{CEL_MODE} != '{MODE}' || {_CEL_CUBES} == '{CubeSource.EXISTING.value}' || "
        f"(has(self.capacity) && has(self.capacity.type) && "
        f"self.capacity.type == '{CapacityType.RESERVED.value}')",
        f"spec.capacity.type must be Reserved with provisioning.mode {MODE}: the operator "
        "creates the cubes from an All Capacity mode reservation (spec.capacity.reservation, "
        "its block or sub-block); or set provisioning.dynamicSlicing.cubes: Existing for cubes "
        "that are there",
        lambda s: (
            s.provisioning.mode != MODE
            or _cubes_source(s) == CubeSource.EXISTING
            or s.capacity.type == CapacityType.RESERVED
        ),
    ),
)
# What the pods' node selection may not name (GKE "Use dynamic slicing with a custom scheduler":
# "Do NOT put cloud.google.com/gke-tpu-slice here manually"): the operator forms the job's
# Slices, chooses their cubes and pins each slice's pods to its Slice itself (`place`).
_SELECTOR = "spec.template.spec.nodeSelector"
_AFFINITY = (
    "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
)
_SLICE_BY_HAND = (
    f"with provisioning.mode {MODE} the operator forms the job's Slices and selects them itself "
    f"(node affinity on their names; GKE: do not set {keys.GKE_TPU_SLICE} by hand, "
    f"{cubes.SAME_BLOCK_DOC}): the pods could never schedule on a Slice of your naming; remove it"
)
_POOL_BY_HAND = (
    f"with provisioning.mode {MODE} each slice runs on a GKE Slice the operator forms from "
    "4x4x4 cubes (one node pool each, chosen among the free cubes of one reservation block) and "
    f"selects by its name ({keys.GKE_TPU_SLICE}): a node pool selector would pin every slice to "
    "one cube; remove it"
)


def _cel_selector_lacks(key: str) -> str:
    return (
        f"{CEL_MODE} != '{MODE}' || !has(self.template.spec) || "
        f"!has(self.template.spec.nodeSelector) || !('{key}' in self.template.spec.nodeSelector)"
    )


def _selector(s: MultisliceJobSpec) -> Mapping[str, Any]:
    found = (s.template.get("spec") or {}).get("nodeSelector")
    return found if isinstance(found, dict) else {}


def _affinity_keys(s: MultisliceJobSpec) -> set[str]:
    """The keys the template's required node affinity names."""
    node = ((s.template.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    return {
        str(e.get("key"))
        for t in terms or []
        if isinstance(t, dict)
        for e in t.get("matchExpressions") or []
        if isinstance(e, dict)
    }


RULES += (
    Rule(
        (),
        f"{_SELECTOR}.{keys.GKE_TPU_SLICE}",
        _cel_selector_lacks(keys.GKE_TPU_SLICE),
        f"{_SELECTOR}.{keys.GKE_TPU_SLICE}: {_SLICE_BY_HAND}",
        lambda s: s.provisioning.mode != MODE or keys.GKE_TPU_SLICE not in _selector(s),
    ),
    Rule(
        (),
        _AFFINITY,
        "",  # the template's affinity is not in the CRD's schema: validate and the plan say it
        f"{_AFFINITY}: names {keys.GKE_TPU_SLICE}; {_SLICE_BY_HAND}",
        lambda s: s.provisioning.mode != MODE or keys.GKE_TPU_SLICE not in _affinity_keys(s),
    ),
    Rule(
        (),
        f"{_SELECTOR}.{keys.GKE_NODEPOOL}",
        _cel_selector_lacks(keys.GKE_NODEPOOL),
        f"{_SELECTOR}.{keys.GKE_NODEPOOL}: {_POOL_BY_HAND}",
        lambda s: s.provisioning.mode != MODE or keys.GKE_NODEPOOL not in _selector(s),
    ),
)
# GKE Slices: cluster-scoped, labelled with their job; kopf starts the watch when the Slice CRD
# is served (GKE's slice controller enabled on the cluster).
SLICE_WATCH = Watch(
    name="slices",
    group=keys.SLICE_GROUP,
    version=keys.SLICE_VERSION,
    plural=keys.SLICE_PLURAL,
    summarize=f"{__name__}:summarize_slice",
    labels={keys.MANAGED_BY: keys.MANAGED_BY_VALUE},
    optional=True,  # served only where GKE's slice controller is enabled
)


DOCS = """\
GKE `Slice` objects (accelerator.gke.io/v1beta1) over Ironwood 4x4x4 cubes, formed all or none
from free usable cubes, each Slice from one reservation block (`spec.spares` counts spare cubes);
a lost Slice is formed again from a spare cube, a degraded one kept running (or replaced:
`dynamicSlicing.degraded`) ([provisioning.md](provisioning.md#dynamic-slicing)).
`status.capacity`: none.
"""


DESCRIPTION = (
    "each slice is a GKE Slice formed from 4x4x4 cubes (provisioning.dynamicSlicing), all or "
    "none (tpu7x, GKE 1.35.2-gke.1842000+)."
)
PLUGIN = CapacityPlugin(
    MODE,
    DYNAMIC_SLICES,
    DESCRIPTION,
    accepts={Feature.SPARES: "spare cubes", Feature.FLEX_START: ""},
    rules=RULES,
    check=check,
    pools=plan_pools,
    observe=observe,
    place=place,
    exclusive_topology=keys.GKE_TPU_SLICE,
    appliers={
        CreateSlice: "multislice_operator.plugins.dynamic_shell:create_slice",
        DeleteSlices: "multislice_operator.plugins.dynamic_shell:delete_slices",
        ReleaseSlices: "multislice_operator.plugins.dynamic_shell:release_slices",
    },
    watches=(SLICE_WATCH,),
    waits_for_nodes=True,
    docs=DOCS,
)


def register(r: Registry) -> None:
    r.add_model(PLUGIN)
