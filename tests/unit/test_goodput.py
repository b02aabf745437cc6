"""Goodput accounting over synthetic timelines: parts sum to wall time, operator gaps are charged
to the state seen when the operator comes back, restarts report lost steps and recovery."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multislice_operator.api.models import (
    GOODPUT_TIMELINE_MAX,
    GoodputState,
    GoodputStatus,
    MultisliceJobStatus,
    Phase,
    PodFailureStatus,
)
from multislice_operator.common.pools import PoolState
from multislice_operator.controller.observe import pod_records, summarize_pod
from multislice_operator.reconcile import (
    DecideConfig,
    JobMeta,
    JobSetObservation,
    SliceObservation,
    Termination,
    termination,
)
from multislice_operator.reconcile.goodput import (
    STATE_OF_PHASE,
    accounting_state,
    advance,
    live,
    steps_lost,
)
from tests.unit import jobs
from tests.unit.jobs import Observed, failed, spec_and_plan

S = GoodputState
T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@dataclass
class Pass:
    """One reconcile pass: at `t`, the operator sees `state` holding `held` chips."""

    t: int
    state: GoodputState | None
    held: int = 0


def drive(
    passes: list[Pass],
    created: int = 0,
    down: tuple[int, int] | None = None,
    heartbeat: bool = True,
) -> tuple[GoodputStatus | None, int]:
    """Run the accounting over the passes as the operator would. While `down` (from, to) no pass
    happens; the first pass after it was blind since the previous operator's last heartbeat
    (`from`), or knows nothing without a heartbeat. Returns the accounting and the number of
    passes that changed it (status writes)."""
    g: GoodputStatus | None = None
    writes, back = 0, False
    for p in passes:
        if down and down[0] < p.t < down[1]:
            continue
        blind = None
        if down and p.t >= down[1] and not back:
            back = True
            blind = at(down[0]) if heartbeat else None
        new = advance(g, p.state, p.held, at(p.t), at(created), blind)
        if new is not g:
            writes += 1
        g = new
    return g, writes


def every(start: int, stop: int, state: GoodputState | None, held: int = 0, step: int = 10):
    return [Pass(t, state, held) for t in range(start, stop, step)]


def total(g: GoodputStatus | None, now: int) -> int:
    return live(g, at(now)).wall_seconds


# ---------------------------------------------------------------- the table


def test_every_phase_maps_to_an_accounting_state():
    """A new phase (Kueue's Queued) is one line in STATE_OF_PHASE; until then this fails."""
    assert set(STATE_OF_PHASE) == {p.value for p in Phase}
    for phase in Phase:
        state = accounting_state(phase.value)
        assert (state is None) == phase.terminal


def test_a_slice_being_repaired_overrides_the_phase():
    assert accounting_state("Restarting", repairing=True) == S.REPAIRING
    assert accounting_state("Running", repairing=True) == S.REPAIRING
    assert accounting_state("Suspended", repairing=True) == S.SUSPENDED
    assert accounting_state("Succeeded", repairing=True) is None


# ---------------------------------------------------------------- timelines


def test_lifecycle_parts_sum_to_wall_time_and_writes_only_on_changes():
    passes = (
        every(0, 10, S.QUEUED)
        + every(10, 30, S.PROVISIONING, 0)
        + every(30, 70, S.PROVISIONING, 16)  # the first pool exists
        + every(70, 80, S.STARTING, 32)
        + every(80, 380, S.RUNNING, 32)
        + [Pass(380, None)]
    )
    g, writes = drive(passes)
    assert g is not None and g.state is None and g.since == at(380)
    assert g.seconds.model_dump() == {
        "queued": 10,
        "provisioning": 60,
        "starting": 10,
        "running": 300,
        "restarting": 0,
        "repairing": 0,
        "suspended": 0,
    }
    assert g.seconds.total() == 380  # completion - creation
    assert g.chip_seconds.provisioning == 40 * 16
    assert g.chip_seconds.running == 300 * 32
    assert g.chip_seconds.total() == 40 * 16 + 10 * 32 + 300 * 32
    assert g.chip_goodput == round(300 * 32 / g.chip_seconds.total(), 4)
    assert g.admitted_time == at(10)
    assert g.wall_goodput == round(300 / 370, 4)
    assert writes == 6  # first pass, 4 changes, completion: nothing in between
    assert [s.state for s in g.timeline] == ["queued", "provisioning", "starting", "running"]
    # Finished: the clock stopped, reading it later changes nothing.
    assert total(g, 10_000) == 380


def test_an_idle_pass_returns_the_accounting_itself():
    g = advance(None, S.RUNNING, 32, at(0), at(0))
    assert advance(g, S.RUNNING, 32, at(3600), at(0), at(3590)) is g


def test_live_figure_adds_the_current_state_up_to_now():
    g, _ = drive([*every(0, 100, S.STARTING, 32), Pass(100, S.RUNNING, 32)])
    assert g is not None
    view = live(g, at(160))
    assert view.seconds["starting"] == 100 and view.seconds["running"] == 60
    assert view.wall_seconds == 160
    assert view.running_chip_seconds == 60 * 32
    assert view.chip_goodput == round(60 / 160, 4)


def test_restart_and_suspend_are_accounted():
    passes = (
        every(0, 100, S.RUNNING, 32)
        + every(100, 130, S.RESTARTING, 32)
        + every(130, 200, S.RUNNING, 32)
        + every(200, 260, S.SUSPENDED, 32)  # releasing the pools
        + every(260, 500, S.SUSPENDED, 0)  # released
        + every(500, 560, S.PROVISIONING, 32)
        + every(560, 600, S.RUNNING, 32)
        + [Pass(600, None)]
    )
    g, _ = drive(passes)
    assert g is not None
    assert g.seconds.restarting == 30
    assert g.seconds.suspended == 300
    assert g.chip_seconds.suspended == 60 * 32
    assert g.seconds.running == 100 + 70 + 40
    assert g.seconds.total() == 600


def test_operator_gap_is_charged_to_the_state_seen_when_it_comes_back():
    """Killed at 200 (its last heartbeat), back at 800: the slices were restarting by then."""
    passes = every(0, 100, S.STARTING, 32) + every(100, 800, S.RUNNING, 32)
    passes += [*every(800, 900, S.RESTARTING, 32), Pass(900, S.RUNNING, 32)]
    g, _ = drive(passes, down=(200, 800))
    assert g is not None
    assert g.seconds.running == 100  # 100..200, up to the last heartbeat
    assert g.seconds.restarting == 700  # the gap 200..800 and 800..900
    assert total(g, 900) == 900


def test_operator_gap_in_the_same_state_is_simply_that_state():
    g, writes = drive(
        every(0, 100, S.STARTING, 32) + every(100, 1000, S.RUNNING, 32), down=(200, 800)
    )
    assert g is not None and writes == 2
    assert live(g, at(1000)).seconds["running"] == 900


def test_without_a_heartbeat_the_old_state_keeps_the_gap():
    passes = [*every(0, 800, S.RUNNING, 32), Pass(800, S.RESTARTING, 32)]
    g, _ = drive(passes, down=(200, 800), heartbeat=False)
    assert g is not None
    assert g.seconds.running == 800 and g.since == at(800)
    assert total(g, 800) == 800


def test_a_job_finishing_during_a_gap_keeps_its_time_until_completion():
    g, _ = drive([*every(0, 800, S.RUNNING, 32), Pass(800, None)], down=(200, 800))
    assert g is not None and g.state is None
    assert g.seconds.running == 800  # no state to charge after it: the last one keeps it
    assert g.seconds.total() == 800


def test_time_before_the_first_pass_goes_to_the_first_state_seen():
    """Created while the operator was down: the first state seen takes the time since creation."""
    g = advance(None, S.PROVISIONING, 0, at(50), created=at(0))
    assert g is not None and g.since == at(0) and g.admitted_time == at(0)
    assert total(g, 60) == 60


def test_a_finished_job_that_runs_again_restarts_the_clock():
    g, _ = drive([*every(0, 100, S.RUNNING, 32), Pass(100, None)])
    g2 = advance(g, S.QUEUED, 0, at(500), at(0), at(490))
    assert g2 is not None and g2.state == S.QUEUED and g2.since == at(500)
    assert g2.seconds.running == 100 and total(g2, 520) == 120


def test_the_timeline_is_bounded_and_the_totals_still_sum():
    passes: list[Pass] = []
    t = 0
    for _ in range(40):
        passes += every(t, t + 30, S.RUNNING, 32) + every(t + 30, t + 40, S.RESTARTING, 32)
        t += 40
    g, _ = drive([*passes, Pass(t, None)])
    assert g is not None
    assert len(g.timeline) == GOODPUT_TIMELINE_MAX
    assert g.timeline[-1].state == S.RESTARTING
    assert g.seconds.running == 40 * 30 and g.seconds.restarting == 40 * 10
    assert g.seconds.total() == t


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(1, 500),
            st.sampled_from([*GoodputState, None]),
            st.sampled_from([0, 16, 32]),
        ),
        min_size=1,
        max_size=30,
    ),
    created_before=st.integers(0, 300),
    gap=st.one_of(st.none(), st.tuples(st.integers(0, 30), st.integers(1, 30))),
    heartbeat=st.booleans(),
)
def test_property_parts_always_sum_to_wall_time(steps, created_before, gap, heartbeat):
    t, passes = 0, []
    for dt, state, held in steps:
        t += dt
        passes.append(Pass(t, state, held))
    down = None
    if gap is not None and gap[0] < len(passes):
        start = passes[gap[0]].t
        down = (start, start + gap[1] * 100)
        passes = [p if p.t <= start else Pass(p.t + gap[1] * 100, p.state, p.held) for p in passes]
    created = -created_before
    g, _ = drive(passes, created=created, down=down, heartbeat=heartbeat)
    end = passes[-1].t
    # The reference: the clock runs from creation once a state is seen, stops at completion and
    # starts again at the next pass that sees a state.
    expected, since, seen = 0, None, False
    for p in passes:
        if p.state is None and since is not None:
            expected, since = expected + p.t - since, None
        elif p.state is not None and since is None:
            since, seen = (p.t if seen else created), True
    if since is not None:
        expected += end - since
    view = live(g, at(end))
    assert view.wall_seconds == expected
    for s in GoodputState:  # chips held never exceed the job's
        assert 0 <= view.chip_seconds[s.value] <= view.seconds[s.value] * 32
    assert sum(view.chip_seconds.values()) == view.held_chip_seconds


# ---------------------------------------------------------------- termination messages


def test_contract_termination_message_is_parsed():
    text = (
        '{"v": 1, "reason": "hang", "exitCode": 75, "step": 123, "checkpointStep": 120, '
        '"checkpointRequest": {"id": "1733050000", "step": 120}, "message": "no step for 312 s"}'
    )
    assert termination.parse(text) == Termination(123, 120, "hang", ("1733050000", 120))


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "Traceback (most recent call last):\n  File ...",  # FallbackToLogsOnError
        '{"step": 12',  # truncated
        "[1, 2]",
        '{"step": -1, "checkpointStep": true}',
    ],
)
def test_anything_else_says_nothing(text):
    said = termination.parse(text)
    assert said is None or (said.step, said.checkpoint_step) == (None, None)


def test_nulls_before_the_first_step_and_checkpoint():
    assert termination.parse('{"step": null, "checkpointStep": null}') == Termination()
    assert termination.parse('{"step": 40, "checkpointStep": null}') == Termination(40)
    assert steps_lost(PodFailureStatus(pod="p", step=40)) == 40  # no checkpoint: all of it
    assert steps_lost(PodFailureStatus(pod="p", step=40, checkpoint_step=30)) == 10
    assert steps_lost(PodFailureStatus(pod="p")) is None


def test_failed_pod_summary_carries_the_steps():
    pod = {
        "metadata": {
            "name": "job-slice-1-0-abc",
            "labels": {
                "jobset.sigs.k8s.io/job-index": "1",
                "jobset.sigs.k8s.io/restart-attempt": "0",
            },
        },
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": 13,
                            "reason": "Error",
                            "message": '{"v": 1, "step": 57, "checkpointStep": 50}',
                        }
                    }
                }
            ],
        },
    }
    summary = summarize_pod(pod)
    assert summary["termination"] == Termination(57, 50)
    assert pod_records([summary], JobSetObservation()) == [
        failed("job-slice-1-0-abc", 1, 13, "Error", 0, step=57, checkpoint_step=50)
    ]


# ---------------------------------------------------------------- through decide()

CFG = DecideConfig.from_settings(None, resync_seconds=10)
META = JobMeta("ns", "job", "uid-1", 1, creation_time=T0, has_finalizer=True)


def existing_job():
    return spec_and_plan(provisioning={"mode": "Existing"})


SLICES = [SliceObservation(i, f"pool-{i}", PoolState.READY, 4) for i in range(2)]


def step(old, t, blind=None, jobset=None, failures=(), running=None):
    obs = Observed(
        now=at(t),
        slices=list(SLICES),
        jobset=jobset,
        pods=[*failures, *jobs.running(running or {}, jobset.restarts if jobset else 0)],
        blind_since=at(blind) if blind is not None else None,
    )
    return jobs.run(old, obs, cfg=CFG, meta=META, plan=existing_job()).status


def test_one_restart_reports_cause_lost_steps_and_recovery():
    run = {0: 4, 1: 4}
    s = step(None, 5)  # JobSet created: Starting
    s = step(s, 10, None, JobSetObservation(ready_jobs=2), running=run)
    assert s.phase == "Running" and s.goodput is not None and s.goodput.since == at(10)
    # A pod of attempt 0 fails after step 120, last checkpoint at 100.
    crash = failed("job-slice-1-0-a", 1, 13, "Error", 0, step=120, checkpoint_step=100)
    s = step(s, 100, None, JobSetObservation(ready_jobs=1), [crash], running={0: 4})
    assert s.goodput is not None and s.goodput.state == "restarting"
    assert s.goodput.since == at(100)
    assert s.last_failure is not None and s.last_failure.step == 120
    s = step(s, 105, None, JobSetObservation(ready_jobs=0, restarts=1, restarts_counted=1), [crash])
    assert s.last_restart is not None
    assert s.last_restart.model_dump() == {
        "restart": 1,
        "cause": "workload",
        "time": at(100),
        "lost_steps": 20,
        "recovery_seconds": None,
        "strategy": "Recreate",  # no in-place restart where the cluster was not found to have it
    }
    assert s.goodput.lost_steps == 20
    s = step(
        s,
        125,
        None,
        JobSetObservation(ready_jobs=2, restarts=1, restarts_counted=1),
        running={0: 4},
    )
    assert s.phase == "Running" and s.last_restart is not None
    assert s.last_restart.recovery_seconds is None  # slice 1's pods are not running yet
    s = step(
        s, 130, None, JobSetObservation(ready_jobs=2, restarts=1, restarts_counted=1), running=run
    )
    assert s.last_restart is not None and s.last_restart.recovery_seconds == 30
    assert s.goodput.seconds.restarting == 125 - 100
    again = step(
        s, 200, None, JobSetObservation(ready_jobs=2, restarts=1, restarts_counted=1), running=run
    )
    assert again.to_dict() == s.to_dict()  # idle: nothing to write
    done = step(again, 300, None, JobSetObservation(completed=True, restarts=1, restarts_counted=1))
    assert done.goodput is not None and done.completion_time == at(300)
    assert done.goodput.seconds.total() == 300  # completion - creation
    assert done.goodput.seconds.starting == 5 + 5  # creation..10 (first seen at 5)
    assert done.goodput.lost_steps == 20


def test_a_restart_recovered_while_the_operator_was_down():
    old = MultisliceJobStatus.from_dict(
        {
            "phase": "Running",
            "slices": [{"index": i, "hosts": 4, "phase": "Running"} for i in range(2)],
            "goodput": {"state": "running", "since": "2026-11-30T12:00:00Z", "heldChips": 32},
        }
    )
    run = {0: 4, 1: 4}
    # JobSet did not charge it to maxRestarts: a disruption (its pod was gone before we looked).
    s = step(old, 600, 400, JobSetObservation(ready_jobs=2, restarts=1), running=run)
    assert s.last_restart is not None
    assert (s.last_restart.cause, s.last_restart.time) == ("disruption", at(400))
    assert s.last_restart.recovery_seconds == 200
    assert s.goodput is not None and s.goodput.since == at(0)  # still running: nothing to close


@pytest.mark.parametrize(("counted", "cause"), [(2, "workload"), (1, "disruption")])
def test_a_restart_whose_failure_was_not_seen_has_the_cause_jobset_charged(counted, cause):
    old = MultisliceJobStatus.from_dict(
        {
            "phase": "Running",
            "restarts": 1,
            "restartsByCause": {"workload": 1},
            "lastFailure": {"pod": "p", "restartAttempt": 0, "exitCode": 13, "step": 9},
        }
    )
    s = step(old, 50, None, JobSetObservation(ready_jobs=0, restarts=2, restarts_counted=counted))
    assert s.last_restart is not None
    # The record of attempt 0 says nothing of restart 2: no steps lost are claimed.
    assert (s.last_restart.cause, s.last_restart.lost_steps) == (cause, None)
    assert s.goodput is not None and s.goodput.lost_steps == 0


def test_a_lost_slice_is_repairing_time_with_its_pool_held():
    managed_spec, mplan = spec_and_plan()
    names = [p.name for p in mplan.node_pools]
    before = [{"index": i, "phase": "Running", "hosts": 4, "seenReady": True} for i in range(2)]
    old = MultisliceJobStatus.from_dict(
        {
            "phase": "Running",
            "slices": before,
            "goodput": {"state": "running", "since": "2026-11-30T12:00:00Z", "heldChips": 32},
        }
    )
    obs = Observed(
        now=at(60),
        slices=[
            SliceObservation(0, names[0], PoolState.READY, 4),
            SliceObservation(1, names[1], PoolState.ABSENT),
        ],
        jobset=JobSetObservation(ready_jobs=1),
    )
    s = jobs.run(old, obs, cfg=CFG, meta=META, plan=(managed_spec, mplan)).status
    assert s.goodput is not None
    # The surviving pool, and the replacement this very pass creates (held from now on).
    assert s.goodput.held_chips == 32 and s.goodput.state == "repairing"
    assert s.goodput.seconds.running == 60 and s.goodput.chip_seconds.running == 60 * 32


# ---------------------------------------------------------------- the heartbeat


class FakeLeases:
    def __init__(self, lease=None, refuse=False) -> None:
        self.lease, self.refuse, self.writes = lease, refuse, 0

    async def get_lease(self, namespace, name):
        if self.refuse:
            raise OSError("forbidden")
        return self.lease

    async def create_lease(self, namespace, body):
        return await self.replace_lease(namespace, body)

    async def replace_lease(self, namespace, body):
        if self.refuse:
            raise OSError("forbidden")
        self.writes += 1
        self.lease = {**body, "metadata": {**body["metadata"], "resourceVersion": "1"}}
        return self.lease


def test_heartbeat_reads_the_previous_operator_then_renews_as_itself():
    import asyncio

    from multislice_operator.controller.heartbeat import Heartbeat, HeartbeatConfig

    cfg = HeartbeatConfig("ns", "msj-heartbeat", "me")
    old = {
        "metadata": {"name": "msj-heartbeat"},
        "spec": {"holderIdentity": "them", "renewTime": "2026-11-30T12:00:00.000000Z"},
    }
    kube = FakeLeases(old)
    hb = Heartbeat(kube, cfg)  # type: ignore[arg-type]
    assert asyncio.run(hb.start()) == T0
    assert kube.lease["spec"]["holderIdentity"] == "me" and kube.writes == 1
    assert asyncio.run(Heartbeat(kube, cfg).start()) is None  # its own: no outage to charge
    refused = Heartbeat(FakeLeases(old, refuse=True), cfg)  # type: ignore[arg-type]
    assert asyncio.run(refused.start()) is None and refused.failing


def test_keys_another_manager_still_holds_are_removed_with_nulls():
    """Server-side apply drops the keys it owned and no longer sends; a key written before (by
    an operator that merge-patched) stays until a merge patch of nulls removes it."""
    from multislice_operator.controller.reconciler import _stale

    stored = {"phase": "Succeeded", "goodput": {"state": "running", "since": "t2", "heldChips": 0}}
    new = {"phase": "Succeeded", "goodput": {"since": "t2", "heldChips": 0}}
    assert _stale(stored, new) == {"goodput": {"state": None}}
    assert _stale(new, new) is None
    assert _stale({"a": {"b": 1}, "c": 2}, {"a": 2}) == {"c": None}


def test_resuming_a_managed_job_is_provisioning_time():
    """Resuming re-creates the pools released while suspended: Provisioning, not a pass without
    a phase (which would have left the time to no state)."""
    spec, plan = spec_and_plan()
    names = [p.name for p in plan.node_pools]
    old = MultisliceJobStatus.from_dict(
        {
            "phase": "Suspended",
            "goodput": {"state": "suspended", "since": "2026-11-30T12:00:00Z", "heldChips": 0},
        }
    )
    obs = Observed(
        now=at(30),
        slices=[SliceObservation(i, n, PoolState.ABSENT) for i, n in enumerate(names)],
        jobset=JobSetObservation(suspended=True),
    )
    d = jobs.run(old, obs, cfg=CFG, meta=META, plan=(spec, plan))
    assert d.status.phase == "Provisioning" and "resuming" in (d.status.message or "")
    assert d.status.goodput is not None and d.status.goodput.state == "provisioning"
    assert d.status.goodput.seconds.suspended == 30
