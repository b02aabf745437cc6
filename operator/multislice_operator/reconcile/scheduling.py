"""Pods waiting for a node: two clocks that the operator's own actions do not reset. Pure.

Both are derived from the pods on every pass (a pod's creation, its PodScheduled condition) and
written to status.scheduling only once the startup deadline acts on them (startup.py), which would
otherwise reset them; from then on they are kept until they stop, so an ordinary start, whose
pods wait a moment for the scheduler, costs no status write.

A scheduler that serves a pod's schedulerName looks at it at once: kube-scheduler binds it or
writes PodScheduled=False (reason Unschedulable) with a FailedScheduling event, from the
profile that has that name (pkg/scheduler/schedule_one.go, handleSchedulingFailure). Two ways a
job's pods never run follow, and each has its clock in status.scheduling:

* `waiting_since`: a pod waits for a node (the scheduler's "no", or no scheduler looks at it)
  while every slice's capacity is ready. spec.failurePolicy.unschedulableTimeoutSeconds counts
  from it. It is kept through the startup deadline's own pool replacements and restarts (which
  replace the pods and pause the capacity clock) until every pod of an attempt was scheduled:
  the deadlines do not reset each other, and a job whose pods are never bound fails.
* `unseen_since`: no scheduler has looked at any pod of the job (Pending, no PodScheduled
  condition, no node): the scheduler named is not running. Past --scheduler-grace-seconds from
  the first such pod's creation the job fails (SchedulerNotRunning), whatever its timeouts.
* `pods_missing_since`: after the job ran (a restart since, or it was Running), a slice has no
  pod of the current attempt: a drained node's Job failed before JobSet recreates the slices, or
  a restart between its old pods going and the new coming, or the apiserver refusing them. Not
  derivable from the pods (they are gone), so it is written from the first pass that sees it;
  at a job's first start the capacity clock is the origin (no status write for an ordinary
  start). spec.failurePolicy.unschedulableTimeoutSeconds counts from it (PodsNotCreated).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from multislice_operator.api.models import MultisliceJobSpec, SchedulingStatus
from multislice_operator.reconcile.types import Pod

DEFAULT_SCHEDULER = "default-scheduler"  # a pod's spec.schedulerName when it names none


def clocks(
    old: SchedulingStatus | None,
    runs: bool,
    attempt: int,
    pods: Sequence[Pod],
    waiting: Sequence[Pod],
    ready_since: datetime | None,
    gap: bool,
    now: datetime,
) -> SchedulingStatus | None:
    """The clocks of this pass from the last ones: `pods` every pod of the job, `waiting` the
    current attempt's pods that wait for a node, `ready_since` the capacity clock (None: a slice
    is not ready now); `runs`: the job's JobSet runs (not suspended, not being deleted); `gap`:
    a slice of a job that ran has no pod of the current attempt (seen at `now`)."""
    if not runs:
        return None
    kept = old or SchedulingStatus()
    current = [p for p in pods if p.attempt == attempt and not p.deleting]
    waited = _waiting_since(kept.waiting_since, bool(current), waiting, ready_since)
    unseen = _unseen_since(kept.unseen_since, current, waiting)
    missing = _missing_since(kept.pods_missing_since, gap, ready_since, now)
    if waited is None and unseen is None and missing is None:
        return None
    return SchedulingStatus(waiting_since=waited, unseen_since=unseen, pods_missing_since=missing)


def _missing_since(kept: datetime | None, gap: bool, ready_since: datetime | None,
                   now: datetime) -> datetime | None:  # fmt: skip
    """Since when a slice of a job that ran has had no pod with every slice's capacity ready:
    from the first pass that saw it (nothing else records when its pods went), until every
    slice has one."""
    if not gap or ready_since is None:
        return None
    return kept if kept is not None else now


def _waiting_since(kept: datetime | None, current: bool, waiting: Sequence[Pod],
                   ready_since: datetime | None) -> datetime | None:  # fmt: skip
    """Since when a pod waits with every slice's capacity ready: kept once set, until every
    pod of an attempt (`current`: it has pods) was scheduled."""
    if waiting and kept is None and ready_since is not None:
        return max(min(_since(p) for p in waiting), ready_since)
    if not waiting and current:  # every pod of this attempt was scheduled
        return None
    return kept


def _unseen_since(kept: datetime | None, current: Sequence[Pod],
                  waiting: Sequence[Pod]) -> datetime | None:  # fmt: skip
    """Since when no scheduler looked at any pod: the first such pod's creation, until one of
    the current attempt's pods is looked at."""
    if any(p.looked_at for p in current):
        return None
    if kept is not None:
        return kept
    never = [_since(p) for p in waiting if not p.looked_at]
    return min(never) if never else None


def _since(pod: Pod) -> datetime:
    assert pod.unschedulable_since is not None  # every waiting pod has one (facts.py)
    return pod.unschedulable_since


def scheduler_name(spec: MultisliceJobSpec) -> str:
    """The scheduler the job's pods name (spec.template.spec.schedulerName, or the default)."""
    pod = spec.template.get("spec") or {}
    name = pod.get("schedulerName") if isinstance(pod, dict) else None
    return name if isinstance(name, str) and name else DEFAULT_SCHEDULER
