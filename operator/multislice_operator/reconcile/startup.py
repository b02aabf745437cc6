"""The startup deadline (failurePolicy.startupTimeoutSeconds). Pure.

A start or restart is timed from the moment every slice's capacity is ready (a slice being
provisioned or repaired stops the clock: that has its own timeout) until every slice runs. Past
the deadline the operator acts once, and again after another deadline if nothing changed:

- Managed, and a slow slice's pods cannot schedule: the job's ready node pool that hosts none
  of its pods (JobSet places each slice on a pool of its own, any of the job's) is replaced, once
  per pool and attempt; the other slices keep their pods and wait.
- Otherwise every slice restarts: the operator evicts the slow slices' pods that do not run
  (the Eviction API gives them the DisruptionTarget condition, so the JobSet's `Disruption` rule
  restarts every slice without charging maxRestarts) and the restart that follows has cause
  `startup`, charged to maxDisruptionRestarts (restarts.py).
"""

from __future__ import annotations

from datetime import timedelta

from multislice_operator.api.models import (
    ConditionType,
    MultisliceJobSpec,
    Phase,
    StartupStatus,
)
from multislice_operator.plan import Plan
from multislice_operator.reconcile.capacity import live
from multislice_operator.reconcile.context import Ctx
from multislice_operator.reconcile.types import DeletePools, EvictPods, PodObservation

TIMED_PHASES = (Phase.STARTING, Phase.RESTARTING)


def _capacity_ready(ctx: Ctx, plan: Plan) -> bool:
    if ctx.repairing:
        return False
    if not plan.managed:
        return True  # Existing pools are the JobSet's once it runs
    cond = ctx.status.condition(ConditionType.PROVISIONED)
    return cond is not None and cond.status == "True"


def _running(p: PodObservation) -> bool:
    return p.phase == "Running" and p.ready and not p.deleting


def check(ctx: Ctx, spec: MultisliceJobSpec, plan: Plan) -> None:
    timeout = spec.failure_policy.startup_timeout_seconds
    js = ctx.obs.jobset
    if (
        timeout is None
        or js is None
        or js.suspended
        or not js.owned
        or ctx.status.phase not in TIMED_PHASES
    ):
        ctx.status.startup = None
        return
    old = ctx.old.startup
    if old is not None and old.attempt == js.restarts:
        timing = old.model_copy(deep=True)
    else:
        timing = StartupStatus(attempt=js.restarts)
    ctx.status.startup = timing
    if not _capacity_ready(ctx, plan):
        timing.since = None
        return
    if timing.since is None:
        timing.since = ctx.now
    left = (timing.since + timedelta(seconds=timeout) - ctx.now).total_seconds()
    if left > 0:
        ctx.requeue_in(left)
        return
    _act(ctx, plan, timing, timeout)


def _act(ctx: Ctx, plan: Plan, timing: StartupStatus, timeout: int) -> None:
    hosts = plan.shape.hosts
    pods = [p for p in ctx.obs.pods if p.attempt == timing.attempt and not p.deleting]
    running = {
        i: sum(1 for p in pods if p.slice_index == i and _running(p)) for i in range(plan.slices)
    }
    done = ctx.obs.succeeded_pods  # a slice that finished already is not slow
    slow = [i for i in range(plan.slices) if running[i] + done.get(i, 0) < hosts]
    if not slow:  # every pod runs (or ran); the JobSet has not said so yet
        ctx.requeue_in(ctx.cfg.resync_seconds)
        return
    unschedulable = {i for i in slow if any(p.slice_index == i and p.unschedulable for p in pods)}
    what = "; ".join(
        f"slice {i}: {running[i]}/{hosts} pods running"
        + (" (unschedulable)" if i in unschedulable else "")
        for i in slow
    )
    head = (
        f"not every pod runs {timeout}s after the capacity was ready "
        f"(spec.failurePolicy.startupTimeoutSeconds): {what}"
    )
    # The pools no pod of this attempt got (Managed): where the unschedulable pods should go.
    occupied = {p.pool for p in pods if p.pool and p.node}
    free = [
        s
        for s in sorted(ctx.obs.slices, key=lambda s: s.index)
        if plan.managed and live(s) and s.pool not in occupied and s.index not in timing.repaired
    ][: len(unschedulable)]
    if free:
        pools = tuple(str(s.pool) for s in free)
        ctx.actions.append(DeletePools(pools))
        timing.repaired = sorted({*timing.repaired, *(s.index for s in free)})
        timing.since = None
        ctx.event(
            "Warning",
            "StartupDeadlineExceeded",
            f"{head}; replacing node pool {', '.join(pools)}, on which no pod of the job could "
            "schedule",
            cause="startup",
        )
        return
    victims = [p.name for p in pods if p.slice_index in slow and not _running(p)]
    if not victims:  # the slow slice has no pod to evict: any pod restarts every slice
        victims = [p.name for p in pods][:1]
    timing.since = ctx.now  # look again after another deadline if no restart follows
    ctx.requeue_in(timeout)
    if not victims:
        return
    ctx.actions.append(EvictPods(tuple(sorted(victims))))
    timing.evicted = True
    ctx.event(
        "Warning",
        "StartupDeadlineExceeded",
        f"{head}; restarting all slices (cause startup, charged to maxDisruptionRestarts): "
        f"evicting {len(victims)} pod{'s' if len(victims) > 1 else ''} of slice "
        f"{', '.join(map(str, slow))}",
        cause="startup",
    )
