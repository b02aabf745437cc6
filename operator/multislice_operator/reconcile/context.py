"""The scratch of one decision: the status being built from the old one, actions, events."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

from multislice_operator.api.models import (
    Condition,
    ConditionType,
    MultisliceJobStatus,
    Phase,
)
from multislice_operator.reconcile.types import (
    Action,
    DecideConfig,
    Decision,
    Event,
    JobMeta,
    Observed,
)


def at_second(t: datetime) -> datetime:
    """Times in status have whole seconds: a status that changed every pass would be rewritten."""
    return t.astimezone(UTC).replace(microsecond=0)


def set_condition(
    conditions: list[Condition],
    ctype: ConditionType | str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> None:
    """Upsert a condition; lastTransitionTime moves only when the status flips."""
    for cond in conditions:
        if cond.type == ctype:
            if cond.status != status:
                cond.last_transition_time = at_second(now)
            cond.status, cond.reason, cond.message = status, reason, message
            cond.observed_generation = generation
            return
    conditions.append(
        Condition(
            type=str(ctype),
            status=status,
            reason=reason,
            message=message,
            last_transition_time=at_second(now),
            observed_generation=generation,
        )
    )


def backoff_seconds(uid: str, attempt: int, cfg: DecideConfig) -> float:
    """Exponential backoff with +-20% jitter, deterministic per job and attempt (pure)."""
    base = min(cfg.backoff_max_seconds, cfg.backoff_base_seconds * 2.0 ** max(attempt - 1, 0))
    digest = hashlib.sha256(f"{uid}/{attempt}".encode()).digest()
    jitter = (digest[0] / 255.0) * 0.4 - 0.2
    return float(round(base * (1 + jitter), 1))


class Ctx:
    """Mutable scratch for one decision. `old` is the status as read; `status` is being built."""

    def __init__(
        self, meta: JobMeta, old: MultisliceJobStatus, obs: Observed, cfg: DecideConfig
    ) -> None:
        self.meta, self.old, self.obs, self.cfg = meta, old, obs, cfg
        self.now = at_second(obs.now)
        self.status = old.model_copy(deep=True)
        self.status.phase = None
        self.status.message = None
        self.status.observed_generation = meta.generation
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: float | None = None
        self.repairing: set[int] = set()
        self.not_ready: set[int] = set()  # slices NotReady within the grace period (a blip)
        self.rolled_back: str | None = None  # this pass rolled the gang back: why
        self.restart_cause: str | None = None  # the cause of the newest restart counted now

    def cond(self, ctype: ConditionType, status: str, reason: str, message: str) -> None:
        set_condition(
            self.status.conditions, ctype, status, reason, message, self.now, self.meta.generation
        )

    def phase(self, phase: Phase, message: str) -> None:
        self.status.phase = phase
        self.status.message = message

    def event(self, type_: str, reason: str, message: str, cause: str = "") -> None:
        self.events.append(Event(type_, reason, message, cause))

    def requeue_in(self, seconds: float) -> None:
        seconds = max(seconds, 1.0)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def decision(self) -> Decision:
        self._transition_event()
        return Decision(self.status, self.actions, self.events, self.requeue)

    def _transition_event(self) -> None:
        old_phase, new_phase = self.old.phase, self.status.phase
        if new_phase != old_phase:
            warn = new_phase == Phase.FAILED
            self.event(
                "Warning" if warn else "Normal",
                str(new_phase),
                f"{old_phase or 'New'} -> {new_phase}: {self.status.message or ''}",
            )
