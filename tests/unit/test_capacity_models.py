"""Capacity models as plugins (reconcile/capacity.py, registry.py): every registered mode has a
whole model, the job's model is chosen once, in derive, so that decide() asks it and never
tests which one it has, and a model's spec rules are an allow-list generated from what it
accepts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from multislice_operator.api import crd, models
from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common.errors import SpecError
from multislice_operator.common.pools import PoolState
from multislice_operator.plugins.dynamic import DYNAMIC_SLICES
from multislice_operator.plugins.existing import EXISTING_POOLS
from multislice_operator.plugins.fallback import Fallback, wrap
from multislice_operator.plugins.nodepools import NODE_POOLS
from multislice_operator.reconcile import DecideConfig, JobMeta, SliceObservation
from multislice_operator.reconcile.capacity import WITHOUT_PLAN, CapacityModel, model_of
from multislice_operator.reconcile.facts import derive
from multislice_operator.registry import REGISTRY, CapacityPlugin, PluginError, Registry
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings()
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
# The interface: its attributes and its methods, as the Protocol declares them.
MEMBERS = sorted(
    {*CapacityModel.__annotations__, *(n for n in vars(CapacityModel) if not n.startswith("_"))}
)
MODELS = {p.mode: p.model for p in REGISTRY.models().values()}


def test_the_registry_holds_the_in_tree_models() -> None:
    assert {k: v for k, v in MODELS.items() if k != "Fallback"} == {
        "Managed": NODE_POOLS,
        "Existing": EXISTING_POOLS,
        "DynamicSlicing": DYNAMIC_SLICES,
    }
    assert isinstance(MODELS["Fallback"], Fallback)  # composes the others (plugins/fallback.py)
    assert len({m.name for m in MODELS.values()}) == len(MODELS)  # one name, one model


@pytest.mark.parametrize("model", [*MODELS.values(), WITHOUT_PLAN], ids=lambda m: m.name)
def test_each_model_implements_the_whole_interface(model: CapacityModel) -> None:
    assert {"slices", "provide", "release", "present", "dry_run_first"} <= set(MEMBERS)
    for member in MEMBERS:
        assert hasattr(model, member), f"{model.name} lacks {member}"
        declared = getattr(CapacityModel, member, None)
        assert callable(getattr(model, member)) == callable(declared), member


# What a mode needs besides itself: dynamic slicing is tpu7x on a reservation.
NEEDS = {
    "DynamicSlicing": {
        "accelerator": "tpu7x-128",
        "capacity": {"type": "Reserved", "reservation": "ironwood"},
    },
    "Fallback": {"provisioning": {"mode": "Fallback", "fallback": {"options": [{}]}}},
}


@pytest.mark.parametrize("mode", list(MODELS))
def test_derive_chooses_the_plans_model_once(mode: str) -> None:
    spec, plan = spec_and_plan(**{"provisioning": {"mode": mode}, **NEEDS.get(mode, {})})
    f = derive(META, spec, plan, None, MultisliceJobStatus(), Observed(now=NOW), CFG)
    # Fallback is asked through the model of the option it tries (Managed by default).
    expected = wrap(NODE_POOLS) if mode == "Fallback" else MODELS[mode]
    assert f.capacity is expected is model_of(plan)


def test_a_job_without_a_plan_releases_only_its_strays() -> None:
    f = derive(META, None, None, None, MultisliceJobStatus(), Observed(now=NOW), CFG)
    assert f.capacity is WITHOUT_PLAN and f.capacity.name == "HoldsNothing"
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


# ------------------------------------------------------------------ the API, from the registry


def test_the_crd_enum_of_modes_is_the_registrys() -> None:
    mode = crd.spec_schema()["properties"]["provisioning"]["properties"]["mode"]
    assert mode["enum"] == ["Managed", "Existing", "DynamicSlicing", "Fallback"]
    assert mode["default"] == "Managed"
    assert "Existing: the slices run on node pools that already exist" in mode["description"]


def test_a_mode_no_plugin_registers_is_refused_naming_the_modes() -> None:
    with pytest.raises(SpecError) as err:
        spec_and_plan(provisioning={"mode": "Labelled"})
    (e,) = err.value.errors
    assert e.path == "spec.provisioning.mode"
    assert (
        "'Labelled' is not a provisioning mode: use Managed, Existing, DynamicSlicing or Fallback"
        in str(e)
    )


@pytest.mark.parametrize(
    ("mode", "fields", "path"),
    [
        ("Existing", {"spares": 1}, "spec.spares"),
        ("Existing", {"elastic": {"minSlices": 1}}, "spec.elastic"),
        ("DynamicSlicing", {"elastic": {"minSlices": 1}, **NEEDS["DynamicSlicing"]},
         "spec.elastic"),
    ],
)  # fmt: skip
def test_a_feature_a_model_does_not_accept_is_refused_naming_the_field(
    mode: str, fields: dict[str, object], path: str
) -> None:
    with pytest.raises(SpecError) as err:
        spec_and_plan(provisioning={"mode": mode}, **fields)
    found = [e for e in err.value.errors if e.path == path]
    assert found and f"provisioning.mode {mode} does not accept it" in str(found[0])


def test_the_allow_lists_are_cel_rules_naming_the_modes_that_accept() -> None:
    rules = {r.field: r for r in models.spec_rules() if r.cel.endswith("]")}
    assert rules["spec.spares"].cel.endswith("in ['Managed', 'DynamicSlicing', 'Fallback']")
    assert rules["spec.elastic"].cel.endswith("in ['Managed']")
    cel = [v["rule"] for v in crd.spec_schema()["x-kubernetes-validations"]]
    assert rules["spec.spares"].cel in cel and rules["spec.elastic"].cel in cel


def test_a_model_is_registered_once_with_a_word_for_a_mode(registry: Registry) -> None:
    with pytest.raises(PluginError, match="registered twice"):
        registry.add_model(CapacityPlugin("Managed", EXISTING_POOLS, "again"))
    with pytest.raises(PluginError, match="not a CamelCase word"):
        registry.add_model(CapacityPlugin("no'quote", EXISTING_POOLS, "bad"))
    with pytest.raises(PluginError, match="unknown features"):
        registry.add_model(CapacityPlugin("Other", EXISTING_POOLS, "x", accepts={"gpus": ""}))
