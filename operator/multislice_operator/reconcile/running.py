"""Once the JobSet runs: its state says the phase; restarts are recorded and explained. Pure."""

from __future__ import annotations

from multislice_operator.api.models import (
    ConditionType,
    ExitCodePolicy,
    MultisliceJobSpec,
    Phase,
    PodFailureStatus,
)
from multislice_operator.reconcile import restarts
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import JobSetObservation, Pod

SLICES_READY = ConditionType.SLICES_READY
RUNS = (Phase.RUNNING, Phase.RESTARTING)  # the phases of a JobSet that ran and runs on


def describe(f: PodFailureStatus) -> str:
    code = f" with exit code {f.exit_code}" if f.exit_code is not None else ""
    disrupted = f" (DisruptionTarget: {f.disruption})" if f.disruption else ""
    return f"pod {f.pod} failed{code} {f.reason}".rstrip() + disrupted


def record(p: Pod) -> PodFailureStatus:
    t = p.termination
    return PodFailureStatus(
        pod=p.name,
        slice=p.slice_index,
        exit_code=p.exit_code,
        reason=p.reason,
        restart_attempt=p.attempt,
        step=t.step if t else None,
        checkpoint_step=t.checkpoint_step if t else None,
        cause=restarts.failure_cause(p).value,
        disruption=p.disruption,
    )


def why_failed(f: Facts, spec: MultisliceJobSpec, js: JobSetObservation) -> str:
    fp = spec.failure_policy
    for p in sorted(f.failures, key=lambda p: (-p.attempt, p.name)):
        if not p.disruption and fp.is_fatal(p.exit_code):
            where = f" (slice {p.slice_index})" if p.slice_index is not None else ""
            field = (
                "not in spec.failurePolicy.restartExitCodes"
                if fp.exit_code_policy == ExitCodePolicy.RESTART_IF_LISTED
                else "spec.failurePolicy.nonRetryableExitCodes"
            )
            return f"pod {p.name}{where} exited with non-retryable code {p.exit_code} ({field})"
    note = _last_failure_note(f)
    if "ReachedMaxRestarts" in js.failure_reason or (
        not js.failure_reason and js.restarts_counted >= fp.max_restarts
    ):
        return f"{restarts.max_restarts_message(f.restarts.by_cause, spec, js)}{note}"
    return f"JobSet failed: {js.failure_message}{note}"


def _last_failure_note(f: Facts) -> str:
    p = restarts.first_failure(f.failures)
    return f"; last failure: {describe(record(p))}" if p else ""


def count_restarts(f: Facts, b: Builder) -> None:
    """status.restarts, restartsByCause and lastFailure from the JobSet and its pods; the
    RestartingAllSlices event for a restart counted now."""
    js, spec = f.js, f.spec
    if js is None or spec is None:
        return
    seen = restarts.first_failure(f.failures)
    kept = b.status.last_failure
    # The failed pod is deleted by the restart; keep what it said for the event and users. Once
    # an attempt's failure is recorded it stays: the pods the restart stops fail after it.
    if seen is not None and (kept is None or (kept.restart_attempt or 0) < seen.attempt):
        b.status.last_failure = record(seen)
    b.status.restarts = max(f.old.restarts, js.restarts)
    b.status.restarts_by_cause = f.restarts.by_cause
    by, cause = f.restarts.by_cause, f.restarts.cause
    # A strategy that announces its own restarts (a resize: ShrinkingSlices, GrowingSlices).
    strategy = f.restart.get(cause) if cause is not None else None
    announced = strategy is not None and strategy.announces
    if f.restarts.new > 0 and cause is not None and not announced and by is not None:
        last = b.status.last_failure
        what = describe(last) if last else "a slice failed"
        b.event(
            Reason.RESTARTING_ALL_SLICES,
            f"restart {js.restarts} (cause {cause}: {restarts.budget_note(spec, by, cause)}): "
            f"{what}; all slices restart and resume from the last checkpoint",
            cause=cause.value,
        )


def running_phase(f: Facts, b: Builder, js: JobSetObservation, capacity_ready: bool
                  ) -> tuple[Phase, str]:  # fmt: skip
    assert f.plan is not None
    # The slices of this JobSet: fewer than spec.slices while an elastic job is shrunk.
    slices = js.replicas or f.size.target
    of = f" (of {f.plan.slices}: spec.elastic)" if slices < f.plan.slices else ""
    # A slice that already finished counts as running: slices rarely finish in the same second.
    up = js.up
    if up >= slices and capacity_ready:
        b.cond(SLICES_READY, "True", Reason.ALL_SLICES_RUNNING, f"{slices}/{slices} running{of}")
        if b.status.running_time is None:
            b.status.running_time = f.now
        return Phase.RUNNING, f"{slices}/{slices} slices running{of}"
    message = f"{up}/{slices} slices running"
    b.cond(SLICES_READY, "False", Reason.SLICES_STARTING, message)
    # A slice that stops while the job runs (before JobSet counts the restart). Not a job that
    # ran once and starts again after a hold (Kueue's preemption and resume, spec.suspend):
    # that is a start, no restart of all slices.
    was_running = b.status.running_time is not None and f.old.phase in RUNS
    if js.restarts > 0 or not capacity_ready or was_running:
        attempt = f"restart {js.restarts}" if js.restarts else "a slice stopped"
        return Phase.RESTARTING, f"restarting all slices ({attempt}): {message}"
    return Phase.STARTING, message
