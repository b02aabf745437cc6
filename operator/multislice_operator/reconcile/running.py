"""Once the JobSet exists: its state drives the phase; restarts are counted and explained."""

from __future__ import annotations

from multislice_operator.api.models import (
    ConditionType,
    ExitCodePolicy,
    MultisliceJobSpec,
    Phase,
    PodFailureStatus,
)
from multislice_operator.plan import Plan
from multislice_operator.reconcile import restarts
from multislice_operator.reconcile.context import Ctx
from multislice_operator.reconcile.types import JobSetObservation, PodFailure

SLICES_READY = ConditionType.SLICES_READY


def complete(ctx: Ctx, phase: Phase, reason: str, message: str) -> None:
    ctx.status.completion_time = ctx.now
    ctype = ConditionType.COMPLETED if phase == Phase.SUCCEEDED else ConditionType.FAILED
    ctx.cond(ctype, "True", reason, message)
    ctx.phase(phase, message)
    if ctx.obs.jobset is not None:
        ctx.status.restarts = max(ctx.status.restarts, ctx.obs.jobset.restarts)


def why_failed(ctx: Ctx, spec: MultisliceJobSpec) -> str:
    fp = spec.failure_policy
    js = ctx.obs.jobset
    for failure in sorted(ctx.obs.pod_failures, key=lambda f: (-f.restart_attempt, f.pod)):
        if not failure.disruption and fp.is_fatal(failure.exit_code):
            where = f" (slice {failure.slice_index})" if failure.slice_index is not None else ""
            field = (
                "not in spec.failurePolicy.restartExitCodes"
                if fp.exit_code_policy == ExitCodePolicy.RESTART_IF_LISTED
                else "spec.failurePolicy.nonRetryableExitCodes"
            )
            return (
                f"pod {failure.pod}{where} exited with non-retryable code {failure.exit_code} "
                f"({field})"
            )
    if js is not None and (
        "ReachedMaxRestarts" in js.failure_reason
        or (not js.failure_reason and js.restarts_counted >= fp.max_restarts)
    ):
        return f"{restarts.max_restarts_message(ctx, spec, js)}{_last_failure_note(ctx)}"
    text = js.failure_message if js else ""
    return f"JobSet failed: {text}{_last_failure_note(ctx)}"


def latest_failure(failures: list[PodFailure]) -> PodFailure | None:
    # Of the latest attempt, a pod that said where the run stood (its termination message) first.
    key = lambda f: (f.restart_attempt, f.step is not None, f.pod)  # noqa: E731
    return max(failures, key=key) if failures else None


def describe(f: PodFailureStatus) -> str:
    code = f" with exit code {f.exit_code}" if f.exit_code is not None else ""
    disrupted = f" (DisruptionTarget: {f.disruption})" if f.disruption else ""
    return f"pod {f.pod} failed{code} {f.reason}".rstrip() + disrupted


def _last_failure_note(ctx: Ctx) -> str:
    f = latest_failure(ctx.obs.pod_failures)
    return f"; last failure: {describe(_record(f))}" if f else ""


def _record(f: PodFailure) -> PodFailureStatus:
    return PodFailureStatus(
        pod=f.pod,
        slice=f.slice_index,
        exit_code=f.exit_code,
        reason=f.reason,
        restart_attempt=f.restart_attempt,
        step=f.step,
        checkpoint_step=f.checkpoint_step,
        cause=restarts.failure_cause(f).value,
        disruption=f.disruption,
    )


def count_restarts(ctx: Ctx, spec: MultisliceJobSpec, js: JobSetObservation) -> None:
    seen = latest_failure(ctx.obs.pod_failures)
    if seen is not None:
        # The failed pod is deleted by the restart; keep what it said for the event and users.
        ctx.status.last_failure = _record(seen)
    before = ctx.old.restarts
    ctx.status.restarts = max(before, js.restarts)
    cause = restarts.attribute(ctx, js)
    by = ctx.status.restarts_by_cause
    if js.restarts > before and cause is not None and by is not None:
        last = ctx.status.last_failure
        what = describe(last) if last else "a slice failed"
        ctx.event(
            "Warning",
            "RestartingAllSlices",
            f"restart {js.restarts} (cause {cause}: {restarts.budget_note(spec, by, cause)}): "
            f"{what}; all slices restart and resume from the last checkpoint",
            cause=cause.value,
        )


def running_phase(ctx: Ctx, plan: Plan, js: JobSetObservation, capacity_ready: bool) -> None:
    # A slice that already finished counts as running: slices rarely finish in the same second.
    up = js.ready_jobs + js.succeeded_jobs
    if up >= plan.slices and capacity_ready:
        ctx.cond(SLICES_READY, "True", "AllSlicesRunning", f"{plan.slices}/{plan.slices} running")
        if ctx.status.running_time is None:
            ctx.status.running_time = ctx.now
        ctx.phase(Phase.RUNNING, f"{plan.slices}/{plan.slices} slices running")
        return
    message = f"{up}/{plan.slices} slices running"
    ctx.cond(SLICES_READY, "False", "SlicesStarting", message)
    was_running = ctx.status.running_time is not None
    if js.restarts > 0 or not capacity_ready or was_running:
        attempt = f"restart {js.restarts}" if js.restarts else "a slice stopped"
        ctx.phase(Phase.RESTARTING, f"restarting all slices ({attempt}): {message}")
    else:
        ctx.phase(Phase.STARTING, message)
