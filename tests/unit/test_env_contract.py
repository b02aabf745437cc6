"""The environment contract, owned by one test: what render() puts in the pod template, resolved
for every pod the way the kubelet resolves it, is exactly what the workload reads and accepts.

The kubelet's rules: `valueFrom.fieldRef` reads the pod's own metadata (JobSet and the Job
controller set the annotations read here), and `$(VAR)` expands a variable defined earlier in the
same list (facts.md section 4). The pod annotations are the ones JobSet and the Job controller set.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from multislice_operator.common import keys
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.render.jobset import render_jobset
from multislice_workload import env as contract

FIELD = re.compile(r"^metadata\.annotations\['([^']+)'\]$")
REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def job(name: str, accelerator: str, slices: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": name, "namespace": "team"},
        "spec": {
            "accelerator": accelerator,
            "slices": slices,
            "template": {"spec": {"containers": [{"name": "train", "image": "w"}]}},
            **spec,
        },
    }


def pod_env(
    env: list[dict[str, Any]], annotations: dict[str, str], pod: dict[str, str]
) -> dict[str, str]:
    """The container's environment as the kubelet resolves it."""
    out: dict[str, str] = {}
    for var in env:
        if "valueFrom" in var:
            path = var["valueFrom"]["fieldRef"]["fieldPath"]
            match = FIELD.match(path)
            value = annotations[match.group(1)] if match else pod[path]
        else:
            value = REF.sub(lambda m: out.get(m.group(1), m.group(0)), var["value"])
        out[var["name"]] = value
    return out


@pytest.mark.parametrize(
    ("accelerator", "slices", "spec"),
    [
        ("v5litepod-16", 2, {"checkpoint": {"directory": "gs://bkt/run"}}),
        ("v4-16", 4, {"parallelism": {"ici": {"fsdp": 8}, "dcn": {"data": 2, "fsdp": 2}}}),
        ("v5p-32", 3, {"provisioning": {"mode": "Existing"}}),
    ],
)
def test_every_pod_reads_a_consistent_contract(
    accelerator: str, slices: int, spec: dict[str, Any]
) -> None:
    obj = load_job(job("llm", accelerator, slices, **spec))
    plan = plan_job(obj)
    jobset = render_jobset(plan, obj.spec, obj.metadata.labels)
    (rjob,) = jobset["spec"]["replicatedJobs"]
    hosts = rjob["template"]["spec"]["parallelism"]
    container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
    subdomain = jobset["spec"]["network"]["subdomain"]
    rendered = {v["name"] for v in container["env"]}
    seen_ids = []
    for slice_id in range(rjob["replicas"]):
        for worker in range(hosts):
            annotations = {
                keys.JOBSET_JOB_INDEX: str(slice_id),
                keys.JOB_COMPLETION_INDEX: str(worker),
                keys.JOBSET_RESTART_ATTEMPT: "0",
            }
            pod_name = f"{jobset['metadata']['name']}-{rjob['name']}-{slice_id}-{worker}"
            pod = {"metadata.name": f"{pod_name}-abcde", "metadata.namespace": "team"}
            environ = pod_env(container["env"], annotations, pod)
            got = contract.from_environ(environ)
            seen_ids.append(got.process_id)
            assert got.num_slices == plan.slices and got.slice_id == slice_id
            assert got.hosts_per_slice == plan.shape.hosts and got.worker_id == worker
            assert got.chips_per_host == plan.shape.chips_per_host
            # Hostnames are the pods' own DNS names under the JobSet's headless service.
            assert got.worker_hostnames[worker] == f"{pod_name}.{subdomain}"
            assert (
                got.megascale_coordinator == f"{jobset['metadata']['name']}-slice-0-0.{subdomain}"
            )
            assert got.jax_coordinator.split(":")[0] == got.megascale_coordinator
            assert got.checkpoint_dir == (obj.spec.checkpoint.directory or None)
    assert sorted(seen_ids) == list(range(plan.total_hosts))
    required = set(contract.REQUIRED_VARIABLES) | {contract.RESTART_ATTEMPT}
    assert required <= rendered, f"the workload needs {sorted(required - rendered)} unrendered"
    ours = {n for n in rendered if n.startswith(("MEGASCALE_", "TPU_", "JAX_", "MULTISLICE_"))}
    unknown = ours - set(contract.CONTRACT_VARIABLES)
    assert not unknown, f"render() sets {sorted(unknown)} that the workload never reads"
    assert not ours & set(contract.FAULT_VARIABLES)  # test hooks are never rendered
