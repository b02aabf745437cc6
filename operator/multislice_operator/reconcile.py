"""decide(): observed state -> actions and status. The reconcile brain, pure and table-tested.

Level-based like the JobSet and Kueue controllers: every call recomputes the desired state from what
is observed now (the job, its JobSet, its slices' pools and nodes, its pods) and from the job's own
status (the only memory: restart count, gang attempts and backoff deadline). Nothing here does I/O;
the controller applies the actions and writes the status, and a crash between any two steps just
means the next call sees a little more done and carries on.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from multislice_operator import keys
from multislice_operator.api.models import (
    MultisliceJobSpec,
    Phase,
)
from multislice_operator.errors import (
    SpecError,
)
from multislice_operator.plan import (
    Plan,
)
from multislice_operator.provisioning.base import (
    PoolError,
    PoolState,
)

# Condition types.
VALIDATED = "Validated"
PROVISIONED = "Provisioned"
SLICES_READY = "SlicesReady"
DCN_BOUND = "DCNBound"
COMPLETED = "Completed"
FAILED = "Failed"

# Slice phases shown in status.slices[].phase.
SLICE_PENDING = "Pending"
SLICE_PROVISIONING = "Provisioning"
SLICE_READY = "Ready"
SLICE_RUNNING = "Running"
SLICE_SUCCEEDED = "Succeeded"
SLICE_FAILED = "Failed"
SLICE_RELEASING = "Releasing"
SLICE_REPAIRING = "Repairing"
RELEASING_NOTE = " (releasing node pools)"


# ---------------------------------------------------------------- observed state (plain data)


@dataclass(frozen=True)
class SliceObservation:
    """One slice's capacity: its pool in Managed mode, a matching node pool in Existing mode."""

    index: int
    pool: str | None
    pool_status: str = PoolState.ABSENT
    ready_hosts: int = 0
    error: PoolError | None = None
    foreign: bool = False  # a pool with our name but another owner uid (a previous incarnation)
    operation_pending: bool = False


@dataclass(frozen=True)
class PodFailure:
    pod: str
    slice_index: int | None
    exit_code: int | None
    reason: str = ""
    restart_attempt: int = 0


@dataclass(frozen=True)
class JobSetObservation:
    suspended: bool = False
    restarts: int = 0
    completed: bool = False
    failed: bool = False
    failure_reason: str = ""
    failure_message: str = ""
    ready_jobs: int = 0
    active_jobs: int = 0
    succeeded_jobs: int = 0
    owned: bool = True  # labelled/owned by this job; a stranger of the same name is not touched


@dataclass(frozen=True)
class JobMeta:
    namespace: str
    name: str
    uid: str
    generation: int
    creation_time: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class Observed:
    now: datetime
    slices: list[SliceObservation] = field(default_factory=list)
    jobset: JobSetObservation | None = None
    pod_failures: list[PodFailure] = field(default_factory=list)
    running_pods: dict[int, int] = field(default_factory=dict)  # slice index -> running pods
    succeeded_pods: dict[int, int] = field(default_factory=dict)
    offered_error: PoolError | None = None  # accelerator type not offered in the zone
    provisioner_error: str | None = None  # Managed mode but no provisioner configured
    existing_pools_found: int = 0  # Existing mode: matching pools seen, ready or not


@dataclass(frozen=True)
class DecideConfig:
    backoff_base_seconds: float = 30.0
    backoff_max_seconds: float = 600.0
    resync_seconds: float = 10.0


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class CreatePools:
    slices: tuple[int, ...]


@dataclass(frozen=True)
class DeletePools:
    pools: tuple[str, ...]


@dataclass(frozen=True)
class CreateJobSet:
    pass


@dataclass(frozen=True)
class SetJobSetSuspend:
    suspend: bool


@dataclass(frozen=True)
class DeleteJob:
    """The MultisliceJob itself (ttlSecondsAfterFinished)."""


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


Action = CreatePools | DeletePools | CreateJobSet | SetJobSetSuspend | DeleteJob


@dataclass
class Decision:
    status: dict[str, Any]
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None


# ---------------------------------------------------------------- helpers


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def set_condition(
    conditions: list[dict[str, Any]],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> None:
    """Upsert a condition; lastTransitionTime moves only when the status flips."""
    for cond in conditions:
        if cond["type"] == ctype:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = iso(now)
            cond.update(status=status, reason=reason, message=message)
            cond["observedGeneration"] = generation
            return
    conditions.append(
        {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": iso(now),
            "observedGeneration": generation,
        }
    )


def backoff_seconds(uid: str, attempt: int, cfg: DecideConfig) -> float:
    """Exponential backoff with +-20% jitter, deterministic per job and attempt (pure)."""
    base = min(cfg.backoff_max_seconds, cfg.backoff_base_seconds * 2.0 ** max(attempt - 1, 0))
    digest = hashlib.sha256(f"{uid}/{attempt}".encode()).digest()
    jitter = (digest[0] / 255.0) * 0.4 - 0.2
    return float(round(base * (1 + jitter), 1))


def _slice_ready(s: SliceObservation, hosts: int) -> bool:
    return (
        s.pool_status in (PoolState.READY, PoolState.UPDATING)
        and s.ready_hosts >= hosts
        and not s.foreign
    )


def _slice_lost(s: SliceObservation, before: str | None) -> bool:
    """Capacity that was there is gone: pool broken or deleted, or its nodes disappeared.

    A pool that is READY without Ready nodes is only lost if its nodes were seen Ready before
    (`before`, the slice's last phase): a fresh pool's nodes take a moment to register.
    """
    if s.foreign or s.pool_status in (PoolState.FAILED, PoolState.ABSENT, PoolState.DELETING):
        return True
    had_nodes = before in (SLICE_READY, SLICE_RUNNING, SLICE_REPAIRING)
    return (
        s.pool_status in (PoolState.READY, PoolState.DEGRADED) and s.ready_hosts == 0 and had_nodes
    )


# ---------------------------------------------------------------- the decision


class _Ctx:
    """Mutable scratch for one decision: the status being built, actions and events."""

    def __init__(
        self,
        meta: JobMeta,
        old: dict[str, Any],
        obs: Observed,
        cfg: DecideConfig,
    ) -> None:
        self.meta, self.old, self.obs, self.cfg = meta, old, obs, cfg
        self.now = obs.now
        self.status: dict[str, Any] = {
            k: v for k, v in old.items() if k not in ("phase", "message", "observedGeneration")
        }
        self.status["conditions"] = [dict(c) for c in old.get("conditions") or []]
        self.status["observedGeneration"] = meta.generation
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: float | None = None
        self.repairing: set[int] = set()

    def cond(self, ctype: str, status: str, reason: str, message: str) -> None:
        set_condition(
            self.status["conditions"],
            ctype,
            status,
            reason,
            message,
            self.now,
            self.meta.generation,
        )

    def phase(self, phase: Phase, message: str) -> None:
        self.status["phase"] = phase.value
        self.status["message"] = message

    def requeue_in(self, seconds: float) -> None:
        seconds = max(seconds, 1.0)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def decision(self) -> Decision:
        self._transition_events()
        return Decision(self.status, self.actions, self.events, self.requeue)

    def _transition_events(self) -> None:
        old_phase, new_phase = self.old.get("phase"), self.status.get("phase")
        if new_phase != old_phase:
            warn = new_phase in (Phase.FAILED.value,)
            self.events.append(
                Event(
                    "Warning" if warn else "Normal",
                    str(new_phase),
                    f"{old_phase or 'New'} -> {new_phase}: {self.status.get('message', '')}",
                )
            )


def decide(
    meta: JobMeta,
    spec: MultisliceJobSpec | None,
    plan: Plan | None,
    spec_error: SpecError | None,
    old_status: dict[str, Any] | None,
    obs: Observed,
    cfg: DecideConfig | None = None,
) -> Decision:
    """From what is observed now to what to do next and the status to write."""
    ctx = _Ctx(meta, dict(old_status or {}), obs, cfg or DecideConfig())
    if spec_error is not None or spec is None or plan is None:
        _invalid(ctx, spec_error)
        return ctx.decision()
    ctx.cond(VALIDATED, "True", "Valid", f"{plan.slices} x {plan.shape.accelerator}")
    ctx.status["totalChips"] = plan.total_chips
    _dcn_condition(ctx, plan)
    if ctx.old.get("phase") in (Phase.SUCCEEDED.value, Phase.FAILED.value) and not _failed_invalid(
        ctx.old
    ):
        _finished(ctx, spec, plan)
    elif spec.suspend:
        _suspended(ctx, plan)
    else:
        _active(ctx, spec, plan)
    _slice_statuses(ctx, plan)
    return ctx.decision()


def _failed_invalid(old: dict[str, Any]) -> bool:
    return any(
        c.get("type") == VALIDATED and c.get("status") == "False"
        for c in old.get("conditions") or []
    )


def _invalid(ctx: _Ctx, error: SpecError | None) -> None:
    message = str(error) if error else "the spec could not be read"
    ctx.cond(VALIDATED, "False", "InvalidSpec", message)
    ctx.cond(FAILED, "True", "InvalidSpec", message)
    ctx.phase(Phase.FAILED, f"invalid spec: {message}")
    if ctx.old.get("message") != ctx.status["message"] and ctx.old.get("phase") == "Failed":
        ctx.events.append(Event("Warning", "InvalidSpec", message))


def _dcn_condition(ctx: _Ctx, plan: Plan) -> None:
    advice = plan.advice
    bound = "True" if advice.verdict == "dcn-bound" else "False"
    reason = {"ok": "BatchLargeEnough", "dcn-bound": "BatchTooSmall"}.get(
        advice.verdict, "NoBatchHint"
    )
    ctx.cond(DCN_BOUND, bound, reason, advice.message)


def _pools_present(ctx: _Ctx) -> list[str]:
    """Pools that exist and are not already going away (deleting them again is harmless)."""
    return [
        s.pool
        for s in ctx.obs.slices
        if s.pool and s.pool_status not in (PoolState.ABSENT, PoolState.DELETING)
    ]


def _release(ctx: _Ctx, plan: Plan) -> bool:
    """Delete every pool of a Managed job; True when none is left."""
    if not plan.managed:
        return True
    present = [p for p in _pools_present(ctx) if p]
    if present:
        ctx.actions.append(DeletePools(tuple(present)))
    remaining = [s for s in ctx.obs.slices if s.pool_status != PoolState.ABSENT]
    if remaining:
        ctx.requeue_in(ctx.cfg.resync_seconds / 2)
    return not remaining


def _finished(ctx: _Ctx, spec: MultisliceJobSpec, plan: Plan) -> None:
    phase = Phase(ctx.old["phase"])
    message = (ctx.old.get("message") or phase.value).split(RELEASING_NOTE)[0]
    ctx.phase(phase, message)
    keep = phase == Phase.SUCCEEDED and spec.provisioning.keep_node_pools
    released = True if keep else _release(ctx, plan)
    if not released:
        ctx.status["message"] = f"{ctx.status['message']}{RELEASING_NOTE}"
    ttl = spec.ttl_seconds_after_finished
    done = parse_time(ctx.old.get("completionTime"))
    if ttl is not None and done is not None and released:
        left = (done + timedelta(seconds=ttl) - ctx.now).total_seconds()
        if left <= 0:
            ctx.actions.append(DeleteJob())
        else:
            ctx.requeue_in(left)


def _suspended(ctx: _Ctx, plan: Plan) -> None:
    js = ctx.obs.jobset
    if js is not None and js.owned and not js.suspended:
        ctx.actions.append(SetJobSetSuspend(True))
    released = _release(ctx, plan)
    ctx.status.pop("attemptStartTime", None)
    ctx.status.pop("nextAttemptTime", None)
    ctx.cond(PROVISIONED, "False", "Suspended", "capacity released while suspended")
    ctx.cond(SLICES_READY, "False", "Suspended", "job is suspended")
    detail = "" if released else " (releasing node pools)"
    ctx.phase(Phase.SUSPENDED, f"suspended{detail}; set spec.suspend: false to resume")


def _active(ctx: _Ctx, spec: MultisliceJobSpec, plan: Plan) -> None:
    if "startTime" not in ctx.status:
        ctx.status["startTime"] = iso(ctx.now)
    js = ctx.obs.jobset
    if js is not None and not js.owned:
        ctx.cond(FAILED, "True", "JobSetConflict", "a JobSet of the same name is not ours")
        ctx.phase(
            Phase.FAILED,
            f"a JobSet named {plan.name} exists and is not owned by this job; delete or rename it",
        )
        ctx.status["completionTime"] = iso(ctx.now)
        return
    if js is not None and js.completed:
        _complete(ctx, plan, Phase.SUCCEEDED, "Completed", "all slices finished")
        return
    if js is not None and js.failed:
        _complete(
            ctx, plan, Phase.FAILED, js.failure_reason or "JobSetFailed", _why_failed(ctx, spec)
        )
        return
    # Existing pools are the JobSet's business once it runs; Managed pools are ours to repair.
    ready = _capacity_ready(ctx, spec, plan) if plan.managed or js is None or js.suspended else True
    if js is None:
        if ready:
            ctx.actions.append(CreateJobSet())
            ctx.phase(Phase.STARTING, f"all {plan.slices} slices ready; starting the JobSet")
            ctx.status["jobSet"] = plan.name
        return
    ctx.status["jobSet"] = plan.name
    _count_restarts(ctx, spec, js)
    if js.suspended:
        queue = ctx.meta.labels.get(keys.KUEUE_QUEUE_NAME)
        if queue:  # Kueue owns the JobSet's suspend flag: it unsuspends on admission
            ctx.phase(Phase.PENDING, f"queued in Kueue queue {queue}: waiting for admission")
        elif ready:
            ctx.actions.append(SetJobSetSuspend(False))
            ctx.phase(Phase.STARTING, "capacity ready again; resuming the JobSet")
        return
    _running_phase(ctx, plan, js, ready)


def _complete(ctx: _Ctx, plan: Plan, phase: Phase, reason: str, message: str) -> None:
    ctx.status["completionTime"] = iso(ctx.now)
    if phase == Phase.SUCCEEDED:
        ctx.cond(COMPLETED, "True", reason, message)
    else:
        ctx.cond(FAILED, "True", reason, message)
    ctx.phase(phase, message)
    if ctx.obs.jobset is not None:
        ctx.status["restarts"] = max(ctx.status.get("restarts", 0), ctx.obs.jobset.restarts)


def _why_failed(ctx: _Ctx, spec: MultisliceJobSpec) -> str:
    fatal = set(spec.failure_policy.non_retryable_exit_codes)
    js = ctx.obs.jobset
    for failure in sorted(ctx.obs.pod_failures, key=lambda f: (-f.restart_attempt, f.pod)):
        if failure.exit_code in fatal:
            where = f" (slice {failure.slice_index})" if failure.slice_index is not None else ""
            return (
                f"pod {failure.pod}{where} exited with non-retryable code {failure.exit_code} "
                "(spec.failurePolicy.nonRetryableExitCodes)"
            )
    if (
        js is not None
        and js.restarts >= spec.failure_policy.max_restarts
        and ("ReachedMaxRestarts" in js.failure_reason or not js.failure_reason)
    ):
        last = _last_failure(ctx)
        return (
            f"restarted {js.restarts} times, reaching spec.failurePolicy.maxRestarts "
            f"({spec.failure_policy.max_restarts}){last}"
        )
    text = js.failure_message if js else ""
    return f"JobSet failed: {text}{_last_failure(ctx)}"


def _last_failure(ctx: _Ctx) -> str:
    if not ctx.obs.pod_failures:
        return ""
    f = max(ctx.obs.pod_failures, key=lambda f: (f.restart_attempt, f.pod))
    code = f" with exit code {f.exit_code}" if f.exit_code is not None else ""
    return f"; last failure: pod {f.pod} failed{code} {f.reason}".rstrip()


def _count_restarts(ctx: _Ctx, spec: MultisliceJobSpec, js: JobSetObservation) -> None:
    before = int(ctx.old.get("restarts") or 0)
    seen = _last_failure(ctx).removeprefix("; last failure: ")
    if seen:
        # The failed pod is deleted by the restart; keep what it said for the event and users.
        ctx.status["lastFailure"] = seen
    if js.restarts > before:
        ctx.status["restarts"] = js.restarts
        cause = ctx.status.get("lastFailure") or "a slice failed"
        ctx.events.append(
            Event(
                "Warning",
                "RestartingAllSlices",
                f"restart {js.restarts}/{spec.failure_policy.max_restarts}: {cause}; all slices "
                "restart and resume from the last checkpoint",
            )
        )
    else:
        ctx.status["restarts"] = before


def _running_phase(ctx: _Ctx, plan: Plan, js: JobSetObservation, capacity_ready: bool) -> None:
    # A slice that already finished counts as running: slices rarely finish in the same second.
    up = js.ready_jobs + js.succeeded_jobs
    if up >= plan.slices and capacity_ready:
        ctx.cond(SLICES_READY, "True", "AllSlicesRunning", f"{plan.slices}/{plan.slices} running")
        if "runningTime" not in ctx.status:
            ctx.status["runningTime"] = iso(ctx.now)
        ctx.phase(Phase.RUNNING, f"{plan.slices}/{plan.slices} slices running")
        return
    message = f"{up}/{plan.slices} slices running"
    ctx.cond(SLICES_READY, "False", "SlicesStarting", message)
    was_running = "runningTime" in ctx.status
    if js.restarts > 0 or not capacity_ready or was_running:
        attempt = f"restart {js.restarts}" if js.restarts else "a slice stopped"
        ctx.phase(Phase.RESTARTING, f"restarting all slices ({attempt}): {message}")
    else:
        ctx.phase(Phase.STARTING, message)


# ---------------------------------------------------------------- capacity


def _capacity_ready(ctx: _Ctx, spec: MultisliceJobSpec, plan: Plan) -> bool:
    if plan.managed:
        return _gang(ctx, spec, plan)
    return _existing(ctx, plan)


def _existing(ctx: _Ctx, plan: Plan) -> bool:
    ready = [s for s in ctx.obs.slices if _slice_ready(s, plan.shape.hosts)]
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


def _gang(ctx: _Ctx, spec: MultisliceJobSpec, plan: Plan) -> bool:
    """All or none: every slice's pool is created together; any failure rolls the gang back."""
    obs, hosts = ctx.obs, plan.shape.hosts
    if obs.provisioner_error:
        ctx.cond(PROVISIONED, "False", "ProvisionerNotConfigured", obs.provisioner_error)
        ctx.phase(Phase.PENDING, obs.provisioner_error)
        ctx.requeue_in(ctx.cfg.resync_seconds * 3)
        return False
    permanent = [s.error for s in obs.slices if s.error and s.error.permanent]
    if obs.offered_error:
        permanent.insert(0, obs.offered_error)
    if permanent:
        _gang_failed(ctx, plan, permanent[0])
        return False
    slices = obs.slices
    if ctx.obs.jobset is not None:
        return _repair(ctx, plan)
    if all(_slice_ready(s, hosts) for s in slices) and len(slices) == plan.slices:
        _provisioned(ctx, plan)
        return True
    next_at = parse_time(ctx.old.get("nextAttemptTime"))
    if next_at is not None and ctx.now < next_at:
        _release(ctx, plan)
        wait = (next_at - ctx.now).total_seconds()
        ctx.phase(Phase.PROVISIONING, _retry_message(ctx, ctx.old.get("nextAttemptTime")))
        ctx.requeue_in(wait)
        return False
    failed = [s for s in slices if s.error is not None or s.pool_status == PoolState.FAILED]
    started = parse_time(ctx.old.get("attemptStartTime"))
    timeout = spec.provisioning.timeout_seconds
    if failed:
        first = failed[0]
        err = first.error or PoolError(
            first.index, first.pool or "?", "ERROR", "pool in ERROR", False
        )
        _rollback(ctx, plan, "SliceFailed", str(err))
        return False
    if started is not None and (ctx.now - started).total_seconds() > timeout:
        pending = [str(s.index) for s in slices if not _slice_ready(s, hosts)]
        _rollback(
            ctx,
            plan,
            "Timeout",
            f"slices {', '.join(pending)} not ready within spec.provisioning.timeoutSeconds "
            f"({timeout}s)",
        )
        return False
    _advance_gang(ctx, plan, started)
    return False


def _retry_message(ctx: _Ctx, next_at: str | None) -> str:
    # No countdown in the text: a status that changed every second would be rewritten every resync.
    reason = next(
        (c.get("message", "") for c in ctx.status["conditions"] if c["type"] == PROVISIONED), ""
    )
    attempts = ctx.status.get("provisioningAttempts", 0)
    return f"gang attempt {attempts} rolled back ({reason}); next attempt at {next_at}"


def _advance_gang(ctx: _Ctx, plan: Plan, started: datetime | None) -> None:
    hosts = plan.shape.hosts
    foreign = [
        s.pool
        for s in ctx.obs.slices
        if s.foreign and s.pool_status not in (PoolState.ABSENT, PoolState.DELETING)
    ]
    if foreign:
        ctx.actions.append(DeletePools(tuple(p for p in foreign if p)))
    creatable = tuple(
        s.index
        for s in ctx.obs.slices
        if s.pool_status == PoolState.ABSENT and not s.operation_pending
    )
    if creatable:
        ctx.actions.append(CreatePools(creatable))
    if started is None:
        ctx.status["attemptStartTime"] = iso(ctx.now)
        ctx.status["provisioningAttempts"] = int(ctx.old.get("provisioningAttempts") or 0) + 1
        ctx.status.pop("nextAttemptTime", None)
    ready = sum(1 for s in ctx.obs.slices if _slice_ready(s, hosts))
    message = f"provisioning {plan.slices} node pools as a gang: {ready}/{plan.slices} ready"
    ctx.cond(PROVISIONED, "False", "Provisioning", message)
    ctx.phase(Phase.PROVISIONING, message)
    ctx.requeue_in(ctx.cfg.resync_seconds)


def _provisioned(ctx: _Ctx, plan: Plan) -> None:
    ctx.cond(PROVISIONED, "True", "GangReady", f"all {plan.slices} node pools ready")
    if ctx.status.get("attemptStartTime") is not None or "provisionedTime" not in ctx.status:
        ctx.status["provisionedTime"] = iso(ctx.now)
        ctx.events.append(
            Event("Normal", "GangProvisioned", f"all {plan.slices} node pools running and ready")
        )
    ctx.status.pop("attemptStartTime", None)
    ctx.status.pop("nextAttemptTime", None)


def _rollback(ctx: _Ctx, plan: Plan, reason: str, message: str) -> None:
    attempts = int(ctx.old.get("provisioningAttempts") or 1)
    wait = backoff_seconds(ctx.meta.uid, attempts, ctx.cfg)
    ctx.status["nextAttemptTime"] = iso(ctx.now + timedelta(seconds=wait))
    ctx.status.pop("attemptStartTime", None)
    ctx.status["provisioningAttempts"] = attempts
    _release(ctx, plan)
    full = f"{message}; deleting all {plan.slices} node pools of the gang"
    ctx.cond(PROVISIONED, "False", f"Gang{reason}", full)
    ctx.events.append(
        Event("Warning", "GangRolledBack", f"attempt {attempts}: {full}; retry in {wait:.0f}s")
    )
    ctx.phase(Phase.PROVISIONING, _retry_message(ctx, ctx.status["nextAttemptTime"]))
    ctx.requeue_in(wait)


def _gang_failed(ctx: _Ctx, plan: Plan, err: PoolError) -> None:
    _release(ctx, plan)
    message = f"{err}; retrying cannot help, fix the spec or the project and recreate the job"
    ctx.cond(PROVISIONED, "False", "ProvisioningFailed", message)
    ctx.cond(FAILED, "True", "ProvisioningFailed", message)
    ctx.status["completionTime"] = iso(ctx.now)
    ctx.phase(Phase.FAILED, message)


def _repair(ctx: _Ctx, plan: Plan) -> bool:
    """The JobSet exists: replace the pool of any slice that lost its capacity, that slice only."""
    hosts = plan.shape.hosts
    lost = [s for s in ctx.obs.slices if _slice_lost(s, _old_slice(ctx, s.index).get("phase"))]
    broken = tuple(
        s.pool
        for s in lost
        if s.pool and s.pool_status not in (PoolState.ABSENT, PoolState.DELETING)
    )
    if broken:
        ctx.actions.append(DeletePools(tuple(p for p in broken if p)))
    absent = tuple(
        s.index
        for s in ctx.obs.slices
        if s.pool_status == PoolState.ABSENT and not s.operation_pending
    )
    if absent:
        ctx.actions.append(CreatePools(absent))
    for s in lost:
        why = (
            s.error.code
            if s.error
            else (
                "nodes gone"
                if s.pool_status in (PoolState.READY, PoolState.DEGRADED)
                else s.pool_status
            )
        )
        ctx.repairing.add(s.index)
        if _old_slice(ctx, s.index).get("phase") != SLICE_REPAIRING:
            ctx.events.append(
                Event(
                    "Warning",
                    "SliceLost",
                    f"slice {s.index} lost its capacity ({why}); replacing node pool {s.pool}; "
                    "all slices restart once it is ready",
                )
            )
    ready = all(_slice_ready(s, hosts) for s in ctx.obs.slices)
    if ready:
        ctx.cond(PROVISIONED, "True", "GangReady", f"all {plan.slices} node pools ready")
    else:
        n = sum(1 for s in ctx.obs.slices if _slice_ready(s, hosts))
        ctx.cond(
            PROVISIONED, "False", "Repairing", f"replacing lost slices: {n}/{plan.slices} ready"
        )
        ctx.requeue_in(ctx.cfg.resync_seconds)
    return ready


def _old_slice(ctx: _Ctx, index: int) -> dict[str, Any]:
    for s in ctx.old.get("slices") or []:
        if s.get("index") == index:
            return dict(s)
    return {}


def _slice_statuses(ctx: _Ctx, plan: Plan) -> None:
    hosts = plan.shape.hosts
    phase = ctx.status.get("phase")
    by_index = {s.index: s for s in ctx.obs.slices}
    out = []
    for i in range(plan.slices):
        s = by_index.get(i)
        entry: dict[str, Any] = {"index": i, "hosts": hosts, "readyHosts": 0}
        if s is not None:
            entry["nodePool"] = s.pool
            entry["readyHosts"] = min(s.ready_hosts, hosts)
        entry["phase"] = _slice_phase(ctx, s, i, hosts, phase)
        if s is not None and s.error is not None:
            entry["message"] = f"{s.error.code}: {s.error.message}"
        out.append({k: v for k, v in entry.items() if v is not None})
    ctx.status["slices"] = out
    ready = sum(1 for e in out if e["phase"] in (SLICE_READY, SLICE_RUNNING, SLICE_SUCCEEDED))
    ctx.status["readySlices"] = f"{ready}/{plan.slices}"


def _slice_phase(
    ctx: _Ctx, s: SliceObservation | None, i: int, hosts: int, phase: str | None
) -> str:
    if phase == Phase.SUCCEEDED.value:
        return SLICE_SUCCEEDED
    if phase == Phase.FAILED.value:
        return SLICE_FAILED
    if s is None:
        return SLICE_PENDING
    if i in ctx.repairing:
        return SLICE_REPAIRING
    if phase == Phase.SUSPENDED.value and s.pool_status != PoolState.ABSENT:
        return SLICE_RELEASING
    if ctx.obs.succeeded_pods.get(i, 0) >= hosts:
        return SLICE_SUCCEEDED
    if _slice_ready(s, hosts):
        return SLICE_RUNNING if ctx.obs.running_pods.get(i, 0) >= hosts else SLICE_READY
    if s.pool_status in (PoolState.CREATING, PoolState.UPDATING) or s.operation_pending:
        return SLICE_PROVISIONING
    if s.error is not None or s.pool_status == PoolState.FAILED:
        return SLICE_FAILED
    return SLICE_PENDING
