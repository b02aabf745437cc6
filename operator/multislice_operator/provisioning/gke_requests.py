"""The GKE requests for a plan: one ``CreateNodePoolRequest`` per slice, exactly as sent.

Pure: what the operator will ask GKE for follows from the plan alone, so the dry run
(``multislice-operator render --gke-requests``) prints the same bodies the provisioner sends.
"""

from __future__ import annotations

import re

from google.cloud.container_v1.types import cluster_service as cs

from multislice_operator import keys
from multislice_operator.plan import NodePoolSpec, Plan

# GCE resource labels (lowercase [a-z0-9_-], <= 63): the owner job, readable without Kubernetes.
RL_MANAGED_BY = "managed-by"
RL_JOB_NAMESPACE = "multislice-job-namespace"
RL_JOB_NAME = "multislice-job-name"
RL_JOB_UID = "multislice-job-uid"
RL_JOB_KEY = "multislice-job-key"
RL_SLICE = "multislice-slice"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"
_GCE_LABEL_RE = re.compile(r"[^a-z0-9_-]")


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
) -> cs.NodePool:
    """The GKE NodePool for one slice, as create_node_pool sends it."""
    labels = dict(spec.node_labels)
    labels[keys.JOB_UID] = owner_uid
    config = cs.NodeConfig(
        machine_type=spec.machine_type,
        labels=labels,
        resource_labels=_resource_labels(plan, spec, owner_uid),
        spot=spec.spot,
    )
    affinity = _reservation_affinity(spec.reservation)
    if affinity is not None:
        config.reservation_affinity = affinity
    if tpu_taint and spec.gke_accelerator:
        config.taints = [
            cs.NodeTaint(
                key=keys.TPU_RESOURCE, value="present", effect=cs.NodeTaint.Effect.NO_SCHEDULE
            )
        ]
    pool = cs.NodePool(
        name=spec.name,
        initial_node_count=spec.node_count,
        locations=list(node_locations),
        config=config,
        management=cs.NodeManagement(auto_repair=True, auto_upgrade=False),
    )
    if spec.tpu_topology:
        pool.placement_policy = cs.NodePool.PlacementPolicy(
            type_=cs.NodePool.PlacementPolicy.Type.COMPACT, tpu_topology=spec.tpu_topology
        )
    return pool


def _reservation_affinity(reservation: str | None) -> cs.ReservationAffinity | None:
    kind = cs.ReservationAffinity.Type
    if reservation is None:
        return None
    if reservation == "":
        return cs.ReservationAffinity(consume_reservation_type=kind.ANY_RESERVATION)
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
