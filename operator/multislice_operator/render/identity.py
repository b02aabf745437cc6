"""Which Google identity a job's pods act as on GKE: pure, from the operator's node settings and
the rendered pod template. `plan`, `validate` and the operator's start-up log say it.

GKE's rules (Workload Identity Federation for GKE, "Restrictions": "Pods running on the host
network (hostNetwork: true) don't use Workload Identity Federation for GKE. GKE automatically
routes requests from these Pods to the Compute Engine metadata server"):

* without Workload Identity every pod acts as the node's service account, within its scopes;
* with it (the node pool runs the GKE metadata server, ``GKE_METADATA``) a pod acts as its
  Kubernetes service account, unless it runs on the host network: then as the node's account;
* the kubelet pulls images with the node's credentials in both cases.

TPU pods run on the host network by default (hostports.host_network: GKE's Multislice example and
xpk do), so under Workload Identity they still act as the nodes' service account. The product
keeps that default (DCN traffic over the hosts' NICs), says so, and keeps the nodes' scopes in
both modes (provisioning/gke_requests.py), as xpk does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from multislice_operator.planning.hostports import host_network

# What GKE uses when a node pool names no service account (NodeConfig.service_account).
COMPUTE_DEFAULT_ACCOUNT = (
    "the Compute Engine default service account "
    "(PROJECT_NUMBER-compute@developer.gserviceaccount.com)"
)
DEFAULT_SCOPES_TEXT = "storage-full, gke-default, cloud-platform (as xpk)"
NODE, KUBERNETES, EXISTING = "node-service-account", "kubernetes-service-account", "existing-nodes"


@dataclass(frozen=True)
class PodIdentity:
    """Who the pods are to Google APIs (``via`` one of NODE, KUBERNETES, EXISTING)."""

    via: str
    principal: str
    warning: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"via": self.via, "principal": self.principal, "warning": self.warning}


def node_account(service_account: str | None) -> str:
    return service_account or COMPUTE_DEFAULT_ACCOUNT


def node_identity(
    workload_identity: bool, service_account: str | None, scopes: list[str] | tuple[str, ...]
) -> str:
    """One line on the TPU nodes the operator creates: account, scopes, metadata server."""
    shown = ", ".join(scopes) if scopes else DEFAULT_SCOPES_TEXT
    metadata = (
        "GKE_METADATA (Workload Identity; host-network pods still act as this account)"
        if workload_identity
        else "the Compute Engine metadata server (every pod acts as this account)"
    )
    return f"service account {node_account(service_account)}; scopes {shown}; metadata {metadata}"


def pod_identity(
    template: dict[str, Any],
    namespace: str,
    *,
    managed: bool,
    workload_identity: bool,
    service_account: str | None,
) -> PodIdentity:
    """The identity the job's pods will have, and a warning where it is not the one the user
    would expect from their Kubernetes service account."""
    pod = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    ksa = f"{namespace}/{(pod or {}).get('serviceAccountName') or 'default'}"
    on_host = host_network(pod or {})
    if not managed:
        how = (
            "the existing nodes' service account (host-network pods do not use Workload Identity)"
            if on_host
            else f"Kubernetes service account {ksa} where the existing node pools run the GKE "
            "metadata server (Workload Identity), else the nodes' service account"
        )
        return PodIdentity(EXISTING, how)
    account = node_account(service_account)
    if not workload_identity:
        return PodIdentity(NODE, f"the TPU nodes' service account, {account}")
    if not on_host:
        return PodIdentity(
            KUBERNETES,
            f"Kubernetes service account {ksa} (Workload Identity Federation for GKE); images "
            f"are pulled as the TPU nodes' service account, {account}",
        )
    return PodIdentity(
        NODE,
        f"the TPU nodes' service account, {account} (host-network pods do not use Workload "
        "Identity)",
        warning=(
            "Workload Identity is on but the pods run on the host network "
            "(spec.template.spec.hostNetwork unset or true): GKE routes their metadata requests "
            f"to the Compute Engine metadata server, so they act as {account}, not as Kubernetes "
            f"service account {ksa}. Grant the job's roles (its checkpoint bucket, logging, "
            f"image pull) to that account, or set spec.template.spec.hostNetwork: false for the "
            f"pods to act as {ksa}"
        ),
    )
