"""What the operator asks GKE for (issue 12): the NodePool messages and the error classes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud.container_v1.types import cluster_service as cs

from multislice_operator.common.pools import CODE_RESERVATION_EXHAUSTED
from multislice_operator.planning.plan import Plan, load_job, plan_job
from multislice_operator.provisioning.gke_errors import (
    CODE_PERMISSION,
    CODE_QUOTA,
    CODE_RATE_LIMITED,
    classify_exception,
    classify_message,
    describe_quota,
)
from multislice_operator.provisioning.gke_requests import (
    XPK_NODE_SCOPES,
    NodeOptions,
    build_node_pool,
    create_request_json,
)

ZONE = "us-east5-b"
BASE: dict[str, Any] = {
    "apiVersion": "multislice.dev/v1alpha1",
    "kind": "MultisliceJob",
    "metadata": {"name": "llm", "namespace": "team-a"},
    "spec": {
        "accelerator": "v5litepod-16",
        "slices": 2,
        "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
    },
}


def plan_of(**spec: Any) -> Plan:
    obj = copy.deepcopy(BASE)
    obj["spec"].update(spec)
    return plan_job(load_job(obj))


def pool_of(plan: Plan, node: NodeOptions | None = None) -> cs.NodePool:
    return build_node_pool(plan, plan.node_pools[0], "uid-1", [ZONE], node=node)


def test_node_labels_use_our_prefix_only():
    # Defect 1: "Applying kubernetes label is not allowed"; cloud.google.com/* is GKE's.
    labels = dict(pool_of(plan_of()).config.labels)
    reserved = ("kubernetes.io", "k8s.io", "cloud.google.com")
    for key in labels:
        domain = key.rpartition("/")[0]
        assert not any(domain == d or domain.endswith("." + d) for d in reserved), key
    assert labels["multislice.dev/managed-by"] == "multislice-operator"
    assert labels["multislice.dev/job-uid"] == "uid-1"


def test_management_keeps_auto_upgrade_on():
    # Defect 2: "Auto_upgrade cannot be false when release_channel REGULAR is set".
    management = pool_of(plan_of()).management
    assert (management.auto_upgrade, management.auto_repair) == (True, True)


def test_scopes_let_checkpoints_write_in_both_identity_modes():
    # Defect 8: default node scopes give read-only Cloud Storage. Issue 21: Workload Identity
    # sent no scopes at all (the API adds none), so nodes could neither pull a private image
    # (the kubelet pulls as the node) nor write gs:// from host-network pods (the node's
    # identity); xpk keeps storage-full, gke-default, cloud-platform next to GKE_METADATA.
    config = pool_of(plan_of()).config
    assert "https://www.googleapis.com/auth/devstorage.full_control" in config.oauth_scopes
    assert "https://www.googleapis.com/auth/cloud-platform" in config.oauth_scopes
    assert tuple(config.oauth_scopes) == XPK_NODE_SCOPES
    assert not config.service_account and "workload_metadata_config" not in config
    wi = pool_of(
        plan_of(),
        NodeOptions(workload_identity=True, service_account="tpu@p.iam.gserviceaccount.com"),
    ).config
    assert wi.workload_metadata_config.mode == cs.WorkloadMetadataConfig.Mode.GKE_METADATA
    assert tuple(wi.oauth_scopes) == XPK_NODE_SCOPES
    assert wi.service_account == "tpu@p.iam.gserviceaccount.com"
    custom = NodeOptions(oauth_scopes=("https://www.googleapis.com/auth/cloud-platform",))
    assert list(pool_of(plan_of(), custom).config.oauth_scopes) == list(custom.oauth_scopes or ())


@pytest.mark.parametrize("reservation", ["tpu-res", "projects/owner-proj/reservations/tpu-res"])
def test_reservations_by_name_or_shared(reservation):
    # Defect 9: shared reservations are named projects/P/reservations/R.
    affinity = pool_of(plan_of(capacity={"type": "Reserved", "reservation": reservation}))
    res = affinity.config.reservation_affinity
    assert res.consume_reservation_type == cs.ReservationAffinity.Type.SPECIFIC_RESERVATION
    assert (res.key, list(res.values)) == ("compute.googleapis.com/reservation-name", [reservation])


def test_request_json_is_the_wire_format():
    pool = pool_of(plan_of())
    body = create_request_json("projects/p/locations/l/clusters/c", pool)
    assert body["parent"] == "projects/p/locations/l/clusters/c"
    assert body["nodePool"]["placementPolicy"] == {"type": 1, "tpuTopology": "4x4"}  # COMPACT
    named = create_request_json("x", pool, enum_names=True)["nodePool"]["placementPolicy"]
    assert named["type"] == "COMPACT"


QUOTA_403 = (
    'Insufficient regional quota to satisfy request: resource "TPU_LITE_PODSLICE_V5": request '
    "requires '32.0' and is short '32.0'. project has a quota of '0.0' with '0.0' available."
)


@pytest.mark.parametrize(
    "message",
    [
        QUOTA_403,
        'Insufficient project quota to satisfy request: resource "CPUS_ALL_REGIONS": request '
        "requires '16.0' and is short '8.0'.",
        '(1) insufficient regional quota to satisfy request: resource "CPUS": request requires '
        "'72.0' and is short '48.0'.",
    ],
)
def test_quota_403_is_capacity_not_permission(message):
    # Defect 3: GKE answers a create over quota with 403 PERMISSION_DENIED.
    c = classify_exception(gexc.Forbidden(message))
    assert (c.code, c.permanent) == (CODE_QUOTA, False)


def test_real_permission_403_stays_permanent():
    c = classify_exception(
        gexc.Forbidden('Required "container.clusters.update" permission(s) for "projects/p".')
    )
    assert (c.code, c.permanent) == (CODE_PERMISSION, True)


def test_quota_message_names_quota_and_region():
    text = describe_quota(QUOTA_403, "us-east5")
    assert text.startswith("insufficient quota TPU_LITE_PODSLICE_V5 in region us-east5: ")


# GKE's answer to a create on a specific reservation without the VMs free: a synchronous 429
# RESOURCE_EXHAUSTED (GoogleCloudPlatform/gsutil#1000, `gcloud container node-pools create
# --reservation-affinity specific`), and the managed instance group's own wording (the cluster
# autoscaler's RESERVATION_CAPACITY_EXCEEDED, kubernetes/autoscaler#7319).
RESERVATION_429 = (
    'Reservation does not have enough resources for the request: specific reservation "res-a" '
    'is insufficient for node pool "np4" at zone "us-central1-c": required 4 and short of 4 VM '
    "count of machine type ct5lp-hightpu-4t."
)


def test_an_exhausted_reservation_is_capacity_not_a_rate_limit():
    c = classify_exception(gexc.TooManyRequests(RESERVATION_429))
    assert (c.code, c.permanent, c.retry_now) == (CODE_RESERVATION_EXHAUSTED, False, False)
    mig = "Reservation res-a does not have sufficient capacity for the requested resources."
    assert classify_message(mig) == (CODE_RESERVATION_EXHAUSTED, False)
    # An API rate limit stays one (retried at once).
    c = classify_exception(gexc.TooManyRequests("Quota exceeded for quota metric 'Requests'"))
    assert (c.code, c.retry_now) == (CODE_RATE_LIMITED, True)
