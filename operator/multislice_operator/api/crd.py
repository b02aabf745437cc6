"""Generate the MultisliceJob CRD from the pydantic models (the one source of truth).

Pydantic's JSON schema is turned into a structural OpenAPI v3 schema: references inlined, titles
dropped, free-form objects marked to preserve unknown fields. CEL rules and printer columns that the
apiserver enforces are added here, next to the schema they constrain.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from multislice_operator.api import models
from multislice_operator.common import names
from multislice_operator.tpu import catalog

# Fields that shape the node pools or the JobSet: they cannot be added, changed or removed once
# the job exists (changing them means a different job). The rules sit on spec itself, where both
# the old and the new object always have a value: a transition rule on the field would not run
# when the field is absent on either side, and adding `capacity: {type: Spot}` to a job created
# without capacity would slip through.
IMMUTABLE = (
    "accelerator",
    "slices",
    "capacity",
    "parallelism",
    "template",
    "checkpoint",
    "failurePolicy",
    "managedBy",  # Kueue's rule for every managedBy: a job changes hands only by recreation
)


def _unchanged(name: str) -> dict[str, str]:
    return {
        "rule": f"has(self.{name}) == has(oldSelf.{name}) && "
        f"(!has(self.{name}) || self.{name} == oldSelf.{name})",
        "message": f"spec.{name} is immutable (it cannot be added, changed or removed); delete "
        "and recreate the job to change it",
    }


def _mode(side: str) -> str:
    default = models.DEFAULT_MODE
    return (
        f"(has({side}.provisioning) && has({side}.provisioning.mode) ? "
        f"{side}.provisioning.mode : '{default}')"
    )


SPEC_RULES: list[dict[str, str]] = [
    _unchanged("topology"),
    # provisioning also holds mutable fields: the mode is compared as it takes effect (absent
    # means Managed), so adding `provisioning: {timeoutSeconds: 600}` stays allowed.
    {
        "rule": f"{_mode('self')} == {_mode('oldSelf')}",
        "message": "spec.provisioning.mode is immutable; delete and recreate the job to change it",
    },
]


def _hosts_expr() -> str:
    """CEL for hosts per slice from spec.accelerator, generated from the catalog (the plan's
    arithmetic: single-host sizes are one VM, anything else 4-chip VMs)."""
    number = "int(self.spec.accelerator.split('-')[1])"
    expr = "1"
    for gen in reversed(list(catalog.GENERATIONS.values())):
        chips = number if gen.cores_per_chip == 1 else f"({number} / {gen.cores_per_chip})"
        singles = ", ".join(str(c) for c in gen.single_host_chips)
        hosts = f"({chips} in [{singles}] ? 1 : {chips} / {gen.multi_host_chips_per_vm})"
        expr = f"(self.spec.accelerator.startsWith('{gen.prefix}-') ? {hosts} : {expr})"
    return expr


# A CRD may constrain metadata.name (and generateName) only; JobSet's webhook needs the name to
# be a DNS-1035 label (it becomes the JobSet's subdomain and headless service).
METADATA_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "maxLength": names.DNS_LABEL_MAX,
            "pattern": names.DNS1035_RE.pattern,
            "description": "A DNS-1035 label (JobSet names pods and a headless service after "
            "it): short enough for the longest pod name of this job's slices and hosts.",
        }
    },
}


def root_rules() -> list[dict[str, str]]:
    """The metadata.name length JobSet's webhook enforces for this job's slices and hosts,
    checked at admission instead of at the JobSet create (plan._check_name: the same rule for
    `validate` and the operator)."""
    hosts = _hosts_expr()
    fixed = len(names.longest_pod_name("", 1, 1)) - 2  # "-slice--" and "-abcde"
    digits = "(size(string(self.spec.slices - 1)) + size(string(" + hosts + " - 1)))"
    parsable = "self.spec.accelerator.matches('^[a-z0-9]+-[0-9]{1,6}$')"
    room = f"({names.DNS_LABEL_MAX} - {fixed} - {digits})"
    return [
        {
            "rule": f"!has(self.spec) || !has(self.spec.slices) || !{parsable} || "
            f"size(self.metadata.name) <= {room}",
            "message": "metadata.name is too long for this job's slices and hosts: JobSet pod "
            "names (NAME-slice-SLICE-HOST-xxxxx) must fit a DNS label of "
            f"{names.DNS_LABEL_MAX} characters; `multislice-operator validate` prints the longest "
            "name allowed",
        },
    ]


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Accelerator", "type": "string", "jsonPath": ".spec.accelerator"},
    {"name": "Slices", "type": "integer", "jsonPath": ".spec.slices"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.readySlices"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Chips", "type": "integer", "jsonPath": ".status.totalChips", "priority": 1},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].split("/")[-1]])
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return _resolve({**target, **extra}, defs)
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """Make one schema node structural: single type, no titles, no nulls."""
    node = dict(node)
    node.pop("title", None)
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) == 1:
            node = {**options[0], **node}
        node.pop("title", None)
    if node.get("default", 0) is None:
        node.pop("default")
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node.pop("allOf")[0], **node}
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if node.get("type") == "object" or "properties" in node:
        node["type"] = "object"
        props = node.get("properties")
        additional = node.pop("additionalProperties", None)
        if props:
            node["properties"] = {k: _structural(v) for k, v in props.items()}
        elif isinstance(additional, dict) and additional:
            node["additionalProperties"] = _structural(additional)
        else:
            node["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        node["items"] = _structural(node["items"])
    return node


def _schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(_resolve(raw, defs))


def spec_schema() -> dict[str, Any]:
    schema = _schema_of(models.MultisliceJobSpec)
    for rule in models.spec_rules():  # stated once, with their Python twin
        if not rule.cel:  # enforced by a rule inside its own schema (the pod template's)
            continue
        node = schema
        for part in rule.path:
            node = node["properties"][part]
        validation = {"rule": rule.cel, "message": rule.message}
        if rule.message_expression:
            validation["messageExpression"] = rule.message_expression
        node.setdefault("x-kubernetes-validations", []).append(validation)
    schema["x-kubernetes-validations"] = [
        *SPEC_RULES[:1],
        *(_unchanged(name) for name in IMMUTABLE),
        *SPEC_RULES[1:],
        *schema.get("x-kubernetes-validations", []),  # the model's rules on spec itself
    ]
    return schema


def status_schema() -> dict[str, Any]:
    return _schema_of(models.MultisliceJobStatus)


def generate_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{models.PLURAL}.{models.GROUP}"},
        "spec": {
            "group": models.GROUP,
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": list(models.SHORT_NAMES),
                "categories": ["all", "multislice"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "MultisliceJob runs one training program over several "
                            "identical Cloud TPU slices, provisioned all together or not at all, "
                            "restarting every slice from the last checkpoint when one fails.",
                            "required": ["spec"],
                            "x-kubernetes-validations": root_rules(),
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": METADATA_SCHEMA,
                                "spec": spec_schema(),
                                "status": status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }
