"""Render a Plan into the JobSet the operator applies. The environment contract lives here only.

Pure: the same plan and spec always give the same object, so the operator can compare what it would
create with what exists, and GitOps users can review it with `multislice-operator render`.
"""

from __future__ import annotations

import copy
from typing import Any

from multislice_operator import keys
from multislice_operator.api.models import (
    MultisliceJobSpec,
)
from multislice_operator.plan import (
    REPLICATED_JOB,
    Plan,
)

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_KIND = "JobSet"

# JobSet / Job metadata the environment reads through the downward API.

MEGASCALE_PORT = 8080
JAX_COORDINATOR_PORT = 8476
FATAL_RULE = "FatalExitCode"  # JobSet rule names: alphanumerics and _,: only


def coordinator_host(name: str) -> str:
    """Slice 0, worker 0 of the JobSet: `<jobset>-slice-0-0.<subdomain>` (subdomain = name)."""
    return f"{name}-{REPLICATED_JOB}-0-0.{name}"


def worker_hostnames(name: str, hosts: int, slice_ref: str) -> str:
    return ",".join(f"{name}-{REPLICATED_JOB}-{slice_ref}-{i}.{name}" for i in range(hosts))


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def contract_env(plan: Plan, spec: MultisliceJobSpec) -> list[dict[str, Any]]:
    """The multislice environment, in an order where `$(VAR)` references are already defined."""
    name, shape, par = plan.name, plan.shape, plan.parallelism
    env: list[dict[str, Any]] = [
        {"name": "MEGASCALE_NUM_SLICES", "value": str(plan.slices)},
        {
            "name": "MEGASCALE_SLICE_ID",
            **_field(f"metadata.annotations['{keys.JOBSET_JOB_INDEX}']"),
        },
        {"name": "MEGASCALE_COORDINATOR_ADDRESS", "value": coordinator_host(name)},
        {"name": "MEGASCALE_PORT", "value": str(MEGASCALE_PORT)},
        {
            "name": "TPU_WORKER_ID",
            **_field(f"metadata.annotations['{keys.JOB_COMPLETION_INDEX}']"),
        },
        {
            "name": "TPU_WORKER_HOSTNAMES",
            "value": worker_hostnames(name, shape.hosts, "$(MEGASCALE_SLICE_ID)"),
        },
        {
            "name": "JAX_COORDINATOR_ADDRESS",
            "value": f"{coordinator_host(name)}:{JAX_COORDINATOR_PORT}",
        },
        {"name": "JAX_PROCESS_COUNT", "value": str(plan.total_hosts)},
        {"name": "MULTISLICE_JOB_NAME", "value": name},
        {"name": "MULTISLICE_ACCELERATOR", "value": shape.accelerator},
        {"name": "MULTISLICE_HOSTS_PER_SLICE", "value": str(shape.hosts)},
        {"name": "MULTISLICE_CHIPS_PER_HOST", "value": str(shape.chips_per_host)},
        {"name": "MULTISLICE_CHIPS_PER_SLICE", "value": str(shape.chips)},
        {
            "name": "MULTISLICE_RESTART_ATTEMPT",
            **_field(f"metadata.annotations['{keys.JOBSET_RESTART_ATTEMPT}']"),
        },
        {"name": "MULTISLICE_ICI_DATA", "value": str(par.ici_data)},
        {"name": "MULTISLICE_ICI_FSDP", "value": str(par.ici_fsdp)},
        {"name": "MULTISLICE_ICI_TENSOR", "value": str(par.ici_tensor)},
        {"name": "MULTISLICE_DCN_DATA", "value": str(par.dcn_data)},
        {"name": "MULTISLICE_DCN_FSDP", "value": str(par.dcn_fsdp)},
        {"name": "MULTISLICE_DCN_PIPELINE", "value": str(par.dcn_pipeline)},
        {"name": "MULTISLICE_DCN_TENSOR", "value": str(par.dcn_tensor)},
    ]
    if spec.checkpoint.directory:
        env.append({"name": "MULTISLICE_CHECKPOINT_DIR", "value": spec.checkpoint.directory})
    return env


def merge_env(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A variable the user sets wins, in our slot, so later `$(VAR)` expansions still see it."""
    by_name = {e.get("name"): e for e in theirs}
    merged = [copy.deepcopy(by_name.get(e["name"], e)) for e in ours]
    taken = {e["name"] for e in ours}
    merged += [copy.deepcopy(e) for e in theirs if e.get("name") not in taken]
    return merged


def job_labels(plan: Plan) -> dict[str, str]:
    return {keys.JOB_NAME: plan.name, keys.MANAGED_BY: keys.MANAGED_BY_VALUE}


def render_pod_template(plan: Plan, spec: MultisliceJobSpec) -> dict[str, Any]:
    template = copy.deepcopy(spec.template)
    meta = template.setdefault("metadata", {}) or {}
    template["metadata"] = meta
    meta["labels"] = {**(meta.get("labels") or {}), **job_labels(plan)}
    pod = template["spec"]
    pod["restartPolicy"] = "Never"
    # DCN traffic goes over the hosts' NICs: GKE's Multislice example JobSet and xpk run TPU pods
    # on the host network. A template that sets hostNetwork itself (false) opts out. The
    # hostnames in the environment still resolve: JobSet's headless service publishes each pod's
    # hostname.subdomain, and ClusterFirstWithHostNet keeps cluster DNS on the host network.
    if pod.get("hostNetwork") is None:
        pod["hostNetwork"] = True
    if pod["hostNetwork"] and not pod.get("dnsPolicy"):
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    selector = dict(pod.get("nodeSelector") or {})
    selector[keys.GKE_TPU_ACCELERATOR] = plan.shape.generation.gke_accelerator
    selector[keys.GKE_TPU_TOPOLOGY] = plan.shape.topology
    if plan.managed:
        # Only this job's own node pools; Existing mode relies on exclusive placement instead.
        selector[keys.JOB_KEY] = plan.job_key
    pod["nodeSelector"] = selector
    tolerations = list(pod.get("tolerations") or [])
    if not any(t.get("key") == keys.TPU_RESOURCE for t in tolerations):
        tolerations.append({"key": keys.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    pod["tolerations"] = tolerations
    containers = pod["containers"]
    tpu = containers[0]
    chips = str(plan.shape.chips_per_host)
    resources = tpu.setdefault("resources", {}) or {}
    tpu["resources"] = resources
    for kind in ("requests", "limits"):
        resources[kind] = {**(resources.get(kind) or {}), keys.TPU_RESOURCE: chips}
    ports = list(tpu.get("ports") or [])
    known = {p.get("containerPort") for p in ports}
    for port, pname in ((MEGASCALE_PORT, "megascale"), (JAX_COORDINATOR_PORT, "jax-coord")):
        if port not in known:
            ports.append({"containerPort": port, "name": pname, "protocol": "TCP"})
    tpu["ports"] = ports
    tpu["env"] = merge_env(contract_env(plan, spec), list(tpu.get("env") or []))
    return template


def render_jobset(
    plan: Plan, spec: MultisliceJobSpec, job_meta_labels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The JobSet for a plan: one replicatedJob `slice` with one Job per slice."""
    labels = job_labels(plan)
    queue = (job_meta_labels or {}).get(keys.KUEUE_QUEUE_NAME)
    if queue:
        labels[keys.KUEUE_QUEUE_NAME] = queue
        # Kueue reads the Workload's priority from the job's label (a WorkloadPriorityClass).
        priority = (job_meta_labels or {}).get(keys.KUEUE_PRIORITY_CLASS)
        if priority:
            labels[keys.KUEUE_PRIORITY_CLASS] = priority
    hosts = plan.shape.hosts
    job_spec: dict[str, Any] = {
        "parallelism": hosts,
        "completions": hosts,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": render_pod_template(plan, spec),
    }
    codes = sorted(set(spec.failure_policy.non_retryable_exit_codes))
    rules: list[dict[str, Any]] = []
    if codes:
        tpu_container = spec.template["spec"]["containers"][0]["name"]
        job_spec["podFailurePolicy"] = {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": tpu_container,
                        "operator": "In",
                        "values": codes,
                    },
                }
            ]
        }
        rules.append(
            {
                "name": FATAL_RULE,
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        )
    failure_policy: dict[str, Any] = {
        "maxRestarts": spec.failure_policy.max_restarts,
        "restartStrategy": "Recreate",
    }
    if rules:
        failure_policy["rules"] = rules
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": JOBSET_KIND,
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "labels": labels,
            "annotations": {keys.JOBSET_EXCLUSIVE_TOPOLOGY: keys.GKE_NODEPOOL},
        },
        "spec": {
            # Kueue admits suspended JobSets: a queued job starts suspended and Kueue resumes it.
            "suspend": spec.suspend or bool(queue),
            "failurePolicy": failure_policy,
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [REPLICATED_JOB]},
            "network": {"enableDNSHostnames": True, "subdomain": plan.name},
            "replicatedJobs": [
                {
                    "name": REPLICATED_JOB,
                    "replicas": plan.slices,
                    "template": {"metadata": {"labels": dict(labels)}, "spec": job_spec},
                }
            ],
        },
    }


def render_probe_job(jobset: dict[str, Any]) -> dict[str, Any]:
    """The first Job the JobSet controller makes of `jobset` (slice 0), for a server-side dry run.

    The JobSet's own schema and webhook do not judge the pod template's metadata or semantics
    (label keys and values, annotation size, duplicate container names, quantities...); the Job's
    validation does, and a Job the apiserver refuses would leave the JobSet with no pod at all.
    Named, labelled and annotated as the JobSet controller does it (jobset v0.10.1), so that the
    limits that depend on them (name and label lengths) are judged too.
    """
    name = jobset["metadata"]["name"]
    (rjob,) = jobset["spec"]["replicatedJobs"]
    job_name = f"{name}-{rjob['name']}-0"
    ours = {
        keys.JOBSET_NAME: name,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob["replicas"]),
        keys.JOBSET_JOB_INDEX: "0",
        "jobset.sigs.k8s.io/job-global-index": "0",
        keys.JOBSET_RESTART_ATTEMPT: "0",
    }
    template = copy.deepcopy(rjob["template"])
    spec = template["spec"]
    pod_meta = spec["template"].setdefault("metadata", {})
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **ours}
    pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **ours}
    if jobset["spec"].get("network", {}).get("enableDNSHostnames"):
        spec["template"]["spec"]["subdomain"] = jobset["spec"]["network"]["subdomain"]
    labels = {**(template.get("metadata") or {}).get("labels", {}), **ours}
    labels.pop(keys.KUEUE_QUEUE_NAME, None)  # a probe, not a workload for a queue to admit
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": jobset["metadata"]["namespace"],
            "labels": labels,
            "annotations": dict(ours),
        },
        "spec": spec,
    }
