"""Capacity model `NodePools` (spec.provisioning.mode Managed): a GKE node pool per slice. Pure.

The operator creates one node pool per slice (and per spare, spec.spares) as a gang, all or
none: any failure or a timeout rolls the gang back and the next attempt waits out a backoff. A
flex-start pool (Dynamic Workload Scheduler) waits for its capacity without a timeout. Once the
slices were up, a lost slice's pool is replaced alone (a repair) while a spare runs the slice, or
the job runs on fewer slices (spec.elastic: elastic.py sizes it), or every slice waits. The pools
are released at the end. The capacity verdicts' evidence (a pool name an older job holds, an
error retrying cannot fix) is read here; verdicts.py words them.

Registered (`register`) with what it accepts (spares, elastic, flex-start), what its plan creates
(`plan_pools`), how its pools are observed (`observe`: the cloud's listing and their nodes, and
its own observation, `FlexStartPools`), and its part of the pod template (`place`: this job's own
pools only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from multislice_operator.api.models import MultisliceJobSpec, MultisliceJobStatus, Phase
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.controller.observe import ObserveInputs, pool_slices
from multislice_operator.planning.plan import Plan, node_pools_of
from multislice_operator.reconcile import elastic
from multislice_operator.reconcile.capacity import (
    PROVISIONED,
    Capacity,
    Released,
    Size,
    Slices,
    live,
    release_pools,
    slice_ready,
    stale_note,
    strays,
)
from multislice_operator.reconcile.context import Builder, at_second, backoff_seconds
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    CreatePools,
    DecideConfig,
    Decision,
    JobSetObservation,
    Observed,
    SliceObservation,
)
from multislice_operator.registry import CapacityPlugin, Feature, Registry
from multislice_operator.tpu import catalog

if TYPE_CHECKING:
    from multislice_operator.reconcile.facts import Facts

MODE = "Managed"
NO_PROVISIONER = (
    "spec.provisioning.mode is Managed but the operator has no GKE cluster configured "
    "(--gke-project/--gke-location/--gke-cluster); configure it or use mode: Existing"
)


@dataclass(frozen=True)
class FlexStartPools:
    """NodePools' own observation (`Observed.capacity`): the job's flex-start pools (GKE's
    Dynamic Workload Scheduler), by slice index, each with its maximum run duration in seconds
    (None: not listed). Such a pool gets its nodes when capacity for the whole slice is found, so
    READY without nodes waits, not fails; GKE removes the VMs that long after they came."""

    max_run: Mapping[int, int | None] = field(default_factory=dict)


def flex_start(obs: Observed) -> Mapping[int, int | None]:
    """The flex-start pools NodePools observed (none for another model's observation)."""
    return obs.capacity.max_run if isinstance(obs.capacity, FlexStartPools) else {}


class NodePools:
    """A node pool per slice, created by the operator (Managed)."""

    name = "NodePools"
    finalizer_first = True  # before any pool can exist
    dry_run_first = True  # the JobSet is judged before TPUs are paid for
    replaces_idle_pools = True  # a pool no pod of a slow start got is replaced (startup.py)

    def slices(self, old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
               now: datetime) -> Slices:  # fmt: skip
        hosts = plan.shape.hosts
        ready = frozenset(s.index for s in obs.slices if slice_ready(s, hosts))
        lost: dict[int, str] = {}
        blips: dict[int, float] = {}
        for s in obs.slices:
            why = _lost(old, s, hosts, cfg, now)
            if isinstance(why, str):
                lost[s.index] = why
            elif why is not None:
                blips[s.index] = why
        complete = len(obs.slices) == len(plan.pools)
        up = ready | blips.keys()
        return Slices(
            hosts,
            ready,
            lost,
            blips,
            all_ready=complete and all(s.index in up for s in obs.slices),
            waiting=_waiting(old, obs, hosts, ready),
            up=len(up),
            complete=complete,
            need=plan.slices,
        )

    def size(self, plan: Plan, old: MultisliceJobStatus, slices: Slices, obs: Observed,
             js: JobSetObservation | None, now: datetime) -> Size:  # fmt: skip
        if plan.elastic is None:
            return Size(plan.slices, plan.slices)  # spec.elastic is the only other size
        lost = frozenset(slices.lost)
        return elastic.size(plan, old, slices.ready, slices.up, obs.slices, js, now, lost)

    def clock_ready(self, slices: Slices) -> bool:
        return slices.enough

    def provide(self, f: Facts, b: Builder, started: bool) -> Capacity:
        assert f.plan is not None
        if not f.obs.provisioner_configured:
            b.cond(PROVISIONED, "False", Reason.PROVISIONER_NOT_CONFIGURED, NO_PROVISIONER)
            b.requeue_in(f.cfg.resync_seconds * 3)
            return Capacity(False, Phase.PENDING, NO_PROVISIONER)
        if started:
            return _repair(f, b, f.plan)
        return _gang(f, b, f.plan)

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        return self.provide(f, b, started=False)

    def held(self, f: Facts, b: Builder, note: Released) -> None:
        held = (
            "leaving the queue's quota: the node pools go once the JobSet's pods are gone"
            if note is Released.STOPPING
            else "no quota reserved: no node pools"
        )
        b.cond(PROVISIONED, "False", Reason.QUEUED, held)

    def present(self, f: Facts) -> list[str]:
        """A pool of our name that another live job owns is never ours to delete."""
        return [str(s.pool) for s in f.obs.slices if live(s) and not s.taken_by] + strays(f)

    def release(self, f: Facts, b: Builder) -> bool:
        return release_pools(f, b, list(f.obs.slices), self.present(f))

    def taken(self, f: Facts) -> list[SliceObservation]:
        return [s for s in f.obs.slices if s.taken_by and s.taken_by_older]

    def permanent_errors(self, f: Facts, started: bool) -> list[PoolError]:
        if not f.obs.provisioner_configured:
            return []
        permanent = [s.error for s in f.obs.slices if s.error and s.error.permanent]
        if f.obs.offered_error is not None and not started and not self.present(f):
            permanent.insert(0, f.obs.offered_error)  # only matters before the first pool exists
        return permanent

    def chips_held(self, f: Facts, b: Builder, plan: Plan, in_use: bool) -> int:
        """Every pool of the job's that exists (creating, running, being deleted: GKE bills the
        VMs from creation to deletion) or that this pass creates, spares' included."""
        return self.pools_held(f, b) * plan.shape.chips

    def status(self, f: Facts) -> dict[str, Any] | None:
        return None  # status.slices and the conditions say it all

    def ends(self, f: Facts) -> datetime | None:
        """Flex-start pools: GKE removes the VMs their maximum run duration after they came
        (a disruption, every slice restarts), counted from when every slice's capacity was
        ready (the nodes came then)."""
        runs = [seconds for seconds in flex_start(f.obs).values() if seconds]
        since = f.capacity_ready_since
        return since + timedelta(seconds=min(runs)) if runs and since is not None else None

    def violations(self, f: Facts, d: Decision) -> list[tuple[int, str]]:
        return []  # its pool actions are the core's, checked there (invariants.py)

    def pools_held(self, f: Facts, b: Builder) -> int:
        """The job's own pools that exist or that this pass creates (not another job's)."""
        creating = {i for a in b.actions if isinstance(a, CreatePools) for i in a.slices}
        return sum(
            1
            for s in f.obs.slices
            if (s.pool_state != PoolState.ABSENT or s.index in creating) and not s.foreign
        )


# ---------------------------------------------------------------- ready, lost, blips


def _seen(old: MultisliceJobStatus, index: int) -> bool:
    before = old.slice(index)
    return bool(before and before.seen_ready)


def _waiting(old: MultisliceJobStatus, obs: Observed, hosts: int, ready: frozenset[int]
             ) -> frozenset[int]:  # fmt: skip
    """Flex-start pools up and error-free whose nodes have not come yet."""
    flex = flex_start(obs)
    return frozenset(
        s.index
        for s in obs.slices
        if s.index in flex
        and s.index not in ready
        and s.pool_state == PoolState.READY
        and s.error is None
        and s.hosts_present < hosts
        and not _seen(old, s.index)  # once its nodes came, nodes gone are a loss
    )


def slice_lost(s: SliceObservation, seen_ready: bool) -> bool:
    """Capacity that was there is gone: pool broken or deleted, or its nodes disappeared.

    A READY pool without nodes is only lost if its nodes were seen Ready since it was created
    (`seen_ready`): a fresh pool's nodes take a moment to register. Nodes that are there but not
    Ready are a blip until the grace period passes, not a loss.
    """
    if s.foreign or s.taken_by:
        return True
    if s.pool_state in (PoolState.FAILED, PoolState.ABSENT, PoolState.DELETING):
        return True
    return (
        s.pool_state in (PoolState.READY, PoolState.DEGRADED)
        and s.hosts_present == 0
        and seen_ready
    )


def _lost(old: MultisliceJobStatus, s: SliceObservation, hosts: int, cfg: DecideConfig,
          now: datetime) -> str | float | None:  # fmt: skip
    """Why the slice is lost (a text), or the seconds of its NotReady blip, or None: neither."""
    if slice_lost(s, _seen(old, s.index)):
        if s.error:
            return s.error.code
        up = s.pool_state in (PoolState.READY, PoolState.DEGRADED)
        return "nodes gone" if up else str(s.pool_state)
    elapsed = _not_ready_for(old, s, hosts, now)
    if elapsed is None or elapsed < cfg.not_ready_grace_seconds:
        return elapsed
    return f"{s.ready_hosts}/{hosts} hosts Ready, NotReady for {elapsed:.0f}s"


def _not_ready_for(old: MultisliceJobStatus, s: SliceObservation, hosts: int,
                   now: datetime) -> float | None:  # fmt: skip
    """Seconds a once-ready slice has had fewer Ready hosts than it needs while its pool is up;
    None when it is not in that state."""
    before = old.slice(s.index)
    if before is None or not before.seen_ready or slice_ready(s, hosts):
        return None
    if s.pool_state not in (PoolState.READY, PoolState.DEGRADED, PoolState.UPDATING):
        return None
    since = before.not_ready_time or now
    return (now - since).total_seconds()


# ---------------------------------------------------------------- the gang: all or none


def _gang(f: Facts, b: Builder, plan: Plan) -> Capacity:
    """All or none: every slice's pool is created together; any failure rolls the gang back."""
    slices = f.obs.slices
    if len(slices) == len(plan.pools) and all(slice_ready(s, plan.shape.hosts) for s in slices):
        _provisioned(f, b, plan)
        return Capacity(True)
    flex = _flex_wait(f, b, plan)
    if flex is not None:  # not a failure: no rollback, no timeout while DWS queues it
        return flex
    next_at = f.old.next_attempt_time
    if next_at is not None and f.now < next_at:
        NODE_POOLS.release(f, b)
        b.requeue_in((next_at - f.now).total_seconds())
        return Capacity(False, Phase.PROVISIONING, retry_message(b))
    failure = _attempt_failed(f, plan)
    if failure is not None:
        return _rollback(f, b, plan, *failure)
    return _advance(f, b, plan, f.old.attempt_start_time is None)


def _attempt_failed(f: Facts, plan: Plan) -> tuple[Reason, str] | None:
    """Why the attempt in flight is rolled back (a slice failed, or the timeout), if it is."""
    started = f.old.attempt_start_time
    slices = f.obs.slices
    # A refused create of an absent pool belongs to the attempt that made it: a new attempt
    # (none started) creates the pool again instead of rolling back on the old answer.
    failed = [
        s
        for s in slices
        if s.pool_state == PoolState.FAILED
        or (s.error is not None and (started is not None or s.pool_state != PoolState.ABSENT))
    ]
    if failed:
        first = failed[0]
        err = first.error or PoolError(
            first.index, first.pool or "?", "ERROR", "pool in ERROR", False
        )
        return Reason.GANG_SLICE_FAILED, str(err)
    timeout = f.spec.provisioning.timeout_seconds if f.spec else 0
    if started is not None and (f.now - started).total_seconds() > timeout:
        pending = [str(s.index) for s in slices if not slice_ready(s, plan.shape.hosts)]
        return Reason.GANG_TIMEOUT, (
            f"slices {', '.join(pending)} not ready within spec.provisioning.timeoutSeconds "
            f"({timeout}s)"
        )
    return None


def _flex_wait(f: Facts, b: Builder, plan: Plan) -> Capacity | None:
    """Every slice that is not ready is a flex-start pool waiting for capacity."""
    unready = [s for s in f.obs.slices if s.index not in f.slices.ready]
    if not unready or len(f.obs.slices) != len(plan.pools):
        return None
    if any(s.index not in f.slices.waiting for s in unready):
        return None
    since = f.old.attempt_start_time or b.status.attempt_start_time or f.now
    b.status.attempt_start_time = since
    message = (
        f"waiting for flex-start capacity (Dynamic Workload Scheduler) for {len(unready)}/"
        f"{len(plan.pools)} node pools since {since.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    )
    b.cond(PROVISIONED, "False", Reason.WAITING_FOR_FLEX_START_CAPACITY, message)
    b.requeue_in(f.cfg.resync_seconds)
    return Capacity(False, Phase.PROVISIONING, message, with_pods=message)


def retry_message(b: Builder) -> str:
    # No countdown in the text: a status that changed every second would be rewritten every resync.
    cond = b.status.condition(PROVISIONED)
    reason = cond.message if cond else ""
    attempts = b.status.provisioning_attempts or 0
    when = b.status.next_attempt_time
    at = when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else "?"
    return f"gang attempt {attempts} rolled back ({reason}); next attempt at {at}"


def _advance(f: Facts, b: Builder, plan: Plan, new_attempt: bool) -> Capacity:
    _delete(b, [s for s in f.obs.slices if s.foreign])
    create_absent(f, b)
    if new_attempt:
        b.status.attempt_start_time = f.now
        b.status.provisioning_attempts = (f.old.provisioning_attempts or 0) + 1
        b.status.next_attempt_time = None
    ready, pools = len(f.slices.ready), len(plan.pools)
    message = f"provisioning {_pools(plan)} as a gang: {ready}/{pools} ready{stale_note(f.obs)}"
    waiting = [s for s in f.obs.slices if s.taken_by]
    if waiting:
        s = waiting[0]
        message += (
            f"; waiting for job {s.taken_by} (created after this one) to release node pool "
            f"{s.pool}, whose name collides with this job's"
        )
    b.cond(PROVISIONED, "False", Reason.PROVISIONING, message)
    b.requeue_in(f.cfg.resync_seconds)
    return Capacity(False, Phase.PROVISIONING, message)


def _pools(plan: Plan) -> str:
    """'4 node pools', or '4 node pools (3 slices + 1 spare)'."""
    n = len(plan.pools)
    spares = n - plan.slices
    if not spares:
        return f"{n} node pools"
    return f"{n} node pools ({plan.slices} slices + {spares} spare{'s' if spares > 1 else ''})"


def _delete(b: Builder, slices: list[SliceObservation]) -> None:
    b.delete_pools(str(s.pool) for s in slices if live(s))


def create_absent(f: Facts, b: Builder) -> None:
    """Every slice without a pool gets one (unless a create is already on its way)."""
    absent = tuple(
        s.index
        for s in f.obs.slices
        if s.pool_state == PoolState.ABSENT and not s.operation_pending and not s.taken_by
    )
    if absent:
        b.add(CreatePools(absent))


def _provisioned(f: Facts, b: Builder, plan: Plan) -> None:
    before = f.old.condition(PROVISIONED)
    b.cond(PROVISIONED, "True", Reason.GANG_READY, f"all {_pools(plan)} ready")
    if f.old.attempt_start_time is not None or before is None or before.status != "True":
        b.event(Reason.GANG_PROVISIONED, f"all {_pools(plan)} running and ready")
    b.status.attempt_start_time = None
    b.status.next_attempt_time = None


def _rollback(f: Facts, b: Builder, plan: Plan, reason: Reason, message: str) -> Capacity:
    full = f"{message}; deleting all {_pools(plan)} of the gang"
    return roll_back(f, b, NODE_POOLS.release, reason, full)


def roll_back(f: Facts, b: Builder, release: Callable[[Facts, Builder], object], reason: Reason,
              full: str) -> Capacity:  # fmt: skip
    """A gang attempt rolled back: `release` lets go of what it made, the next attempt waits out
    a backoff (every capacity model's, so their rollbacks read and pace alike)."""
    attempts = f.old.provisioning_attempts or 1
    wait = backoff_seconds(f.meta.uid, attempts, f.cfg)
    b.status.next_attempt_time = at_second(f.now + timedelta(seconds=wait))
    b.status.attempt_start_time = None
    b.status.provisioning_attempts = attempts
    release(f, b)
    b.cond(PROVISIONED, "False", reason, full)
    b.event(Reason.GANG_ROLLED_BACK, f"attempt {attempts}: {full}; retry in {wait:.0f}s")
    b.requeue_in(wait)
    return Capacity(False, Phase.PROVISIONING, retry_message(b), rolled_back=full)


# ---------------------------------------------------------------- repair: one slice at a time


def _repair(f: Facts, b: Builder, plan: Plan) -> Capacity:
    """The JobSet exists: replace the pool of any slice that lost its capacity, that slice only."""
    _announce_blips(f, b, plan)
    by_index = {s.index: s for s in f.obs.slices}
    lost = [by_index[i] for i in sorted(f.slices.lost)]
    _delete(b, [s for s in lost if not s.taken_by])
    create_absent(f, b)
    if not lost and not f.slices.blips:
        flex = _flex_wait(f, b, plan)
        if flex is not None:  # the JobSet exists and its pods wait for the pools' nodes
            return flex
    _announce_lost(f, b, plan, lost)
    _repair_condition(f, b, plan)
    return Capacity(
        f.slices.enough,
        repairing=frozenset(f.slices.lost),
        blips=frozenset(f.slices.blips),
        covered=f.slices.enough,
    )


def _announce_blips(f: Facts, b: Builder, plan: Plan) -> None:
    """A slice that went NotReady (once, when it starts) and one Ready again after it."""
    hosts, grace = plan.shape.hosts, f.cfg.not_ready_grace_seconds
    by_index = {s.index: s for s in f.obs.slices}
    for i, elapsed in sorted(f.slices.blips.items()):
        s = by_index[i]
        b.requeue_in(grace - elapsed)
        old = f.old.slice(i)
        if old is not None and old.not_ready_time is None:
            b.event(
                Reason.SLICE_NOT_READY,
                f"slice {i}: {s.ready_hosts}/{hosts} hosts Ready, {s.hosts_present} nodes "
                f"there; node pool {s.pool} is replaced if they are not Ready within {grace:.0f}s",
            )
    for s in f.obs.slices:
        old = f.old.slice(s.index)
        if old and old.not_ready_time and slice_ready(s, hosts):
            b.event(
                Reason.SLICE_READY,
                f"slice {s.index} is Ready again after a NotReady blip; nothing was replaced",
            )


def _announce_lost(f: Facts, b: Builder, plan: Plan, lost: list[SliceObservation]) -> None:
    """SliceLost, once per loss, by the pass that starts it, saying what the slices do then."""
    if f.slices.enough and not f.size.degraded:
        then = "a spare node pool takes its place: all slices restart now"
    elif plan.elastic is not None:
        then = (
            "all slices restart once it is ready, or on fewer slices (spec.elastic) if it is "
            f"not ready within {plan.elastic.wait_seconds}s"
        )
    else:
        then = "all slices restart once it is ready"
    for s in lost:
        old = f.old.slice(s.index)
        if not (old and old.lost_time):
            b.event(
                Reason.SLICE_LOST,
                f"slice {s.index} lost its capacity ({f.slices.lost[s.index]}); replacing node "
                f"pool {s.pool}; {then}",
            )


def _repair_condition(f: Facts, b: Builder, plan: Plan) -> None:
    """Provisioned while the gang is up: ready, running on fewer or on a spare, or repairing."""
    n, pools = len(f.slices.ready), len(plan.pools)
    if f.slices.all_ready:
        message = f"all {_pools(plan)} ready"
        if f.slices.blips:
            blips = ", ".join(str(i) for i in sorted(f.slices.blips))
            grace = f.cfg.not_ready_grace_seconds
            message += (
                f"; slice {blips} NotReady with its nodes there (replaced after {grace:.0f}s)"
            )
        b.cond(PROVISIONED, "True", Reason.GANG_READY, message)
        return
    if f.slices.enough and f.size.degraded:  # spec.elastic: on fewer slices meanwhile
        b.cond(
            PROVISIONED,
            "True",
            Reason.REPAIRING_DEGRADED,
            f"{n}/{pools} node pools ready: the job runs on {f.size.target} of "
            f"{plan.slices} slices (spec.elastic) while the lost pools are replaced",
        )
    elif f.slices.enough:  # a spare covers the loss: the job runs while the pool is replaced
        b.cond(
            PROVISIONED,
            "True",
            Reason.REPAIRING_SPARE,
            f"{n}/{pools} node pools ready, enough for the {plan.slices} slices; "
            "replacing the lost pool as the new spare",
        )
    else:
        b.cond(PROVISIONED, "False", Reason.REPAIRING, f"replacing lost slices: {n}/{pools} ready")
    b.requeue_in(f.cfg.resync_seconds)


NODE_POOLS = NodePools()


# ---------------------------------------------------------------- its other parts


def plan_pools(spec: MultisliceJobSpec, shape: catalog.SliceShape, namespace: str,
               name: str) -> dict[str, Any]:  # fmt: skip
    """One pool per slice, then one per hot spare (slice indexes slices..slices+spares-1)."""
    spares = range(spec.slices, spec.slices + spec.spares)
    return {
        "node_pools": node_pools_of(spec, shape, namespace, name, range(spec.slices)),
        "spare_pools": node_pools_of(spec, shape, namespace, name, spares),
    }


def observe(i: ObserveInputs) -> tuple[list[SliceObservation], FlexStartPools | None]:
    """Each of the plan's pools as the cloud lists it, with its nodes (none without a GKE
    cluster configured: nothing is listed), and which of them are flex-start pools."""
    listed = i.gang.pools if i.gang is not None else {}
    flex = {
        spec.slice_index: pool.max_run_duration_s
        for spec in i.plan.pools
        if (pool := listed.get(spec.name)) is not None and pool.waits_for_capacity
    }
    return pool_slices(i), FlexStartPools(flex) if flex else None


def place(template: dict[str, Any], plan: Plan) -> None:
    """Only this job's own node pools (their nodes carry its key)."""
    template["spec"]["nodeSelector"][keys.JOB_KEY] = plan.job_key


DOCS = """\
A GKE node pool per slice and per hot spare, created as a gang, all or none; a lost slice's pool
is replaced alone; every pool is released when the job ends
([provisioning.md](provisioning.md#node-pools-managed-mode)). `status.capacity`: none.
"""


DESCRIPTION = (
    "the operator creates one GKE node pool per slice, all or none, and deletes them when the "
    "job ends."
)
PLUGIN = CapacityPlugin(
    MODE,
    NODE_POOLS,
    DESCRIPTION,
    accepts={
        Feature.SPARES: "spare node pools",
        Feature.ELASTIC: "",
        Feature.FLEX_START: "flex-start node pools",
    },
    pools=plan_pools,
    observe=observe,
    place=place,
    own_slice_pools=True,
    docs=DOCS,
)


def register(r: Registry) -> None:
    r.add_model(PLUGIN)
