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

from multislice_operator.api.models import Phase, StartupStatus
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts, live
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import EvictPods, Pod, SliceObservation

TIMED_PHASES = (Phase.STARTING, Phase.RESTARTING)


def check(f: Facts, b: Builder, phase: Phase, repairing: bool) -> None:
    """The deadline counts from the later of two facts: since when every slice's capacity has
    been ready (status.capacityReadyTime, the one clock) and when this attempt began (or the
    operator last acted on it: status.startup.since)."""
    spec, js, plan = f.spec, f.js, f.plan
    timeout = spec.failure_policy.startup_timeout_seconds if spec else None
    if timeout is None or js is None or plan is None or js.suspended or phase not in TIMED_PHASES:
        b.status.startup = None
        return
    old = f.old.startup
    if old is not None and old.attempt == js.restarts:
        timing = old.model_copy(deep=True)
    else:
        timing = StartupStatus(attempt=js.restarts)
    b.status.startup = timing
    if timing.since is None:
        timing.since = f.now
    ready_since = f.capacity_ready_since
    if ready_since is None or repairing:
        return  # a slice being provisioned or repaired stops the clock: that has its own timeout
    start = max(timing.since, ready_since)
    left = (start + timedelta(seconds=timeout) - f.now).total_seconds()
    if left > 0:
        b.requeue_in(left)
        return
    if f.scheduling is not None and f.scheduling.unseen_since is not None:
        return  # no scheduler looked at any pod: no new pool or restart helps (the grace's)
    _act(f, b, plan, timing, timeout)


def _act(f: Facts, b: Builder, plan: Plan, timing: StartupStatus, timeout: int) -> None:
    # What follows replaces the pods or pauses the capacity clock: the clocks of pods waiting
    # for a node are kept from here on, so that this does not reset them (scheduling.py).
    b.status.scheduling = f.scheduling
    pods = [p for p in f.live_pods if p.attempt == timing.attempt and not p.deleting]
    running, slow = _slow_slices(f, plan, pods)
    if not slow:  # every pod runs (or ran); the JobSet has not said so yet
        b.requeue_in(f.cfg.resync_seconds)
        return
    unschedulable = {
        i for i in slow if any(p.slice_index == i and p.unschedulable_since for p in pods)
    }
    head = _head(timeout, plan.shape.hosts, running, slow, unschedulable)
    free = _free_pools(f, plan, timing, pods, len(unschedulable))
    if free:
        _replace_pools(f, b, timing, free, head)
        return
    _evict(f, b, timing, timeout, pods, slow, head)


def _slow_slices(f: Facts, plan: Plan, pods: list[Pod]) -> tuple[dict[int, int], list[int]]:
    """Running pods per slice of the JobSet, and the slices with fewer running (or finished)
    pods than hosts."""
    slices = range(f.active)  # the JobSet's: fewer than spec.slices while an elastic job shrank
    running = {i: sum(1 for p in pods if p.slice_index == i and p.running) for i in slices}
    done = f.succeeded  # a slice that finished already is not slow
    slow = [i for i in slices if running[i] + done.get(i, 0) < plan.shape.hosts]
    return running, slow


def _head(
    timeout: int, hosts: int, running: dict[int, int], slow: list[int], unschedulable: set[int]
) -> str:
    """The event's first sentence: the deadline and each slow slice's running pods."""
    what = "; ".join(
        f"slice {i}: {running[i]}/{hosts} pods running"
        + (" (unschedulable)" if i in unschedulable else "")
        for i in slow
    )
    return (
        f"not every pod runs {timeout}s after the capacity was ready "
        f"(spec.failurePolicy.startupTimeoutSeconds): {what}"
    )


def _free_pools(
    f: Facts, plan: Plan, timing: StartupStatus, pods: list[Pod], wanted: int
) -> list[SliceObservation]:
    """The pools no pod of this attempt got (Managed): where the unschedulable pods should go;
    at most `wanted`, each replaced once per attempt."""
    if not f.capacity.replaces_idle_pools:
        return []
    occupied = {p.pool for p in pods if p.pool and p.node}
    return [
        s
        for s in sorted(f.obs.slices, key=lambda s: s.index)
        if live(s) and s.pool not in occupied and s.index not in timing.repaired
    ][:wanted]


def _replace_pools(
    f: Facts, b: Builder, timing: StartupStatus, free: list[SliceObservation], head: str
) -> None:
    pools = tuple(str(s.pool) for s in free)
    b.delete_pools(pools)
    timing.repaired = sorted({*timing.repaired, *(s.index for s in free)})
    timing.since = f.now  # the replaced pool's capacity restarts the clock anyway
    b.event(
        Reason.STARTUP_DEADLINE_EXCEEDED,
        f"{head}; replacing node pool {', '.join(pools)}, on which no pod of the job could "
        "schedule",
        cause="startup",
    )


def _evict(
    f: Facts,
    b: Builder,
    timing: StartupStatus,
    timeout: int,
    pods: list[Pod],
    slow: list[int],
    head: str,
) -> None:
    """Every slice restarts: evict the slow slices' pods that do not run."""
    victims = [p.name for p in pods if p.slice_index in slow and not p.running]
    if not victims:  # the slow slice has no pod to evict: any pod restarts every slice
        victims = [p.name for p in pods][:1]
    timing.since = f.now  # look again after another deadline if no restart follows
    b.requeue_in(timeout)
    if not victims:
        return
    b.add(EvictPods(tuple(sorted(victims))))
    timing.evicted = True
    b.event(
        Reason.STARTUP_DEADLINE_EXCEEDED,
        f"{head}; restarting all slices (cause startup, charged to maxDisruptionRestarts): "
        f"evicting {len(victims)} pod{'s' if len(victims) > 1 else ''} of slice "
        f"{', '.join(map(str, slow))}",
        cause="startup",
    )
