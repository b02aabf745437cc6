"""Capacity: Managed gang provisioning (all or none, rollback, backoff, repair) and Existing pools.

Returns whether every slice has its capacity now; records conditions, actions and events on the
context. Pure.
"""

from __future__ import annotations

from datetime import timedelta

from multislice_operator.api.models import ConditionType, MultisliceJobSpec, Phase
from multislice_operator.plan import Plan
from multislice_operator.provisioning.base import PoolError, PoolState
from multislice_operator.reconcile.context import Ctx, at_second, backoff_seconds
from multislice_operator.reconcile.types import CreatePools, DeletePools, SliceObservation

PROVISIONED = ConditionType.PROVISIONED
NO_PROVISIONER = (
    "spec.provisioning.mode is Managed but the operator has no GKE cluster configured "
    "(--gke-project/--gke-location/--gke-cluster); configure it or use mode: Existing"
)


NAME_TAKEN = "PoolNameTaken"


def slice_ready(s: SliceObservation, hosts: int) -> bool:
    return (
        s.pool_state in (PoolState.READY, PoolState.UPDATING)
        and s.ready_hosts >= hosts
        and not s.foreign
        and not s.taken_by
    )


def slice_lost(s: SliceObservation, seen_ready: bool) -> bool:
    """Capacity that was there is gone: pool broken or deleted, or its nodes disappeared.

    A READY pool without nodes is only lost if its nodes were seen Ready since it was created
    (`seen_ready`): a fresh pool's nodes take a moment to register. Nodes that are there but not
    Ready are a blip until the grace period passes (see `_repair`), not a loss.
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


def _not_ready_for(ctx: Ctx, s: SliceObservation, hosts: int) -> float | None:
    """Seconds a once-ready slice has had fewer Ready hosts than it needs while its pool is up;
    None when it is not in that state."""
    old = ctx.old.slice(s.index)
    if old is None or not old.seen_ready or slice_ready(s, hosts):
        return None
    if s.pool_state not in (PoolState.READY, PoolState.DEGRADED, PoolState.UPDATING):
        return None
    since = old.not_ready_time or ctx.now
    return (ctx.now - since).total_seconds()


def capacity_ready(
    ctx: Ctx, spec: MultisliceJobSpec, plan: Plan, started: bool | None = None
) -> bool:
    """`started`: the gang is already up and its JobSet runs, so a lost slice is repaired alone;
    otherwise all or none. Default: the JobSet exists. A queued job's JobSet exists (suspended)
    before its gang: Kueue mode says which (reconcile/queue.py)."""
    if plan.managed:
        return _gang(ctx, spec, plan, ctx.obs.jobset is not None if started is None else started)
    return _existing(ctx, plan)


# ---------------------------------------------------------------- Existing mode


def _existing(ctx: Ctx, plan: Plan) -> bool:
    ready = [s for s in ctx.obs.slices if slice_ready(s, plan.shape.hosts)]
    if len(ready) >= plan.slices:
        ctx.cond(PROVISIONED, "True", "ExistingNodePools", f"{len(ready)} matching node pools")
        return True
    message = (
        f"waiting for {plan.slices} existing node pools with {plan.shape.hosts} Ready nodes "
        f"labelled {plan.shape.generation.gke_accelerator} / {plan.shape.topology}: "
        f"{len(ready)} ready of {ctx.obs.existing_pools_found} found"
    )
    ctx.cond(PROVISIONED, "False", "WaitingForNodePools", message)
    if ctx.obs.jobset is None:
        ctx.phase(Phase.PENDING, message)
    ctx.requeue_in(ctx.cfg.resync_seconds)
    return False


# ---------------------------------------------------------------- Managed mode: the gang


def _gang(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan, gang_up: bool) -> bool:
    """All or none: every slice's pool is created together; any failure rolls the gang back."""
    obs, hosts = ctx.obs, plan.shape.hosts
    if not obs.provisioner_configured:
        ctx.cond(PROVISIONED, "False", "ProvisionerNotConfigured", NO_PROVISIONER)
        ctx.phase(Phase.PENDING, NO_PROVISIONER)
        ctx.requeue_in(ctx.cfg.resync_seconds * 3)
        return False
    taken = [s for s in obs.slices if s.taken_by and s.taken_by_older]
    if taken:
        _name_taken(ctx, plan, taken[0])
        return False
    permanent = [s.error for s in obs.slices if s.error and s.error.permanent]
    if obs.offered_error is not None and not gang_up and not pools_present(ctx):
        permanent.insert(0, obs.offered_error)  # only matters before the first pool exists
    if permanent:
        gang_failed(ctx, plan, permanent[0])
        return False
    if gang_up:
        return _repair(ctx, plan)
    slices = obs.slices
    if len(slices) == plan.slices and all(slice_ready(s, hosts) for s in slices):
        _provisioned(ctx, plan)
        return True
    next_at = ctx.old.next_attempt_time
    if next_at is not None and ctx.now < next_at:
        release(ctx, plan)
        ctx.phase(Phase.PROVISIONING, _retry_message(ctx))
        ctx.requeue_in((next_at - ctx.now).total_seconds())
        return False
    started = ctx.old.attempt_start_time
    # A refused create of an absent pool belongs to the attempt that made it: a new attempt
    # (none started) creates the pool again instead of rolling back on the old answer.
    failed = [
        s
        for s in slices
        if s.pool_state == PoolState.FAILED
        or (s.error is not None and (started is not None or s.pool_state != PoolState.ABSENT))
    ]
    timeout = spec.provisioning.timeout_seconds
    if failed:
        first = failed[0]
        err = first.error or PoolError(
            first.index, first.pool or "?", "ERROR", "pool in ERROR", False
        )
        _rollback(ctx, plan, "SliceFailed", str(err))
        return False
    if started is not None and (ctx.now - started).total_seconds() > timeout:
        pending = [str(s.index) for s in slices if not slice_ready(s, hosts)]
        _rollback(
            ctx,
            plan,
            "Timeout",
            f"slices {', '.join(pending)} not ready within spec.provisioning.timeoutSeconds "
            f"({timeout}s)",
        )
        return False
    _advance(ctx, plan, started is None)
    return False


def _retry_message(ctx: Ctx) -> str:
    # No countdown in the text: a status that changed every second would be rewritten every resync.
    cond = ctx.status.condition(PROVISIONED)
    reason = cond.message if cond else ""
    attempts = ctx.status.provisioning_attempts or 0
    when = ctx.status.next_attempt_time
    at = when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else "?"
    return f"gang attempt {attempts} rolled back ({reason}); next attempt at {at}"


def _advance(ctx: Ctx, plan: Plan, new_attempt: bool) -> None:
    _delete(ctx, [s for s in ctx.obs.slices if s.foreign])
    _create_absent(ctx)
    if new_attempt:
        ctx.status.attempt_start_time = ctx.now
        ctx.status.provisioning_attempts = (ctx.old.provisioning_attempts or 0) + 1
        ctx.status.next_attempt_time = None
    ready = sum(1 for s in ctx.obs.slices if slice_ready(s, plan.shape.hosts))
    message = f"provisioning {plan.slices} node pools as a gang: {ready}/{plan.slices} ready"
    waiting = [s for s in ctx.obs.slices if s.taken_by]
    if waiting:
        s = waiting[0]
        message += (
            f"; waiting for job {s.taken_by} (created after this one) to release node pool "
            f"{s.pool}, whose name collides with this job's"
        )
    ctx.cond(PROVISIONED, "False", "Provisioning", message)
    ctx.phase(Phase.PROVISIONING, message)
    ctx.requeue_in(ctx.cfg.resync_seconds)


def live(s: SliceObservation) -> bool:
    """The slice's pool exists and is not already going away."""
    return bool(s.pool) and s.pool_state not in (PoolState.ABSENT, PoolState.DELETING)


def _delete(ctx: Ctx, slices: list[SliceObservation]) -> None:
    pools = tuple(str(s.pool) for s in slices if live(s))
    if pools:
        ctx.actions.append(DeletePools(pools))


def _create_absent(ctx: Ctx) -> None:
    """Every slice without a pool gets one (unless a create is already on its way)."""
    absent = tuple(
        s.index
        for s in ctx.obs.slices
        if s.pool_state == PoolState.ABSENT and not s.operation_pending
    )
    if absent:
        ctx.actions.append(CreatePools(absent))


def _provisioned(ctx: Ctx, plan: Plan) -> None:
    ctx.cond(PROVISIONED, "True", "GangReady", f"all {plan.slices} node pools ready")
    if ctx.status.attempt_start_time is not None or ctx.status.provisioned_time is None:
        ctx.status.provisioned_time = ctx.now
        ctx.event("Normal", "GangProvisioned", f"all {plan.slices} node pools running and ready")
    ctx.status.attempt_start_time = None
    ctx.status.next_attempt_time = None


def _rollback(ctx: Ctx, plan: Plan, reason: str, message: str) -> None:
    attempts = ctx.old.provisioning_attempts or 1
    wait = backoff_seconds(ctx.meta.uid, attempts, ctx.cfg)
    ctx.status.next_attempt_time = at_second(ctx.now + timedelta(seconds=wait))
    ctx.status.attempt_start_time = None
    ctx.status.provisioning_attempts = attempts
    release(ctx, plan)
    full = f"{message}; deleting all {plan.slices} node pools of the gang"
    ctx.cond(PROVISIONED, "False", f"Gang{reason}", full)
    ctx.event("Warning", "GangRolledBack", f"attempt {attempts}: {full}; retry in {wait:.0f}s")
    ctx.rolled_back = full
    ctx.phase(Phase.PROVISIONING, _retry_message(ctx))
    ctx.requeue_in(wait)


def _name_taken(ctx: Ctx, plan: Plan, s: SliceObservation) -> None:
    release(ctx, plan)
    message = (
        f"node pool {s.pool} (slice {s.index}) belongs to job {s.taken_by}, which was created "
        "first: the two jobs' node pool names collide; nothing of that job is touched; rename "
        "this job and recreate it"
    )
    ctx.cond(PROVISIONED, "False", NAME_TAKEN, message)
    ctx.cond(ConditionType.FAILED, "True", NAME_TAKEN, message)
    ctx.status.completion_time = ctx.now
    ctx.phase(Phase.FAILED, message)


def gang_failed(ctx: Ctx, plan: Plan, err: PoolError) -> None:
    release(ctx, plan)
    message = f"{err}; retrying cannot help, fix the spec or the project and recreate the job"
    ctx.cond(PROVISIONED, "False", "ProvisioningFailed", message)
    ctx.cond(ConditionType.FAILED, "True", "ProvisioningFailed", message)
    ctx.status.completion_time = ctx.now
    ctx.phase(Phase.FAILED, message)


def _repair(ctx: Ctx, plan: Plan) -> bool:
    """The JobSet exists: replace the pool of any slice that lost its capacity, that slice only."""
    hosts, grace = plan.shape.hosts, ctx.cfg.not_ready_grace_seconds
    lost, why = [], {}
    for s in ctx.obs.slices:
        if slice_lost(s, _seen_ready(ctx, s.index)):
            lost.append(s)
            continue
        elapsed = _not_ready_for(ctx, s, hosts)
        if elapsed is None:
            continue
        if elapsed >= grace:
            lost.append(s)
            why[s.index] = f"{s.ready_hosts}/{hosts} hosts Ready, NotReady for {elapsed:.0f}s"
            continue
        ctx.not_ready.add(s.index)  # a blip: an event, not a repair
        ctx.requeue_in(grace - elapsed)
        old = ctx.old.slice(s.index)
        if old is not None and old.not_ready_time is None:
            ctx.event(
                "Warning",
                "SliceNotReady",
                f"slice {s.index}: {s.ready_hosts}/{hosts} hosts Ready, {s.hosts_present} nodes "
                f"there; node pool {s.pool} is replaced if they are not Ready within {grace:.0f}s",
            )
    for s in ctx.obs.slices:
        old = ctx.old.slice(s.index)
        if old and old.not_ready_time and slice_ready(s, hosts):
            ctx.event(
                "Normal",
                "SliceReady",
                f"slice {s.index} is Ready again after a NotReady blip; nothing was replaced",
            )
    _delete(ctx, [s for s in lost if not s.taken_by])
    _create_absent(ctx)
    for s in lost:
        reason = why.get(s.index) or (
            s.error.code
            if s.error
            else (
                "nodes gone"
                if s.pool_state in (PoolState.READY, PoolState.DEGRADED)
                else str(s.pool_state)
            )
        )
        ctx.repairing.add(s.index)
        if not _was_repairing(ctx, s.index):
            ctx.event(
                "Warning",
                "SliceLost",
                f"slice {s.index} lost its capacity ({reason}); replacing node pool {s.pool}; "
                "all slices restart once it is ready",
            )
    ready = all(slice_ready(s, hosts) or s.index in ctx.not_ready for s in ctx.obs.slices)
    if ready:
        message = f"all {plan.slices} node pools ready"
        if ctx.not_ready:
            blips = ", ".join(str(i) for i in sorted(ctx.not_ready))
            message += (
                f"; slice {blips} NotReady with its nodes there (replaced after {grace:.0f}s)"
            )
        ctx.cond(PROVISIONED, "True", "GangReady", message)
    else:
        n = sum(1 for s in ctx.obs.slices if slice_ready(s, hosts))
        ctx.cond(
            PROVISIONED, "False", "Repairing", f"replacing lost slices: {n}/{plan.slices} ready"
        )
        ctx.requeue_in(ctx.cfg.resync_seconds)
    return ready


def _seen_ready(ctx: Ctx, index: int) -> bool:
    old = ctx.old.slice(index)
    return bool(old and old.seen_ready)


def _was_repairing(ctx: Ctx, index: int) -> bool:
    # The SliceLost event is announced once per loss: the first pass that starts the repair.
    old = ctx.old.slice(index)
    return bool(old and old.lost_time)


# ---------------------------------------------------------------- releasing


def strays(ctx: Ctx) -> list[str]:
    gone = (PoolState.ABSENT, PoolState.DELETING)
    return [name for name, state in sorted(ctx.obs.strays.items()) if state not in gone]


def pools_present(ctx: Ctx) -> list[str]:
    """Pools of ours that exist and are not already going away (deleting them again is harmless).
    A pool of our name that another live job owns is never ours to delete."""
    return [str(s.pool) for s in ctx.obs.slices if live(s) and not s.taken_by] + strays(ctx)


def release(ctx: Ctx, plan: Plan | None) -> bool:
    """Delete every pool of the job (its plan's, and any other labelled with its uid); True when
    none is left."""
    # An Existing job's slices are pools of the cluster, not ours: only its strays are released.
    managed = plan is not None and plan.managed
    slices = ctx.obs.slices if managed else []
    present = pools_present(ctx) if managed else strays(ctx)
    if present:
        ctx.actions.append(DeletePools(tuple(present)))
    remaining = [s for s in slices if s.pool_state != PoolState.ABSENT and not s.taken_by]
    left = [n for n, state in ctx.obs.strays.items() if state != PoolState.ABSENT]
    if remaining or left:
        ctx.requeue_in(ctx.cfg.resync_seconds / 2)
    return not remaining and not left
