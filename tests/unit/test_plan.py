import copy

import pytest

from multislice_operator.api.models import FailurePolicy
from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import (
    NODE_POOL_NAME_MAX,
    load_job,
    make_plan,
    node_pool_name,
)

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


# ---------------------------------------------------------------- issue 21: fail before any pool


def pod(**fields):
    return {"spec": {"containers": [{"name": "train", "image": "img:1"}], **fields}}


@pytest.mark.parametrize(
    ("fields", "path", "needle"),
    [
        ({"nodeSelector": {"disktype": "ssd"}}, "spec.template.spec.nodeSelector.disktype", ""),
        (
            {"nodeSelector": {"cloud.google.com/gke-nodepool": "tpu-pool"}},
            "spec.template.spec.nodeSelector.cloud.google.com/gke-nodepool",
            "each slice runs on a node pool of its own",
        ),
        (
            {"nodeSelector": {"cloud.google.com/gke-spot": "true"}},  # on-demand pools
            "spec.template.spec.nodeSelector.cloud.google.com/gke-spot",
            "",
        ),
        (
            {"nodeSelector": {"node.kubernetes.io/instance-type": "ct5lp-hightpu-8t"}},
            "spec.template.spec.nodeSelector.node.kubernetes.io/instance-type",
            "",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "pool", "operator": "In",
                                                       "values": ["a"]}]},
                                {"matchExpressions": [{"key": "multislice.dev/slice",
                                                       "operator": "Gt", "values": ["5"]}]},
                            ]
                        }
                    }
                }
            },
            "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            "no nodeSelectorTerm matches",
        ),
    ],
    ids=["foreign-label", "another-pool", "spot-on-on-demand", "machine-type", "affinity"],
)  # fmt: skip
def test_node_selection_the_managed_pools_never_satisfy_is_refused(fields, path, needle):
    # Issue 21: the gang was provisioned and held for unschedulableTimeoutSeconds (600 s).
    errors = errors_of(job(template=pod(**fields)))
    assert path in errors, errors
    assert "msj-llm-" in errors[path] and "multislice.dev/job-key=" in errors[path]  # the labels
    assert needle in errors[path]


@pytest.mark.parametrize(
    "fields",
    [
        {"nodeSelector": {"cloud.google.com/gke-spot": "true"}},
        {"nodeSelector": {"node.kubernetes.io/instance-type": "ct5lp-hightpu-4t"}},
        {"nodeSelector": {"topology.kubernetes.io/zone": "us-east5-b"}},  # GKE's: unknown here
        {"nodeSelector": {"feature.node.kubernetes.io/cpu-sse4": "true"}},  # added by a daemon
        {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "4x4"}},  # the operator's own
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
                            {"matchExpressions": [{"key": "multislice.dev/slice",
                                                   "operator": "In", "values": ["0", "1"]}]},
                        ]
                    }
                }
            }
        },
    ],
    ids=["spot", "machine-type", "zone", "platform-domain", "same-topology", "one-term-matches"],
)  # fmt: skip
def test_node_selection_the_pools_can_satisfy_passes(fields):
    plan = plan_of(job(template=pod(**fields), capacity={"type": "Spot"}))
    assert len(plan.node_pools) == 2


def test_existing_mode_node_selection_is_the_users_business():
    plan = plan_of(
        job(template=pod(nodeSelector={"pool": "mine"}), provisioning={"mode": "Existing"})
    )
    assert plan.node_pools == []


@pytest.mark.parametrize(
    ("fields", "path", "needle"),
    [
        (
            {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x4"}},
            "spec.template.spec.nodeSelector.cloud.google.com/gke-tpu-topology",
            "'2x4' conflicts with the operator's '4x4'",
        ),
        (
            {"nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}},
            "spec.template.spec.nodeSelector.cloud.google.com/gke-tpu-accelerator",
            "conflicts with the operator's 'tpu-v5-lite-podslice'",
        ),
        (
            {"containers": [{"name": "t", "image": "i",
                             "resources": {"limits": {"google.com/tpu": 8}}}]},
            "spec.template.spec.containers[0].resources.limits.google.com/tpu",
            "conflicts with the 4 chips per host",
        ),
        (
            {"containers": [{"name": "t", "image": "i"},
                            {"name": "s", "image": "i",
                             "resources": {"requests": {"google.com/tpu": "4"}}}]},
            "spec.template.spec.containers[1].resources.requests.google.com/tpu",
            "only the first container gets the TPUs",
        ),
    ],
    ids=["topology", "accelerator", "chips", "second-container"],
)  # fmt: skip
def test_a_template_that_contradicts_what_the_operator_sets_is_refused(fields, path, needle):
    # Issue 21: the render silently replaced them.
    for mode in ("Managed", "Existing"):
        errors = errors_of(job(template=pod(**fields), provisioning={"mode": mode}))
        assert needle in errors[path], errors


def test_the_operators_own_values_are_accepted_in_the_template():
    fields = {
        "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"},
        "containers": [
            {"name": "t", "image": "i", "resources": {"limits": {"google.com/tpu": "4"}}}
        ],
    }
    assert plan_of(job(template=pod(**fields))).total_chips == 32


def test_no_checkpoint_is_a_warning():
    plan = plan_of(job())
    assert [w.path for w in plan.warnings] == ["spec.checkpoint.directory"]
    assert "starts training from step 0" in plan.warnings[0].message
    assert plan_of(job(checkpoint={"directory": "gs://bkt/run"})).warnings == []


@pytest.mark.parametrize(
    ("volumes", "mounts", "needle"),
    [
        ([], [], "is on no volume of the TPU container"),
        ([{"name": "ck", "emptyDir": {}}], [{"name": "ck", "mountPath": "/ckpt"}], "(emptyDir)"),
        ([{"name": "ck", "hostPath": {"path": "/x"}}], [{"name": "ck", "mountPath": "/"}],
         "(hostPath)"),
        ([{"name": "ck", "persistentVolumeClaim": {"claimName": "c"}}],
         [{"name": "ck", "mountPath": "/ckpt/run-other"}], "is on no volume"),
        ([{"name": "ck", "persistentVolumeClaim": {"claimName": "c"}}],
         [{"name": "ck", "mountPath": "/ckpt"}], None),
        ([{"name": "ck", "csi": {"driver": "gcsfuse.csi.storage.gke.io"}}],
         [{"name": "ck", "mountPath": "/ckpt/"}], None),
    ],
    ids=["no-volume", "empty-dir", "host-path", "other-dir", "pvc", "gcs-fuse"],
)  # fmt: skip
def test_a_local_checkpoint_needs_a_volume_that_persists(volumes, mounts, needle):
    template = {
        "spec": {
            "containers": [{"name": "t", "image": "i", "volumeMounts": mounts}],
            "volumes": volumes,
        }
    }
    plan = plan_of(job(template=template, checkpoint={"directory": "/ckpt/run"}))
    if needle is None:
        assert plan.warnings == []
    else:
        [warning] = plan.warnings
        assert needle in warning.message, warning
