"""The GKE requests for a plan: one ``CreateNodePoolRequest`` per slice, exactly as sent.

Pure: what the operator will ask GKE for follows from the plan alone, so the dry run
(``multislice-operator render --gke-requests``) prints the same bodies the provisioner sends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from google.cloud.container_v1.types import cluster_service as cs
from google.protobuf import duration_pb2, json_format

from multislice_operator.common import keys
from multislice_operator.planning.plan import NodePoolSpec, Plan

# GCE resource labels (lowercase [a-z0-9_-], <= 63): the owner job, readable without Kubernetes.
RL_MANAGED_BY = "managed-by"
RL_JOB_NAMESPACE = "multislice-job-namespace"
RL_JOB_NAME = "multislice-job-name"
RL_JOB_UID = "multislice-job-uid"
RL_JOB_KEY = "multislice-job-key"
RL_SLICE = "multislice-slice"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
_GCE_LABEL_RE = re.compile(r"[^a-z0-9_-]")

# The scopes xpk gives TPU node pools, with and without Workload Identity (src/xpk/core/nodepool.py:
# --scopes=storage-full,gke-default,cloud-platform on every TPU pool, --workload-metadata=
# GKE_METADATA added in Workload Identity mode), expanded as gcloud expands the aliases. The API
# adds no scope of its own (NodeConfig.oauth_scopes: "If unspecified, no scopes are added, unless
# Cloud Logging or Cloud Monitoring are enabled"; gcloud's default scopes are a client-side
# alias): a pool created without them cannot pull a private image (the kubelet pulls with the
# node's credentials, Workload Identity or not) nor write gs:// from a host-network pod.
XPK_NODE_SCOPES = (
    "https://www.googleapis.com/auth/devstorage.full_control",  # storage-full
    "https://www.googleapis.com/auth/devstorage.read_only",  # gke-default ...
    "https://www.googleapis.com/auth/logging.write",
    "https://www.googleapis.com/auth/monitoring",
    "https://www.googleapis.com/auth/service.management.readonly",
    "https://www.googleapis.com/auth/servicecontrol",
    "https://www.googleapis.com/auth/trace.append",
    "https://www.googleapis.com/auth/cloud-platform",  # cloud-platform
)


# xpk and ai-on-gke tpu-provisioner create TPU pools with --max-pods-per-node 15 ("otherwise
# we'll run out of IP Space and provisioning will fail"): GKE's default 110 reserves a /24 of the
# cluster's pod range per node, 15 a /27 (GKE "Configure maximum Pods per node").
DEFAULT_MAX_PODS_PER_NODE = 15


@dataclass(frozen=True)
class NodeOptions:
    """How the operator's TPU nodes reach Google APIs (operator settings, not job fields).

    ``workload_identity``: the cluster runs Workload Identity Federation for GKE; the nodes get
    ``workloadMetadataConfig: GKE_METADATA``, so pods off the host network act as their Kubernetes
    service account. The nodes keep :data:`XPK_NODE_SCOPES` in both modes: the kubelet pulls
    images as the node, and host-network pods (the default) act as the node's service account
    (see render/identity.py). ``oauth_scopes`` replaces them; ``service_account`` names the node
    service account (default: the Compute Engine default one). ``tpu_taint`` sends the
    ``google.com/tpu`` taint explicitly (GKE adds it to TPU nodes itself).
    """

    workload_identity: bool = False
    service_account: str | None = None
    oauth_scopes: tuple[str, ...] | None = None
    tpu_taint: bool = False
    # maxPodsConstraint of TPU pools (settings.gke_max_pods_per_node; None: GKE's default 110).
    max_pods_per_node: int | None = DEFAULT_MAX_PODS_PER_NODE

    def scopes(self) -> tuple[str, ...]:
        return XPK_NODE_SCOPES if self.oauth_scopes is None else self.oauth_scopes


def gce_label_value(value: str) -> str:
    """A GCE resource label value: lowercase [a-z0-9_-], at most 63 characters."""
    return _GCE_LABEL_RE.sub("-", value.lower())[:63]


# --------------------------------------------------------------------------------------------
# Node pool messages


def build_node_pool(
    plan: Plan,
    spec: NodePoolSpec,
    owner_uid: str,
    node_locations: list[str],
    tpu_taint: bool = False,
    node: NodeOptions | None = None,
) -> cs.NodePool:
    """The GKE NodePool for one slice, as create_node_pool sends it."""
    node = node or NodeOptions(tpu_taint=tpu_taint)
    labels = dict(spec.node_labels)
    labels[keys.JOB_UID] = owner_uid
    config = cs.NodeConfig(
        machine_type=spec.machine_type,
        labels=labels,
        resource_labels=_resource_labels(plan, spec, owner_uid),
        spot=spec.spot,
        oauth_scopes=list(node.scopes()),
    )
    if node.service_account:
        config.service_account = node.service_account
    if node.workload_identity:
        config.workload_metadata_config = cs.WorkloadMetadataConfig(
            mode=cs.WorkloadMetadataConfig.Mode.GKE_METADATA
        )
    affinity = _reservation_affinity(spec.reservation)
    if affinity is not None:
        config.reservation_affinity = affinity
    _network_settings(config)
    if (tpu_taint or node.tpu_taint) and spec.gke_accelerator:
        config.taints = [
            cs.NodeTaint(
                key=keys.TPU_RESOURCE, value="present", effect=cs.NodeTaint.Effect.NO_SCHEDULE
            )
        ]
    pool = cs.NodePool(
        name=spec.name,
        initial_node_count=spec.node_count,
        # A fallback option's own zone (of the cluster's region), else the operator's.
        locations=[spec.zone] if spec.zone else list(node_locations),
        config=config,
        # Clusters in a release channel refuse auto-upgrade off ("Auto_upgrade cannot be false
        # when release_channel REGULAR is set"); a pool lives only as long as its job, and an
        # upgrade is a slice loss the job already survives.
        management=cs.NodeManagement(auto_repair=True, auto_upgrade=True),
    )
    if node.max_pods_per_node and spec.gke_accelerator:
        pool.max_pods_constraint = cs.MaxPodsConstraint(max_pods_per_node=node.max_pods_per_node)
    if spec.tpu_topology or spec.cube:  # a cube's policy carries its topology (no tpuTopology)
        pool.placement_policy = _placement(spec)
    if spec.flex_start:
        _flex_start(pool, spec)
    return pool


def _placement(spec: NodePoolSpec) -> cs.NodePool.PlacementPolicy:
    if spec.workload_policy:
        # tpu7x: the pool names a HIGH_THROUGHPUT workload policy and keeps tpuTopology, with no
        # type: GKE stores policyName + tpuTopology without a type (vllm-project/ci-infra#547),
        # and COMPACT puts a tpu7x pool in ERROR ("... with placement policy is not supported. Use
        # workload policy instead."); xpk passes --placement-policy=NAME, no COMPACT.
        return cs.NodePool.PlacementPolicy(
            policy_name=spec.workload_policy, tpu_topology=spec.tpu_topology
        )
    return cs.NodePool.PlacementPolicy(
        type_=cs.NodePool.PlacementPolicy.Type.COMPACT, tpu_topology=spec.tpu_topology
    )


def _network_settings(config: cs.NodeConfig) -> None:
    # gVNIC on TPU pools, as xpk creates them (src/xpk/core/nodepool.py --enable-gvnic): Google's
    # virtual NIC, the one that carries the VMs' full network bandwidth (Compute Engine "Using
    # Google Virtual NIC"), which is the DCN traffic between slices.
    config.gvnic = cs.VirtualNIC(enabled=True)


def _flex_start(pool: cs.NodePool, spec: NodePoolSpec) -> None:
    """Flex-start (Dynamic Workload Scheduler) pools as xpk asks for them (src/xpk/core/
    capacity.py: --flex-start --enable-autoscaling --location-policy=ANY
    --reservation-affinity=none --no-enable-autorepair --max-nodes=HOSTS, and --num-nodes=0 in
    nodepool.py): the pool starts empty and GKE provisions the whole slice at once when capacity
    is found, for at most maxRunDuration (GKE "About flex-start provisioning mode")."""
    pool.initial_node_count = 0
    pool.config.flex_start = True
    if spec.max_run_duration_s:
        pool.config.max_run_duration = duration_pb2.Duration(seconds=spec.max_run_duration_s)
    pool.config.reservation_affinity = cs.ReservationAffinity(
        consume_reservation_type=cs.ReservationAffinity.Type.NO_RESERVATION
    )
    pool.autoscaling = cs.NodePoolAutoscaling(
        enabled=True,
        min_node_count=0,
        max_node_count=spec.node_count,
        location_policy=cs.NodePoolAutoscaling.LocationPolicy.ANY,
    )
    # Flex-start VMs are not repaired (xpk --no-enable-autorepair): a lost one is a lost slice.
    pool.management = cs.NodeManagement(auto_repair=False, auto_upgrade=True)


def cluster_path(project: str, location: str, cluster: str) -> str:
    return f"projects/{project}/locations/{location}/clusters/{cluster}"


def create_request_json(parent: str, pool: cs.NodePool, enum_names: bool = False) -> dict[str, Any]:
    """A CreateNodePoolRequest as the REST transport sends it: ``parent`` (in the URL path) and
    the JSON body, enums as integers (``enum_names``: as names, for reading)."""
    body = json_format.MessageToDict(
        cs.CreateNodePoolRequest(node_pool=pool)._pb,
        use_integers_for_enums=not enum_names,
    )
    return {"parent": parent, **body}


def create_requests(
    plan: Plan,
    parent: str,
    owner_uid: str,
    node_locations: list[str],
    node: NodeOptions | None = None,
    enum_names: bool = False,
) -> list[dict[str, Any]]:
    """Every CreateNodePoolRequest of a plan, one per slice, as the provisioner sends them."""
    return [
        create_request_json(
            parent, build_node_pool(plan, spec, owner_uid, node_locations, node=node), enum_names
        )
        for spec in plan.pools
    ]


def _reservation_affinity(reservation: str | None) -> cs.ReservationAffinity | None:
    kind = cs.ReservationAffinity.Type
    if not reservation:
        return None
    # A bare name or projects/P/reservations/R (a shared reservation), under the same key
    # (GKE "Consume reserved zonal resources"; ai-on-gke tpu-provisioner internal/cloud/gke.go).
    return cs.ReservationAffinity(
        consume_reservation_type=kind.SPECIFIC_RESERVATION,
        key=RESERVATION_KEY,
        values=[reservation],
    )


def _resource_labels(plan: Plan, spec: NodePoolSpec, owner_uid: str) -> dict[str, str]:
    return {
        RL_MANAGED_BY: gce_label_value(keys.MANAGED_BY_VALUE),
        RL_JOB_NAMESPACE: gce_label_value(plan.namespace),
        RL_JOB_NAME: gce_label_value(plan.name),
        RL_JOB_UID: gce_label_value(owner_uid),
        RL_JOB_KEY: gce_label_value(plan.job_key),
        RL_SLICE: str(spec.slice_index),
    }


# --------------------------------------------------------------------------------------------
# Workload policies (Compute Engine resource policies; tpu7x multi-host slices)

# Compute Engine resource policies carry no labels (ResourcePolicy has name, description,
# region and the policy itself): the operator marks the ones it creates in the description.
WORKLOAD_POLICY_MARK = f"{RL_MANAGED_BY}={keys.MANAGED_BY_VALUE}"
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"
CUBE_TOPOLOGY_MODE = "PROVISION_ONLY"


@dataclass(frozen=True)
class WorkloadPolicySpec:
    """A workload policy some slices need: one per generation, topology and region."""

    name: str
    region: str
    accelerator_topology: str
    # PROVISION_ONLY for dynamic-slicing cubes: "provision TPU nodes without forming ICI or OCS
    # links" (GKE "Use dynamic slicing with a custom scheduler"); "" for a slice's own policy.
    topology_mode: str = ""

    def description(self) -> str:
        return (
            f"{WORKLOAD_POLICY_MARK}; placement of {self.accelerator_topology} TPU slices, shared "
            "by every MultisliceJob of that shape in the region; never deleted by the operator"
        )


def region_of(zone: str) -> str:
    """us-central1-c -> us-central1 (a workload policy lives in the pools' region)."""
    parts = zone.split("-")
    return "-".join(parts[:-1]) if len(parts) == 3 and len(parts[-1]) == 1 else zone


def workload_policies(plan: Plan, region: str) -> list[WorkloadPolicySpec]:
    """The distinct workload policies the plan's pools name (none for COMPACT generations)."""
    wanted = {
        (p.workload_policy, p.tpu_topology or p.topology, CUBE_TOPOLOGY_MODE if p.cube else "")
        for p in plan.pools
        if p.workload_policy
    }
    return [WorkloadPolicySpec(name, region, topo, mode) for name, topo, mode in sorted(wanted)]


def build_workload_policy(policy: WorkloadPolicySpec) -> Any:
    """The compute_v1.ResourcePolicy the operator inserts: type HIGH_THROUGHPUT with the slice's
    accelerator topology, as xpk creates it (src/xpk/core/nodepool.py ensure_resource_policy_exists:
    `gcloud compute resource-policies create workload-policy NAME --type=HIGH_THROUGHPUT
    --accelerator-topology=TOPOLOGY`). google-cloud-compute loads only here (it is large)."""
    from google.cloud import compute_v1

    return compute_v1.ResourcePolicy(
        name=policy.name,
        region=policy.region,
        description=policy.description(),
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
            type_=WORKLOAD_POLICY_TYPE,
            accelerator_topology=policy.accelerator_topology,
            **({"accelerator_topology_mode": policy.topology_mode} if policy.topology_mode else {}),
        ),
    )


def policy_insert_json(project: str, policy: WorkloadPolicySpec) -> dict[str, Any]:
    """An InsertResourcePolicyRequest as the REST transport sends it: project and region (in the
    URL path) and the body, resourcePolicyResource."""
    from google.cloud import compute_v1

    request = compute_v1.InsertResourcePolicyRequest(
        project=project,
        region=policy.region,
        resource_policy_resource=build_workload_policy(policy),
    )
    body: dict[str, Any] = json_format.MessageToDict(
        compute_v1.InsertResourcePolicyRequest.pb(request)
    )
    return body
