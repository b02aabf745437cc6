"""The pod's half of in-place restart (JobSet's InPlaceRestart, KEP-467): everything the KEP
leaves to the user, rendered so that a user writes nothing. Pure.

From kubernetes-sigs/jobset v0.12.0: site/static/examples/in-place-restart/
jobset-sidecar-container-mode.yaml (the shape), cmd/in-place-restart-agent/main.go (the agent:
env JOBSET_NAME, POD_NAME, STARTUP_PROBE_PATH/PORT, IN_PLACE_RESTART_EXIT_CODE; the namespace
from the mounted service account token), and pkg/webhooks/jobset_webhook.go (what the webhook
demands of each replicatedJob under InPlaceRestart: backoffLimit MaxInt32, podReplacementPolicy
Failed, completions == parallelism).
"""

from __future__ import annotations

from typing import Any

from multislice_operator.api.models import ExitCodePolicy, MultisliceJobSpec
from multislice_operator.common import keys

AGENT_CONTAINER = "in-place-restart-agent"
# Where JobSet's agent image has the agent (cmd/in-place-restart-agent/Dockerfile: ENTRYPOINT
# ["/in-place-restart-agent"]), and where the operator's image carries it: the chart's default
# agent image is the operator's own, whose entry point is the operator, so the command is named.
AGENT_COMMAND = "/in-place-restart-agent"
AGENT_PORT = 8081  # the agent's default STARTUP_PROBE_PORT; on the host network it is a host port
BARRIER_PATH = "/barrier-is-down"  # DefaultStartupProbePath: 200 once the barrier is lifted
AGENT_EXIT_CODE = 1  # DefaultInPlaceRestartExitCode: the agent exits so to restart its pod
# The pods' service account when the template names none (namespace objects: render_rbac).
AGENT_SERVICE_ACCOUNT = "multislice-inplace-restart"
# The pod annotation the agent writes, and the only change the admission policy lets it make.
ATTEMPT_ANNOTATION = keys.IN_PLACE_RESTART_ATTEMPT
BACKOFF_LIMIT_MAX = 2147483647  # MaxInt32: the webhook's demand (Jobs never fail on a pod)
RESTART_ALL = "RestartAllContainers"  # k8s.io/api core/v1 ContainerRestartRuleAction, 1.35+
BARRIER_SECONDS = 600  # the startup probe's patience: the whole job must reach the barrier


def worker_rules(spec: MultisliceJobSpec) -> list[dict[str, Any]]:
    """Which exits of the TPU container restart its pod in place: exactly the retryable ones. A
    fatal exit matches none, so the pod fails and podFailurePolicy fails the job as before."""
    fp = spec.failure_policy
    if fp.exit_code_policy == ExitCodePolicy.RESTART_IF_LISTED:
        codes = {"operator": "In", "values": fp.restart_codes()}
    else:
        codes = {"operator": "NotIn", "values": sorted({0, *fp.non_retryable_exit_codes})}
    return [{"action": RESTART_ALL, "exitCodes": codes}]


def agent_container(image: str) -> dict[str, Any]:
    """The agent, as a sidecar (an init container that keeps running): its startup probe holds
    the TPU container until every pod is on the JobSet's attempt; its own non-zero exit (asked
    by JobSet) restarts all of the pod's containers."""
    return {
        "name": AGENT_CONTAINER,
        "image": image,
        "command": [AGENT_COMMAND],
        "restartPolicy": "Always",
        "restartPolicyRules": [
            {"action": RESTART_ALL, "exitCodes": {"operator": "NotIn", "values": [0]}}
        ],
        "ports": [{"containerPort": AGENT_PORT, "name": "barrier", "protocol": "TCP"}],
        "startupProbe": {
            "httpGet": {"path": BARRIER_PATH, "port": AGENT_PORT},
            "periodSeconds": 1,
            "failureThreshold": BARRIER_SECONDS,
        },
        "env": [
            {
                "name": "JOBSET_NAME",
                "valueFrom": {
                    "fieldRef": {"fieldPath": f"metadata.annotations['{keys.JOBSET_NAME}']"}
                },
            },
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "STARTUP_PROBE_PATH", "value": BARRIER_PATH},
            {"name": "STARTUP_PROBE_PORT", "value": str(AGENT_PORT)},
            {"name": "IN_PLACE_RESTART_EXIT_CODE", "value": str(AGENT_EXIT_CODE)},
        ],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
    }


def service_account(pod: dict[str, Any]) -> str:
    """The service account the agent runs as: the template's (its token must let the agent
    patch its pod and read the JobSet), else the operator's own one for agents."""
    return str(pod.get("serviceAccountName") or AGENT_SERVICE_ACCOUNT)


def apply_to_pod(pod: dict[str, Any], spec: MultisliceJobSpec, image: str) -> None:
    """Add the agent and the TPU container's restart rules to a rendered pod spec."""
    tpu = pod["containers"][0]
    tpu["restartPolicy"] = "Never"  # container-level: restartPolicyRules need one
    _attempt_from_agent(tpu)
    tpu["restartPolicyRules"] = worker_rules(spec)
    inits = [c for c in pod.get("initContainers") or [] if c.get("name") != AGENT_CONTAINER]
    pod["initContainers"] = [agent_container(image), *inits]
    pod["serviceAccountName"] = service_account(pod)
    pod.pop("automountServiceAccountToken", None)  # the agent reads the mounted token


def _attempt_from_agent(tpu: dict[str, Any]) -> None:
    """MULTISLICE_RESTART_ATTEMPT counts every restart of all slices: under InPlaceRestart the
    JobSet's restart-attempt label moves only when Jobs are recreated, while the agent's attempt
    annotation moves on every restart (a recreated pod's agent starts at the JobSet's current
    attempt + 1 too). The kubelet resolves the downward API each time it starts a container,
    and the agent writes the annotation before its barrier lets the TPU container start, so the
    program sees the new attempt after an in-place restart (an unset value reads as 0), or, when
    the kubelet's copy of the pod has not caught up yet, the one before (docs/restarts.md)."""
    for var in tpu.get("env") or []:
        if var.get("name") == "MULTISLICE_RESTART_ATTEMPT" and "valueFrom" in var:
            path = f"metadata.annotations['{ATTEMPT_ANNOTATION}']"
            var["valueFrom"] = {"fieldRef": {"fieldPath": path}}


def apply_to_job(job_spec: dict[str, Any]) -> None:
    """What the JobSet webhook demands of each Job under InPlaceRestart."""
    job_spec["backoffLimit"] = BACKOFF_LIMIT_MAX
    job_spec["podReplacementPolicy"] = "Failed"


CLUSTER_ROLE = "multislice-inplace-restart"  # the chart's (templates/inplace-restart.yaml)


def render_rbac(namespace: str, account: str) -> list[tuple[str, dict[str, Any]]]:
    """The namespace's objects the agents need, with their paths for a server-side apply
    (site/static/examples/in-place-restart/service-account.yaml, its Role being the chart's
    ClusterRole): the service account (when it is the operator's) and a RoleBinding of it to
    the ClusterRole. The admission policy that limits the agents' pod patch to the attempt
    annotation is cluster-wide: the chart's too."""
    labels = {keys.MANAGED_BY: keys.MANAGED_BY_VALUE}
    objects: list[tuple[str, dict[str, Any]]] = []
    if account == AGENT_SERVICE_ACCOUNT:
        sa = {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": namespace, "labels": labels},
        }
        objects.append((f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}", sa))
    name = f"{CLUSTER_ROLE}-{account}"[:253]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": CLUSTER_ROLE,
        },
    }
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings/{name}"
    objects.append((path, binding))
    return objects
