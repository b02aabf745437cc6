"""api/kubeschema.json: Kubernetes' pod template schema shipped with the CLI (issue 45).

Stale against its pin: the version it was generated from must be hack/tools/kube/go.mod's (a
fresh generation from that module's OpenAPI is compared in
tests/integration/test_kubeschema_source.py). Read right: every type and field agrees with the
`kubernetes` client's typed models (a newer Kubernetes: it may know more fields, never fewer)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml

from multislice_operator.api import kubeschema

ROOT = Path(__file__).resolve().parents[2]
GOMOD = ROOT / "hack" / "tools" / "kube" / "go.mod"


def test_the_shipped_schema_is_of_the_pinned_kubernetes():
    assert kubeschema.source_version() == kubeschema.gomod_version(str(GOMOD)), (
        "run make kube-schema"
    )


def test_the_shipped_schema_is_package_data():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f"api/{kubeschema.DATA_FILE}" in pyproject


def _client_class(name: str) -> Any:
    for prefix in ("V1", "CoreV1"):
        if hasattr(kubernetes.client, prefix + name):
            return getattr(kubernetes.client, prefix + name)
    raise AssertionError(f"the kubernetes client has no model {name}")


def _client_type(kind: Any) -> set[str]:
    """The client's spellings of a shipped type."""
    if isinstance(kind, dict):
        if "ref" in kind:
            return {f"V1{kind['ref']}", f"CoreV1{kind['ref']}"}
        if "array" in kind:
            return {f"List[{t}]" for t in _client_type(kind["array"])}
        return {f"Dict[str, {t}]" for t in _client_type(kind["map"])}
    return {
        "string": {"str", "datetime"},  # metav1.Time is a date-time string
        "int32": {"int"},
        "int64": {"int"},
        "boolean": {"bool"},
        "number": {"float"},
        "object": {"object"},
        "quantity": {"str"},
        "int-or-string": {"object"},
    }[kind]


def test_every_type_and_field_is_the_kubernetes_clients():
    types = kubeschema.load()["types"]
    assert len(types) > 100 and {"PodSpec", "Container", "Probe", "Volume"} <= set(types)
    for name, spec in types.items():
        model = _client_class(name)
        by_json = {v: model.openapi_types[k] for k, v in model.attribute_map.items()}
        for field, kind in spec["properties"].items():
            assert field in by_json, f"{name}.{field}"
            assert by_json[field] in _client_type(kind), (name, field, kind, by_json[field])
        assert set(spec["required"]) <= set(spec["properties"]), name


def test_generation_reads_refs_arrays_maps_and_special_types():
    ref = "#/components/schemas/"
    openapi = {
        "components": {
            "schemas": {
                "io.k8s.api.core.v1.PodTemplateSpec": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {
                        "spec": {"allOf": [{"$ref": ref + "io.k8s.api.core.v1.Thing"}]},
                        "when": {"$ref": ref + "io.k8s.apimachinery.pkg.apis.meta.v1.Time"},
                    },
                },
                "io.k8s.api.core.v1.Thing": {
                    "type": "object",
                    "properties": {
                        "n": {"type": "integer", "format": "int32"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "limits": {
                            "type": "object",
                            "additionalProperties": {
                                "$ref": ref + "io.k8s.apimachinery.pkg.api.resource.Quantity"
                            },
                        },
                        "port": {
                            "allOf": [
                                {"$ref": ref + "io.k8s.apimachinery.pkg.util.intstr.IntOrString"}
                            ]
                        },
                    },
                },
                "io.k8s.apimachinery.pkg.apis.meta.v1.Time": {"type": "string"},
            }
        }
    }
    assert kubeschema.generate(openapi, "v1.0.0")["types"] == {
        "PodTemplateSpec": {
            "properties": {"spec": {"ref": "Thing"}, "when": "string"},
            "required": ["spec"],
        },
        "Thing": {
            "properties": {
                "limits": {"map": "quantity"},
                "n": "int32",
                "port": "int-or-string",
                "tags": {"array": "string"},
            },
            "required": [],
        },
    }


def test_every_example_template_is_valid():
    for path in sorted(ROOT.glob("examples/**/*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("kind") == "MultisliceJob":
                assert kubeschema.check(doc["spec"]["template"]) == [], path


@pytest.mark.parametrize(
    ("template", "path", "words"),
    [
        ({"spec": {"containers": [{"name": "a", "ports": [{}]}]}},
         "spec.template.spec.containers[0].ports[0].containerPort", "required"),
        ({"spec": {"containers": [{"name": "a", "resources": {"limits": {"cpu": 0.5}}}]}},
         "spec.template.spec.containers[0].resources.limits.cpu", "as a string"),
        ({"spec": {"priority": 2**40}}, "spec.template.spec.priority", "out of range"),
        ({"spec": {"hostNetwork": "yes"}}, "spec.template.spec.hostNetwork", "a boolean"),
        ({"metadata": {"labelz": {}}}, "spec.template.metadata.labelz", "did you mean labels?"),
    ],
)  # fmt: skip
def test_each_kind_of_mistake_is_named_with_its_path(template, path, words):
    found = {e.path: e.message for e in kubeschema.check(template)}
    assert path in found and words in found[path], found


def test_a_long_list_of_one_mistake_is_said_a_bounded_number_of_times():
    template = {"spec": {"containers": [{"name": "a", "args": [1] * 10_000}]}}
    assert len(kubeschema.check(template)) == 50
    assert re.search(r"args\[49\]", str(kubeschema.check(template)[-1]))
