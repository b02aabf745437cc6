"""Restarts by cause, and the budget each cause is charged to. Pure.

Every restart of all slices is the JobSet's (render/jobset.py's failure policy):

- a pod with the DisruptionTarget condition (preemption, graceful node shutdown, eviction, the
  pod garbage collector removing the pods of a vanished node) fails its Job through the Job's
  podFailurePolicy rule 0; the JobSet rule `Disruption` matches that Job's failure message and
  restarts every slice with RestartJobSetAndIgnoreMaxRestarts: status.restarts goes up,
  restartsCountTowardsMax does not;
- any other retryable failure gets JobSet's default, RestartJobSet: both go up, and the JobSet
  fails (ReachedMaxRestarts) once restartsCountTowardsMax reaches failurePolicy.maxRestarts.

So the JobSet's own two counters say which restarts were charged; the pods say why. Charged
restarts are the program's: `hang` when a pod of the attempt that ended exited with the hang
code (or said hang in its termination message), else `workload`. Restarts not charged are
`startup` when the operator evicted the pods of that attempt itself (startup.py), else
`disruption`. JobSet does not bound the restarts it does not charge: the operator fails the job
once they exceed failurePolicy.maxDisruptionRestarts (verdicts.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from multislice_operator.api.models import (
    BUDGET_OF_CAUSE,
    EXIT_HANG,
    Budget,
    MultisliceJobSpec,
    MultisliceJobStatus,
    RestartCause,
    RestartsByCause,
)
from multislice_operator.reconcile.restart_strategy import Chosen, unique
from multislice_operator.reconcile.types import JobSetObservation, Pod

C = RestartCause
HANG_REASON = "hang"  # the termination message reason of EXIT_HANG (docs/environment.md section 2)


@dataclass(frozen=True)
class Attribution:
    """status.restartsByCause after this pass, and the cause of the newest restart counted now
    (None: the JobSet made no restart since the status was written)."""

    by_cause: RestartsByCause | None
    new: int = 0
    cause: RestartCause | None = None


def failure_cause(p: Pod) -> RestartCause:
    """What one pod failure counts as."""
    if p.disruption:
        return C.DISRUPTION
    reason = p.termination.reason if p.termination else None
    if p.exit_code == EXIT_HANG or reason == HANG_REASON:
        return C.HANG
    return C.WORKLOAD


STOPPED = frozenset({128 + 15, 128 + 9})  # SIGTERM, SIGKILL: how a pod's deletion ends it


def first_failure(failures: Sequence[Pod]) -> Pod | None:
    """The failure that ended the latest attempt: of that attempt's failed pods, the first to
    fail. The restart it causes stops every other pod (a kubelet reports them Failed, 143 or 137,
    before they go), so they come later; within a second, a pod that was not stopped, then one
    that said where the run stood (its termination message), first."""
    if not failures:
        return None
    last = max(p.attempt for p in failures)

    def key(p: Pod) -> tuple[bool, datetime, bool, bool, str]:
        said = p.termination is not None and p.termination.step is not None
        at = p.failed_at or datetime.max.replace(tzinfo=UTC)
        return (p.failed_at is None, at, p.exit_code in STOPPED, not said, p.name)

    return min((p for p in failures if p.attempt == last), key=key)


def _seed(old: MultisliceJobStatus, js: JobSetObservation) -> RestartsByCause:
    """The split so far. A status written before restarts were split (an older operator) has
    only the total: the restarts JobSet charged are the program's, the others disruptions."""
    if old.restarts_by_cause is not None:
        return old.restarts_by_cause.model_copy()
    charged = min(old.restarts, js.restarts_counted)
    return RestartsByCause(workload=charged, disruption=old.restarts - charged)


def _made(before: int, js: JobSetObservation, chosen: Chosen) -> Counter[RestartCause]:
    """Restarts the operator's own strategies made (a JobSet recreated on another slice count:
    its first attempt is a restart of every slice), by cause."""
    made: Counter[RestartCause] = Counter()
    for s in unique(chosen):
        made.update(s.restarts_made(before, js))
    return made


def attribute(
    old: MultisliceJobStatus, js: JobSetObservation | None, failures: Sequence[Pod],
    chosen: Chosen,
) -> Attribution:  # fmt: skip
    """Split the restarts the JobSet made since the status was written by cause."""
    before = old.restarts
    if js is None or js.restarts - before <= 0:
        return Attribution(old.restarts_by_cause)
    new = js.restarts - before
    by = _seed(old, js)
    made = _made(before, js, chosen)
    for cause, n in made.items():
        by.add(cause, n)
    own = sum(made.values())
    charged = min(new - own, max(0, js.restarts_counted - by.program()))
    free = new - own - charged
    # The failures behind these restarts were seen on pods of the attempts that just ended.
    ending = [p for p in failures if before <= p.attempt < js.restarts]
    causes = [failure_cause(p) for p in ending]
    added: list[RestartCause] = []
    if free:
        started = old.startup
        evicted = started is not None and started.evicted and before <= started.attempt
        cause = C.STARTUP if evicted else C.DISRUPTION
        by.add(cause, free)
        added.append(cause)
    if charged:
        cause = C.HANG if C.HANG in causes else C.WORKLOAD
        by.add(cause, charged)
        added.append(cause)
    added += list(made)
    latest = first_failure(ending)
    newest = failure_cause(latest) if latest is not None else None
    return Attribution(by, new, newest if newest in added else added[-1])


def budget_note(spec: MultisliceJobSpec, by: RestartsByCause, cause: RestartCause) -> str:
    fp = spec.failure_policy
    if BUDGET_OF_CAUSE[cause] == Budget.NONE:
        return "charged to no budget: the operator resized the job (spec.elastic)"
    if BUDGET_OF_CAUSE[cause] == Budget.MAX_RESTARTS:
        return f"{by.program()}/{fp.max_restarts} of spec.failurePolicy.maxRestarts"
    return (
        f"not charged to maxRestarts; {by.not_program()}/{fp.max_disruption_restarts} of "
        "spec.failurePolicy.maxDisruptionRestarts"
    )


def over_budget(by: RestartsByCause | None, spec: MultisliceJobSpec) -> str | None:
    """Why the job fails now: more restarts not caused by the program than
    maxDisruptionRestarts allows (the JobSet would go on restarting)."""
    budget = spec.failure_policy.max_disruption_restarts
    if by is None or by.not_program() <= budget:
        return None
    return (
        f"restarted {by.not_program()} times for disruptions ({by.disruption}) and startup "
        f"deadlines ({by.startup}), more than spec.failurePolicy.maxDisruptionRestarts "
        f"({budget}): the capacity keeps failing (a broken zone or pool?); the JobSet is "
        "deleted"
    )


def max_restarts_message(
    by: RestartsByCause | None, spec: MultisliceJobSpec, js: JobSetObservation
) -> str:
    """The JobSet reached maxRestarts: only the program's own failures count there."""
    by = by or RestartsByCause(workload=js.restarts_counted)
    counted = max(js.restarts_counted, by.program())
    others = by.not_program()
    note = f"; {others} disruption/startup restarts not counted" if others else ""
    return (
        f"restarted {counted} times for the program's own failures (workload {by.workload}, "
        f"hang {by.hang}), reaching spec.failurePolicy.maxRestarts "
        f"({spec.failure_policy.max_restarts}){note}"
    )
