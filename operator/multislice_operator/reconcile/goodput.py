"""Goodput accounting: where every second and chip-second of a job went, level-based and pure.

status.goodput holds closed totals per state plus the current state and when it began (`since`).
A pass changes it only when the state or the chips held change, so an idle job costs no status
write; the live figure (the current state's time up to now) is computed when read, by the CLI
and the metrics (`live`).

A change is charged from the pass that sees it: the operator watches the job's JobSet, pods and
nodes, so it sees a change within moments. Except after an operator restart: while no operator
ran, nobody saw anything, so the time since the previous operator's last heartbeat
(`Observed.blind_since`) is charged to the state the new operator sees when it comes back. A
ten-minute outage is neither lost nor counted twice. Without a heartbeat to go by, the old state
keeps the time up to now.

The accounting starts at metadata.creationTimestamp, so the parts add up to the wall-clock time
from creation to completion (or to now). A finished job's clock stops at completion.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from multislice_operator.api.models import (
    GOODPUT_TIMELINE_MAX,
    GoodputSegment,
    GoodputState,
    GoodputStatus,
    Phase,
    PodFailureStatus,
    RestartCause,
    RestartStatus,
    SlicePhase,
    StateSeconds,
)
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.context import Builder, at_second
from multislice_operator.reconcile.facts import Facts

S = GoodputState

# The one table from phase to accounting state: a new phase is one line here. None: the clock
# stops (the job finished). tests/unit/test_goodput.py fails for a phase missing from it.
STATE_OF_PHASE: dict[str, GoodputState | None] = {
    Phase.PENDING.value: S.QUEUED,
    Phase.QUEUED.value: S.QUEUED,
    Phase.PROVISIONING.value: S.PROVISIONING,
    Phase.STARTING.value: S.STARTING,
    Phase.RUNNING.value: S.RUNNING,
    Phase.RESTARTING.value: S.RESTARTING,
    Phase.SUSPENDED.value: S.SUSPENDED,
    Phase.SUCCEEDED.value: None,
    Phase.FAILED.value: None,
}
# A slice being replaced overrides what the phase says (it is Restarting meanwhile).
REPAIRABLE = (S.STARTING, S.RUNNING, S.RESTARTING)
# Existing pools are not ours: the job holds their chips while its JobSet runs on them (what the
# capacity model is told: `in_use`).
EXISTING_HOLDS = (S.STARTING, S.RUNNING, S.RESTARTING, S.REPAIRING)
RECOVERING = (S.RESTARTING, S.REPAIRING)

SPARE = "spare"  # the chip-seconds key (and metric label) of hot spare pools
CAUSE_WORKLOAD = "workload"  # restarts.py says which cause a restart has; this, when none


def accounting_state(phase: str | None, repairing: bool = False) -> GoodputState | None:
    if phase is None:
        return None
    state = STATE_OF_PHASE[str(phase)]
    if repairing and state in REPAIRABLE:
        return S.REPAIRING
    return state


# ---------------------------------------------------------------- the accumulation (pure)


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole > 0 else None


def _ratios(g: GoodputStatus, seconds: StateSeconds, chips: StateSeconds, until: datetime,
            spare: int) -> None:  # fmt: skip
    g.chip_goodput = _ratio(chips.running, chips.total() + spare)
    admitted = g.admitted_time
    wall = int((until - admitted).total_seconds()) if admitted else 0
    g.wall_goodput = _ratio(seconds.running, wall)


def advance(
    old: GoodputStatus | None,
    state: GoodputState | None,
    held_chips: int,
    now: datetime,
    created: datetime | None = None,
    blind_since: datetime | None = None,
    spare_chips: int = 0,
    degraded: bool = False,
) -> GoodputStatus | None:
    """The accounting after a pass that observed `state` holding `held_chips` at `now`, of
    which `spare_chips` are hot spares' (charged to spare chip-seconds, not to the state);
    `degraded`: running on fewer slices than spec.slices (spec.elastic), or on degraded
    capacity (an ACTIVE_DEGRADED Slice): counted apart too.

    Returns `old` itself (unchanged) when nothing changed, so an idle job writes nothing."""
    spare_chips = min(spare_chips, held_chips)
    held_chips -= spare_chips
    degraded = degraded and state == S.RUNNING  # as stored (_open): only running is degraded
    now = at_second(now)
    if old is None or (old.state is None and old.since is None):
        if state is None:
            return old  # finished (or invalid) before anything was accounted
        start = min(at_second(created), now) if created is not None else now
        g = GoodputStatus(
            state=state,
            since=start,
            held_chips=held_chips,
            spare_chips=spare_chips,
            degraded=degraded,
        )
        g.timeline = [GoodputSegment(state=state, since=start)]
        if state != S.QUEUED:
            g.admitted_time = start
        _ratios(g, g.seconds, g.chip_seconds, start, g.spare_chip_seconds)
        return g
    if old.state is None:  # the clock had stopped: a job that runs again starts from now
        if state is None:
            return old
        g = old.model_copy(deep=True)
        _open(g, state, held_chips, spare_chips, now, degraded)
        return g
    if (
        state == old.state
        and held_chips == old.held_chips
        and spare_chips == old.spare_chips
        and degraded == old.degraded
    ):
        return old
    assert old.since is not None
    g = old.model_copy(deep=True)
    # Seen now, so changed now; unless the operator was blind since some time: that time goes to
    # what is seen now. A finished job has no state to charge: the old one keeps it.
    split = now
    if blind_since is not None and state is not None:
        split = min(max(at_second(blind_since), old.since), now)
    _close(g, split)
    if state is None:
        g.state, g.since, g.held_chips, g.spare_chips, g.degraded = None, now, 0, 0, False
        _ratios(g, g.seconds, g.chip_seconds, now, g.spare_chip_seconds)
        return g
    _open(g, state, held_chips, spare_chips, split, degraded)
    return g


def _close(g: GoodputStatus, until: datetime) -> None:
    assert g.state is not None and g.since is not None
    seconds = max(0, int((until - g.since).total_seconds()))
    g.seconds.add(g.state, seconds)
    g.chip_seconds.add(g.state, seconds * g.held_chips)
    g.spare_chip_seconds += seconds * g.spare_chips
    if g.degraded and g.state == S.RUNNING:
        g.degraded_chip_seconds += seconds * g.held_chips


def _open(g: GoodputStatus, state: GoodputState, held_chips: int, spare_chips: int,
          at: datetime, degraded: bool = False) -> None:  # fmt: skip
    changed = state != g.state
    g.state, g.since, g.held_chips, g.spare_chips = state, at, held_chips, spare_chips
    g.degraded = degraded and state == S.RUNNING
    if g.admitted_time is None and state != S.QUEUED:
        g.admitted_time = at
    if changed:
        g.timeline = [*g.timeline, GoodputSegment(state=state, since=at)][-GOODPUT_TIMELINE_MAX:]
    _ratios(g, g.seconds, g.chip_seconds, at, g.spare_chip_seconds)


# ---------------------------------------------------------------- reading it live


@dataclass(frozen=True)
class Live:
    """The accounting at `now`: closed totals plus the current state's time so far."""

    now: datetime
    state: GoodputState | None
    since: datetime | None
    held_chips: int
    seconds: dict[str, int]
    chip_seconds: dict[str, int]
    chip_goodput: float | None
    wall_goodput: float | None
    lost_steps: int
    degraded_chip_seconds: int = 0  # of running chip-seconds, those on fewer slices (elastic)

    @property
    def wall_seconds(self) -> int:
        return sum(self.seconds.values())

    @property
    def held_chip_seconds(self) -> int:
        return sum(self.chip_seconds.values())

    @property
    def running_chip_seconds(self) -> int:
        return self.chip_seconds[S.RUNNING.value]

    def as_dict(self) -> dict[str, Any]:
        return {
            "asOf": self.now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "state": self.state.value if self.state else None,
            "since": self.since.strftime("%Y-%m-%dT%H:%M:%SZ") if self.since else None,
            "heldChips": self.held_chips,
            "seconds": dict(self.seconds),
            "chipSeconds": dict(self.chip_seconds),
            "wallSeconds": self.wall_seconds,
            "heldChipSeconds": self.held_chip_seconds,
            "runningChipSeconds": self.running_chip_seconds,
            "chipGoodput": self.chip_goodput,
            "wallGoodput": self.wall_goodput,
            "lostSteps": self.lost_steps,
            "degradedChipSeconds": self.degraded_chip_seconds,
        }


def live(g: GoodputStatus | None, now: datetime) -> Live:
    """The totals as of `now` (never before `since`): what the CLI shows and the metrics count."""
    g = g or GoodputStatus()
    seconds = g.seconds.model_copy()
    chips = g.chip_seconds.model_copy()
    spare = g.spare_chip_seconds
    degraded = g.degraded_chip_seconds
    until = now
    if g.state is not None and g.since is not None:
        until = max(now, g.since)
        open_s = int((until - g.since).total_seconds())
        seconds.add(g.state, open_s)
        chips.add(g.state, open_s * g.held_chips)
        spare += open_s * g.spare_chips
        if g.degraded and g.state == S.RUNNING:
            degraded += open_s * g.held_chips
    elif g.since is not None:
        until = g.since  # stopped: the totals are final
    view = GoodputStatus(admitted_time=g.admitted_time)
    _ratios(view, seconds, chips, until, spare)
    return Live(
        now=until,
        state=GoodputState(g.state) if g.state else None,
        since=g.since,
        held_chips=g.held_chips + g.spare_chips if g.state else 0,
        seconds={s.value: seconds.get(s) for s in GoodputState},
        # Hot spares' chip-seconds beside the states': held (and paid for) in every state.
        chip_seconds={**{s.value: chips.get(s) for s in GoodputState}, SPARE: spare},
        chip_goodput=view.chip_goodput,
        wall_goodput=view.wall_goodput,
        lost_steps=g.lost_steps,
        degraded_chip_seconds=degraded,
    )


# ------------------------------------------------------ steps lost (docs/environment.md section 2)


def steps_lost(f: PodFailureStatus) -> int | None:
    """last step - last checkpoint step (everything, without a checkpoint); None: not said."""
    if f.step is None:
        return None
    return max(0, f.step - (f.checkpoint_step or 0))


# ---------------------------------------------------------------- the hook in decide()


def held_chips(f: Facts, b: Builder, state: GoodputState | None) -> int:
    """The chips the job holds after this pass, as its capacity model counts them
    (`CapacityModel.chips_held`): its own pools (or cube pools) that exist and those this pass
    creates (held from now on, as the next pass will see them: no second write); capacity it
    does not create while its JobSet runs on it (Existing pools), or while its Slices hold it
    (Existing cubes)."""
    if f.plan is None or state is None:
        return 0
    return f.capacity.chips_held(f, b, f.plan, state in EXISTING_HOLDS)


def spare_chips(plan: Plan | None, held: int) -> int:
    """Of `held`, the chips beyond spec.slices' pools (plan.total_chips): the hot spares'
    (whichever pools they are: a slice may run on any of the job's pools), or spare cubes'
    (DynamicSlicing: spec.spares counts cubes)."""
    if plan is None:
        return 0
    return max(0, held - plan.total_chips)


def account(f: Facts, b: Builder, repairing: bool, on_degraded: bool = False) -> None:
    """Called once per decide(), after the phase and status.slices are decided; `on_degraded`:
    a slice runs on degraded capacity (the capacity model's word: an ACTIVE_DEGRADED Slice)."""
    if b.status.phase is None:  # no phase decided: nothing says the state changed
        return
    state = accounting_state(b.status.phase, repairing)
    held = held_chips(f, b, state)
    g = advance(
        b.status.goodput,  # a copy of the old one: returned as is when nothing changed
        state,
        held,
        f.now,
        f.meta.creation_time,
        f.obs.blind_since,
        spare_chips(f.plan, held),
        _degraded(f, b) or on_degraded,
    )
    if g is None:
        return
    b.status.goodput = g
    if b.status.restarts > f.old.restarts or b.status.last_restart is not None:
        _restarts(f, b, g)


def _degraded(f: Facts, b: Builder) -> bool:
    """An elastic job running on fewer slices than spec.slices."""
    active = b.status.active_slices
    return f.plan is not None and active is not None and active < f.plan.slices


def _restarts(f: Facts, b: Builder, g: GoodputStatus) -> None:
    """status.lastRestart: cause and steps lost when a restart is counted; recovery once every
    slice runs again."""
    last = b.status.last_restart
    if b.status.restarts > f.old.restarts:
        last = _counted(f, b, g, last)
    if last is not None and last.recovery_seconds is None and _all_running(f, b, g):
        last = _recovered(f, g, last)
    b.status.last_restart = last


def _counted(f: Facts, b: Builder, g: GoodputStatus, last: RestartStatus | None) -> RestartStatus:
    """The record of the restart counted on this pass; its lost steps go to the goodput."""
    failure = b.status.last_failure
    # The failure that caused restart n was seen on a pod of attempt n-1; an older record
    # belongs to an earlier restart and says nothing about this one.
    known = failure is not None and failure.restart_attempt == b.status.restarts - 1
    lost = steps_lost(failure) if known and failure is not None else None
    cause = f.restarts.cause or RestartCause(CAUSE_WORKLOAD)
    strategy = f.restart.get(cause)
    continues = strategy is not None and strategy.continues_outage
    began = _outage_began(f, g, continues, last)
    g.lost_steps += lost or 0
    return RestartStatus(
        restart=b.status.restarts,
        cause=cause.value,
        time=began,
        lost_steps=lost,
        strategy=strategy.name if strategy is not None else None,
    )


def _outage_began(f: Facts, g: GoodputStatus, continues: bool, last: RestartStatus | None
                  ) -> datetime:  # fmt: skip
    """When the slices stopped running, for a restart counted now."""
    if g.state in RECOVERING and g.since is not None:
        began = g.since  # when the slices stopped running, as accounted
    else:  # stopped and recovered unseen (while the operator was down, or within a pass)
        blind = f.obs.blind_since
        began = min(at_second(blind), f.now) if blind is not None else f.now
    # A restart that continues an outage the job has not recovered from (a shrink after a
    # loss): the outage began with the loss.
    unrecovered = last is not None and last.recovery_seconds is None
    if continues and unrecovered and last and last.time:
        began = min(began, last.time)
    return began


def _recovered(f: Facts, g: GoodputStatus, last: RestartStatus) -> RestartStatus:
    """`last` with its recovery time: from the outage's start to when every slice ran again."""
    old = f.old.goodput
    opened_now = old is None or g.since != old.since or g.state != old.state
    end = g.since if opened_now and g.since is not None else f.now
    began = last.time or end
    seconds = int((max(end, began) - began).total_seconds())
    return last.model_copy(update={"recovery_seconds": seconds})


def _all_running(f: Facts, b: Builder, g: GoodputStatus) -> bool:
    """Every slice runs (or ran): as many pools busy as the JobSet's slices (spec.slices, or
    fewer while an elastic job is shrunk); an idle spare is not."""
    up = (SlicePhase.RUNNING.value, SlicePhase.SUCCEEDED.value)
    slices = f.active if f.plan is not None else len(b.status.slices)
    busy = sum(1 for s in b.status.slices if s.phase in up)
    return g.state == S.RUNNING and bool(b.status.slices) and busy >= slices
