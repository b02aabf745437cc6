"""Capacity: Managed gang provisioning (all or none, rollback, backoff, repair) and Existing pools.

A step of the lifecycle: it returns what it found (`Capacity`: ready or not, the phase the job
waits in, a rollback) and records conditions, actions and events on the builder. The terminal
capacity verdicts (a pool name another job holds, a permanent error) are verdicts.py's. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from multislice_operator.api.models import ConditionType, Phase
from multislice_operator.plan import DEFAULT_POD_GRACE_SECONDS, Plan
from multislice_operator.pools import PoolError, PoolState
from multislice_operator.reconcile.context import Builder, at_second, backoff_seconds
from multislice_operator.reconcile.facts import Facts, live, slice_ready
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import CreatePools, SliceObservation

PROVISIONED = ConditionType.PROVISIONED
NO_PROVISIONER = (
    "spec.provisioning.mode is Managed but the operator has no GKE cluster configured "
    "(--gke-project/--gke-location/--gke-cluster); configure it or use mode: Existing"
)


@dataclass(frozen=True)
class Capacity:
    ready: bool
    phase: Phase | None = None  # the phase of a job that waits for its capacity
    message: str = ""
    rolled_back: str | None = None  # this pass rolled the gang back: why
    repairing: frozenset[int] = frozenset()  # slices whose lost pool is being replaced
    blips: frozenset[int] = frozenset()  # slices NotReady within the grace period
    # Lost pools (`repairing`) whose slices spare pools cover: the job runs meanwhile.
    covered: bool = False
    # Every slice ready or a flex-start pool waiting for capacity: the JobSet can exist (its
    # pending pods are what makes GKE scale a flex-start pool up); why it waits.
    flex_wait: str | None = None


def capacity(f: Facts, b: Builder, started: bool) -> Capacity:
    """`started`: the gang is up and its JobSet runs, so a lost slice is repaired alone;
    otherwise all or none."""
    assert f.plan is not None
    if f.plan.managed:
        return _gang(f, b, f.plan, started)
    return _existing(f, b, f.plan)


# ---------------------------------------------------------------- Existing mode


def _existing(f: Facts, b: Builder, plan: Plan) -> Capacity:
    ready = len(f.slices.ready)
    if f.slices.all_ready:
        b.cond(PROVISIONED, "True", Reason.EXISTING_NODE_POOLS, f"{ready} matching node pools")
        return Capacity(True)
    message = (
        f"waiting for {plan.slices} existing node pools with {plan.shape.hosts} Ready nodes "
        f"labelled {plan.shape.generation.gke_accelerator} / {plan.shape.topology}: "
        f"{ready} ready of {f.obs.existing_pools_found} found"
    )
    b.cond(PROVISIONED, "False", Reason.WAITING_FOR_NODE_POOLS, message)
    b.requeue_in(f.cfg.resync_seconds)
    return Capacity(False, Phase.PENDING, message)


# ---------------------------------------------------------------- Managed mode: the gang


def _gang(f: Facts, b: Builder, plan: Plan, gang_up: bool) -> Capacity:
    """All or none: every slice's pool is created together; any failure rolls the gang back."""
    obs, hosts = f.obs, plan.shape.hosts
    if not obs.provisioner_configured:
        b.cond(PROVISIONED, "False", Reason.PROVISIONER_NOT_CONFIGURED, NO_PROVISIONER)
        b.requeue_in(f.cfg.resync_seconds * 3)
        return Capacity(False, Phase.PENDING, NO_PROVISIONER)
    if gang_up:
        return _repair(f, b, plan)
    slices = obs.slices
    if len(slices) == len(plan.pools) and all(slice_ready(s, hosts) for s in slices):
        _provisioned(f, b, plan)
        return Capacity(True)
    flex = _flex_wait(f, b, plan)
    if flex is not None:  # not a failure: no rollback, no timeout while DWS queues it
        return flex
    next_at = f.old.next_attempt_time
    if next_at is not None and f.now < next_at:
        release(f, b)
        b.requeue_in((next_at - f.now).total_seconds())
        return Capacity(False, Phase.PROVISIONING, _retry_message(b))
    started = f.old.attempt_start_time
    # A refused create of an absent pool belongs to the attempt that made it: a new attempt
    # (none started) creates the pool again instead of rolling back on the old answer.
    failed = [
        s
        for s in slices
        if s.pool_state == PoolState.FAILED
        or (s.error is not None and (started is not None or s.pool_state != PoolState.ABSENT))
    ]
    timeout = f.spec.provisioning.timeout_seconds if f.spec else 0
    if failed:
        first = failed[0]
        err = first.error or PoolError(
            first.index, first.pool or "?", "ERROR", "pool in ERROR", False
        )
        return _rollback(f, b, plan, Reason.GANG_SLICE_FAILED, str(err))
    if started is not None and (f.now - started).total_seconds() > timeout:
        pending = [str(s.index) for s in slices if not slice_ready(s, hosts)]
        return _rollback(
            f,
            b,
            plan,
            Reason.GANG_TIMEOUT,
            f"slices {', '.join(pending)} not ready within spec.provisioning.timeoutSeconds "
            f"({timeout}s)",
        )
    return _advance(f, b, plan, started is None)


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
    return Capacity(False, Phase.PROVISIONING, message, flex_wait=message)


def _retry_message(b: Builder) -> str:
    # No countdown in the text: a status that changed every second would be rewritten every resync.
    cond = b.status.condition(PROVISIONED)
    reason = cond.message if cond else ""
    attempts = b.status.provisioning_attempts or 0
    when = b.status.next_attempt_time
    at = when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else "?"
    return f"gang attempt {attempts} rolled back ({reason}); next attempt at {at}"


def _advance(f: Facts, b: Builder, plan: Plan, new_attempt: bool) -> Capacity:
    _delete(b, [s for s in f.obs.slices if s.foreign])
    _create_absent(f, b)
    if new_attempt:
        b.status.attempt_start_time = f.now
        b.status.provisioning_attempts = (f.old.provisioning_attempts or 0) + 1
        b.status.next_attempt_time = None
    ready, pools = len(f.slices.ready), len(plan.pools)
    message = f"provisioning {_pools(plan)} as a gang: {ready}/{pools} ready"
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


def _create_absent(f: Facts, b: Builder) -> None:
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
    attempts = f.old.provisioning_attempts or 1
    wait = backoff_seconds(f.meta.uid, attempts, f.cfg)
    b.status.next_attempt_time = at_second(f.now + timedelta(seconds=wait))
    b.status.attempt_start_time = None
    b.status.provisioning_attempts = attempts
    release(f, b)
    full = f"{message}; deleting all {_pools(plan)} of the gang"
    b.cond(PROVISIONED, "False", reason, full)
    b.event(Reason.GANG_ROLLED_BACK, f"attempt {attempts}: {full}; retry in {wait:.0f}s")
    b.requeue_in(wait)
    return Capacity(False, Phase.PROVISIONING, _retry_message(b), rolled_back=full)


def _repair(f: Facts, b: Builder, plan: Plan) -> Capacity:
    """The JobSet exists: replace the pool of any slice that lost its capacity, that slice only."""
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
    lost = [by_index[i] for i in sorted(f.slices.lost)]
    _delete(b, [s for s in lost if not s.taken_by])
    _create_absent(f, b)
    if not lost and not f.slices.blips:
        flex = _flex_wait(f, b, plan)
        if flex is not None:  # the JobSet exists and its pods wait for the pools' nodes
            return flex
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
        if not (old and old.lost_time):  # announced once per loss, by the pass that starts it
            b.event(
                Reason.SLICE_LOST,
                f"slice {s.index} lost its capacity ({f.slices.lost[s.index]}); replacing node "
                f"pool {s.pool}; {then}",
            )
    if f.slices.all_ready:
        message = f"all {_pools(plan)} ready"
        if f.slices.blips:
            blips = ", ".join(str(i) for i in sorted(f.slices.blips))
            message += (
                f"; slice {blips} NotReady with its nodes there (replaced after {grace:.0f}s)"
            )
        b.cond(PROVISIONED, "True", Reason.GANG_READY, message)
    elif f.slices.enough and f.size.degraded:  # spec.elastic: on fewer slices meanwhile
        n = len(f.slices.ready)
        b.cond(
            PROVISIONED,
            "True",
            Reason.REPAIRING_DEGRADED,
            f"{n}/{len(plan.pools)} node pools ready: the job runs on {f.size.target} of "
            f"{plan.slices} slices (spec.elastic) while the lost pools are replaced",
        )
        b.requeue_in(f.cfg.resync_seconds)
    elif f.slices.enough:  # a spare covers the loss: the job runs while the pool is replaced
        n = len(f.slices.ready)
        b.cond(
            PROVISIONED,
            "True",
            Reason.REPAIRING_SPARE,
            f"{n}/{len(plan.pools)} node pools ready, enough for the {plan.slices} slices; "
            "replacing the lost pool as the new spare",
        )
        b.requeue_in(f.cfg.resync_seconds)
    else:
        n = len(f.slices.ready)
        b.cond(
            PROVISIONED,
            "False",
            Reason.REPAIRING,
            f"replacing lost slices: {n}/{len(plan.pools)} ready",
        )
        b.requeue_in(f.cfg.resync_seconds)
    return Capacity(
        f.slices.enough,
        repairing=frozenset(f.slices.lost),
        blips=frozenset(f.slices.blips),
        covered=f.slices.enough,
    )


# ---------------------------------------------------------------- releasing


def strays(f: Facts) -> list[str]:
    gone = (PoolState.ABSENT, PoolState.DELETING)
    return [name for name, state in sorted(f.obs.strays.items()) if state not in gone]


def pools_present(f: Facts) -> list[str]:
    """Pools of ours that exist and are not already going away (deleting them again is harmless).
    A pool of our name that another live job owns is never ours to delete."""
    return [str(s.pool) for s in f.obs.slices if live(s) and not s.taken_by] + strays(f)


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
    """`release` once the job's JobSet is stopped (`stop_wait`)."""
    wait = stop_wait(f)
    if wait is not None:
        b.requeue_in(wait)
        return Released.STOPPING
    return Released.ALL if release(f, b) else Released.RELEASING


def release(f: Facts, b: Builder) -> bool:
    """Delete every pool of the job (its plan's, and any other labelled with its uid); True when
    none is left."""
    # An Existing job's slices are pools of the cluster, not ours: only its strays are released.
    slices = f.obs.slices if f.managed else []
    b.delete_pools(pools_present(f) if f.managed else strays(f))
    remaining = [s for s in slices if s.pool_state != PoolState.ABSENT and not s.taken_by]
    left = [n for n, state in f.obs.strays.items() if state != PoolState.ABSENT]
    if remaining or left:
        b.requeue_in(f.cfg.resync_seconds / 2)
    return not remaining and not left
