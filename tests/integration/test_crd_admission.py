"""Our generated CRD on the real apiserver: accepted, examples valid, bad objects rejected."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.harness import install_crds
from multislice_operator.api import models

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def api(kube_api):
    api_client = kube_api.api_client()
    install_crds(api_client)
    yield api_client
    api_client.close()


def examples() -> list[dict]:
    docs = []
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == models.KIND]
    return docs


def create(api, ns, obj, dry_run=None):
    custom = client.CustomObjectsApi(api)
    return custom.create_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, obj, dry_run=dry_run
    )


def rejection(api, ns, obj) -> str:
    with pytest.raises(ApiException) as exc:
        create(api, ns, obj, dry_run="All")
    assert exc.value.status == 422, exc.value.body
    return str(exc.value.body)


def test_examples_are_accepted(api, namespace, kube_api):
    ns = namespace(kube_api)
    docs = examples()
    assert docs, "examples/ must hold MultisliceJobs"
    for doc in docs:
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = ns
        created = create(api, ns, doc)
        assert created["spec"]["accelerator"] == doc["spec"]["accelerator"]
        # Defaults from the models are applied by the apiserver itself.
        if "provisioning" in doc["spec"]:
            assert created["spec"]["provisioning"]["timeoutSeconds"] >= 60


def _dynamic(selector: dict[str, str]) -> dict[str, Any]:
    """A DynamicSlicing job's spec change whose template selects `selector`."""
    return {
        "accelerator": "tpu7x-128",
        "capacity": {"type": "Reserved", "reservation": "iw/reservationBlocks/b1"},
        "provisioning": {"mode": "DynamicSlicing"},
        "template": {
            "spec": {"containers": [{"name": "c", "image": "i"}], "nodeSelector": selector}
        },
    }


BASE = {
    "apiVersion": models.API_VERSION,
    "kind": models.KIND,
    "metadata": {"name": "bad"},
    "spec": {
        "accelerator": "v5litepod-16",
        "slices": 2,
        "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
    },
}


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"slices": 0}, "spec.slices"),
        ({"slices": 257}, "spec.slices"),
        ({"accelerator": "v3-8"}, "spec.accelerator"),
        ({"parallelism": {"dcn": {"tensor": 2}}}, "spec.parallelism.dcn.tensor must be 1"),
        ({"capacity": {"type": "Spot", "reservation": "r"}}, "only valid with type: Reserved"),
        ({"capacity": {"type": "Cheap"}}, "spec.capacity.type"),
        ({"provisioning": {"timeoutSeconds": 5}}, "spec.provisioning.timeoutSeconds"),
        # Issue 15: the exit-code policies and the new deadlines.
        ({"failurePolicy": {"nonRetryableExitCodes": [75]}}, "75 is the workload's hang code"),
        (
            {"failurePolicy": {"restartExitCodes": [42]}},
            "restartExitCodes is only valid with exitCodePolicy: RestartIfListed",
        ),
        (
            {"failurePolicy": {"exitCodePolicy": "RestartIfListed", "nonRetryableExitCodes": [1]}},
            "nonRetryableExitCodes is only valid with exitCodePolicy: RestartUnlessListed",
        ),
        (
            {"failurePolicy": {"exitCodePolicy": "RestartIfListed", "restartExitCodes": [0]}},
            "restartExitCodes: exit codes must be 1-255",
        ),
        ({"failurePolicy": {"exitCodePolicy": "Never"}}, "spec.failurePolicy.exitCodePolicy"),
        ({"failurePolicy": {"startupTimeoutSeconds": 5}}, "startupTimeoutSeconds"),
        ({"failurePolicy": {"maxDisruptionRestarts": -1}}, "maxDisruptionRestarts"),
        ({"maintenance": {"checkpointAheadSeconds": 0}}, "checkpointAheadSeconds"),
        # Issue 41: dynamic slicing is tpu7x on a reservation; its field only with its mode.
        ({"provisioning": {"mode": "DynamicSlicing"}}, "forms GKE Slices from Ironwood"),
        (
            {"accelerator": "tpu7x-128", "provisioning": {"mode": "DynamicSlicing"}},
            "spec.capacity.type must be Reserved with provisioning.mode DynamicSlicing",
        ),
        (
            {"provisioning": {"dynamicSlicing": {"cubes": "Existing"}}},
            "dynamicSlicing is only read with mode: DynamicSlicing",
        ),
        ({"spares": 1, "provisioning": {"mode": "Existing"}}, "spec.spares needs"),
        # Issue 54: GKE "do NOT put cloud.google.com/gke-tpu-slice here manually"; a node pool
        # selector on cubes. CEL on the template's nodeSelector refuses both at admission.
        (_dynamic({"cloud.google.com/gke-tpu-slice": "my-slice"}), "gke-tpu-slice by hand"),
        (_dynamic({"cloud.google.com/gke-nodepool": "p"}), "a node pool selector would pin"),
    ],
)
def test_invalid_objects_rejected_naming_the_field(api, namespace, kube_api, change, needle):
    ns = namespace(kube_api, "adm")
    obj = copy.deepcopy(BASE)
    obj["spec"].update(change)
    assert needle in rejection(api, ns, obj)


def test_immutable_fields(api, namespace, kube_api):
    ns = namespace(kube_api, "imm")
    obj = copy.deepcopy(BASE)
    obj["metadata"]["name"] = "imm"
    create(api, ns, obj)
    custom = client.CustomObjectsApi(api)
    with pytest.raises(ApiException) as exc:
        custom.patch_namespaced_custom_object(
            models.GROUP, models.VERSION, ns, models.PLURAL, "imm", {"spec": {"slices": 4}}
        )
    assert exc.value.status == 422
    assert "spec.slices is immutable" in str(exc.value.body)
    # suspend stays mutable
    custom.patch_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "imm", {"spec": {"suspend": True}}
    )


@pytest.mark.parametrize(
    ("name", "change", "needle"),
    [
        # Issue 12, defect 4: names JobSet's webhook refuses, refused at admission instead.
        ("1st-run", {}, "metadata.name"),
        ("a.b", {}, "metadata.name"),
        ("n" * 48, {}, "metadata.name is too long"),  # 2 x 4 hosts: 47 at most
        ("n" * 46, {"accelerator": "v5p-256", "slices": 12}, "metadata.name is too long"),
        # Defect 9: Reserved needs a reservation; the name is a GCE name or a shared one.
        ("res", {"capacity": {"type": "Reserved"}}, "on-demand capacity"),
        ("res", {"capacity": {"type": "Reserved", "reservation": "Bad_Res"}}, "reservation"),
    ],
)
def test_names_and_reservations_refused_at_admission(
    api, namespace, kube_api, name, change, needle
):
    ns = namespace(kube_api, "adm")
    obj = copy.deepcopy(BASE)
    obj["metadata"]["name"] = name
    obj["spec"].update(change)
    assert needle in rejection(api, ns, obj)


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("n" * 47, {}),  # exactly the longest a 2 x 4-host job may have
        ("n" * 45, {"accelerator": "v5p-256", "slices": 12}),  # 12 x 32 hosts: 45 at most
        (
            "shared",
            {"capacity": {"type": "Reserved", "reservation": "projects/owner-1/reservations/r"}},
        ),
        (
            "xpk",
            {"failurePolicy": {"exitCodePolicy": "RestartIfListed", "restartExitCodes": [42, 143]}},
        ),
        ("maint", {"maintenance": {"checkpointAheadSeconds": 600}}),
    ],
)
def test_longest_names_and_shared_reservations_accepted(api, namespace, kube_api, name, change):
    ns = namespace(kube_api, "adm")
    obj = copy.deepcopy(BASE)
    obj["metadata"]["name"] = name
    obj["spec"].update(change)
    create(api, ns, obj, dry_run="All")
    from multislice_operator.planning.plan import load_job, plan_job

    plan_job(load_job({**obj, "metadata": {"name": name, "namespace": ns}}))  # the plan agrees
