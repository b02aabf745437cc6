"""spec.elastic: the slice count the job's JobSet runs on, and the resizes that change it. Pure.

A JobSet cannot change its replicas (its webhook keeps spec.replicatedJobs immutable), and the
environment contract (MEGASCALE_NUM_SLICES, the DCN layout) is in its pod template, so a resize
is a restart of every slice from its checkpoint: the JobSet is deleted in the foreground and
created again on the new count, continuing the job's restart counters (keys.RESTARTS_BEFORE).

- Shrink: a slice's pool was lost and its replacement is not Ready within waitSeconds (or GKE
  answers stockout or quota for it): the job restarts on the largest allowed size (plan.sizes,
  never below minSlices) that the Ready pools hold. The lost pools stay requested.
- Grow: Ready pools hold a larger size again: a checkpoint is requested on demand and, once it
  is saved (or nothing runs to save, or the workload does not answer within GROW_SAVE_SECONDS),
  the job restarts on the larger count.

The first gang stays all or none: nothing shrinks before the job's slices were up once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from multislice_operator.api.models import (
    CheckpointStatus,
    ConditionType,
    MultisliceJobStatus,
    Phase,
)
from multislice_operator.common.pools import CAPACITY_CODES
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.capacity import Size
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    CreateJobSet,
    DeleteJobSet,
    JobSetObservation,
    SliceObservation,
)

DEGRADED = ConditionType.DEGRADED
GROW_PREFIX = "grow-"  # the id of the checkpoint requested before a grow: grow-<slices>-<attempt>
GROW_SAVE_SECONDS = 300  # how long a grow waits for that checkpoint before it goes anyway


def size(
    plan: Plan,
    old: MultisliceJobStatus,
    ready: frozenset[int],
    up: int,
    slices: list[SliceObservation],
    js: JobSetObservation | None,
    now: datetime,
    lost_now: frozenset[int] = frozenset(),
) -> Size:
    """`ready`: the pools ready now; `up`: those ready or in a NotReady blip; `lost_now`: the
    pools lost as this pass sees them."""
    full, elastic = plan.slices, plan.elastic
    if elastic is None or up >= full:  # spec.elastic: accepted by its capacity model alone
        return Size(full, full)
    fits = [s.slices for s in plan.sizes if s.slices <= up]
    if not fits:  # below minSlices: wait for the pools, as a job that is not elastic does
        return _below_min(full, up, js)
    lost = _loss_times(old, ready, lost_now, now)
    degraded = _runs_fewer(js, full) or _was_degraded(old)
    if not lost and not degraded:
        return Size(full, full)  # the first gang: all or none
    why = _refused(slices)
    waited = (now - min(lost)).total_seconds() if lost else 0.0
    if not why and not degraded and waited < elastic.wait_seconds:
        return Size(full, full, wait_left=elastic.wait_seconds - waited)
    return Size(max(fits), full, why or _lost_too_long(full, up, elastic.wait_seconds))


def _runs_fewer(js: JobSetObservation | None, full: int) -> bool:
    """The JobSet runs on fewer slices than spec.slices (a shrink happened)."""
    return js is not None and 0 < js.replicas < full


def _below_min(full: int, up: int, js: JobSetObservation | None) -> Size:
    """Fewer than minSlices up: a shrunk job stays on the slices it has (not a grow); any
    other waits for all of them."""
    if js is not None and _runs_fewer(js, full):
        why = f"{full - up} of {full} slices lost, fewer than spec.elastic.minSlices up"
        return Size(js.replicas, full, why)
    return Size(full, full)


def _loss_times(
    old: MultisliceJobStatus, ready: frozenset[int], lost_now: frozenset[int], now: datetime
) -> list[datetime]:
    """When each pool that is not Ready was lost: as recorded, or now for a loss this pass."""
    lost = [e.lost_time for e in old.slices if e.lost_time is not None and e.index not in ready]
    # Lost this pass, after its nodes were seen Ready (a pool never up is not a loss).
    lost += [now for i in lost_now if (e := old.slice(i)) and e.seen_ready and not e.lost_time]
    return lost


def _refused(slices: list[SliceObservation]) -> str:
    """The first pool GKE refused for capacity (stockout, quota), as the shrink's cause."""
    refused = [(s.pool, s.error.code) for s in slices if s.error and s.error.code in CAPACITY_CODES]
    return f"node pool {refused[0][0]}: {refused[0][1]}" if refused else ""


def _lost_too_long(full: int, up: int, wait_seconds: int) -> str:
    # No running count in the text: a status that changed every pass would be rewritten.
    why = f"{full - up} of {full} slices lost for longer than spec.elastic.waitSeconds "
    return why + f"({wait_seconds}s)"


def _was_degraded(old: MultisliceJobStatus) -> bool:
    cond = old.condition(DEGRADED)
    return cond is not None and cond.status == "True"


def resized(old: MultisliceJobStatus) -> bool:
    """A JobSet of this job ran before (status.activeSlices): the next one is a resize."""
    return old.active_slices is not None


def create(plan: Plan, old: MultisliceJobStatus, target: int) -> CreateJobSet:
    """The JobSet create for `target` slices; a recreate continues the job's restarts, and is
    itself one (cause resize)."""
    if plan.elastic is None:
        return CreateJobSet()
    slices = target if target != plan.slices else None
    if not resized(old):
        return CreateJobSet(slices)
    by = old.restarts_by_cause
    return CreateJobSet(slices, old.restarts + 1, by.program() if by is not None else 0)


def finishing(js: JobSetObservation) -> bool:
    """A slice of it finished (or all): the job ends on the slices it has, never rerun to grow."""
    return js.completed or js.failed or js.succeeded_jobs > 0


def grow_request(plan: Plan, js: JobSetObservation | None, s: Size, attempt: int) -> str | None:
    """The checkpoint to request before growing back (None: no grow is due)."""
    if plan.elastic is None or js is None or js.deleting or not js.replicas or finishing(js):
        return None
    if s.target <= js.replicas:
        return None
    return f"{GROW_PREFIX}{s.target}-{attempt}"


@dataclass(frozen=True)
class Now:
    """What a resize decides on besides the JobSet: whether any of its pods runs, the time, and
    the steps the workload saved, by request id, as the pods say (checkpoint.acked)."""

    running: bool
    at: datetime
    acked: Mapping[str, int]


def resize(plan: Plan, old: MultisliceJobStatus, b: Builder, js: JobSetObservation, s: Size,
           now: Now) -> tuple[Phase, str] | None:  # fmt: skip
    """While the JobSet exists: delete it for a resize that is due (the next pass creates it
    on the new count once it is gone); None when its slice count stays."""
    if plan.elastic is None:
        return None
    if js.deleting:
        return _resizing(old, s)
    current = js.replicas or s.full
    if finishing(js):
        return None
    if s.target < current:
        return _shrink(plan, b, s)
    if s.target > current:
        return _grow(old, b, js, s, now)
    return None


def _resizing(old: MultisliceJobStatus, s: Size) -> tuple[Phase, str] | None:
    """The old JobSet is going: a resize waits for its pods (None: not a resize)."""
    if not resized(old):
        return None
    return Phase.RESTARTING, (
        f"resizing to {s.target} of {s.full} slices: waiting for the old JobSet's pods to go"
    )


def _shrink(plan: Plan, b: Builder, s: Size) -> tuple[Phase, str]:
    layout = plan.parallelism_at(s.target)
    b.add(DeleteJobSet(foreground=True))
    b.event(
        Reason.SHRINKING_SLICES,
        f"{s.why}: restarting on {s.target} of {s.full} slices (dcn.data "
        f"{layout.dcn_data}) from the last checkpoint; the lost pools stay requested and "
        "the job grows back once they are Ready",
    )
    return Phase.RESTARTING, f"shrinking to {s.target} of {s.full} slices: {s.why}"


def _grow(old: MultisliceJobStatus, b: Builder, js: JobSetObservation, s: Size, now: Now
          ) -> tuple[Phase, str] | None:  # fmt: skip
    """Grow once the grow's checkpoint is saved, or late, or nothing runs to save."""
    rid = f"{GROW_PREFIX}{s.target}-{js.restarts}"
    cp = _grow_checkpoint(old, b, rid, now.at, now.acked)
    saved = cp is not None and cp.saved_step is not None
    asked = cp.request_time if cp is not None else None
    late = asked is not None and (now.at - asked).total_seconds() >= GROW_SAVE_SECONDS
    if now.running and not saved and not late:
        if asked is not None:
            b.requeue_in(GROW_SAVE_SECONDS - (now.at - asked).total_seconds())
        return None  # the checkpoint is requested (checkpoint.py); running meanwhile
    b.add(DeleteJobSet(foreground=True))
    b.event(
        Reason.GROWING_SLICES,
        f"node pools for {s.target} of {s.full} slices are Ready again: restarting on "
        f"{s.target} slices{_grow_note(rid, cp, late)}",
    )
    return Phase.RESTARTING, f"growing back to {s.target} of {s.full} slices"


def _grow_checkpoint(
    old: MultisliceJobStatus, b: Builder, rid: str, now: datetime, acked: Mapping[str, int]
) -> CheckpointStatus | None:
    """The grow's checkpoint request `rid` (None: not requested yet). Saved as this pass sees
    it: recorded here (this pass ends before checkpoint.py would), and the grow goes now, not a
    pass later."""
    cp = old.checkpoint
    if cp is None or cp.request_id != rid:
        return None
    if cp.saved_step is None and rid in acked:
        cp = b.status.checkpoint
        assert cp is not None
        cp.saved_step, cp.saved_time = acked[rid], now
        b.event(Reason.CHECKPOINT_SAVED, f"checkpoint {rid} saved at step {cp.saved_step}")
    return cp


def _grow_note(rid: str, cp: CheckpointStatus | None, late: bool) -> str:
    """What the grow event says about its checkpoint."""
    if cp is not None and cp.saved_step is not None:
        return f" (checkpoint {rid} saved at step {cp.saved_step})"
    if late:
        return f" (checkpoint {rid} not saved within {GROW_SAVE_SECONDS}s)"
    return ""


def degraded(b: Builder, s: Size) -> None:
    """The Degraded condition: running on fewer slices than spec.slices, and why."""
    active = b.status.active_slices
    if active is not None and active < s.full:
        b.cond(
            DEGRADED,
            "True",
            Reason.FEWER_SLICES,
            f"running on {active} of {s.full} slices (spec.elastic); "
            + (s.why or "growing back: the pools are Ready again"),
        )
    else:
        b.cond(DEGRADED, "False", Reason.ALL_SLICES, f"running on all {s.full} slices")
