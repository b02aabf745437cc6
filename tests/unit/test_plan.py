import copy

import pytest

from multislice_operator.api.models import FailurePolicy
from multislice_operator.errors import SpecError
from multislice_operator.plan import NODE_POOL_NAME_MAX, load_job, make_plan, node_pool_name

BASE = {
    "apiVersion": "multislice.dev/v1alpha1",
    "kind": "MultisliceJob",
    "metadata": {"name": "llm", "namespace": "team-a"},
    "spec": {
        "accelerator": "v5litepod-16",
        "slices": 2,
        "template": {"spec": {"containers": [{"name": "train", "image": "img:1"}]}},
    },
}


def job(**spec):
    obj = copy.deepcopy(BASE)
    obj["spec"].update(spec)
    return obj


def plan_of(obj):
    j = load_job(obj)
    return make_plan(j.spec, j.metadata.namespace, j.metadata.name)


def errors_of(obj):
    with pytest.raises(SpecError) as exc:
        plan_of(obj)
    return {e.path: e.message for e in exc.value.errors}


def test_plan_of_the_seed_example():
    plan = plan_of(job(topology="4x4", training={"globalBatchTokens": 4_194_304}))
    assert (plan.slices, plan.total_chips, plan.total_hosts) == (2, 32, 8)
    assert plan.shape.machine_type == "ct5lp-hightpu-4t"
    assert plan.advice.verdict == "ok"
    assert [p.slice_index for p in plan.node_pools] == [0, 1]
    pool = plan.node_pools[0]
    assert (pool.node_count, pool.tpu_topology, pool.spot, pool.reservation) == (
        4,
        "4x4",
        False,
        None,
    )
    assert pool.node_labels["multislice.dev/job-namespace"] == "team-a"
    assert pool.node_labels["multislice.dev/slice"] == "0"


def test_single_host_pools_have_no_tpu_topology():
    plan = plan_of(job(accelerator="v5litepod-4", slices=1))
    assert all(p.tpu_topology is None for p in plan.node_pools)
    assert plan.shape.hosts == 1


def test_spot_and_reservation():
    assert plan_of(job(capacity={"type": "Spot"})).node_pools[0].spot is True
    res = plan_of(job(capacity={"type": "Reserved", "reservation": "r1"})).node_pools[0]
    assert res.reservation == "r1"


# ---------------------------------------------------------------- issue 12


def test_reserved_needs_a_reservation_and_accepts_shared_ones():
    # Defect 9: without a name GKE would consume any reservation and fall back to on-demand.
    errs = errors_of(job(capacity={"type": "Reserved"}))
    assert "on-demand" in errs["spec.capacity.reservation"]
    shared = "projects/owner-proj/reservations/tpu-res"
    pool = plan_of(job(capacity={"type": "Reserved", "reservation": shared})).node_pools[0]
    assert pool.reservation == shared
    bad = errors_of(job(capacity={"type": "Reserved", "reservation": "projects/p/res/r"}))
    assert "spec.capacity.reservation" in bad


@pytest.mark.parametrize(
    ("accelerator", "suggested"),
    [
        ("v4-8", "v4-16"),
        ("v5p-8", "v5p-16"),
        ("v5litepod-1", "v5litepod-8"),
        ("v5litepod-4", "v5litepod-8"),
        ("v6e-1", "v6e-8"),
        ("v6e-4", "v6e-8"),
    ],
)
def test_multislice_needs_multi_host_slices(accelerator, suggested):
    # Defect 5: GKE Multislice only supports multi-host TPU slice node pools.
    errs = errors_of(job(accelerator=accelerator, slices=2))
    assert "single-host" in errs["spec.slices"] and suggested in errs["spec.slices"]
    assert plan_of(job(accelerator=accelerator, slices=1)).slices == 1
    for mode in ("Managed", "Existing"):
        assert "spec.slices" in errors_of(
            job(accelerator=accelerator, slices=2, provisioning={"mode": mode})
        )


def test_v5e_and_v6e_8_are_multisliceable():
    for accelerator, machine in (
        ("v5litepod-8", "ct5lp-hightpu-4t"),
        ("v6e-8", "ct6e-standard-4t"),
    ):
        plan = plan_of(job(accelerator=accelerator, slices=2))
        assert [(p.node_count, p.machine_type, p.tpu_topology) for p in plan.node_pools] == [
            (2, machine, "2x4")
        ] * 2


def test_name_jobset_would_refuse():
    # Defect 4: JobSet's webhook wants `<name>-slice-<maxJob>-<maxPod>-abcde` <= 63 characters
    # and a DNS-1035 name; a 50-character name with 2 slices x 4 hosts is 66 characters.
    obj = job()
    obj["metadata"]["name"] = "n" * 50
    msg = errors_of(obj)["metadata.name"]
    assert "use at most 47 characters" in msg and "2 slices x 4 hosts" in msg
    obj["metadata"]["name"] = "n" * 47
    assert plan_of(obj).name == "n" * 47
    obj["metadata"]["name"] = "1st-run"
    assert "DNS-1035" in errors_of(obj)["metadata.name"]


def test_node_labels_stay_out_of_reserved_namespaces():
    # Defect 1: GKE and the kubelet refuse kubernetes.io / k8s.io node labels; cloud.google.com
    # belongs to GKE. Ownership goes to multislice.dev.
    pool = plan_of(job()).node_pools[0]
    for key in pool.node_labels:
        assert key.startswith("multislice.dev/"), key
    assert pool.node_labels["multislice.dev/managed-by"] == "multislice-operator"


def test_existing_mode_has_no_pools():
    assert plan_of(job(provisioning={"mode": "Existing"})).node_pools == []


def test_node_pool_names_deterministic_short_unique():
    long = "x" * 63
    names = {node_pool_name("ns", long, i) for i in range(256)}
    assert len(names) == 256
    assert all(len(n) <= NODE_POOL_NAME_MAX for n in names)
    assert node_pool_name("a", "job", 0) == node_pool_name("a", "job", 0)
    assert node_pool_name("a", "job", 0) != node_pool_name("b", "job", 0)
    assert node_pool_name("a", "My.Job", 1).startswith("msj-my-job-")


def test_every_error_reported_with_path():
    errs = errors_of(
        job(
            parallelism={"ici": {"fsdp": 3}, "dcn": {"data": 1, "tensor": 2}},
            capacity={"type": "Spot", "reservation": "r"},
            failurePolicy={"nonRetryableExitCodes": [0, 300]},
            template={"spec": {"containers": []}},
        )
    )
    assert set(errs) >= {
        "spec.parallelism.ici",
        "spec.parallelism.dcn.tensor",
        "spec.capacity.reservation",
        "spec.failurePolicy.nonRetryableExitCodes",
        "spec.template.spec.containers",
    }


@pytest.mark.parametrize(
    ("policy", "field", "needle"),
    [
        ({"nonRetryableExitCodes": [75]}, "nonRetryableExitCodes", "hang code"),
        ({"restartExitCodes": [42]}, "restartExitCodes", "exitCodePolicy: RestartIfListed"),
        (
            {"exitCodePolicy": "RestartIfListed", "nonRetryableExitCodes": [1]},
            "nonRetryableExitCodes",
            "exitCodePolicy: RestartUnlessListed",
        ),
        (
            {"exitCodePolicy": "RestartIfListed", "restartExitCodes": [300]},
            "restartExitCodes",
            "1-255",
        ),
    ],
)
def test_exit_code_policy_rules_in_python_too(policy, field, needle):
    errs = errors_of(job(failurePolicy=policy))
    assert needle in errs[f"spec.failurePolicy.{field}"]


def test_exit_code_policies_decide_what_is_fatal():
    default = FailurePolicy()
    assert [c for c in (1, 13, 42, 75, 78, 137, 143) if default.is_fatal(c)] == [78]
    xpk = FailurePolicy(exitCodePolicy="RestartIfListed")
    assert [c for c in (1, 13, 42, 75, 78, 137, 143) if xpk.is_fatal(c)] == [1, 13, 78]
    assert not xpk.is_fatal(0) and not xpk.is_fatal(None)
    listed = FailurePolicy(exitCodePolicy="RestartIfListed", restartExitCodes=[13])
    assert [c for c in (1, 13, 42, 75, 143) if listed.is_fatal(c)] == [1, 42, 143]


def test_pydantic_errors_become_field_paths():
    errs = errors_of(job(slices=0, capacity={"type": "Cheap"}, bogus=1))
    assert "spec.slices" in errs
    assert "spec.capacity.type" in errs
    assert "unknown field" in errs["spec.bogus"]


def test_unknown_accelerator_lists_families():
    errs = errors_of(job(accelerator="v3-8"))
    assert "v5litepod-N" in errs["spec.accelerator"]


def test_bad_topology_names_topology():
    assert "valid: 4x4" in errors_of(job(topology="2x8"))["spec.topology"]


def test_wrong_kind_and_missing_spec():
    with pytest.raises(SpecError, match="kind: expected MultisliceJob"):
        load_job({"kind": "Job", "spec": {}})
    with pytest.raises(SpecError, match="spec: required"):
        load_job({"kind": "MultisliceJob"})


def test_name_too_long_for_hostnames():
    obj = job(accelerator="v5litepod-256", slices=256)
    obj["metadata"]["name"] = "n" * 52
    assert "metadata.name" in errors_of(obj)


def test_restart_policy_must_be_never():
    obj = job(
        template={"spec": {"restartPolicy": "Always", "containers": [{"name": "a", "image": "b"}]}}
    )
    assert "spec.template.spec.restartPolicy" in errors_of(obj)
