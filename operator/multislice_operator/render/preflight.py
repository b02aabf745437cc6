"""The compile Job of spec.preflight: the job's own image and environment, on a CPU, before any
TPU exists (reconcile/preflight.py decides when it runs).

The command compiles the program ahead of time for the job's TPU topology (JAX compiles for a
TPU topology on a CPU-only machine with libtpu: `jax.experimental.topologies.get_topology_desc`;
MaxText's `train_compile.py` does the same with `compile_topology`). What it says comes back as
its container's termination message: the command writes its JSON result to /dev/termination-log
(the kubelet's default terminationMessagePath), and with terminationMessagePolicy
FallbackToLogsOnError a command that fails without writing one leaves the tail of its log there
instead (kubelet: getTerminationMessage in pkg/kubelet/kuberuntime/kuberuntime_container.go, at
most 80 lines / 2048 bytes: pkg/kubelet/container/runtime.go). The policy alone never reads a
successful command's log, hence the file.
The pod's status carries it; no pods/log read, no sidecar. A successful command that writes
nothing (another program's compile) passes without figures.
"""

from __future__ import annotations

import copy
from typing import Any

from multislice_operator.api.models import MultisliceJobSpec
from multislice_operator.common import keys
from multislice_operator.common.names import preflight_job
from multislice_operator.planning.plan import Plan
from multislice_operator.render.jobset import (
    TERMINATION_MESSAGE_POLICY,
    contract_env,
    job_labels,
    merge_env,
)

WORKLOAD_COMMAND = "multislice_workload"  # the workload image's entry point (workload/Dockerfile)
TRAIN = "train"  # the workload's train subcommand: its flags are the compile command's too
GENERATION_LABEL = f"{keys.PREFIX}/preflight-generation"  # the spec generation it compiles
# The shape it compiles when the job has several (provisioning.mode Fallback): a shape's name,
# "" for the job's own (Plan.shape_key).
SHAPE_LABEL = f"{keys.PREFIX}/preflight-shape"
CONTAINER = "compile"


def topology_name(plan: Plan) -> str:
    """The topology as JAX's get_topology_desc names it: `<generation>:<topology>`."""
    return f"{plan.shape.generation.name}:{plan.shape.topology}"


def default_command(plan: Plan, spec: MultisliceJobSpec) -> list[str]:
    """The workload's own compile command for the job's TPUs, with the flags it trains with."""
    tpu = _tpu_container(spec)
    args = [str(a) for a in tpu.get("args") or []]
    if args[:1] == [TRAIN]:
        args = args[1:]
    return [WORKLOAD_COMMAND, "compile", "--topology", topology_name(plan),
            "--slices", str(plan.slices), "--json", *args]  # fmt: skip


def command(plan: Plan, spec: MultisliceJobSpec) -> list[str]:
    assert spec.preflight is not None
    return list(spec.preflight.command or default_command(plan, spec))


def _tpu_container(spec: MultisliceJobSpec) -> dict[str, Any]:
    containers = (spec.template.get("spec") or {}).get("containers") or [{}]
    first: dict[str, Any] = containers[0]
    return first


def render_preflight_job(
    plan: Plan, spec: MultisliceJobSpec, generation: int, owner: dict[str, Any]
) -> dict[str, Any]:
    """A batch/v1 Job, one pod, no retry, no TPU: the first container's image, env and mounts,
    the multislice environment as the job's pods get it, and the compile command."""
    assert spec.preflight is not None
    pre = spec.preflight
    pod_spec = copy.deepcopy(spec.template.get("spec") or {})
    tpu = _tpu_container(spec)
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": tpu.get("image"),
        "command": command(plan, spec),
        # The job's environment (its own variables win, as in its pods); downward-API fields of
        # JobSet's annotations (slice and worker index) read as empty here: the compile is for
        # every slice at once.
        "env": merge_env(contract_env(plan, spec), copy.deepcopy(tpu.get("env") or [])),
        "resources": {
            "requests": {"cpu": pre.cpu, "memory": pre.memory},
            "limits": {"memory": pre.memory},
        },
        "terminationMessagePolicy": TERMINATION_MESSAGE_POLICY,
    }
    for key in ("envFrom", "volumeMounts", "workingDir", "imagePullPolicy", "securityContext"):
        if tpu.get(key):
            container[key] = copy.deepcopy(tpu[key])
    labels = {**job_labels(plan), GENERATION_LABEL: str(generation)}
    if plan.shape_key is not None:
        labels[SHAPE_LABEL] = plan.shape_key
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
    }
    # What the pod needs to start like the job's (its service account, pull secrets, volumes);
    # never its TPU placement (node selector, tolerations, host network).
    for key in ("serviceAccountName", "imagePullSecrets", "volumes", "securityContext"):
        if pod_spec.get(key):
            pod[key] = pod_spec[key]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": preflight_job(plan.name),
            "namespace": plan.namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "backoffLimit": 0,  # a compile is deterministic: a failure is the answer
            "activeDeadlineSeconds": pre.timeout_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
