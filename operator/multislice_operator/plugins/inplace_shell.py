"""In-place restart's check of the cluster (plugins/inplace.py registers `probe_in_place` as
its `probe`; controller/versions.py runs it at start-up and while its checks repeat). Loaded by
the controller; the CLI never imports it.

In-place restart (docs/restarts.md) is used when four things hold, each found here, and its
`StrategySupport` names the first that does not:

1. an agent image is configured (``--in-place-agent-image``; JobSet publishes none);
2. JobSet >= v0.11: its CRD's failurePolicy.restartStrategy enum has ``InPlaceRestart``;
3. JobSet's ``InPlaceRestart`` feature gate is on: a server-side dry run of a JobSet with it is
   not refused by JobSet's webhook ("InPlaceRestart restart strategy cannot be set when
   InPlaceRestart feature gate is disabled", jobset v0.12.0 pkg/webhooks/jobset_webhook.go);
4. Kubernetes >= 1.35 and its apiserver keeps a pod's ``RestartAllContainers`` restart rule (a
   dry run of a Job; the gate RestartAllContainersOnContainerExits is alpha in 1.35, beta and on
   in 1.36). The kubelet's own gate cannot be read from the apiserver: docs/restarts.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.controller.kube import ApiError
from multislice_operator.controller.runtime import Runtime
from multislice_operator.controller.versions import JOBSET_VERSION
from multislice_operator.reconcile import StrategySupport
from multislice_operator.render import inplace

IN_PLACE_STRATEGY, IN_PLACE_JOBSET, IN_PLACE_KUBE = "InPlaceRestart", "v0.11.0", (1, 35)
PROBE_NAMESPACE, PROBE_NAME = "default", "multislice-inplace-probe"


def _restart_strategies(crd: dict[str, Any] | None) -> list[str]:
    for v in ((crd or {}).get("spec") or {}).get("versions") or []:
        if v.get("name") != JOBSET_VERSION or not v.get("served"):
            continue
        node: Any = ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
        for step in ("spec", "failurePolicy", "restartStrategy"):
            node = (node.get("properties") or {}).get(step) or {}
        return [str(e) for e in node.get("enum") or []]
    return []


def kube_minor(git_version: str) -> tuple[int, int] | None:
    found = re.match(r"v?(\d+)\.(\d+)", git_version)
    return (int(found.group(1)), int(found.group(2))) if found else None


@dataclass(frozen=True)
class InPlaceFindings:
    """What the start-up check found; `in_place_support` judges it (pure)."""

    agent_image: str
    crd: dict[str, Any] | None
    gate_refusal: str | None  # JobSet's webhook refused an InPlaceRestart JobSet: its words
    kube_version: str  # the apiserver's gitVersion; "" when not read
    pod_rule_kept: bool  # a dry-run pod kept its RestartAllContainers rule


def in_place_support(found: InPlaceFindings) -> StrategySupport:
    """Whether the operator renders JobSets for in-place restart on this cluster, and why."""
    if not found.agent_image:
        return StrategySupport(
            False,
            "no in-place restart agent image is configured (operator "
            "flag --in-place-agent-image, chart inPlaceRestart.agentImage)",
        )
    if IN_PLACE_STRATEGY not in _restart_strategies(found.crd):
        return StrategySupport(
            False,
            f"the installed JobSet is older than {IN_PLACE_JOBSET}: its "
            f"CRD has no failurePolicy.restartStrategy {IN_PLACE_STRATEGY}",
        )
    if found.gate_refusal is not None:
        return StrategySupport(
            False,
            "the JobSet controller's InPlaceRestart feature gate is "
            f"off (its webhook: {found.gate_refusal}); set featureGates: "
            "{InPlaceRestart: true} in its configuration",
        )
    minor = kube_minor(found.kube_version)
    if minor is None or minor < IN_PLACE_KUBE:
        return StrategySupport(
            False,
            f"Kubernetes {found.kube_version or 'unknown'} has no "
            "RestartAllContainers container restart action (1.35 or newer)",
        )
    if not found.pod_rule_kept:
        return StrategySupport(
            False,
            f"Kubernetes {found.kube_version} does not keep a pod's "
            "RestartAllContainers restart rule: its feature gate "
            "RestartAllContainersOnContainerExits is off (alpha in 1.35)",
        )
    return StrategySupport(True, f"JobSet with InPlaceRestart on Kubernetes {found.kube_version}")


GATE_OFF = "InPlaceRestart feature gate is disabled"  # JobSet's webhook, when the gate is off
NO_UID = "00000000-0000-0000-0000-000000000000"  # a dry run stores nothing; no owner is read


def probe_namespace(watched: list[str]) -> str:
    """Where the dry runs go: a namespace the operator may create JobSets and Jobs in (the
    first one it watches by name; else default)."""
    literal = [n for n in watched if not any(ch in n for ch in "*?[")]
    return literal[0] if literal else PROBE_NAMESPACE


def probe_jobset(namespace: str = PROBE_NAMESPACE) -> dict[str, Any]:
    """The smallest JobSet JobSet's webhook accepts under InPlaceRestart (backoffLimit MaxInt32,
    podReplacementPolicy Failed, completions == parallelism), for a dry run; labelled and owned
    as the operator's own (the chart's admission policy lets it create no other JobSet)."""
    job: dict[str, Any] = {
        "parallelism": 1,
        "completions": 1,
        "template": {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "probe"}]}
        },
    }
    inplace.apply_to_job(job)
    owner = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "name": PROBE_NAME,
        "uid": NO_UID,
        "controller": True,
    }
    labels = {keys.JOB_NAME: PROBE_NAME, keys.MANAGED_BY: keys.MANAGED_BY_VALUE}
    return {
        "apiVersion": f"jobset.x-k8s.io/{JOBSET_VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": PROBE_NAME,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner],
        },
        "spec": {
            "failurePolicy": {"restartStrategy": IN_PLACE_STRATEGY},
            "replicatedJobs": [{"name": "r", "replicas": 1, "template": {"spec": job}}],
        },
    }


def probe_job(namespace: str = PROBE_NAMESPACE) -> dict[str, Any]:
    """A Job whose pod uses the RestartAllContainers action, for a dry run (the operator creates
    Jobs only so): an apiserver without the feature refuses or drops the rule."""
    rules = [{"action": inplace.RESTART_ALL, "exitCodes": {"operator": "In", "values": [1]}}]
    container = {
        "name": "c",
        "image": "probe",
        "restartPolicy": "Never",
        "restartPolicyRules": rules,
    }
    pod = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": PROBE_NAME, "namespace": namespace},
        "spec": {"template": pod},
    }


def _kept(job: dict[str, Any]) -> bool:
    pod = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    return any(
        r.get("action") == inplace.RESTART_ALL
        for c in pod.get("containers") or []
        for r in c.get("restartPolicyRules") or []
    )


async def find_in_place(rt: Runtime, crd: dict[str, Any] | None) -> InPlaceFindings:
    """The dry runs and reads in_place_support judges (none when no agent image is set). Raises
    what is no answer (RBAC, the moment): the check is tried again."""
    image = rt.settings.in_place_agent_image
    if not image or IN_PLACE_STRATEGY not in _restart_strategies(crd):
        return InPlaceFindings(image, crd, None, "", False)
    namespace = probe_namespace(rt.settings.namespaces)
    refusal: str | None = None
    try:
        await rt.kube.dry_run_returned(probe_jobset(namespace))
    except ApiError as exc:
        message = exc.message or str(exc)
        if GATE_OFF not in message:
            raise
        refusal = message
    version = await rt.kube.server_version()
    try:
        kept = _kept(await rt.kube.dry_run_returned(probe_job(namespace)))
    except ApiError as exc:
        if exc.status != 422:  # invalid: the action is not allowed; anything else is no answer
            raise
        kept = False
    return InPlaceFindings(image, crd, refusal, version, kept)


async def probe_in_place(rt: Runtime, crd: dict[str, Any] | None) -> StrategySupport:
    """In-place restart's probe (plugins/inplace.py registers it): the findings, judged."""
    return in_place_support(await find_in_place(rt, crd))
