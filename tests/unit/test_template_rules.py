"""The pod template's schema and rules in Python (the twin of the CRD's, issue 14): what passes
always renders, what the renderer could not merge into is refused naming the field, contract
variables and unsafe checkpoint directories are refused naming what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multislice_operator.api import podtemplate
from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.render.jobset import contract_env, render_jobset


def body(template: Any = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": "job", "namespace": "ns"},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "template": template or {"spec": {"containers": [{"name": "c", "image": "i"}]}},
            **spec,
        },
    }


def errors(obj: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as exc:
        plan_job(load_job(obj))
    return str(exc.value)


def container(**fields: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "image": "i", **fields}]}}


@pytest.mark.parametrize(
    ("template", "needle"),
    [
        (container(env="x"), "spec.template.spec.containers[0].env: must be of type array"),
        (container(resources="lots"), "spec.template.spec.containers[0].resources: must be of"),
        (container(ports="8080"), "spec.template.spec.containers[0].ports: must be of type array"),
        (container(name=123), "spec.template.spec.containers[0].name: must be of type string"),
        (container(env=["A=1"]), "spec.template.spec.containers[0].env[0]: must be of type object"),
        (
            container(resources={"requests": {"cpu": "lots"}}),
            "spec.template.spec.containers[0].resources.requests.cpu: 'lots' is not a quantity",
        ),
        (
            container(resources={"requests": {"cpu": 1.5}}),
            "spec.template.spec.containers[0].resources.requests.cpu: must be an integer or a",
        ),
        (
            {"spec": {"containers": [{"name": "c", "image": "i"}], "tolerations": {"key": "x"}}},
            "spec.template.spec.tolerations: must be of type array",
        ),
        (
            {"metadata": {"labels": {"a": 1}}, "spec": {"containers": [{"name": "c"}]}},
            "spec.template.metadata.labels.a: must be of type string",
        ),
    ],
)
def test_malformed_template_is_refused_naming_the_field(template, needle):
    assert needle in errors(body(template))


def test_contract_variables_are_refused_naming_each():
    template = container(env=[{"name": "MEGASCALE_NUM_SLICES", "value": "99"}])
    template["spec"]["containers"].append(
        {"name": "s", "image": "i", "env": [{"name": "TPU_WORKER_ID", "value": "7"}]}
    )
    text = errors(body(template))
    needle = "spec.template.spec.containers[].env: MEGASCALE_NUM_SLICES, TPU_WORKER_ID is set by"
    assert needle in text


def test_every_contract_variable_is_reserved():
    """A variable render adds must be refused in the template too (this list is the CRD's)."""
    job = load_job(body(checkpoint={"directory": "gs://bkt/x"}))
    names = {e["name"] for e in contract_env(plan_job(job), job.spec)}
    assert names <= set(podtemplate.RESERVED_ENV), names - set(podtemplate.RESERVED_ENV)


@pytest.mark.parametrize(
    "directory",
    ["file:///etc/passwd", "../..", "ckpt", "/a/../b", "/a\nB=1", "gs://bkt/$(HOME)", "gs://B/x"],
)
def test_checkpoint_directory_refused(directory):
    assert "spec.checkpoint.directory: must be gs://BUCKET/PATH" in errors(
        body(checkpoint={"directory": directory})
    )


@pytest.mark.parametrize("directory", ["gs://bkt", "gs://my.bucket/a/b", "/ckpt", "/a/..b/c"])
def test_checkpoint_directory_accepted(directory):
    plan_job(load_job(body(checkpoint={"directory": directory})))


# ---------------------------------------------------------------- what passes always renders

scalars = st.one_of(st.none(), st.integers(-3, 70000), st.text(max_size=4), st.booleans())
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
keys = st.sampled_from(
    ["name", "image", "env", "ports", "resources", "requests", "limits", "value", "containerPort"]
)
containers = st.dictionaries(keys, values, max_size=5).map(lambda c: {"name": "c", **c})
templates = st.fixed_dictionaries(
    {
        "spec": st.fixed_dictionaries(
            {"containers": st.lists(containers, min_size=1, max_size=2)},
            optional={
                "nodeSelector": values,
                "tolerations": values,
                "restartPolicy": values,
                "volumes": values,
            },
        )
    },
    optional={"metadata": st.dictionaries(st.sampled_from(["labels", "annotations"]), values)},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(templates)
def test_any_template_either_renders_or_is_refused_by_field(template):
    try:
        job = load_job(body(template))
        plan = plan_job(job)
    except SpecError as exc:
        assert all(e.path.startswith(("spec.", "metadata.")) for e in exc.errors), exc
        return
    render_jobset(plan, job.spec)  # never raises on a template the plan accepted


@pytest.mark.parametrize(
    ("template", "path", "hint"),
    [
        ({"spec": {"contianers": [{"name": "c", "image": "i"}]}},
         "spec.template.spec.contianers", "did you mean containers?"),
        ({"spec": {"containers": [{"name": "c", "image": "i", "imagePullPolcy": "Always"}]}},
         "spec.template.spec.containers[0].imagePullPolcy", "did you mean imagePullPolicy?"),
        ({"metdata": {}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
         "spec.template.metdata", "did you mean metadata?"),
        ({"spec": {"containers": [{"name": "c", "image": "i"}], "gpus": 1}},
         "spec.template.spec.gpus", "not a field of a pod spec"),
    ],
    ids=["containers", "container-field", "metadata", "no-close-match"],
)  # fmt: skip
def test_a_misspelt_field_is_named(template, path, hint):
    # Issue 21: `contianers` was reported as "at least one container is required".
    text = errors(body(template))
    assert f"{path}: unknown field" in text and hint in text, text
    assert "at least one container is required" not in text


def test_the_field_lists_are_kubernetes_own():
    # The JobSet v0.10.1 CRD's pod template (k8s.io/api v0.34); the Kubernetes client the
    # tests use may know newer alpha fields, never fewer.
    from kubernetes.client import V1Container, V1PodSpec, V1PodTemplateSpec

    newer = {"evictionResponders", "schedulingGroup"}  # Kubernetes 1.35 alpha fields
    assert set(V1PodSpec.attribute_map.values()) - newer == podtemplate.POD_SPEC_FIELDS
    assert set(V1Container.attribute_map.values()) == podtemplate.CONTAINER_FIELDS
    assert set(V1PodTemplateSpec.attribute_map.values()) == podtemplate.TEMPLATE_FIELDS
