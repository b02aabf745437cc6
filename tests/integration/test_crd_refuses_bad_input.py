"""Issue 14 at admission, on the real apiserver: what must never reach a node pool is refused here.

* item 1: a malformed pod template (`env: "x"`, `resources: "lots"`, tolerations as a map,
  `ports: "8080"`) is refused naming the field, as Kubernetes types it;
* contract variables (`MEGASCALE_NUM_SLICES`, `TPU_WORKER_ID`, ...) are refused naming the variable;
* checkpoint directories: gs:// and absolute paths only;
* item 9: every field that shapes the node pools or the JobSet is immutable from creation, absent
  to present and present to absent included; the mutable fields stay mutable.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from multislice_local.harness import install_crds
from multislice_operator.api import models
from tests import msj
from tests.msj import create, custom


@pytest.fixture(scope="module")
def api(kube_api):
    api_client = kube_api.api_client()
    install_crds(api_client)
    yield api_client
    api_client.close()


def base(name: str = "h") -> dict[str, Any]:
    return msj.job(name, container="c", image="i")


def refused(call: Any) -> str:
    with pytest.raises(ApiException) as exc:
        call()
    assert exc.value.status == 422, exc.value.body
    return str(json.loads(exc.value.body)["message"])


def with_container(**fields: Any) -> dict[str, Any]:
    obj = base()
    obj["spec"]["template"]["spec"]["containers"][0].update(fields)
    return obj


@pytest.mark.parametrize(
    ("obj", "needle"),
    [
        (with_container(env="x"), "spec.template.spec.containers[0].env"),
        (with_container(resources="lots"), "spec.template.spec.containers[0].resources"),
        (
            with_container(resources={"requests": {"cpu": "lots"}}),
            "spec.template.spec.containers[0].resources.requests.cpu",
        ),
        (with_container(ports="8080"), "spec.template.spec.containers[0].ports"),
        (with_container(name=123), "spec.template.spec.containers[0].name"),
        (with_container(env=[{"name": "A", "value": 5}]), "containers[0].env[0].value"),
    ],
    ids=[
        "env-string",
        "resources-string",
        "quantity",
        "ports-string",
        "name-number",
        "env-value-number",
    ],
)
def test_malformed_template_refused_naming_the_field(api, namespace, kube_api, obj, needle):
    ns = namespace(kube_api, "tpl")
    message = refused(lambda: create(api, ns, obj, dry_run="All"))
    assert needle in message, message


def test_tolerations_map_refused(api, namespace, kube_api):
    ns = namespace(kube_api, "tol")
    obj = base()
    obj["spec"]["template"]["spec"]["tolerations"] = {"key": "x"}
    message = refused(lambda: create(api, ns, obj, dry_run="All"))
    assert "spec.template.spec.tolerations" in message, message


@pytest.mark.parametrize("var", ["MEGASCALE_NUM_SLICES", "TPU_WORKER_ID", "MULTISLICE_JOB_NAME"])
def test_contract_variables_refused_naming_them(api, namespace, kube_api, var):
    ns = namespace(kube_api, "env")
    obj = with_container(env=[{"name": "OK", "value": "1"}, {"name": var, "value": "99"}])
    message = refused(lambda: create(api, ns, obj, dry_run="All"))
    assert "spec.template.spec.containers[0].env[1]: Invalid value" in message, message
    assert f"{var} is set by the operator" in message, message


def test_contract_variable_in_a_sidecar_refused(api, namespace, kube_api):
    ns = namespace(kube_api, "side")
    obj = base()
    obj["spec"]["template"]["spec"]["containers"].append(
        {"name": "side", "image": "i", "env": [{"name": "MEGASCALE_NUM_SLICES", "value": "1"}]}
    )
    message = refused(lambda: create(api, ns, obj, dry_run="All"))
    assert "containers[1].env[0]" in message and "MEGASCALE_NUM_SLICES" in message, message


def test_other_variables_and_unknown_fields_are_kept(api, namespace, kube_api):
    ns = namespace(kube_api, "keep")
    obj = with_container(
        env=[{"name": "JAX_PLATFORMS", "value": "tpu"}, {"name": "MEGASCALE_GRPC_X", "value": "1"}],
        volumeMounts=[{"name": "v", "mountPath": "/data"}],
        resources={"requests": {"cpu": "1", "memory": 1024}},
    )
    obj["spec"]["template"]["spec"]["volumes"] = [{"name": "v", "emptyDir": {}}]
    created = create(api, ns, obj, dry_run="All")
    container = created["spec"]["template"]["spec"]["containers"][0]
    assert container["volumeMounts"] == [{"name": "v", "mountPath": "/data"}]
    assert created["spec"]["template"]["spec"]["volumes"][0]["emptyDir"] == {}


@pytest.mark.parametrize(
    "directory",
    ["file:///etc/passwd", "../..", "ckpt/run1", "/ckpt/../etc", "/ckpt\nX=1", "gs://b/$(HOME)"],
)
def test_checkpoint_directory_refused(api, namespace, kube_api, directory):
    ns = namespace(kube_api, "ckpt")
    obj = base()
    obj["spec"]["checkpoint"] = {"directory": directory}
    message = refused(lambda: create(api, ns, obj, dry_run="All"))
    assert "spec.checkpoint.directory must be gs://BUCKET/PATH or an absolute path" in message


@pytest.mark.parametrize("directory", ["gs://my-bucket/runs/a", "gs://b.example.com", "/ckpt/a"])
def test_checkpoint_directory_accepted(api, namespace, kube_api, directory):
    ns = namespace(kube_api, "ckok")
    obj = base()
    obj["spec"]["checkpoint"] = {"directory": directory}
    create(api, ns, obj, dry_run="All")


def patch(api, ns: str, name: str, body: dict[str, Any]) -> Any:
    return custom(api).patch_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, name, body
    )


@pytest.mark.parametrize(
    ("added", "field"),
    [
        ({"capacity": {"type": "Spot"}}, "spec.capacity"),
        ({"checkpoint": {"directory": "gs://bkt/c"}}, "spec.checkpoint"),
        ({"parallelism": {"ici": {"fsdp": 16}}}, "spec.parallelism"),
        ({"provisioning": {"mode": "Existing"}}, "spec.provisioning.mode"),
        ({"failurePolicy": {"maxRestarts": 1}}, "spec.failurePolicy"),
        ({"topology": "4x4"}, "spec.topology"),
    ],
    ids=["capacity", "checkpoint", "parallelism", "mode", "failurePolicy", "topology"],
)
def test_absent_to_present_is_refused(api, namespace, kube_api, added, field):
    ns = namespace(kube_api, "add")
    create(api, ns, base("add"))
    message = refused(lambda: patch(api, ns, "add", {"spec": added}))
    assert f"{field} is immutable" in message, message


@pytest.mark.parametrize(
    ("present", "field"),
    [
        ({"capacity": {"type": "Spot"}}, "spec.capacity"),
        ({"checkpoint": {"directory": "gs://bkt/c"}}, "spec.checkpoint"),
        ({"provisioning": {"mode": "Existing"}}, "spec.provisioning.mode"),
    ],
    ids=["capacity", "checkpoint", "mode"],
)
def test_present_to_absent_is_refused(api, namespace, kube_api, present, field):
    ns = namespace(kube_api, "rm")
    obj = base("rm")
    obj["spec"].update(copy.deepcopy(present))
    create(api, ns, obj)
    key = next(iter(present))
    message = refused(lambda: patch(api, ns, "rm", {"spec": {key: None}}))
    assert f"{field} is immutable" in message, message


def test_mutable_fields_stay_mutable(api, namespace, kube_api):
    ns = namespace(kube_api, "mut")
    create(api, ns, base("mut"))
    patch(api, ns, "mut", {"spec": {"suspend": True}})
    patch(api, ns, "mut", {"spec": {"ttlSecondsAfterFinished": 60}})
    patch(api, ns, "mut", {"spec": {"provisioning": {"timeoutSeconds": 600}}})
    patch(api, ns, "mut", {"spec": {"provisioning": {"mode": "Managed", "keepNodePools": True}}})
    patch(api, ns, "mut", {"spec": {"training": {"globalBatchTokens": 1000000}}})
    got = custom(api).get_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "mut"
    )
    assert got["spec"]["provisioning"]["timeoutSeconds"] == 600
    assert got["spec"]["provisioning"]["keepNodePools"] is True
