"""Hot spare slices (spec.spares) in decide(): the spare pools are provisioned with the gang, and a
lost pool's slice restarts at once on a spare while the lost pool is replaced as the new spare."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial

from multislice_operator.common.pools import PoolState
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    CreateJobSet,
    CreatePools,
    DecideConfig,
    DeletePools,
    JobMeta,
    JobSetObservation,
    Pod,
    SliceObservation,
)
from tests.unit import jobs
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 2, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10)
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
HOSTS = 4  # hosts per slice of the default job (v5p, 2x2x4)


run = partial(jobs.run, cfg=CFG, meta=META, spares=1)  # run(old, obs, spares=...)


def pools(*states: PoolState, ready: list[int] | None = None, spares: int = 1):
    _, plan = spec_and_plan(spares=spares)
    out = []
    for i, state in enumerate(states):
        hosts = ready[i] if ready else (HOSTS if state == PoolState.READY else 0)
        out.append(SliceObservation(i, plan.pools[i].name, state, hosts))
    return out


def running_pods(placement: dict[int, int], attempt: int = 0) -> list[Pod]:
    """`placement`: JobSet slice -> the index of the pool its pods run on."""
    _, plan = spec_and_plan(spares=1)
    return [
        Pod(
            f"job-slice-{s}-{h}",
            s,
            attempt,
            phase="Running",
            ready=True,
            node=f"node-{p}-{h}",
            pool=plan.pools[p].name,
        )
        for s, p in placement.items()
        for h in range(HOSTS)
    ]


def reasons(d) -> list[str]:
    return [e.reason for e in d.events]


def cond(d, type_: str) -> dict:
    return next(c for c in d.status.to_dict()["conditions"] if c["type"] == type_)


def running_before(n: int = 3, restarts: int = 0) -> dict:
    slices = [{"index": i, "phase": "Running", "hosts": HOSTS, "seenReady": True} for i in range(n)]
    return {"phase": "Running", "restarts": restarts, "slices": slices,
            "runningTime": "2026-12-02T11:00:00Z"}  # fmt: skip


def test_the_plan_holds_the_spare_pools_beside_the_slices():
    _, plan = spec_and_plan(spares=2)
    assert plan.slices == 2 and len(plan.pools) == 4 and len(plan.node_pools) == 2
    assert [p.slice_index for p in plan.pools] == [0, 1, 2, 3]
    assert len({p.name for p in plan.pools}) == 4


def test_the_gang_includes_the_spares_and_the_jobset_waits_for_all_of_them():
    d = run(None, Observed(now=NOW, slices=pools(*[PoolState.ABSENT] * 3)))
    assert d.actions == [CreatePools((0, 1, 2))]
    # Two of three pools ready: enough for the slices, but the gang is all or none.
    d = run(d.status, Observed(now=NOW, slices=pools(PoolState.READY, PoolState.READY,
                                                     PoolState.CREATING)))  # fmt: skip
    assert not any(isinstance(a, CreateJobSet) for a in d.actions)
    assert d.status.phase == "Provisioning"
    assert "3 node pools (2 slices + 1 spare)" in d.status.message
    d = run(d.status, Observed(now=NOW, slices=pools(*[PoolState.READY] * 3)))
    assert CreateJobSet() in d.actions
    assert cond(d, "Provisioned")["message"] == "all 3 node pools (2 slices + 1 spare) ready"


def test_a_lost_pool_covered_by_a_spare_runs_again_before_its_replacement_exists():
    # Slices 0 and 1 ran on pools 0 and 1; pool 1's nodes are gone (spot preemption).
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.READY, PoolState.READY, ready=[4, 0, 4]),
        jobset=JobSetObservation(ready_jobs=1, restarts=1),
        pods=running_pods({0: 0}, attempt=1),
    )
    d = run(running_before(), obs)
    _, plan = spec_and_plan(spares=1)
    assert d.actions == [DeletePools((plan.pools[1].name,))]
    assert cond(d, "Provisioned")["status"] == "True"
    assert cond(d, "Provisioned")["reason"] == Reason.REPAIRING_SPARE
    lost = [e.message for e in d.events if e.reason == Reason.SLICE_LOST]
    assert len(lost) == 1 and "a spare node pool takes its place" in lost[0]
    # The JobSet restarted (JobSet's own failure policy): slice 1 now runs on the spare, pool 2,
    # while pool 1 is absent and being created again: the job is Running, not repairing.
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.ABSENT, PoolState.READY),
        jobset=JobSetObservation(ready_jobs=2, restarts=1),
        pods=running_pods({0: 0, 1: 2}, attempt=1),
    )
    d2 = run(d.status, obs)
    assert d2.actions == [CreatePools((1,))]
    assert d2.status.phase == "Running"
    assert d2.status.goodput is not None and d2.status.goodput.state == "running"
    phases = [s.phase for s in d2.status.slices]
    assert phases == ["Running", "Repairing", "Running"]  # per pool: slice 1 is on pool 2
    assert d2.status.ready_slices == "2/3"


def test_without_a_spare_the_same_loss_waits_for_the_replacement():
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.ABSENT, spares=0),
        jobset=JobSetObservation(ready_jobs=1, restarts=1),
    )
    d = run(running_before(2), obs, spares=0)
    assert d.actions == [CreatePools((1,))]
    assert d.status.phase == "Restarting"
    assert cond(d, "Provisioned")["reason"] == Reason.REPAIRING
    assert d.status.goodput is not None and d.status.goodput.state == "repairing"


def test_two_pools_lost_with_one_spare_is_not_enough():
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.ABSENT, PoolState.ABSENT),
        jobset=JobSetObservation(ready_jobs=1, restarts=1),
    )
    d = run(running_before(), obs)
    assert d.actions == [CreatePools((1, 2))]
    assert d.status.phase == "Restarting"
    assert cond(d, "Provisioned")["status"] == "False"
    assert cond(d, "Provisioned")["reason"] == Reason.REPAIRING
    assert d.status.goodput is not None and d.status.goodput.state == "repairing"


def test_goodput_charges_the_spares_chip_seconds_apart_and_counts_their_cost():
    """Running 100 s on 2 slices with 1 spare held: the running state gets the 2 slices'
    chip-seconds, the spare's go to spareChipSeconds, and chip goodput is 2/3, not 1."""
    from datetime import timedelta

    from multislice_operator.reconcile import goodput

    _, plan = spec_and_plan(spares=1)
    chips = plan.shape.chips
    obs = Observed(
        now=NOW,
        slices=pools(*[PoolState.READY] * 3),
        jobset=JobSetObservation(ready_jobs=2),
        pods=running_pods({0: 0, 1: 1}),
    )
    d = run(running_before(), obs)
    g = d.status.goodput
    assert g is not None and g.state == "running"
    assert (g.held_chips, g.spare_chips) == (2 * chips, chips)
    later = goodput.live(g, NOW + timedelta(seconds=100))
    assert later.chip_seconds["running"] == 100 * 2 * chips
    assert later.chip_seconds[goodput.SPARE] == 100 * chips
    assert later.held_chips == 3 * chips
    assert later.chip_goodput == round(2 / 3, 4)
    # Closed by a change of state (a restart): the totals land in the status the same way.
    obs.now = NOW + timedelta(seconds=100)
    obs.jobset = JobSetObservation(ready_jobs=1, restarts=1)
    d2 = run(d.status, obs)
    g2 = d2.status.goodput
    assert g2 is not None and g2.state == "restarting"
    assert g2.chip_seconds.running == 100 * 2 * chips
    assert g2.spare_chip_seconds == 100 * chips
    assert g2.chip_goodput == round(2 / 3, 4)


def test_without_spares_nothing_is_charged_to_them():
    obs = Observed(
        now=NOW,
        slices=pools(PoolState.READY, PoolState.READY, spares=0),
        jobset=JobSetObservation(ready_jobs=2),
    )
    d = run(running_before(2), obs, spares=0)
    _, plan = spec_and_plan(spares=0)
    g = d.status.goodput
    assert g is not None and g.spare_chips == 0 and g.held_chips == 2 * plan.shape.chips
