"""status.goodput of a DynamicSlicing job (issue 41): the chips it holds are its 4x4x4 cubes.
Managed cubes: every cube pool of the job that exists or that the pass creates, spare cubes
included (spareChipSeconds); Existing cubes: the cubes of the job's Slices."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common.pools import PoolState
from multislice_operator.planning import cubes
from multislice_operator.plugins.dynamic import CreateSlice, CubeObservation, SliceObjectObservation
from multislice_operator.reconcile import JobMeta, SliceObservation
from multislice_operator.reconcile.goodput import SPARE, live
from multislice_operator.reconcile.types import CreatePools, JobSetObservation
from tests.unit import jobs
from tests.unit.test_dynamic_slicing import Observed

T0 = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
META = JobMeta("ns", "job", "uid-1", 1, creation_time=T0, has_finalizer=True)
BLOCK = "ironwood/reservationBlocks/block-1"


def _job(accelerator: str, spares: int, source: str = "Managed") -> Any:
    return jobs.spec_and_plan(
        accelerator=accelerator,
        slices=2,
        spares=spares,
        capacity={"type": "Reserved", "reservation": BLOCK},
        provisioning={"mode": "DynamicSlicing", "dynamicSlicing": {"cubes": source}},
    )


def _cube_chips(plan: Any) -> int:
    cube = cubes.cube_shape(plan.shape.generation)
    assert cube is not None
    return cube.chips


def _pools(plan: Any, state: PoolState) -> list[SliceObservation]:
    hosts = 16 if state == PoolState.READY else 0
    return [SliceObservation(p.slice_index, p.name, state, hosts) for p in plan.pools]


def _cubes(plan: Any) -> list[CubeObservation]:
    return [CubeObservation(f"p{p.slice_index}", p.name, "HEALTHY", 16) for p in plan.pools]


def _slices(plan: Any) -> list[SliceObjectObservation]:
    per = plan.cubes_per_slice
    return [
        SliceObjectObservation(
            cubes.slice_names(plan.job_key, i)[0],
            i,
            tuple(f"p{c}" for c in range(i * per, (i + 1) * per)),
            "ACTIVE",
        )
        for i in range(plan.slices)
    ]


def _run(sp: Any, old: Any, t: int, **obs: Any) -> Any:
    d = jobs.run(old, Observed(now=T0 + timedelta(seconds=t), **obs), meta=META, plan=sp)
    assert not d.violations
    return d


def test_the_managed_cube_pools_a_pass_creates_are_held_spare_cube_apart() -> None:
    """tpu7x-256 (4x4x8) is 2 cubes a slice: 2 slices + 1 spare cube are 5 cube pools, 320
    chips from the pass that creates them, 64 of them the spare's."""
    sp = _job("tpu7x-256", spares=1)
    plan = sp[1]
    cube = _cube_chips(plan)
    assert (plan.cubes_needed, cube, plan.total_chips) == (5, 64, 256)
    d = _run(sp, None, 0, slices=_pools(plan, PoolState.ABSENT))
    assert [a for a in d.actions if isinstance(a, CreatePools)] == [CreatePools((0, 1, 2, 3, 4))]
    g = d.status.goodput
    assert g is not None and g.state == "provisioning"
    assert (g.held_chips, g.spare_chips) == (4 * cube, cube)


def test_a_running_dynamic_job_charges_its_spare_cube_to_spare_chip_seconds() -> None:
    sp = _job("tpu7x-128", spares=1)  # 4x4x4: one cube a slice, 3 cube pools
    plan = sp[1]
    cube = _cube_chips(plan)
    running = {
        "phase": "Running",
        "jobSet": "job",
        "conditions": [{"type": "Provisioned", "status": "True", "reason": "GangReady"}],
    }
    d = _run(
        sp,
        MultisliceJobStatus.from_dict(running),
        0,
        slices=_pools(plan, PoolState.READY),
        cubes=_cubes(plan),
        slice_objects=_slices(plan),
        jobset=JobSetObservation(ready_jobs=2),
        pods=jobs.running({0: 16, 1: 16}),
    )
    g = d.status.goodput
    assert g is not None and g.state == "running"
    assert (g.held_chips, g.spare_chips) == (2 * cube, cube)
    later = live(g, T0 + timedelta(seconds=100))
    assert later.chip_seconds["running"] == 100 * 2 * cube
    assert later.chip_seconds[SPARE] == 100 * cube
    assert later.held_chips == 3 * cube
    assert later.chip_goodput == round(2 / 3, 4)


def test_a_failed_cube_pool_is_held_until_gone_another_jobs_pool_never() -> None:
    """A failed cube pool is deleted to be made again: held until it is absent; a pool of the
    job's name that another job holds (foreign) is not the job's."""
    sp = _job("tpu7x-128", spares=0)
    plan = sp[1]
    cube = _cube_chips(plan)
    pools = _pools(plan, PoolState.READY)
    pools[1] = SliceObservation(1, pools[1].pool, PoolState.FAILED)
    d = _run(sp, None, 0, slices=pools)
    g = d.status.goodput
    assert g is not None and g.state == "provisioning" and g.held_chips == 2 * cube
    pools[1] = SliceObservation(1, pools[1].pool, PoolState.READY, 16, foreign=True)
    d = _run(sp, None, 0, slices=pools)
    g = d.status.goodput
    assert g is not None and g.held_chips == cube


def test_existing_cubes_are_held_while_the_jobs_slices_hold_them() -> None:
    """Existing cubes are not the job's: it holds the cubes its Slices hold, from the pass that
    forms them; a free cube (a spare for it to re-form on) is anyone's and not charged."""
    sp = _job("tpu7x-128", spares=1, source="Existing")
    plan = sp[1]
    cube = _cube_chips(plan)
    there = [CubeObservation(f"x{i}", f"pool-{i}", "HEALTHY", 16) for i in range(3)]
    d = _run(sp, None, 0, cubes=there)
    formed = [a for a in d.actions if isinstance(a, CreateSlice)]
    assert [a.partitions for a in formed] == [("x0",), ("x1",)]
    g = d.status.goodput
    assert g is not None and g.state == "provisioning"
    assert (g.held_chips, g.spare_chips) == (2 * cube, 0)
    # One Slice going away holds its cube until it is gone; then the cube is no longer the
    # job's (another job's Slice took it and the free one meanwhile: nothing re-formed).
    kept = SliceObjectObservation(formed[0].name, 0, ("x0",), "ACTIVATING")
    going = SliceObjectObservation(formed[1].name, 1, ("x1",), "ACTIVATING", True)
    taken = frozenset({"x1", "x2"})
    for t, objects, chips in ((5, [kept, going], 2 * cube), (10, [kept], cube)):
        d = _run(sp, d.status, t, cubes=there, slice_objects=objects, cubes_taken=taken)
        assert not [a for a in d.actions if isinstance(a, CreateSlice)]
        g = d.status.goodput
        assert g is not None and (g.held_chips, g.spare_chips) == (chips, 0)


def test_the_held_node_pools_metric_counts_cube_pools() -> None:
    """multislice_job_held_node_pools: a cube job's pools are cubes (3 here: 2 slices + 1 spare),
    not slices' worth of chips (which gave 2 for 5 pools of 2 x tpu7x-256 + 1 spare)."""
    from multislice_operator.controller import metrics
    from multislice_operator.controller.reconciler import _record_goodput

    sp = _job("tpu7x-256", spares=1)
    plan = sp[1]
    d = _run(sp, None, 0, slices=_pools(plan, PoolState.ABSENT))
    key = ("ns", "cube-pools")
    _record_goodput(key, META, d.status, T0, plan)
    labels = {"namespace": "ns", "name": "cube-pools"}
    try:
        assert metrics.REGISTRY.get_sample_value("multislice_job_held_node_pools", labels) == 5
        assert metrics.REGISTRY.get_sample_value("multislice_job_held_chips", labels) == 320
    finally:
        metrics.forget_job(key)
