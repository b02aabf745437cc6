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


def slice_ready(s: SliceObservation, hosts: int) -> bool:
    return (
        s.pool_state in (PoolState.READY, PoolState.UPDATING)
        and s.ready_hosts >= hosts
        and not s.foreign
    )


def slice_lost(s: SliceObservation, seen_ready: bool) -> bool:
    """Capacity that was there is gone: pool broken or deleted, or its nodes disappeared.

    A READY pool without Ready nodes is only lost if its nodes were seen Ready since it was
    created (`seen_ready`): a fresh pool's nodes take a moment to register.
    """
    if s.foreign or s.pool_state in (PoolState.FAILED, PoolState.ABSENT, PoolState.DELETING):
        return True
    return (
        s.pool_state in (PoolState.READY, PoolState.DEGRADED) and s.ready_hosts == 0 and seen_ready
    )


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
    foreign = [
        s.pool
        for s in ctx.obs.slices
        if s.foreign and s.pool and s.pool_state not in (PoolState.ABSENT, PoolState.DELETING)
    ]
    if foreign:
        ctx.actions.append(DeletePools(tuple(p for p in foreign if p)))
    creatable = tuple(
        s.index
        for s in ctx.obs.slices
        if s.pool_state == PoolState.ABSENT and not s.operation_pending
    )
    if creatable:
        ctx.actions.append(CreatePools(creatable))
    if new_attempt:
        ctx.status.attempt_start_time = ctx.now
        ctx.status.provisioning_attempts = (ctx.old.provisioning_attempts or 0) + 1
        ctx.status.next_attempt_time = None
    ready = sum(1 for s in ctx.obs.slices if slice_ready(s, plan.shape.hosts))
    message = f"provisioning {plan.slices} node pools as a gang: {ready}/{plan.slices} ready"
    ctx.cond(PROVISIONED, "False", "Provisioning", message)
    ctx.phase(Phase.PROVISIONING, message)
    ctx.requeue_in(ctx.cfg.resync_seconds)


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


def gang_failed(ctx: Ctx, plan: Plan, err: PoolError) -> None:
    release(ctx, plan)
    message = f"{err}; retrying cannot help, fix the spec or the project and recreate the job"
    ctx.cond(PROVISIONED, "False", "ProvisioningFailed", message)
    ctx.cond(ConditionType.FAILED, "True", "ProvisioningFailed", message)
    ctx.status.completion_time = ctx.now
    ctx.phase(Phase.FAILED, message)


def _repair(ctx: Ctx, plan: Plan) -> bool:
    """The JobSet exists: replace the pool of any slice that lost its capacity, that slice only."""
    hosts = plan.shape.hosts
    lost = [s for s in ctx.obs.slices if slice_lost(s, _seen_ready(ctx, s.index))]
    broken = tuple(
        s.pool
        for s in lost
        if s.pool and s.pool_state not in (PoolState.ABSENT, PoolState.DELETING)
    )
    if broken:
        ctx.actions.append(DeletePools(tuple(p for p in broken if p)))
    absent = tuple(
        s.index
        for s in ctx.obs.slices
        if s.pool_state == PoolState.ABSENT and not s.operation_pending
    )
    if absent:
        ctx.actions.append(CreatePools(absent))
    for s in lost:
        why = (
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
                f"slice {s.index} lost its capacity ({why}); replacing node pool {s.pool}; "
                "all slices restart once it is ready",
            )
    ready = all(slice_ready(s, hosts) for s in ctx.obs.slices)
    if ready:
        ctx.cond(PROVISIONED, "True", "GangReady", f"all {plan.slices} node pools ready")
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


def pools_present(ctx: Ctx) -> list[str]:
    """Pools that exist and are not already going away (deleting them again is harmless)."""
    return [
        s.pool
        for s in ctx.obs.slices
        if s.pool and s.pool_state not in (PoolState.ABSENT, PoolState.DELETING)
    ]


def release(ctx: Ctx, plan: Plan) -> bool:
    """Delete every pool of a Managed job; True when none is left."""
    if not plan.managed:
        return True
    present = pools_present(ctx)
    if present:
        ctx.actions.append(DeletePools(tuple(present)))
    remaining = [s for s in ctx.obs.slices if s.pool_state != PoolState.ABSENT]
    if remaining:
        ctx.requeue_in(ctx.cfg.resync_seconds / 2)
    return not remaining
