"""Render a Plan into the JobSet the operator applies. The environment contract lives here only.

Pure: the same plan and spec always give the same object, so the operator can compare what it would
create with what exists, and GitOps users can review it with `multislice-operator render`.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from multislice_operator.api.models import (
    ExitCodePolicy,
    MultisliceJobSpec,
)
from multislice_operator.common import keys
from multislice_operator.common.names import REPLICATED_JOB
from multislice_operator.planning.hostports import (
    JAX_COORDINATOR_PORT,
    MEGASCALE_PORT,
    OPERATOR_PORTS,
    host_network,
)
from multislice_operator.planning.plan import Plan
from multislice_operator.registry import REGISTRY
from multislice_operator.render import podgroup

if TYPE_CHECKING:
    from multislice_operator.settings import Settings

# What the JobSet carries out itself when a slice fails: JobSet's default deletes and creates
# every slice's Job. Any other restartStrategy is a registered strategy's (registry.py), which
# renders its half of the Job too (in-place restart: render/inplace.py).
DEFAULT_RESTART_STRATEGY = "Recreate"

JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
JOBSET_KIND = "JobSet"

# JobSet / Job metadata the environment reads through the downward API.

FATAL_RULE = "FatalExitCode"  # JobSet rule names: alphanumerics and _,: only
DISRUPTION_RULE = "Disruption"
DISRUPTION_CONDITION = "DisruptionTarget"  # the pod condition of preemption, eviction, shutdown
# The Job's podFailurePolicy rules, by index: the Job controller names the index in its Failed
# condition's message, which is how the JobSet's rules tell a disruption from a fatal exit
# (k8s pkg/controller/job/pod_failure_policy.go: "Pod NS/NAME has condition DisruptionTarget
# matching FailJob rule at index 0", "Container C for pod NS/NAME failed with exit code N
# matching FailJob rule at index 1").
DISRUPTION_POD_RULE, FATAL_POD_RULE = 0, 1
JOB_FAILURE_REASON = "PodFailurePolicy"  # the Job's Failed reason when a FailJob rule matched
DISRUPTION_MESSAGE = (
    f"^Pod .* has condition {DISRUPTION_CONDITION} matching FailJob rule at index "
    f"{DISRUPTION_POD_RULE}$"
)
FATAL_MESSAGE = (
    f"^Container .* failed with exit code [0-9]+ matching FailJob rule at index {FATAL_POD_RULE}$"
)
# Checkpoint on demand (docs/environment.md section 3): the pod's own annotations, mounted.
PODINFO_VOLUME = "multislice-podinfo"
PODINFO_DIR = "/etc/multislice/podinfo"
PODINFO_FILE = "annotations"
TERMINATION_MESSAGE_POLICY = "FallbackToLogsOnError"


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
        {"name": "MULTISLICE_POD_NAME", **_field("metadata.name")},
        {"name": "MULTISLICE_POD_NAMESPACE", **_field("metadata.namespace")},
        {"name": "MULTISLICE_PODINFO_DIR", "value": PODINFO_DIR},
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
    """A variable the user sets wins, in our slot, so later `$(VAR)` expansions still see it.
    The result shares the entries of both lists: the caller's, fresh (render_pod_template has
    already deep-copied the template, and contract_env builds new entries)."""
    by_name = {e.get("name"): e for e in theirs}
    merged = [by_name.get(e["name"], e) for e in ours]
    taken = {e["name"] for e in ours}
    merged += [e for e in theirs if e.get("name") not in taken]
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
    pod["hostNetwork"] = host_network(pod)
    if pod["hostNetwork"] and not pod.get("dnsPolicy"):
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    selector = dict(pod.get("nodeSelector") or {})
    selector[keys.GKE_TPU_ACCELERATOR] = plan.shape.generation.gke_accelerator
    selector[keys.GKE_TPU_TOPOLOGY] = plan.shape.topology
    selector.update(plan.node_selector)  # what else the job's pools carry (a fallback option's)
    pod["nodeSelector"] = selector
    place = REGISTRY.model(plan.mode).place
    if place is not None:  # the capacity model's part: which nodes are the job's
        place(template, plan)
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
    for port, pname in OPERATOR_PORTS:
        if port not in known:
            ports.append({"containerPort": port, "name": pname, "protocol": "TCP"})
    tpu["ports"] = ports
    tpu["env"] = merge_env(contract_env(plan, spec), list(tpu.get("env") or []))
    # The workload's JSON termination message; its logs when it wrote none (a crash).
    tpu.setdefault("terminationMessagePolicy", TERMINATION_MESSAGE_POLICY)
    _mount_podinfo(pod, tpu)
    return template


def exclusive_topology(plan: Plan) -> str:
    """The node label JobSet places each slice's Job exclusively on: its node pool, unless the
    capacity model says otherwise (dynamic slicing: its Slice, GKE's JobSet example)."""
    return REGISTRY.model(plan.mode).exclusive_topology or keys.GKE_NODEPOOL


def _mount_podinfo(pod: dict[str, Any], tpu: dict[str, Any]) -> None:
    """The pod's annotations as a file (downward API): how a checkpoint request reaches the
    workload. The kubelet refreshes it within about a minute of a change."""
    volumes = list(pod.get("volumes") or [])
    if not any(v.get("name") == PODINFO_VOLUME for v in volumes):
        volumes.append(
            {
                "name": PODINFO_VOLUME,
                "downwardAPI": {
                    "items": [
                        {"path": PODINFO_FILE, "fieldRef": {"fieldPath": "metadata.annotations"}}
                    ]
                },
            }
        )
    pod["volumes"] = volumes
    mounts = list(tpu.get("volumeMounts") or [])
    if not any(
        m.get("name") == PODINFO_VOLUME or m.get("mountPath") == PODINFO_DIR for m in mounts
    ):
        mounts.append({"name": PODINFO_VOLUME, "mountPath": PODINFO_DIR, "readOnly": True})
    tpu["volumeMounts"] = mounts


def pod_failure_policy(spec: MultisliceJobSpec) -> dict[str, Any]:
    """The Job's rules: a pod with the DisruptionTarget condition fails its Job at once (index
    0), whatever it exited with; a fatal exit code of the TPU container fails it too (index 1).
    Any other failure fails the Job through backoffLimit 0 (reason BackoffLimitExceeded)."""
    fp = spec.failure_policy
    container = spec.template["spec"]["containers"][0]["name"]
    rules: list[dict[str, Any]] = [
        {
            "action": "FailJob",
            "onPodConditions": [{"type": DISRUPTION_CONDITION, "status": "True"}],
        }
    ]
    if fp.exit_code_policy == ExitCodePolicy.RESTART_IF_LISTED:
        fatal = {"containerName": container, "operator": "NotIn", "values": fp.restart_codes()}
        rules.append({"action": "FailJob", "onExitCodes": fatal})
    else:
        codes = sorted(set(fp.non_retryable_exit_codes))
        if codes:
            fatal = {"containerName": container, "operator": "In", "values": codes}
            rules.append({"action": "FailJob", "onExitCodes": fatal})
    return {"rules": rules}


def jobset_failure_rules(pod_policy: dict[str, Any]) -> list[dict[str, Any]]:
    """A disruption restarts every slice without charging maxRestarts; a fatal exit fails the
    JobSet; anything else gets JobSet's default (RestartJobSet, charged). The JobSet runs the
    first rule that any failed Job matches: a disruption wins over a fatal exit seen at once."""
    rules = [
        {
            "name": DISRUPTION_RULE,
            "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": [JOB_FAILURE_REASON],
            "onJobFailureMessagePatterns": [DISRUPTION_MESSAGE],
        }
    ]
    if len(pod_policy["rules"]) > FATAL_POD_RULE:
        rules.append(
            {
                "name": FATAL_RULE,
                "action": "FailJobSet",
                "onJobFailureReasons": [JOB_FAILURE_REASON],
                "onJobFailureMessagePatterns": [FATAL_MESSAGE],
            }
        )
    return rules


def render_jobset(
    plan: Plan,
    spec: MultisliceJobSpec,
    job_meta_labels: dict[str, str] | None = None,
    restarts_before: int = 0,
    counted_before: int = 0,
    restart_strategy: str = DEFAULT_RESTART_STRATEGY,
    settings: Settings | None = None,
    gang: bool = False,
) -> dict[str, Any]:
    """The JobSet for a plan: one replicatedJob `slice` with one Job per slice.

    `restarts_before`/`counted_before`: a JobSet recreated on another slice count (spec.elastic)
    continues the job's restart counters (annotations the operator reads back) and has what is
    left of maxRestarts. `restart_strategy`: its failurePolicy.restartStrategy, the job's chosen
    restart strategies' (decide() says which); the registered strategy that renders it adds its
    half of the Job, with the operator's `settings` (in-place restart: the agent's image).
    `gang`: its pods join the job's PodGroup (render/podgroup.py; where the cluster serves it)."""
    labels = job_labels(plan)
    # A queued job's Workload is the job's own (render/kueue_workload.py): the JobSet carries no
    # queue label, so Kueue's JobSet integration leaves it to the operator.
    queue = (job_meta_labels or {}).get(keys.KUEUE_QUEUE_NAME)
    hosts = plan.shape.hosts
    pod_policy = pod_failure_policy(spec)
    job_spec: dict[str, Any] = {
        "parallelism": hosts,
        "completions": hosts,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": pod_policy,
        "template": render_pod_template(plan, spec),
    }
    _restart_half(restart_strategy, job_spec, spec, settings)
    if gang:  # placed by the scheduler, as one gang, rather than by JobSet's pod webhook
        podgroup.join(job_spec["template"]["spec"], plan, exclusive_topology(plan))
    failure_policy: dict[str, Any] = {
        "maxRestarts": max(0, spec.failure_policy.max_restarts - counted_before),
        # One restartStrategy for every cause JobSet restarts (reconcile/restart_strategy.py).
        "restartStrategy": restart_strategy,
        "rules": jobset_failure_rules(pod_policy),
    }
    annotations = {} if gang else {keys.JOBSET_EXCLUSIVE_TOPOLOGY: exclusive_topology(plan)}
    if restarts_before:
        annotations[keys.RESTARTS_BEFORE] = str(restarts_before)
        annotations[keys.RESTARTS_COUNTED_BEFORE] = str(counted_before)
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": JOBSET_KIND,
        "metadata": {
            "name": plan.name,
            "namespace": plan.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            # A queued job's JobSet starts suspended; the operator resumes it once Kueue admitted
            # the job's Workload and its capacity is ready.
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


def _restart_half(
    value: str, job_spec: dict[str, Any], spec: MultisliceJobSpec, settings: Settings | None
) -> None:
    """The Job's part of the registered strategy that renders restartStrategy `value`."""
    for strategy in REGISTRY.strategies().values():
        if strategy.jobset_value == value:
            strategy.render_job(job_spec, spec, settings)
            return
    if value != DEFAULT_RESTART_STRATEGY:
        raise ValueError(f"no registered restart strategy renders restartStrategy {value!r}")


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
