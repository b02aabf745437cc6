"""Capacity as one interface (reconcile/capacity.py): every provisioning mode has a model in the
registry (capacity_models.py), each model implements the whole interface, and the job's model is
chosen once, in derive, so that decide() asks it and never tests which one it has."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from multislice_operator.api.models import MultisliceJobStatus, ProvisioningMode
from multislice_operator.common.pools import PoolState
from multislice_operator.reconcile import DecideConfig, JobMeta, SliceObservation
from multislice_operator.reconcile.capacity import CapacityModel
from multislice_operator.reconcile.capacity_dynamic import DYNAMIC_SLICES
from multislice_operator.reconcile.capacity_existing import EXISTING_POOLS
from multislice_operator.reconcile.capacity_models import MODELS, WITHOUT_PLAN, model_of
from multislice_operator.reconcile.capacity_nodepools import NODE_POOLS
from multislice_operator.reconcile.facts import derive
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings()
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
# The interface: its attributes and its methods, as the Protocol declares them.
MEMBERS = sorted(
    {*CapacityModel.__annotations__, *(n for n in vars(CapacityModel) if not n.startswith("_"))}
)


def test_every_provisioning_mode_has_a_capacity_model() -> None:
    assert set(MODELS) == set(ProvisioningMode)
    assert MODELS[ProvisioningMode.MANAGED] is NODE_POOLS
    assert MODELS[ProvisioningMode.EXISTING] is EXISTING_POOLS
    assert MODELS[ProvisioningMode.DYNAMIC_SLICING] is DYNAMIC_SLICES
    assert len({m.name for m in MODELS.values()}) == len(MODELS)  # one name, one model


@pytest.mark.parametrize("model", list(MODELS.values()), ids=lambda m: m.name)
def test_each_model_implements_the_whole_interface(model: CapacityModel) -> None:
    assert {"slices", "provide", "release", "present", "dry_run_first"} <= set(MEMBERS)
    for member in MEMBERS:
        assert hasattr(model, member), f"{model.name} lacks {member}"
        declared = getattr(CapacityModel, member, None)
        assert callable(getattr(model, member)) == callable(declared), member


# What a mode needs besides itself: dynamic slicing is tpu7x on a reservation.
NEEDS = {
    ProvisioningMode.DYNAMIC_SLICING: {
        "accelerator": "tpu7x-128",
        "capacity": {"type": "Reserved", "reservation": "ironwood"},
    }
}


@pytest.mark.parametrize("mode", list(ProvisioningMode))
def test_derive_chooses_the_plans_model_once(mode: ProvisioningMode) -> None:
    spec, plan = spec_and_plan(provisioning={"mode": mode.value}, **NEEDS.get(mode, {}))
    f = derive(META, spec, plan, None, MultisliceJobStatus(), Observed(now=NOW), CFG)
    assert f.capacity is MODELS[mode] is model_of(plan)


def test_a_job_without_a_plan_releases_only_its_strays() -> None:
    f = derive(META, None, None, None, MultisliceJobStatus(), Observed(now=NOW), CFG)
    assert f.capacity is WITHOUT_PLAN is EXISTING_POOLS
    assert f.capacity.present(f) == [] and not f.capacity.finalizer_first


def _seen_ready(n: int) -> MultisliceJobStatus:
    slices = [{"index": i, "phase": "Running", "hosts": 4, "seenReady": True} for i in range(n)]
    return MultisliceJobStatus.from_dict({"phase": "Running", "slices": slices})


def test_a_pool_whose_nodes_are_gone_is_lost_only_to_the_node_pool_model() -> None:
    _, managed = spec_and_plan()
    _, existing = spec_and_plan(provisioning={"mode": "Existing"})
    names = [p.name for p in managed.node_pools]
    obs = Observed(
        now=NOW,
        slices=[
            SliceObservation(0, names[0], PoolState.READY, 4, present_hosts=4),
            SliceObservation(1, names[1], PoolState.READY, 0, present_hosts=0),
        ],
    )
    old = _seen_ready(2)
    pools = NODE_POOLS.slices(old, obs, managed, CFG, NOW)
    assert pools.ready == {0} and pools.lost == {1: "nodes gone"} and not pools.enough
    cluster = EXISTING_POOLS.slices(old, obs, existing, CFG, NOW)
    assert cluster.ready == {0} and cluster.lost == {} and not cluster.all_ready


def test_what_each_model_asks_before_its_first_capacity() -> None:
    # The node pools are paid for: the finalizer and the apiserver's dry run come first.
    assert NODE_POOLS.finalizer_first and NODE_POOLS.dry_run_first
    # The cluster's own pools: the JobSet is created at once, nothing of the job's to release.
    assert not EXISTING_POOLS.finalizer_first and not EXISTING_POOLS.dry_run_first
