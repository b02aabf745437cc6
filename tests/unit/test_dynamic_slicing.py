"""Capacity model `DynamicSlices` (plugins/dynamic.py) through decide(): cubes, one GKE `Slice`
per job slice formed from healthy free cubes all or none, the JobSet only once every Slice is
ACTIVE, a broken Slice re-formed from a spare cube with every slice restarted, and everything
released at the end (issue 41)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common import keys
from multislice_operator.common.pools import PoolState
from multislice_operator.planning import cubes
from multislice_operator.plugins.dynamic import (
    DYNAMIC_SLICES,
    CreateSlice,
    CubeObservation,
    DeleteSlices,
    DynamicObservation,
    ReleaseSlices,
    SliceObjectObservation,
)
from multislice_operator.reconcile import JobMeta, SliceObservation
from multislice_operator.reconcile.capacity import model_of
from multislice_operator.reconcile.types import (
    CreateJobSet,
    CreatePools,
    DeletePools,
    EvictPods,
    JobSetObservation,
    Pod,
)
from tests.unit import jobs
from tests.unit.jobs import Observed as _Observed


def Observed(**kw: Any) -> Any:
    """An observation whose cubes and Slices (`cubes`, `slice_objects`, `cubes_taken`) are the
    dynamic model's own (`Observed.capacity`)."""
    parts = {k: kw.pop(k) for k in ("cubes", "slice_objects", "cubes_taken") if k in kw}
    return _Observed(capacity=DynamicObservation(**parts), **kw)


NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
BLOCK = "ironwood/reservationBlocks/block-1"


def _plan(accelerator: str = "tpu7x-128", slices: int = 2, spares: int = 1,
          cubes_source: str = "Managed", **options: Any) -> Any:  # fmt: skip
    return jobs.spec_and_plan(
        accelerator=accelerator,
        slices=slices,
        spares=spares,
        capacity={"type": "Reserved", "reservation": BLOCK},
        provisioning={"mode": "DynamicSlicing",
                      "dynamicSlicing": {"cubes": cubes_source, **options}},
    )  # fmt: skip


def _pools(plan: Any, state: PoolState = PoolState.READY) -> list[SliceObservation]:
    hosts = 16 if state == PoolState.READY else 0
    return [SliceObservation(p.slice_index, p.name, state, hosts) for p in plan.pools]


def _cubes(plan: Any, unhealthy: tuple[str, ...] = ()) -> list[CubeObservation]:
    return [
        CubeObservation(f"p{p.slice_index}", p.name,
                        "UNHEALTHY" if f"p{p.slice_index}" in unhealthy else "HEALTHY", 16, True)
        for p in plan.pools
    ]  # fmt: skip


def _slice(plan: Any, i: int, parts: tuple[str, ...], state: str = "ACTIVE", turn: int = 0,
           deleting: bool = False) -> SliceObjectObservation:  # fmt: skip
    return SliceObjectObservation(cubes.slice_names(plan.job_key, i)[turn], i, parts, state,
                                  deleting)  # fmt: skip


def _on_cubes(plan: Any, counts: dict[int, int], attempt: int = 0) -> list[Pod]:
    """Running pods, slice i's on cube i's pool (Managed cubes: the pod says its node's pool)."""
    return [
        Pod(f"job-slice-{i}-{h}", i, attempt, "Running", ready=True, node=f"n-p{i}-{h}",
            pool=plan.pools[i].name)
        for i, n in sorted(counts.items())
        for h in range(n)
    ]  # fmt: skip


def _of(kind: type, actions: list[Any]) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def _run(sp: Any, old: Any = None, **obs: Any) -> Any:
    d = jobs.run(old, Observed(now=NOW, **obs), plan=sp)
    assert not d.violations  # the invariants (invariants.py) dropped nothing
    return d


def test_the_job_mode_picks_the_dynamic_model() -> None:
    assert model_of(_plan()[1]) is DYNAMIC_SLICES


def test_a_new_job_creates_its_cube_pools_and_no_slice_yet() -> None:
    sp = _plan()
    d = _run(sp, slices=_pools(sp[1], PoolState.ABSENT))
    assert _of(CreatePools, d.actions) == [CreatePools((0, 1, 2))]  # 2 slices + 1 spare cube
    assert not _of(CreateSlice, d.actions) and not _of(CreateJobSet, d.actions)


def test_healthy_cubes_become_one_slice_each_all_together() -> None:
    sp = _plan(accelerator="tpu7x-256", spares=1)  # 4x4x8: two cubes per Slice, 5 cubes
    plan = sp[1]
    d = _run(sp, slices=_pools(plan), cubes=_cubes(plan))
    made = _of(CreateSlice, d.actions)
    assert [(a.index, a.topology, a.partitions) for a in made] == [
        (0, "4x4x8", ("p0", "p1")),
        (1, "4x4x8", ("p2", "p3")),
    ]
    assert [a.name for a in made] == [cubes.slice_names(plan.job_key, i)[0] for i in (0, 1)]
    assert not _of(CreateJobSet, d.actions)  # not before every Slice is ACTIVE


def test_too_few_healthy_cubes_form_no_slice_at_all() -> None:
    sp = _plan(accelerator="tpu7x-256", spares=0)
    plan = sp[1]
    d = _run(sp, slices=_pools(plan), cubes=_cubes(plan, unhealthy=("p3",)))
    assert not _of(CreateSlice, d.actions)  # 3 healthy cubes, 4 needed: none, not one
    cond = d.status.condition("Provisioned")
    assert cond is not None and cond.status == "False"
    assert "waiting for 4 free usable cubes" in cond.message


def test_a_cube_another_slice_holds_is_not_used() -> None:
    sp = _plan(spares=0)
    plan = sp[1]
    d = _run(sp, slices=_pools(plan), cubes=_cubes(plan), cubes_taken=frozenset({"p0"}))
    assert not _of(CreateSlice, d.actions)  # p1 alone for two slices


def test_the_jobset_waits_for_every_slice_active() -> None:
    sp = _plan()
    plan = sp[1]
    one = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",), "ACTIVATING")]
    d = _run(sp, slices=_pools(plan), cubes=_cubes(plan), slice_objects=one)
    assert not _of(CreateJobSet, d.actions) and not _of(CreateSlice, d.actions)
    both = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",))]
    d = _run(sp, slices=_pools(plan), cubes=_cubes(plan), slice_objects=both)
    assert _of(CreateJobSet, d.actions)
    assert "2/2 Slices ACTIVE" in d.status.condition("Provisioned").message


def _running_old() -> MultisliceJobStatus:
    return MultisliceJobStatus.from_dict(
        {"phase": "Running", "jobSet": "job",
         "conditions": [{"type": "Provisioned", "status": "True", "reason": "GangReady"}]}
    )  # fmt: skip


def _p1_failed(sp: Any, slices: list[SliceObjectObservation], js: JobSetObservation,
               pods: list[Pod]) -> Any:  # fmt: skip
    """A pass of the running job with cube p1 UNHEALTHY and these Slices and pods."""
    plan = sp[1]
    return _run(sp, _running_old(), slices=_pools(plan), cubes=_cubes(plan, unhealthy=("p1",)),
                slice_objects=slices, jobset=js, pods=pods)  # fmt: skip


def test_a_failed_slice_is_reformed_from_the_spare_cube_and_every_slice_restarts() -> None:
    sp = _plan()  # 2 slices of one cube + 1 spare cube (p2)
    plan = sp[1]
    slices = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",), "FAILED")]
    d = _p1_failed(sp, slices, JobSetObservation(), _on_cubes(plan, {0: 16, 1: 16}))
    assert _of(DeleteSlices, d.actions) == [DeleteSlices((slices[1].name,))]
    made = _of(CreateSlice, d.actions)
    # The lost slice only, on the spare cube, under its other name (the old one is going away).
    assert [(a.index, a.partitions, a.name) for a in made] == [
        (1, ("p2",), cubes.slice_names(plan.job_key, 1)[1])
    ]
    evicted = _of(EvictPods, d.actions)
    assert len(evicted) == 1 and len(evicted[0].pods) == 16  # slice 1's pods: JobSet restarts all
    assert all("slice-1-" in p for p in evicted[0].pods)
    assert any(e.reason == "SliceLost" for e in d.events)


def test_only_the_pods_on_the_lost_slices_cubes_are_evicted() -> None:
    """A pass that still sees the broken Slice (the watch has not brought its deletion yet) after
    JobSet restarted: the new attempt's pods, waiting unbound or already on the re-formed Slice's
    cube, are not the lost Slice's and stay (evicting them made a second restart under load, in
    test_a_failed_cube_is_swapped_for_the_spare); a pod still on the broken cube goes, whatever
    its JobSet slice index (JobSet's exclusive placement may put Job 0 on Slice 1: the e2e
    test_a_degraded_slice_is_reformed_when_asked saw it)."""
    sp = _plan()
    plan = sp[1]
    p1, p2 = plan.pools[1].name, plan.pools[2].name
    slices = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",), "FAILED"),
              _slice(plan, 1, ("p2",), turn=1)]  # fmt: skip
    pods = [
        Pod("job-slice-1-0-old", 1, 0, "Running", ready=True, node="n-p1-0", pool=p1),
        Pod("job-slice-1-0-new", 1, 1, "Running", ready=True, node="n-p2-0", pool=p2),
        Pod("job-slice-1-1-new", 1, 1, "Pending"),
        Pod("job-slice-0-0-old", 0, 0, "Running", ready=True, node="n-p1-1", pool=p1),
        *jobs.running({0: 16}, attempt=1),
    ]
    d = _p1_failed(sp, slices, JobSetObservation(restarts=1), pods)
    assert _of(DeleteSlices, d.actions) == [DeleteSlices((slices[1].name,))]
    assert _of(EvictPods, d.actions) == [EvictPods(("job-slice-0-0-old", "job-slice-1-0-old"))]


def test_once_the_spare_took_its_place_the_unhealthy_cubes_pool_is_made_again() -> None:
    """After the swap slice 1 runs on p2 and the job has no free healthy cube for its spare: the
    pool of the unhealthy cube p1 (no Slice holds it) is deleted, to be made again on a healthy
    sub-block; the next pass after it is gone creates it."""
    sp = _plan()
    plan = sp[1]
    swapped = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p2",), turn=1)]
    base: dict[str, Any] = dict(slice_objects=swapped, jobset=JobSetObservation(),
                                pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    d = _run(sp, _running_old(), slices=_pools(plan), cubes=_cubes(plan, unhealthy=("p1",)), **base)
    p1 = plan.pools[1].name
    assert _of(DeletePools, d.actions) == [DeletePools((p1,))]
    assert not _of(EvictPods, d.actions) and not _of(DeleteSlices, d.actions)  # slices run on
    gone = [s if s.pool != p1 else SliceObservation(s.index, p1, PoolState.ABSENT, 0)
            for s in _pools(plan)]  # fmt: skip
    cubes_left = [c for c in _cubes(plan) if c.pool != p1]
    d = _run(sp, _running_old(), slices=gone, cubes=cubes_left, **base)
    assert _of(CreatePools, d.actions) == [CreatePools((1,))]
    assert not _of(DeletePools, d.actions)


def test_an_unhealthy_cube_waits_for_its_slice_and_a_degraded_one_stays() -> None:
    sp = _plan()
    plan = sp[1]
    common: dict[str, Any] = dict(slices=_pools(plan), jobset=JobSetObservation(),
                                  pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    # The broken Slice still holds p1 (it is being deleted): the pool waits for it.
    held = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p2",), turn=1),
            _slice(plan, 1, ("p1",), "FAILED", deleting=True)]  # fmt: skip
    d = _run(sp, _running_old(), cubes=_cubes(plan, unhealthy=("p1",)), slice_objects=held,
             **common)  # fmt: skip
    assert not _of(DeletePools, d.actions)
    # The spare cube itself went UNHEALTHY: the job is short of a spare, it is made again.
    running = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",))]
    d = _run(sp, _running_old(), cubes=_cubes(plan, unhealthy=("p2",)), slice_objects=running,
             **common)  # fmt: skip
    assert _of(DeletePools, d.actions) == [DeletePools((plan.pools[2].name,))]
    # DEGRADED ("still usable to form a slice"): kept, whatever the spares.
    degraded = [CubeObservation(c.partition, c.pool, "DEGRADED" if c.partition == "p2" else
                                c.state, 16, True) for c in _cubes(plan)]  # fmt: skip
    d = _run(sp, _running_old(), cubes=degraded, slice_objects=running, **common)
    assert not _of(DeletePools, d.actions)
    # Existing cubes are never deleted, unhealthy or not.
    sp_existing = _plan(cubes_source="Existing")
    theirs = [CubeObservation(c.partition, c.pool, c.state, 16, False)
              for c in _cubes(sp_existing[1], unhealthy=("p2",))]  # fmt: skip
    d = _run(sp_existing, _running_old(), slices=_pools(sp_existing[1]), cubes=theirs,
             slice_objects=running, jobset=JobSetObservation(),
             pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    assert not _of(DeletePools, d.actions)


def _degraded(plan: Any, *partitions: str) -> list[CubeObservation]:
    return [CubeObservation(c.partition, c.pool, "DEGRADED" if c.partition in partitions else
                            c.state, 16, True) for c in _cubes(plan)]  # fmt: skip


def test_a_degraded_slice_keeps_running_by_default() -> None:
    """GKE: a DEGRADED cube is "impaired, still usable to form a slice", an ACTIVE_DEGRADED Slice
    is Ready; xpk's controller counts it active. Nothing is deleted, nothing restarts, with a
    spare cube there or not (issue 54, point 3)."""
    sp = _plan()
    plan = sp[1]
    slices = [_slice(plan, 0, ("p0",), "ACTIVE_DEGRADED"), _slice(plan, 1, ("p1",))]
    d = _run(sp, _running_old(), slices=_pools(plan), cubes=_degraded(plan, "p0"),
             slice_objects=slices, jobset=JobSetObservation(),
             pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    assert not _of(DeleteSlices, d.actions) and not _of(CreateSlice, d.actions)
    assert not _of(EvictPods, d.actions) and not any(e.reason == "SliceLost" for e in d.events)
    cond = d.status.condition("Provisioned")
    assert cond is not None and cond.status == "True"
    kept = "slice 0 on an ACTIVE_DEGRADED Slice (dynamicSlicing.degraded KeepRunning"
    assert kept in cond.message
    # Before the JobSet too: a degraded Slice is Ready, the JobSet is created on it.
    d = _run(sp, slices=_pools(plan), cubes=_degraded(plan, "p0"), slice_objects=slices)
    assert _of(CreateJobSet, d.actions) and not _of(DeleteSlices, d.actions)


def test_a_degraded_slice_is_replaced_when_a_healthy_spare_exists() -> None:
    """dynamicSlicing.degraded ReplaceWhenSpare: re-formed on the healthy spare cube, every
    slice restarts (its pods evicted: a disruption)."""
    sp = _plan(degraded="ReplaceWhenSpare")
    plan = sp[1]
    slices = [_slice(plan, 0, ("p0",), "ACTIVE_DEGRADED"), _slice(plan, 1, ("p1",))]
    d = _run(sp, _running_old(), slices=_pools(plan), cubes=_degraded(plan, "p0"),
             slice_objects=slices, jobset=JobSetObservation(),
             pods=_on_cubes(plan, {0: 16, 1: 16}))  # fmt: skip
    assert [a.partitions for a in _of(CreateSlice, d.actions)] == [("p2",)]
    assert _of(DeleteSlices, d.actions) == [DeleteSlices((slices[0].name,))]
    assert _of(EvictPods, d.actions) and any(e.reason == "SliceLost" for e in d.events)


def _labelled(plan: Any, carried: dict[str, str], degraded: str = "") -> list[CubeObservation]:
    """The cubes, cube i's nodes n-p{i}-h; `carried`: partition -> the Slice name its nodes
    carry (cloud.google.com/gke-tpu-slice)."""
    return [
        dataclasses.replace(c, state="DEGRADED" if c.partition == degraded else c.state,
                            nodes=frozenset(f"n-{c.partition}-{h}" for h in range(16)),
                            slices=frozenset({carried[c.partition]} if c.partition in carried
                                             else ()))
        for c in _cubes(plan)
    ]  # fmt: skip


def test_a_replaced_slices_pods_go_only_once_its_nodes_no_longer_carry_its_name() -> None:
    """The e2e test_a_degraded_slice_is_reformed_when_asked saw slice 1's restarted pods run on
    the old, degraded cube: they were evicted in the pass that deleted its Slice, and the pod
    template accepts every name of the job's Slices, which the old cube's nodes still carried
    until the slice controller's next pass. The pods go once the name is off the usable cube;
    the pods on current Slices stay; and a pass after the old Slice is gone still finds them."""
    sp = _plan(degraded="ReplaceWhenSpare")
    plan = sp[1]
    name = lambda i, turn=0: cubes.slice_names(plan.job_key, i)[turn]  # noqa: E731
    pods = _on_cubes(plan, {0: 16, 1: 16})
    base: dict[str, Any] = dict(slices=_pools(plan), jobset=JobSetObservation(), pods=pods)
    labelled = {"p0": name(0), "p1": name(1)}
    # The pass that finds slice 0 degraded: its Slice deleted, one formed on p2; no pod evicted.
    first = [_slice(plan, 0, ("p0",), "ACTIVE_DEGRADED"), _slice(plan, 1, ("p1",))]
    d = _run(sp, _running_old(), cubes=_labelled(plan, labelled, "p0"), slice_objects=first,
             **base)  # fmt: skip
    assert _of(DeleteSlices, d.actions) == [DeleteSlices((name(0),))]
    assert [a.partitions for a in _of(CreateSlice, d.actions)] == [("p2",)]
    assert not _of(EvictPods, d.actions) and any(e.reason == "SliceLost" for e in d.events)
    assert d.requeue_after is not None and d.requeue_after <= 2
    # The old Slice is going, the new one ACTIVE, but p0's nodes still carry the old name.
    going = [_slice(plan, 0, ("p0",), "ACTIVE_DEGRADED", deleting=True),
             _slice(plan, 0, ("p2",), turn=1), _slice(plan, 1, ("p1",))]  # fmt: skip
    now = {**labelled, "p2": name(0, 1)}
    d = _run(sp, _running_old(), cubes=_labelled(plan, now, "p0"), slice_objects=going, **base)
    assert not _of(EvictPods, d.actions) and not _of(DeleteSlices, d.actions)
    # The name is off p0 (the old Slice DEACTIVATING, or gone): slice 0's pods on p0 go.
    unlabelled = {"p1": name(1), "p2": name(0, 1)}
    on_p0 = EvictPods(tuple(sorted(p.name for p in pods if p.pool == plan.pools[0].name)))
    for seen in (going, going[1:]):
        d = _run(sp, _running_old(), cubes=_labelled(plan, unlabelled, "p0"), slice_objects=seen,
                 **base)  # fmt: skip
        assert _of(EvictPods, d.actions) == [on_p0]
    # A name left behind by a Slice that is gone waits for nothing: no controller would take it.
    d = _run(sp, _running_old(), cubes=_labelled(plan, now, "p0"), slice_objects=going[1:], **base)
    assert _of(EvictPods, d.actions) == [on_p0]


def test_with_existing_cubes_the_pods_on_a_lost_slices_nodes_go() -> None:
    """Existing cubes: a pod does not say its pool (not the job's), its node places it."""
    sp = _plan(cubes_source="Existing")
    plan = sp[1]
    there = [
        CubeObservation(
            f"p{i}",
            f"pool-{i}",
            "UNHEALTHY" if i == 1 else "HEALTHY",
            16,
            nodes=frozenset(f"n-p{i}-{h}" for h in range(16)),
        )
        for i in range(3)
    ]
    pods = [Pod(f"job-slice-{i}-{h}", i, 0, "Running", ready=True, node=f"n-p{i}-{h}")
            for i in (0, 1) for h in range(16)]  # fmt: skip
    slices = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",), "FAILED")]
    d = _run(sp, _running_old(), cubes=there, slice_objects=slices, jobset=JobSetObservation(),
             pods=pods)  # fmt: skip
    slice_1 = tuple(sorted(f"job-slice-1-{h}" for h in range(16)))
    assert _of(EvictPods, d.actions) == [EvictPods(slice_1)]


def test_without_a_healthy_spare_a_degraded_slice_keeps_running() -> None:
    """ReplaceWhenSpare with the spare cube degraded too (or none): nothing to move to."""
    sp = _plan(degraded="ReplaceWhenSpare")
    plan = sp[1]
    slices = [_slice(plan, 0, ("p0",), "ACTIVE_DEGRADED"), _slice(plan, 1, ("p1",))]
    d = _run(sp, _running_old(), slices=_pools(plan), cubes=_degraded(plan, "p0", "p2"),
             slice_objects=slices, jobset=JobSetObservation(),
             pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    assert not _of(DeleteSlices, d.actions) and not _of(CreateSlice, d.actions)
    assert not _of(EvictPods, d.actions)
    assert "until free healthy cubes can form it again" in d.status.condition("Provisioned").message


def test_degraded_cubes_form_a_slice_when_healthy_ones_are_short() -> None:
    sp = _plan(spares=0)
    plan = sp[1]
    d = _run(sp, slices=_pools(plan), cubes=_degraded(plan, "p1"))
    assert [a.partitions for a in _of(CreateSlice, d.actions)] == [("p0",), ("p1",)]
    # Healthy cubes first: with a healthy one spare, the degraded one is left over.
    sp = _plan(spares=1)
    plan = sp[1]
    d = _run(sp, slices=_pools(plan), cubes=_degraded(plan, "p0"))
    assert [a.partitions for a in _of(CreateSlice, d.actions)] == [("p1",), ("p2",)]


def test_degraded_running_time_is_accounted_apart() -> None:
    """The goodput counts a degraded Slice's running chip-seconds as degraded."""
    sp = _plan()
    plan = sp[1]
    old = _running_old()
    slices = [_slice(plan, 0, ("p0",), "ACTIVE_DEGRADED"), _slice(plan, 1, ("p1",))]
    d = _run(sp, old, slices=_pools(plan), cubes=_degraded(plan, "p0"), slice_objects=slices,
             jobset=JobSetObservation(ready_jobs=2), pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    g = d.status.goodput
    assert g is not None and g.state == "running" and g.degraded
    healthy = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",))]
    d = _run(sp, old, slices=_pools(plan), cubes=_cubes(plan), slice_objects=healthy,
             jobset=JobSetObservation(ready_jobs=2), pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    assert d.status.goodput is not None and not d.status.goodput.degraded


# ------------------------------------------------------------ one reservation block per Slice


def _in_blocks(plan: Any, blocks: dict[str, str], ours: bool = True) -> list[CubeObservation]:
    return [CubeObservation(p, f"pool-{p}", "HEALTHY", 16, ours, b) for p, b in blocks.items()]


def test_each_slice_is_formed_from_the_cubes_of_one_block() -> None:
    """Existing cubes of two blocks (issue 54, point 1): sorted by partition, a0 b0 a1 b1 made
    Slices across blocks, which GKE fails; each Slice now takes one block's cubes."""
    sp = _plan(accelerator="tpu7x-256", cubes_source="Existing", spares=0)
    plan = sp[1]
    there = _in_blocks(plan, {"c0": "block-a", "c1": "block-b", "c2": "block-a",
                              "c3": "block-b"}, ours=False)  # fmt: skip
    d = _run(sp, cubes=there)
    assert [a.partitions for a in _of(CreateSlice, d.actions)] == [("c0", "c2"), ("c1", "c3")]


def test_no_slice_is_formed_over_two_blocks() -> None:
    """Four free cubes, but three in one block and one in the other: one 4x4x8 Slice fits, two
    do not; all or none forms none."""
    sp = _plan(accelerator="tpu7x-256", cubes_source="Existing", spares=0)
    plan = sp[1]
    there = _in_blocks(plan, {"c0": "block-a", "c1": "block-a", "c2": "block-a",
                              "c3": "block-b"}, ours=False)  # fmt: skip
    d = _run(sp, cubes=there)
    assert not _of(CreateSlice, d.actions)
    assert "of one reservation block per Slice" in d.status.condition("Provisioned").message


# ------------------------------------------------------------ a Slice that will not go away


def _deleting(plan: Any, i: int, parts: tuple[str, ...], seconds_ago: float) -> Any:
    return SliceObjectObservation(cubes.slice_names(plan.job_key, i)[0], i, parts,
                                  "DEACTIVATING", True,
                                  NOW - timedelta(seconds=seconds_ago))  # fmt: skip


def test_a_slice_stuck_deleting_loses_its_finalizer_after_the_deadline() -> None:
    """GKE's troubleshooting page names Slices stuck in DEACTIVATING; its guide deletes a Slice
    by removing the finalizer. Within the deadline the operator waits (and asks for a pass
    then); past it, it removes the finalizer and says so (issue 54, point 3)."""
    sp = _plan(sliceDeletionTimeoutSeconds=300)
    plan = sp[1]
    meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True, deleting=True)
    waiting = Observed(now=NOW, slices=_pools(plan, PoolState.ABSENT),
                       slice_objects=[_deleting(plan, 0, ("p0",), 200)])  # fmt: skip
    d = jobs.run(_running_old(), waiting, plan=sp, meta=meta)
    assert not _of(ReleaseSlices, d.actions)
    assert d.requeue_after is not None and d.requeue_after <= 101
    stuck = Observed(now=NOW, slices=_pools(plan, PoolState.ABSENT),
                     slice_objects=[_deleting(plan, 0, ("p0",), 301)])  # fmt: skip
    d = jobs.run(_running_old(), stuck, plan=sp, meta=meta)
    assert not d.violations
    name = cubes.slice_names(plan.job_key, 0)[0]
    assert _of(ReleaseSlices, d.actions) == [ReleaseSlices((name,))]
    [event] = [e for e in d.events if e.reason == "SliceFinalizerRemoved"]
    assert name in event.message and "300s" in event.message and "DEACTIVATING" in event.message
    assert not any(type(a).__name__ == "RemoveFinalizer" for a in d.actions)  # not gone yet


def test_a_lost_slice_stuck_deleting_is_released_while_the_job_runs() -> None:
    sp = _plan()
    plan = sp[1]
    running = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p2",), turn=1),
               _deleting(plan, 1, ("p1",), 601)]  # fmt: skip
    d = _run(sp, _running_old(), slices=_pools(plan), cubes=_cubes(plan, unhealthy=("p1",)),
             slice_objects=running, jobset=JobSetObservation(),
             pods=jobs.running({0: 16, 1: 16}))  # fmt: skip
    assert _of(ReleaseSlices, d.actions) == [ReleaseSlices((running[2].name,))]


def test_the_longest_job_names_give_slice_names_gke_accepts() -> None:
    """Newer GKE pages give 49 characters as a Slice name's limit (an older copy said 54)."""
    from multislice_local import slices as sim

    longest = jobs.spec_and_plan(
        jobs.body(name="n" * 44, namespace="s" * 63, accelerator="tpu7x-128", slices=256,
                  capacity={"type": "Reserved", "reservation": BLOCK},
                  provisioning={"mode": "DynamicSlicing"})
    )[1]  # fmt: skip
    names = cubes.all_slice_names(longest.job_key, longest.slices)
    assert max(len(n) for n in names) <= 49 == sim.MAX_NAME_LENGTH
    for n in names[-2:]:
        body = {"metadata": {"name": n},
                "spec": {"type": "tpu7x", "topology": "4x4x4", "partitionIds": ["p"]}}  # fmt: skip
        assert sim.admission_errors(body) == []


def test_a_two_cube_slice_waits_for_its_old_slice_to_free_the_healthy_cube() -> None:
    """tpu7x-256, one spare cube: the broken Slice's healthy cube is free once it is gone."""
    sp = _plan(accelerator="tpu7x-256", spares=1)
    plan = sp[1]
    broken = _slice(plan, 1, ("p2", "p3"), "FAILED")
    base: dict[str, Any] = dict(slices=_pools(plan), cubes=_cubes(plan, unhealthy=("p3",)),
                                jobset=JobSetObservation())  # fmt: skip
    d = _run(sp, _running_old(), slice_objects=[_slice(plan, 0, ("p0", "p1")), broken], **base)
    assert not _of(CreateSlice, d.actions)  # p4 alone: the Slice needs two cubes
    gone = [_slice(plan, 0, ("p0", "p1"))]
    d = _run(sp, _running_old(), slice_objects=gone, **base)
    assert [(a.index, a.partitions) for a in _of(CreateSlice, d.actions)] == [(1, ("p2", "p4"))]


def test_deleting_the_job_deletes_the_slices_then_the_cubes() -> None:
    sp = _plan()
    plan = sp[1]
    meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True, deleting=True)
    slices = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",))]
    d = jobs.run(_running_old(), Observed(now=NOW, slices=_pools(plan), cubes=_cubes(plan),
                                          slice_objects=slices), plan=sp, meta=meta)  # fmt: skip
    assert _of(DeleteSlices, d.actions) == [DeleteSlices(tuple(s.name for s in slices))]
    deleted = _of(DeletePools, d.actions)
    assert deleted and set(deleted[0].pools) == {p.name for p in plan.pools}
    assert not any(type(a).__name__ == "RemoveFinalizer" for a in d.actions)


def test_existing_cubes_are_never_created_or_deleted() -> None:
    sp = _plan(cubes_source="Existing", spares=0)
    plan = sp[1]
    cubes_there = [CubeObservation(f"x{i}", f"pool-{i}", "HEALTHY", 16) for i in range(2)]
    d = _run(sp, cubes=cubes_there)
    assert not _of(CreatePools, d.actions)
    assert [a.partitions for a in _of(CreateSlice, d.actions)] == [("x0",), ("x1",)]
    meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True, deleting=True)
    d = jobs.run(None, Observed(now=NOW, cubes=cubes_there), plan=sp, meta=meta)
    assert not _of(DeletePools, d.actions) and not _of(DeleteSlices, d.actions)
    assert any(type(a).__name__ == "RemoveFinalizer" for a in d.actions)
    assert plan.pools == []


# ------------------------------------------------------------ the gang's timeout


def _pending_old(started_s_ago: float, attempts: int = 1) -> MultisliceJobStatus:
    return MultisliceJobStatus.from_dict(
        {"phase": "Provisioning", "provisioningAttempts": attempts,
         "attemptStartTime": (NOW - timedelta(seconds=started_s_ago)).isoformat()}
    )  # fmt: skip


def test_the_first_pass_starts_the_gangs_clock() -> None:
    sp = _plan()
    d = _run(sp, slices=_pools(sp[1], PoolState.ABSENT))
    assert d.status.attempt_start_time == NOW and d.status.provisioning_attempts == 1


def test_slices_not_all_active_within_the_timeout_are_rolled_back() -> None:
    sp = _plan()
    plan, timeout = sp[1], sp[0].provisioning.timeout_seconds
    one = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",), "ACTIVATING")]
    seen = {"slices": _pools(plan), "cubes": _cubes(plan), "slice_objects": one}
    d = _run(sp, _pending_old(timeout - 1), **seen)  # in time: nothing goes
    assert not _of(DeleteSlices, d.actions) and not _of(DeletePools, d.actions)
    d = _run(sp, _pending_old(timeout + 1), **seen)
    assert _of(DeleteSlices, d.actions) == [DeleteSlices(tuple(o.name for o in one))]
    deleted = _of(DeletePools, d.actions)
    assert deleted and set(deleted[0].pools) == {p.name for p in plan.pools}
    assert not _of(CreateSlice, d.actions) and not _of(CreateJobSet, d.actions)
    cond = d.status.condition("Provisioned")
    assert cond is not None and cond.reason == "GangTimeout"
    assert f"1/2 Slices ACTIVE within spec.provisioning.timeoutSeconds ({timeout}s)" in cond.message
    assert d.status.attempt_start_time is None and d.status.next_attempt_time is not None
    assert d.status.next_attempt_time > NOW


def test_the_backoff_holds_nothing_and_the_next_attempt_starts_again() -> None:
    sp = _plan()
    plan = sp[1]
    old = _pending_old(0, attempts=1)
    old.attempt_start_time = None
    old.next_attempt_time = NOW + timedelta(seconds=30)
    late = [_slice(plan, 0, ("p0",))]  # a Slice whose delete the apiserver has not seen yet
    d = _run(sp, old, slices=_pools(plan), cubes=_cubes(plan), slice_objects=late)
    assert _of(DeleteSlices, d.actions) and _of(DeletePools, d.actions)
    assert not _of(CreatePools, d.actions) and not _of(CreateSlice, d.actions)
    old.next_attempt_time = NOW - timedelta(seconds=1)
    d = _run(sp, old, slices=_pools(plan, PoolState.ABSENT))
    assert _of(CreatePools, d.actions) == [CreatePools((0, 1, 2))]
    assert d.status.attempt_start_time == NOW and d.status.provisioning_attempts == 2


def test_existing_cubes_stay_when_the_gang_is_rolled_back() -> None:
    sp = _plan(cubes_source="Existing", spares=0)
    plan = sp[1]
    there = [CubeObservation(f"x{i}", f"pool-{i}", "HEALTHY", 16) for i in range(2)]
    forming = [_slice(plan, 0, ("x0",), "ACTIVATING"), _slice(plan, 1, ("x1",), "ACTIVATING")]
    late = sp[0].provisioning.timeout_seconds + 1
    d = _run(sp, _pending_old(late), cubes=there, slice_objects=forming)
    assert _of(DeleteSlices, d.actions) and not _of(DeletePools, d.actions)
    assert "0/2 Slices ACTIVE" in d.status.condition("Provisioned").message


def test_a_gang_all_active_is_never_rolled_back_and_stops_the_clock() -> None:
    sp = _plan()
    plan = sp[1]
    both = [_slice(plan, 0, ("p0",)), _slice(plan, 1, ("p1",))]
    late = sp[0].provisioning.timeout_seconds + 1
    d = _run(sp, _pending_old(late), slices=_pools(plan), cubes=_cubes(plan), slice_objects=both)
    assert _of(CreateJobSet, d.actions) and not _of(DeleteSlices, d.actions)
    assert d.status.attempt_start_time is None


# ------------------------------------------------------------ the pods pinned to the Slices


def test_the_jobset_puts_each_slice_on_one_of_the_jobs_slices() -> None:
    from multislice_operator.render.jobset import render_jobset

    spec, plan = _plan(accelerator="tpu7x-256")
    js = render_jobset(plan, spec)
    assert js["metadata"]["annotations"][keys.JOBSET_EXCLUSIVE_TOPOLOGY] == keys.GKE_TPU_SLICE
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod["metadata"]["annotations"][keys.GKE_TPU_SLICE_TOPOLOGY] == "4x4x8"
    assert pod["spec"]["nodeSelector"][keys.GKE_TPU_TOPOLOGY] == "4x4x8"
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    [expr, healthy] = terms["nodeSelectorTerms"][0]["matchExpressions"]
    # Healthy and degraded cubes, as xpk's webhook asks by default (issue 54, point 3).
    usable = ["HEALTHY", "DEGRADED"]
    assert healthy == {"key": keys.GKE_TPU_PARTITION_STATE, "operator": "In", "values": usable}
    assert expr["key"] == keys.GKE_TPU_SLICE and expr["operator"] == "In"
    assert sorted(expr["values"]) == sorted(
        n for i in range(2) for n in cubes.slice_names(plan.job_key, i)
    )
    assert keys.JOB_KEY not in pod["spec"]["nodeSelector"]


def test_a_ganged_jobset_puts_each_slice_on_one_slice_itself() -> None:
    # Where PodGroups are served (render/podgroup.py) the template places the slices, on the
    # Slice label as the annotation did, beside the pin to the job's Slices.
    from multislice_operator.render.jobset import render_jobset

    spec, plan = _plan(accelerator="tpu7x-256")
    js = render_jobset(plan, spec, gang=True)
    assert keys.JOBSET_EXCLUSIVE_TOPOLOGY not in js["metadata"]["annotations"]
    affinity = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["affinity"]
    for kind in ("podAffinity", "podAntiAffinity"):
        (term,) = affinity[kind]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == keys.GKE_TPU_SLICE
    assert (
        affinity["nodeAffinity"]
        == render_jobset(plan, spec)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
            "spec"
        ]["affinity"]["nodeAffinity"]
    )


def test_node_pool_jobs_keep_their_pool_exclusive_placement() -> None:
    from multislice_operator.render.jobset import render_jobset

    spec, plan = jobs.spec_and_plan()
    js = render_jobset(plan, spec)
    assert js["metadata"]["annotations"][keys.JOBSET_EXCLUSIVE_TOPOLOGY] == keys.GKE_NODEPOOL
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert "affinity" not in pod


# ------------------------------------------------------------ what the controller observes


def _node(pool: str, partition: str, state: str = "HEALTHY", ready: bool = True,
          job_key: str | None = None) -> dict[str, Any]:  # fmt: skip
    labels = {keys.GKE_TPU_PARTITION_ID: partition, keys.GKE_TPU_PARTITION_STATE: state}
    return {"ready": ready, "accelerator": "tpu7x", "jobKey": job_key, "labels": labels}


def test_the_controller_observes_cubes_slices_and_cubes_others_hold() -> None:
    from multislice_operator.plugins.dynamic import dynamic_observation, summarize_slice

    _, plan = _plan()
    own = [p.name for p in plan.pools]
    nodes = {
        own[0]: [_node(own[0], "c0", job_key=plan.job_key)] * 16,
        own[1]: [_node(own[1], "c1", "UNHEALTHY", job_key=plan.job_key)] * 16,
        "someone-elses": [_node("x", "c9")] * 16,  # not the job's cube pool: not seen
    }
    mine = cubes.slice_names(plan.job_key, 1)[1]
    body = {
        "metadata": {"name": mine},
        "spec": {"partitionIds": ["c0"]},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "ACTIVE"}]},
    }
    other = {"metadata": {"name": "team-b-slice"}, "spec": {"partitionIds": ["c7", "c8"]}}
    index = {mine: [summarize_slice(body)], "team-b-slice": [summarize_slice(other)]}
    seen = dynamic_observation(plan, nodes, index)
    found, taken, slices = seen.cubes, seen.cubes_taken, seen.slice_objects
    assert [(c.partition, c.state, c.ready_hosts, c.ours) for c in found] == [
        ("c0", "HEALTHY", 16, True),
        ("c1", "UNHEALTHY", 16, True),
    ]
    assert taken == {"c7", "c8"}
    assert slices == [SliceObjectObservation(mine, 1, ("c0",), "ACTIVE", False)]


# ------------------------------------------------------------ the cube pools GKE is asked for


def test_a_cube_pool_names_a_provision_only_policy_and_no_tpu_topology() -> None:
    from multislice_operator.provisioning.gke_requests import (
        build_node_pool,
        policy_insert_json,
        workload_policies,
    )

    _, plan = _plan(accelerator="tpu7x-256", spares=0)
    cube = plan.pools[0]
    assert cube.cube and cube.node_count == 16 and cube.machine_type == "tpu7x-standard-4t"
    pool = build_node_pool(plan, cube, "uid-1", ["us-central1-c"])
    assert pool.placement_policy.policy_name == "msj-tpu7x-4x4x4-cubes"
    assert pool.placement_policy.tpu_topology == ""  # the policy carries the 4x4x4
    [policy] = workload_policies(plan, "us-central1")
    assert (policy.accelerator_topology, policy.topology_mode) == ("4x4x4", "PROVISION_ONLY")
    body = policy_insert_json("proj", policy)["resourcePolicyResource"]["workloadPolicy"]
    assert body["acceleratorTopologyMode"] == "PROVISION_ONLY"
    # A whole 4x4x4 slice's own policy (Managed) stays apart, and forms its links at once.
    _, whole = jobs.spec_and_plan(accelerator="tpu7x-128")
    [own] = workload_policies(whole, "us-central1")
    assert own.name != policy.name and own.topology_mode == ""


# ------------------------------------------------------------ properties: all or none, no leak

STATES = ["", "SliceNotCreated", "ACTIVATING", "ACTIVE", "ACTIVE_DEGRADED", "FAILED"]
CUBE_STATES = ["HEALTHY", "HEALTHY", "DEGRADED", "UNHEALTHY", "INCOMPLETE"]


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Any, dict[str, Any], bool, bool]:
    """tpu7x-256 x 2 + 1 spare cube: five cubes in any health, each slice's Slice in any state
    on cubes drawn from them, the JobSet there or not, the job being deleted or not."""
    sp = _plan(accelerator="tpu7x-256", spares=1)
    plan = sp[1]
    found = [
        CubeObservation(f"p{i}", p.name, draw(st.sampled_from(CUBE_STATES)),
                        draw(st.sampled_from([16, 16, 15, 0])), True)
        for i, p in enumerate(plan.pools)
    ]  # fmt: skip
    objects = []
    for i in range(plan.slices):
        if draw(st.booleans()):
            parts = tuple(draw(st.lists(st.sampled_from([c.partition for c in found]),
                                        min_size=2, max_size=2, unique=True)))  # fmt: skip
            turn = draw(st.integers(0, 1))
            state = draw(st.sampled_from(STATES))
            objects.append(_slice(plan, i, parts, state, turn, draw(st.booleans())))
    obs = {"slices": _pools(plan), "cubes": found, "slice_objects": objects}
    return sp, obs, draw(st.booleans()), draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(world=worlds())
def test_slices_are_formed_all_or_none_and_nothing_is_left(world: Any) -> None:
    sp, obs, started, deleting = world
    plan = sp[1]
    meta = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True, deleting=deleting)
    extra: dict[str, Any] = {"jobset": JobSetObservation()} if started else {}
    old = _running_old() if started else None
    d = jobs.run(old, Observed(now=NOW, **obs, **extra), plan=sp, meta=meta)
    assert not d.violations, d.violations
    live = {o.index: o for o in obs["slice_objects"] if not o.deleting}
    made = _of(CreateSlice, d.actions)
    if deleting:
        assert not made
        deleted = {n for a in _of(DeleteSlices, d.actions) for n in a.names}
        assert deleted == {o.name for o in live.values()}  # every Slice of the job goes
        done = any(type(a).__name__ == "RemoveFinalizer" for a in d.actions)
        assert not done or not obs["slice_objects"]  # the finalizer stays while any is left
        return
    active = {i for i, o in live.items() if o.state in ("ACTIVE", "ACTIVE_DEGRADED")}
    if _of(CreateJobSet, d.actions):
        assert active == set(range(plan.slices))  # the JobSet only on every Slice Ready
    usable = {c.partition for c in obs["cubes"]
              if c.state in ("HEALTHY", "DEGRADED") and c.ready_hosts == 16}  # fmt: skip
    assert all(len(a.partitions) == plan.cubes_per_slice for a in made)  # whole Slices only
    parts = [p for a in made for p in a.partitions]
    assert len(parts) == len(set(parts)) and set(parts) <= usable
    assert not set(parts) & {p for o in obs["slice_objects"] for p in o.partitions}
    broken = {i for i, o in live.items() if o.state == "FAILED"}  # degraded: kept (default)
    missing = {i for i in range(plan.slices) if i not in live or i in broken}
    assert {a.index for a in made} in (set(), missing)  # all the missing Slices, or none
