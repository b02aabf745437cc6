"""What one decision writes (the status being built, actions, events) and small pure helpers."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime

from multislice_operator.api.models import (
    Condition,
    ConditionType,
    MultisliceJobStatus,
    Phase,
)
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    Action,
    DecideConfig,
    DeletePools,
    Event,
    JobMeta,
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


class Builder:
    """What one pass writes: the status being built from the old one, the actions and the events.

    Steps return what they found; only decide() (flow.py) settles the phase, once. Deleting
    pools goes through `release`/`delete_pools`, which merge into one DeletePools per pass."""

    def __init__(self, meta: JobMeta, old: MultisliceJobStatus, now: datetime) -> None:
        self.meta, self.old, self.now = meta, old, now
        # A copy by a round trip through the dict: a third of copy.deepcopy's CPU (pydantic's
        # __deepcopy__), which was the largest part of a steady pass (issue 57).
        self.status = type(old).from_dict(old.to_dict())
        self.status.phase = None
        self.status.message = None
        self.status.observed_generation = meta.generation
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.requeue: float | None = None
        self._deleting: list[str] = []
        # This pass changed what the job's plan is (a composed capacity model moved to another
        # option: the next pass plans it): nothing is made from this pass's plan.
        self.replanned = False

    def cond(self, ctype: ConditionType, status: str, reason: Reason, message: str) -> None:
        """A condition with one of the registry's reasons (reasons.py)."""
        self.cond_copied(ctype, status, reason.value, message)

    def cond_copied(self, ctype: ConditionType, status: str, reason: str, message: str) -> None:
        """A condition whose reason another controller gave (JobSet's failure reason)."""
        set_condition(
            self.status.conditions, ctype, status, reason, message, self.now, self.meta.generation
        )

    def settle(self, phase: Phase, message: str) -> None:
        """The phase of this pass: decided once (a second call is a bug)."""
        if self.status.phase is not None:
            raise RuntimeError(f"phase settled twice: {self.status.phase} then {phase}")
        self.status.phase = phase
        self.status.message = message

    def event(self, reason: Reason, message: str, cause: str = "") -> None:
        self.events.append(Event(reason.event_type, str(reason), message, cause))

    def add(self, action: Action) -> None:
        self.actions.append(action)

    def delete_pools(self, pools: Iterable[str]) -> None:
        new = [p for p in pools if p not in self._deleting]
        if not new:
            return
        if not self._deleting:
            self.actions.append(DeletePools(()))  # its place in the order; filled below
        self._deleting.extend(new)
        for i, a in enumerate(self.actions):
            if isinstance(a, DeletePools):
                self.actions[i] = DeletePools(tuple(self._deleting))
                break

    def requeue_in(self, seconds: float) -> None:
        seconds = max(seconds, 1.0)
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def transition_event(self) -> None:
        """An event for every change of phase; a new job's first phase is its status alone
        (its creation is its own record), which saves every job a write."""
        old_phase, new_phase = self.old.phase, self.status.phase
        if new_phase != old_phase and new_phase is not None and old_phase is not None:
            warn = new_phase == Phase.FAILED
            self.events.append(
                Event(
                    "Warning" if warn else "Normal",
                    str(new_phase),
                    f"{old_phase} -> {new_phase}: {self.status.message or ''}",
                )
            )
