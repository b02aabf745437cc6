"""What a reservation sub-block (one Ironwood 4x4x4 cube) or block can hold, judged before
anything is created (issue 41): `validate` and `plan` refuse a slice larger than a sub-block aimed
at one, and more slices than it holds, naming the field and the fix."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import load_job, make_plan

SUB_BLOCK = "ironwood/reservationBlocks/block-1/reservationSubBlocks/sub-1"
BLOCK = "ironwood/reservationBlocks/block-1"


def _job(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "accelerator": "tpu7x-128",
        "slices": 1,
        "capacity": {"type": "Reserved", "reservation": SUB_BLOCK},
        "checkpoint": {"directory": "gs://bucket/ckpt"},
        "template": {"spec": {"containers": [{"name": "train", "image": "img:1"}]}},
    }
    base.update(spec)
    return {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": "iw", "namespace": "team-a"},
        "spec": copy.deepcopy(base),
    }


def _plan(obj: dict[str, Any]) -> Any:
    j = load_job(obj)
    return make_plan(j.spec, j.metadata.namespace, j.metadata.name)


def _errors(obj: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as exc:
        _plan(obj)
    return {e.path: e.message for e in exc.value.errors}


# ------------------------------------------------------------ node pools aimed at a sub-block


def test_a_tpu7x_slice_of_two_cubes_aimed_at_a_sub_block_is_refused() -> None:
    """The reported bug: tpu7x-256 (4x4x8, 32 VMs) can never provision in one 4x4x4 sub-block."""
    errors = _errors(_job(accelerator="tpu7x-256"))
    message = errors["spec.capacity.reservation"]
    assert "4x4x8" in message and "2 cubes" in message and "sub-block" in message
    assert "reservationBlocks/block-1" in message  # the fix: aim at the block


def test_two_slices_aimed_at_one_sub_block_are_refused() -> None:
    """The reported bug: two tpu7x-128 pools in one sub-block; the second never provisions."""
    errors = _errors(_job(slices=2))
    message = errors["spec.capacity.reservation"]
    assert "2 node pools" in message and "one 4x4x4 cube" in message


def test_a_spare_counts_against_the_sub_block() -> None:
    errors = _errors(_job(spares=1))
    assert "2 node pools" in errors["spec.capacity.reservation"]


def test_one_cube_slice_in_a_sub_block_and_two_cubes_in_a_block_are_accepted() -> None:
    assert _plan(_job()).node_pools[0].reservation == SUB_BLOCK
    two = _plan(
        _job(accelerator="tpu7x-256", slices=2, capacity={"type": "Reserved", "reservation": BLOCK})
    )
    assert [p.reservation for p in two.node_pools] == [BLOCK, BLOCK]


def test_sub_slices_share_a_sub_block_while_their_chips_fit() -> None:
    """tpu7x-64 (2x4x4, 32 chips, 8 VMs) x 2 = 64: a cube fits them; x 3 = 96 chips: it does not."""
    assert len(_plan(_job(accelerator="tpu7x-64", slices=2)).node_pools) == 2
    errors = _errors(_job(accelerator="tpu7x-64", slices=3))
    assert "96 chips" in errors["spec.capacity.reservation"]


# ------------------------------------------------------------ provisioning.mode DynamicSlicing


def _dyn(**spec: Any) -> dict[str, Any]:
    spec.setdefault("provisioning", {"mode": "DynamicSlicing"})
    spec.setdefault("capacity", {"type": "Reserved", "reservation": BLOCK})
    return _job(**spec)


def test_a_dynamic_slicing_job_plans_its_cubes_and_spare_cubes() -> None:
    plan = _plan(_dyn(accelerator="tpu7x-256", slices=2, spares=1))
    assert plan.dynamic and plan.cubes_per_slice == 2 and plan.cubes_needed == 5
    assert [p.slice_index for p in plan.node_pools] == [0, 1, 2, 3]
    assert [p.slice_index for p in plan.spare_pools] == [4]
    cube = plan.node_pools[0]
    assert (cube.topology, cube.node_count, cube.reservation) == ("4x4x4", 16, BLOCK)
    assert plan.spare_chips == 64  # a spare cube, not a spare 4x4x8 slice
    assert plan.as_dict()["dynamicSlicing"]["totalCubes"] == 5


def test_existing_cubes_plan_no_pools_and_need_no_reservation() -> None:
    plan = _plan(
        _dyn(
            provisioning={"mode": "DynamicSlicing", "dynamicSlicing": {"cubes": "Existing"}},
            capacity={"type": "OnDemand"},
            slices=2,
        )
    )
    assert plan.pools == [] and plan.cubes_needed == 2


def test_dynamic_slicing_is_ironwood_only() -> None:
    errors = _errors(_dyn(accelerator="v5p-128", capacity={"type": "Reserved", "reservation": "r"}))
    assert "tpu7x" in errors["spec.accelerator"]


def test_managed_cubes_need_a_reservation() -> None:
    errors = _errors(_dyn(capacity={"type": "OnDemand"}))
    assert "All Capacity mode" in errors["spec.capacity.type"]
    assert "cubes: Existing" in errors["spec.capacity.type"]


def test_a_sub_slice_topology_is_refused_with_the_fix() -> None:
    errors = _errors(_dyn(accelerator="tpu7x-64"))
    assert "sub-slice" in errors["spec.topology"] and "tpu7x-128 (4x4x4)" in errors["spec.topology"]


def test_dynamic_slicing_without_the_mode_is_refused() -> None:
    errors = _errors(_job(provisioning={"dynamicSlicing": {"cubes": "Managed"}}))
    assert "mode: DynamicSlicing" in errors["spec.provisioning.dynamicSlicing"]


def test_a_sub_block_holds_one_cube_of_a_dynamic_slicing_job() -> None:
    errors = _errors(_dyn(capacity={"type": "Reserved", "reservation": SUB_BLOCK}, spares=1))
    assert "2 cubes (1 slice of 1 + 1 spare)" in errors["spec.capacity.reservation"]
    assert len(_plan(_dyn(capacity={"type": "Reserved", "reservation": SUB_BLOCK})).pools) == 1
