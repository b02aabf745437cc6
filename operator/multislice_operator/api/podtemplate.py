"""The pod template's schema: the fields the operator reads or merges into, typed as Kubernetes
types them; everything else is kept as written (x-kubernetes-preserve-unknown-fields).

One schema, enforced twice: the apiserver checks it at admission (it is the `spec.template` node
of the CRD, with the CEL rule that refuses contract variables), and :func:`check` applies the same
types in Python, so the plan refuses what the renderer could not merge into even where an older
CRD is installed. The whole template is then checked by the apiserver and the JobSet webhook
themselves, by a server-side dry run, before any node pool exists (controller/admission.py).

Array limits (containers, env) keep the CEL rule within the apiserver's cost budget; they are far
above what a TPU pod uses.
"""

from __future__ import annotations

import re
from typing import Any

from multislice_operator.common.errors import FieldError

# Set by the operator in the TPU container (render.contract_env): a user value would silently
# replace the operator's (a stale MEGASCALE_NUM_SLICES hangs jax.distributed.initialize), so they
# are refused in every container. tests/unit/test_env_contract.py keeps this list complete.
RESERVED_ENV = (
    "MEGASCALE_NUM_SLICES",
    "MEGASCALE_SLICE_ID",
    "MEGASCALE_COORDINATOR_ADDRESS",
    "MEGASCALE_PORT",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "JAX_COORDINATOR_ADDRESS",
    "JAX_PROCESS_COUNT",
    "MULTISLICE_JOB_NAME",
    "MULTISLICE_ACCELERATOR",
    "MULTISLICE_HOSTS_PER_SLICE",
    "MULTISLICE_CHIPS_PER_HOST",
    "MULTISLICE_CHIPS_PER_SLICE",
    "MULTISLICE_RESTART_ATTEMPT",
    "MULTISLICE_ICI_DATA",
    "MULTISLICE_ICI_FSDP",
    "MULTISLICE_ICI_TENSOR",
    "MULTISLICE_DCN_DATA",
    "MULTISLICE_DCN_FSDP",
    "MULTISLICE_DCN_PIPELINE",
    "MULTISLICE_DCN_TENSOR",
    "MULTISLICE_CHECKPOINT_DIR",
    "MULTISLICE_PODINFO_DIR",
    "MULTISLICE_POD_NAME",
    "MULTISLICE_POD_NAMESPACE",
)
RESERVED_ENV_MESSAGE = (
    "is set by the operator (the multislice environment contract, docs/environment.md); "
    "remove it from the template"
)
MAX_CONTAINERS = 64
MAX_ENV = 1024
MAX_ENV_NAME = 256

_PRESERVE = "x-kubernetes-preserve-unknown-fields"


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", _PRESERVE: True, "properties": props, **extra}


def _map(values: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": values}


_STRING: dict[str, Any] = {"type": "string"}
# resource.Quantity as Kubernetes' own CRDs spell it (controller-gen): "lots" is refused here.
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY: dict[str, Any] = {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}


def _reserved_rule() -> dict[str, str]:
    names = ", ".join(f"'{n}'" for n in RESERVED_ENV)
    return {
        "rule": f"!has(self.name) || !(self.name in [{names}])",
        "messageExpression": f"self.name + ' {RESERVED_ENV_MESSAGE}'",
    }


def schema() -> dict[str, Any]:
    """The structural schema of spec.template (a PodTemplateSpec, partly typed)."""
    env_var = _obj(
        {"name": {"type": "string", "maxLength": MAX_ENV_NAME}, "value": _STRING},
        **{"x-kubernetes-validations": [_reserved_rule()]},
    )
    container = _obj(
        {
            "name": _STRING,
            "image": _STRING,
            "env": {"type": "array", "maxItems": MAX_ENV, "items": env_var},
            "ports": {
                "type": "array",
                "items": _obj(
                    {"containerPort": {"type": "integer"}, "name": _STRING, "protocol": _STRING}
                ),
            },
            "resources": _obj({"requests": _map(_QUANTITY), "limits": _map(_QUANTITY)}),
        }
    )
    toleration = _obj(
        {
            "key": _STRING,
            "operator": _STRING,
            "value": _STRING,
            "effect": _STRING,
            "tolerationSeconds": {"type": "integer"},
        }
    )
    return _obj(
        {
            "metadata": _obj({"labels": _map(_STRING), "annotations": _map(_STRING)}),
            "spec": _obj(
                {
                    "containers": {
                        "type": "array",
                        "maxItems": MAX_CONTAINERS,
                        "items": container,
                    },
                    "nodeSelector": _map(_STRING),
                    "hostNetwork": {"type": "boolean"},
                    "dnsPolicy": _STRING,
                    "tolerations": {"type": "array", "items": toleration},
                    "restartPolicy": _STRING,
                }
            ),
        }
    )


# ---------------------------------------------------------------- the same schema, in Python

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
}


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    for name, types in _JSON_TYPES.items():
        if isinstance(value, types):
            return name
    return "number" if isinstance(value, float) else "null" if value is None else "unknown"


def _int_or_string(node: dict[str, Any], value: Any, path: str, out: list[FieldError]) -> None:
    if _type_name(value) not in ("integer", "string"):
        out.append(FieldError(path, f"must be an integer or a string, got {_type_name(value)}"))
    elif isinstance(value, str) and "pattern" in node and not re.match(node["pattern"], value):
        out.append(FieldError(path, f"{value!r} is not a quantity (e.g. 4, 500m, 16Gi)"))


def _walk_array(node: dict[str, Any], value: list[Any], path: str, out: list[FieldError]) -> None:
    if len(value) > node.get("maxItems", len(value)):
        out.append(FieldError(path, f"must have at most {node['maxItems']} items"))
    for i, item in enumerate(value):
        _walk(node["items"], item, f"{path}[{i}]", out)


def _walk_object(node: dict[str, Any], value: dict[str, Any], path: str,
                 out: list[FieldError]) -> None:  # fmt: skip
    for key, child in (node.get("properties") or {}).items():
        if key in value and value[key] is not None:
            _walk(child, value[key], f"{path}.{key}", out)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        for key, item in value.items():
            _walk(extra, item, f"{path}.{key}", out)


def _walk(node: dict[str, Any], value: Any, path: str, out: list[FieldError]) -> None:
    if node.get("x-kubernetes-int-or-string"):
        _int_or_string(node, value, path, out)
        return
    want = node.get("type")
    if want is not None and _type_name(value) != want:
        out.append(FieldError(path, f"must be of type {want}, got {_type_name(value)}"))
        return
    if want == "string" and len(value) > node.get("maxLength", len(value)):
        out.append(FieldError(path, f"may not be longer than {node['maxLength']} characters"))
    if want == "array":
        _walk_array(node, value, path, out)
    if want == "object":
        _walk_object(node, value, path, out)


def check(template: Any, path: str = "spec.template") -> list[FieldError]:
    """Every place `template` breaks the schema above, by field path."""
    out: list[FieldError] = []
    _walk(schema(), template, path, out)
    return out


def reserved_env(template: Any) -> list[str]:
    """Contract variables the template sets itself, in any container (a well-typed template)."""
    pod = (template or {}).get("spec") if isinstance(template, dict) else None
    containers = pod.get("containers") if isinstance(pod, dict) else None
    found: list[str] = []
    for c in containers if isinstance(containers, list) else []:
        env = c.get("env") if isinstance(c, dict) else None
        for e in env if isinstance(env, list) else []:
            name = e.get("name") if isinstance(e, dict) else None
            if name in RESERVED_ENV and name not in found:
                found.append(name)
    return found


# ---------------------------------------------------------------- field names (typos)

# The fields of a PodTemplateSpec, PodSpec and Container as the JobSet v0.10.1 CRD types them
# (config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml: k8s.io/api v0.34). A name outside
# these is a typo to the JobSet: its structural schema would prune it (or, with
# fieldValidation=Strict, refuse it), so `contianers` would read as "no containers".
# tests/unit/test_template_rules.py compares them with the Kubernetes client's models.
TEMPLATE_FIELDS = frozenset({"metadata", "spec"})
POD_SPEC_FIELDS = frozenset(
    {
        "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "containers",
        "dnsConfig", "dnsPolicy", "enableServiceLinks", "ephemeralContainers", "hostAliases",
        "hostIPC", "hostNetwork", "hostPID", "hostUsers", "hostname", "hostnameOverride",
        "imagePullSecrets", "initContainers", "nodeName", "nodeSelector", "os", "overhead",
        "preemptionPolicy", "priority", "priorityClassName", "readinessGates", "resourceClaims",
        "resources", "restartPolicy", "runtimeClassName", "schedulerName", "schedulingGates",
        "securityContext", "serviceAccount", "serviceAccountName", "setHostnameAsFQDN",
        "shareProcessNamespace", "subdomain", "terminationGracePeriodSeconds", "tolerations",
        "topologySpreadConstraints", "volumes",
    }
)  # fmt: skip
CONTAINER_FIELDS = frozenset(
    {
        "args", "command", "env", "envFrom", "image", "imagePullPolicy", "lifecycle",
        "livenessProbe", "name", "ports", "readinessProbe", "resizePolicy", "resources",
        "restartPolicy", "restartPolicyRules", "securityContext", "startupProbe", "stdin",
        "stdinOnce", "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices",
        "volumeMounts", "workingDir",
    }
)  # fmt: skip


def _unknown(obj: Any, known: frozenset[str], path: str, what: str) -> list[FieldError]:
    import difflib

    out = []
    for key in obj if isinstance(obj, dict) else ():
        if key in known:
            continue
        close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else ""
        out.append(FieldError(f"{path}.{key}", f"unknown field: not a field of a {what}{hint}"))
    return out


def unknown_fields(template: Any, path: str = "spec.template") -> list[FieldError]:
    """Every field of the template, its pod spec and its containers that Kubernetes does not
    have, by path, with the closest real name (``contianers``: did you mean containers?)."""
    if not isinstance(template, dict):
        return []
    out = _unknown(template, TEMPLATE_FIELDS, path, "pod template (metadata, spec)")
    pod = template.get("spec")
    out += _unknown(pod, POD_SPEC_FIELDS, f"{path}.spec", "pod spec")
    for kind in ("containers", "initContainers"):
        items = pod.get(kind) if isinstance(pod, dict) else None
        for i, c in enumerate(items if isinstance(items, list) else []):
            out += _unknown(c, CONTAINER_FIELDS, f"{path}.spec.{kind}[{i}]", "container")
    return out
