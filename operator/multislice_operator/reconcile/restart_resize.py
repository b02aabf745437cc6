"""Restart strategy `Resize` (spec.elastic): the operator recreates the JobSet on another slice
count. Pure.

A JobSet cannot change its replicas, and the environment contract is in its pod template, so the
operator deletes the JobSet (in the foreground) and, once it is gone, creates it again on the new
count, continuing the job's restart counters: every slice restarts from its checkpoint (cause
`resize`, charged to no budget). When to shrink and grow is elastic.py's (`size`, `resize`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from multislice_operator.api.models import Phase
from multislice_operator.reconcile import checkpoint, elastic

if TYPE_CHECKING:
    from multislice_operator.reconcile.capacity import Capacity
    from multislice_operator.reconcile.context import Builder
    from multislice_operator.reconcile.facts import Facts


class Resize:
    """The JobSet deleted and created again on the slice count elastic.py sizes."""

    name = "Resize"

    def jobset_fields(self) -> dict[str, Any]:
        return {}  # not JobSet's: the operator replaces the JobSet

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
        running = any(f.running.values())
        acked = checkpoint.acked(f)
        return elastic.resize(plan, f.old, b, f.js, f.size, running, f.now, acked)


RESIZE = Resize()
