"""The host ports a job's pods will hold, and the duplicates Kubernetes refuses. Pure.

TPU pods run on the host network by default (GKE's Multislice example and xpk), and the operator
adds its own ports to the TPU container (MEGASCALE_PORT, the JAX coordinator's). On the host
network every container port is a host port, so a sidecar that declares one of them (a metrics
server on 8080) makes every pod invalid: `hostPort: Duplicate value: "TCP//8080"`. The apiserver's
dry run of the JobSet cannot see it: only a Pod is defaulted that way, not a pod template, so the
Job controller's creates are refused after the whole gang was provisioned. Checked here, in the
spec validation, with the rule Kubernetes applies (kubernetes/kubernetes, v1.34):

- defaulting, pkg/apis/core/v1/defaults.go `SetDefaults_Pod`: with `hostNetwork: true`,
  `defaultHostNetworkPorts` sets each port's `hostPort` to its `containerPort` where it is 0, in
  `containers` and `initContainers` alike (`protocol` defaults to TCP);
- validation, pkg/apis/core/validation/validation.go: `validateContainers` runs
  `checkHostPortConflicts` over all regular containers together, keyed
  "protocol/hostIP/hostPort" (`AccumulateUniqueHostPorts`, `field.Duplicate` on `hostPort`);
  `validateInitContainers` checks each init container on its own ("init containers run
  one-by-one"), so an init container never conflicts with a regular one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from multislice_operator.common.errors import FieldError

MEGASCALE_PORT = 8080
JAX_COORDINATOR_PORT = 8476
# Added to the TPU container (the first) unless it declares that containerPort itself.
OPERATOR_PORTS = ((MEGASCALE_PORT, "megascale"), (JAX_COORDINATOR_PORT, "jax-coord"))
POD = "spec.template.spec"


def host_network(pod: dict[str, Any]) -> bool:
    """Whether the rendered pods run on the host network: yes unless the template says false."""
    value = pod.get("hostNetwork")
    return True if value is None else bool(value)


def _list(obj: Any, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def _ports(container: Any) -> list[Any]:
    return _list(container, "ports")


def _host_ports(
    container: Any, path: str, on_host: bool
) -> Iterator[tuple[str, str, str, int | None]]:
    """(key, field path, what, containerPort) for each port that holds a host port."""
    for j, port in enumerate(_ports(container)):
        if not isinstance(port, dict):
            continue
        host, inner = port.get("hostPort") or 0, port.get("containerPort")
        if not host and on_host:
            host = inner
        if not isinstance(host, int) or not host:
            continue
        key = f"{port.get('protocol') or 'TCP'}/{port.get('hostIP') or ''}/{host}"
        field = "hostPort" if port.get("hostPort") else "containerPort"
        yield key, f"{path}.ports[{j}].{field}", f"{path}.ports[{j}]", inner


def _operators(tpu: Any) -> list[tuple[str, str]]:
    """(key, name) of the ports the render adds to the TPU container (render/jobset.py)."""
    declared = {p.get("containerPort") for p in _ports(tpu) if isinstance(p, dict)}
    return [(f"TCP//{port}", name) for port, name in OPERATOR_PORTS if port not in declared]


def conflicts(pod: Any) -> list[FieldError]:
    """The host ports of the rendered pod that Kubernetes would refuse as duplicates."""
    if not isinstance(pod, dict):
        return []
    on_host = host_network(pod)
    containers = _list(pod, "containers")
    errors = []
    held: dict[str, str] = {}
    if on_host and containers:
        held = {
            key: f"the operator's {name} port on containers[0] (the TPU container)"
            for key, name in _operators(containers[0])
        }
    for i, c in enumerate(containers):
        for key, field, where, port in _host_ports(c, f"{POD}.containers[{i}]", on_host):
            if key in held:
                errors.append(_duplicate(field, key, held[key], port, on_host))
            else:
                held[key] = where
    inits = _list(pod, "initContainers")
    for i, c in enumerate(inits):
        own: dict[str, str] = {}
        for key, field, where, port in _host_ports(c, f"{POD}.initContainers[{i}]", on_host):
            if key in own:
                errors.append(_duplicate(field, key, own[key], port, on_host))
            else:
                own[key] = where
    return errors


def _duplicate(field: str, key: str, other: str, port: int | None, on_host: bool) -> FieldError:
    why = (
        "on the host network (the default) every container port is a host port"
        if on_host
        else "two ports of one pod may not hold the same host port"
    )
    fix = (
        f"use another port than {port}, or run off the host network ({POD}.hostNetwork: false)"
        if on_host
        else "use another hostPort"
    )
    return FieldError(
        field,
        f"host port {key} is already held by {other}: {why}, and Kubernetes refuses every pod "
        f'(hostPort: Duplicate value: "{key}"); {fix}',
    )
