"""What a DynamicSlicing job may not ask for, as GKE's dynamic-slicing guides say (issue 54):
a Slice's cubes share one reservation block, so Managed cubes of a multi-cube slice are aimed at
a block; the pods' Slice is the operator's to choose (GKE: "Do NOT put
cloud.google.com/gke-tpu-slice here manually"), and so is the cube pool they run on. `validate`
and `plan` refuse each, naming the field and the fix; the CRD's CEL rules refuse the nodeSelector
ones at admission too (tests/integration/test_crd_refuses_bad_input.py)."""

from __future__ import annotations

from typing import Any

import pytest

from multislice_operator.common import keys
from tests.unit import jobs

BLOCK = "ironwood/reservationBlocks/block-1"


def _job(accelerator: str = "tpu7x-256", reservation: str = BLOCK, cubes: str = "Managed",
         pod: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:  # fmt: skip
    fields: dict[str, Any] = {
        "accelerator": accelerator,
        "capacity": {"type": "Reserved", "reservation": reservation},
        "provisioning": {"mode": "DynamicSlicing", "dynamicSlicing": {"cubes": cubes}},
        "template": {"spec": {"containers": [{"name": "train", "image": "img:1"}], **(pod or {})}},
    }
    return jobs.body("iw", "team-a", **{**fields, **spec})


def _plan(obj: dict[str, Any]) -> Any:
    return jobs.spec_and_plan(obj)[1]


_errors = jobs.spec_errors


# ------------------------------------------------------------ 1. one reservation block per Slice


@pytest.mark.parametrize("reservation", ["iw-res", "projects/my-project/reservations/iw-res"])
def test_managed_cubes_of_a_multi_cube_slice_need_a_block(reservation: str) -> None:
    """GKE fails a Slice whose cubes are not in one block, and places a pool aimed at the
    reservation in any block: two cubes of a 4x4x8 slice could never form it."""
    message = _errors(_job(reservation=reservation))["spec.capacity.reservation"]
    assert f"{reservation} names no reservation block" in message
    assert "4x4x8" in message and "2 cubes" in message and "one block" in message
    assert f"{reservation}/reservationBlocks/BLOCK" in message  # the fix
    assert "tpu7x-128" in message  # or slices of one cube


def test_one_cube_slices_and_a_block_are_accepted() -> None:
    assert len(_plan(_job(accelerator="tpu7x-128", reservation="iw-res")).node_pools) == 2
    two = _plan(_job(reservation="projects/my-project/reservations/iw-res/reservationBlocks/b-2"))
    assert {p.reservation for p in two.node_pools} == {
        "projects/my-project/reservations/iw-res/reservationBlocks/b-2"
    }


def test_existing_cubes_name_no_reservation() -> None:
    """Existing cubes are there: the operator groups them by block when it forms a Slice."""
    assert _plan(_job(cubes="Existing", capacity={})).cubes_per_slice == 2


# ------------------------------------------------------------ 2. what users must not write


@pytest.mark.parametrize("cubes", ["Managed", "Existing"])
def test_a_slice_selector_by_hand_is_refused(cubes: str) -> None:
    """The pods could never schedule: the operator's affinity asks for the job's own Slices."""
    pod = {"nodeSelector": {keys.GKE_TPU_SLICE: "my-slice"}}
    extra: dict[str, Any] = {"capacity": {}} if cubes == "Existing" else {}
    errors = _errors(_job(cubes=cubes, pod=pod, **extra))
    message = errors[f"spec.template.spec.nodeSelector.{keys.GKE_TPU_SLICE}"]
    assert "the operator forms the job's Slices and selects them itself" in message
    assert "remove it" in message


def test_a_slice_affinity_by_hand_is_refused() -> None:
    term = {"matchExpressions": [{"key": keys.GKE_TPU_SLICE, "operator": "In", "values": ["s"]}]}
    pod = {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [term]}}
        }
    }  # fmt: skip
    errors = _errors(_job(pod=pod))
    path = ("spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuring"
            "Execution")  # fmt: skip
    assert keys.GKE_TPU_SLICE in errors[path] and "remove it" in errors[path]


def test_a_node_pool_selector_says_cubes_and_slices() -> None:
    pod = {"nodeSelector": {keys.GKE_NODEPOOL: "my-pool"}}
    errors = _errors(_job(pod=pod))
    message = errors[f"spec.template.spec.nodeSelector.{keys.GKE_NODEPOOL}"]
    assert "node pool of its own" not in message
    assert "GKE Slice" in message and "4x4x4 cubes" in message and "remove" in message
    assert len(errors) == 1  # one error for the one selector


def test_node_pool_jobs_keep_the_node_pool_wording() -> None:
    obj = _job(accelerator="v5p-128", pod={"nodeSelector": {keys.GKE_NODEPOOL: "my-pool"}},
               capacity={}, provisioning={})  # fmt: skip
    message = _errors(obj)[f"spec.template.spec.nodeSelector.{keys.GKE_NODEPOOL}"]
    assert "each slice runs on a node pool of its own" in message
