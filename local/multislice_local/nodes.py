"""Fake GKE TPU nodes served by kwok in the ``cluster`` profile.

Nodes are ordinary Node objects carrying the kwok annotation; the kwok controller started by
:class:`~multislice_local.controlplane.ControlPlane` marks them Ready, keeps their leases
fresh and drives the phases of pods bound to them (see ``kwok/stages.yaml``).

Pod failure injection (kwok Stage ``pod-fail``): annotate a pod, at creation through its template
or later by patching a running pod, with ``multislice.dev/fail-exit-code: "17"`` and its
containers terminate with exit code 17 and the pod goes ``Failed`` (after
``multislice.dev/fail-after``, default 1s), their termination message
``multislice.dev/fail-message`` when given (the workload's JSON, e.g.
``{"step": 120, "checkpointStep": 100}``), and with ``multislice.dev/fail-disruption: REASON``
the pod also gets the ``DisruptionTarget`` condition (GKE's graceful node shutdown:
``TerminationByKubelet``): a preemption. Job pods otherwise succeed after
``multislice.dev/run-duration`` (Go duration, default ``3s``); set e.g. ``"1h"`` for pods that
should keep running until a test makes them fail.

NotReady injection (kwok Stage ``node-not-ready``): annotate a node with
``multislice.dev/not-ready: "true"`` (:func:`set_not_ready`) and its Ready condition goes False
while the node object stays, as when a VM's kubelet stops answering for a while; remove the
annotation and kwok makes it Ready again. Nodes hold Leases (kwok ``--node-lease-duration-seconds``)
so they never flap NotReady on their own.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config

from multislice_local.controlplane import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
)
from multislice_operator.common import keys

FAIL_EXIT_CODE_ANNOTATION = "multislice.dev/fail-exit-code"
FAIL_AFTER_ANNOTATION = "multislice.dev/fail-after"
FAIL_MESSAGE_ANNOTATION = "multislice.dev/fail-message"
FAIL_DISRUPTION_ANNOTATION = "multislice.dev/fail-disruption"
# What GKE's graceful node shutdown of a preempted or maintained VM leaves on its pods.
NODE_SHUTDOWN = "TerminationByKubelet"
RUN_DURATION_ANNOTATION = "multislice.dev/run-duration"
NOT_READY_ANNOTATION = "multislice.dev/not-ready"

log = logging.getLogger(__name__)

ClientLike = client.ApiClient | str | os.PathLike[str]


def _api(api_client_or_kubeconfig: ClientLike) -> client.CoreV1Api:
    if isinstance(api_client_or_kubeconfig, client.ApiClient):
        return client.CoreV1Api(api_client_or_kubeconfig)
    api_client = config.new_client_from_config(config_file=os.fspath(api_client_or_kubeconfig))  # type: ignore[no-untyped-call]
    return client.CoreV1Api(api_client)


def tpu_node_manifest(
    name: str,
    pool_name: str,
    accelerator_label: str,
    topology: str,
    chips_per_host: int,
    extra_labels: dict[str, str] | None = None,
    spot: bool = False,
) -> dict[str, Any]:
    """A Node shaped like a GKE TPU VM: pool/accelerator/topology labels, TPU taint, chips."""
    labels = {
        keys.GKE_NODEPOOL: pool_name,
        keys.GKE_TPU_ACCELERATOR: accelerator_label,
        keys.GKE_TPU_TOPOLOGY: topology,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if spot:
        labels[keys.GKE_SPOT] = "true"
    labels.update(extra_labels or {})
    resources = {
        keys.TPU_RESOURCE: str(chips_per_host),
        "cpu": "200",
        "memory": "400Gi",
        "pods": "110",
        "ephemeral-storage": "100Gi",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {
            "taints": [{"key": keys.TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}],
        },
        # kwok's node-initialize stage keeps capacity/allocatable given at creation.
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }


def register_tpu_nodes(
    api_client_or_kubeconfig: ClientLike,
    pool_name: str,
    count: int,
    accelerator_label: str,
    topology: str,
    chips_per_host: int,
    extra_labels: dict[str, str] | None = None,
    spot: bool = False,
    instance_group: str = "",
) -> list[str]:
    """Create ``count`` fake TPU nodes of node pool ``pool_name``; return their names.

    Names are ``<pool_name>-<i>``, or ``<pool_name>-<instance_group>-<i>`` for a pool that GKE
    (the simulator) creates: GKE names nodes after the pool's instance group, so a pool created
    again under its name has nodes of new names. The nodes become Ready within about a second
    (kwok).
    """
    api = _api(api_client_or_kubeconfig)
    names = []
    stem = f"{pool_name}-{instance_group}" if instance_group else pool_name
    for i in range(count):
        name = f"{stem}-{i}"
        body = tpu_node_manifest(
            name, pool_name, accelerator_label, topology, chips_per_host, extra_labels, spot
        )
        # Not read into a V1Node: a gang's nodes register on the cores the operator runs on.
        api.create_node(body, _preload_content=False).read()  # type: ignore[arg-type,attr-defined]
        names.append(name)
    return names


def shut_down_pods(api_client_or_kubeconfig: ClientLike, pool_name: str) -> list[str]:
    """What GKE's graceful node shutdown does to a preempted VM's pods: they end Failed.

    Without a kubelet nobody else would: pods on a deleted fake node stay Running until the
    pod garbage collector removes them much later, which no real TPU VM does.
    """
    api = _api(api_client_or_kubeconfig)
    nodes: list[Any] = api.list_node(label_selector=f"{keys.GKE_NODEPOOL}={pool_name}").items
    failed = []
    for node in nodes:
        pods: list[Any] = api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node.metadata.name}"
        ).items
        for pod in pods:
            if pod.status.phase not in ("Pending", "Running"):
                continue
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            statuses = [
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": 143,
                            "reason": "Terminated",
                            "message": "node shutdown (preempted)",
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
                for c in pod.spec.containers
            ]
            status = {
                "phase": "Failed",
                "reason": "Terminated",
                "message": "Pod was terminated in response to imminent node shutdown.",
                "conditions": [
                    {
                        "type": "DisruptionTarget",
                        "status": "True",
                        "reason": "TerminationByKubelet",
                        "lastTransitionTime": now,
                    },
                    {"type": "Ready", "status": "False", "lastTransitionTime": now},
                ],
                "containerStatuses": statuses,
            }
            try:
                api.patch_namespaced_pod_status(
                    pod.metadata.name, pod.metadata.namespace, {"status": status}
                )
                failed.append(f"{pod.metadata.namespace}/{pod.metadata.name}")
            except client.ApiException as err:
                # The VM goes however its pods end (GKE deletes it after the grace period):
                # a pod left Running here is the pod garbage collector's once its node is gone.
                if err.status != 404:
                    name = f"{pod.metadata.namespace}/{pod.metadata.name}"
                    log.warning("pod %s not shut down: %s", name, err.reason)
    return failed


def delete_nodes(api_client_or_kubeconfig: ClientLike, pool_name: str) -> list[str]:
    """Delete every node of node pool ``pool_name``; return the deleted names.

    Pods bound to them are then removed by the controller-manager's pod garbage collector.
    """
    api = _api(api_client_or_kubeconfig)
    nodes = api.list_node(label_selector=f"{keys.GKE_NODEPOOL}={pool_name}").items
    names = [str(node.metadata.name) for node in nodes if node.metadata]
    for name in names:
        try:
            api.delete_node(name)
        except client.ApiException as err:
            if err.status != 404:  # gone already is what was asked
                raise
    return names


def set_not_ready(
    api_client_or_kubeconfig: ClientLike, pool_name: str, not_ready: bool = True
) -> list[str]:
    """Hold every node of ``pool_name`` NotReady (the nodes stay), or release them; return names."""
    api = _api(api_client_or_kubeconfig)
    nodes = api.list_node(label_selector=f"{keys.GKE_NODEPOOL}={pool_name}").items
    value = "true" if not_ready else None
    names = [str(n.metadata.name) for n in nodes if n.metadata]
    for name in names:
        api.patch_node(name, {"metadata": {"annotations": {NOT_READY_ANNOTATION: value}}})
    return names


def fail_pod(
    api_client_or_kubeconfig: ClientLike,
    namespace: str,
    name: str,
    exit_code: int,
    after: str = "0s",
    message: str | None = None,
    disruption: str | None = None,
) -> None:
    """Make a running pod fail with ``exit_code`` (kwok ``pod-fail`` stage) after ``after``,
    its containers' termination message ``message`` when given; with ``disruption`` (a reason,
    e.g. :data:`NODE_SHUTDOWN`) it fails with the ``DisruptionTarget`` condition too."""
    if exit_code == 0:
        raise ValueError("a failure needs a non-zero exit code")
    api = _api(api_client_or_kubeconfig)
    annotations = {FAIL_EXIT_CODE_ANNOTATION: str(exit_code), FAIL_AFTER_ANNOTATION: after}
    if message is not None:
        annotations[FAIL_MESSAGE_ANNOTATION] = message
    if disruption is not None:
        annotations[FAIL_DISRUPTION_ANNOTATION] = disruption
    patch = {"metadata": {"annotations": annotations}}
    api.patch_namespaced_pod(name, namespace, patch)


def finish_pod(
    api_client_or_kubeconfig: ClientLike, namespace: str, name: str, after: str = "1s"
) -> None:
    """Make a running Job pod succeed ``after`` from now: kwok's pod-complete stage counts its
    ``multislice.dev/run-duration`` from the pod's last update, so a test ends a long run when it
    has seen what it waits for, not when a guessed duration runs out."""
    patch = {"metadata": {"annotations": {RUN_DURATION_ANNOTATION: after}}}
    _api(api_client_or_kubeconfig).patch_namespaced_pod(name, namespace, patch)


def label_nodes(
    api_client_or_kubeconfig: ClientLike, pool_name: str, labels: dict[str, str | None]
) -> list[str]:
    """Set (or, with None, remove) labels on every node of ``pool_name``, as GKE does to announce
    host maintenance (``keys.GKE_SCHEDULED_MAINTENANCE_TIME``: Unix seconds); return the nodes."""
    api = _api(api_client_or_kubeconfig)
    nodes: list[Any] = api.list_node(label_selector=f"{keys.GKE_NODEPOOL}={pool_name}").items
    for node in nodes:
        api.patch_node(node.metadata.name, {"metadata": {"labels": labels}})
    return [str(n.metadata.name) for n in nodes]


def taint_nodes(
    api_client_or_kubeconfig: ClientLike, pool_name: str, key: str, on: bool = True
) -> None:
    """Add (or remove) a NoSchedule taint ``key`` on every node of ``pool_name``: pods that do
    not tolerate it stay Pending, Unschedulable, on nodes that are Ready."""
    api = _api(api_client_or_kubeconfig)
    nodes: list[Any] = api.list_node(label_selector=f"{keys.GKE_NODEPOOL}={pool_name}").items
    for node in nodes:
        taints = [
            {"key": t.key, "value": t.value, "effect": t.effect}
            for t in (node.spec.taints or [])
            if t.key != key
        ]
        if on:
            taints.append({"key": key, "value": "true", "effect": "NoSchedule"})
        api.patch_node(node.metadata.name, {"spec": {"taints": taints}})
