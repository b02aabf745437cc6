"""Restart strategy `Resize` (spec.elastic): the operator recreates the JobSet on another slice
count. Pure.

A JobSet cannot change its replicas, and the environment contract is in its pod template, so the
operator deletes the JobSet (in the foreground) and, once it is gone, creates it again on the new
count, continuing the job's restart counters: every slice restarts from its checkpoint (cause
`resize`, charged to no budget). Its first attempt is the restart it counts (`restarts_made`);
ShrinkingSlices and GrowingSlices announce it. When to shrink and grow is elastic.py's (`size`,
`resize`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from multislice_operator.api.models import MultisliceJobSpec, Phase, RestartCause
from multislice_operator.reconcile import checkpoint, elastic
from multislice_operator.reconcile.restart_strategy import JobSetStrategy
from multislice_operator.reconcile.types import JobSetObservation, Observed
from multislice_operator.registry import Registry

if TYPE_CHECKING:
    from multislice_operator.reconcile.capacity import Capacity
    from multislice_operator.reconcile.context import Builder
    from multislice_operator.reconcile.facts import Facts


class Resize(JobSetStrategy):
    """The JobSet deleted and created again on the slice count elastic.py sizes."""

    name = "Resize"
    description = "a new JobSet on another slice count"
    jobset_value = None  # not JobSet's: the operator replaces the JobSet
    causes = frozenset({RestartCause.RESIZE})
    precedence = 10
    announces = True  # ShrinkingSlices, GrowingSlices
    continues_outage = True  # a shrink after a loss the job has not recovered from

    def available(self, spec: MultisliceJobSpec | None, obs: Observed) -> bool:
        return spec is not None and spec.elastic is not None

    def restarts_made(self, before: int, js: JobSetObservation) -> dict[RestartCause, int]:
        """A JobSet the operator recreated on another slice count: its first attempt is itself a
        restart of every slice, the job's restart `restart_base`."""
        return {RestartCause.RESIZE: 1} if before < js.restart_base else {}

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        """A resize in flight or due now ends the pass."""
        plan = f.plan
        assert plan is not None
        if plan.elastic is None:
            return None
        if f.size.wait_left is not None:
            b.requeue_in(f.size.wait_left)
        if f.js is None:
            if not elastic.resized(f.old) or cap.ready:
                return None  # created by the lifecycle: the first JobSet, or the resized one now
            waiting = cap.message or "waiting for the pools"
            target = f"resizing to {f.size.target} of {plan.slices} slices"
            return Phase.RESTARTING, f"{target}: {waiting}"
        now = elastic.Now(any(f.running.values()), f.now, checkpoint.acked(f))
        return elastic.resize(plan, f.old, b, f.js, f.size, now)


RESIZE = Resize()


def register(r: Registry) -> None:
    r.add_strategy(RESIZE)
