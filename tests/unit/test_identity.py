"""Which Google identity the pods have (issue 21): GKE's Workload Identity restriction on
host-network pods, said by `plan` and `validate`."""

from __future__ import annotations

import pytest

from multislice_operator.render.identity import (
    COMPUTE_DEFAULT_ACCOUNT,
    EXISTING,
    KUBERNETES,
    NODE,
    node_identity,
    pod_identity,
)

SA = "tpu@proj.iam.gserviceaccount.com"


def template(**pod: object) -> dict:
    return {"spec": {"containers": [{"name": "c", "image": "i"}], **pod}}


@pytest.mark.parametrize(
    ("pod", "wi", "via", "warned"),
    [
        ({}, False, NODE, False),
        ({"hostNetwork": False}, False, NODE, False),
        ({}, True, NODE, True),  # the default: host network, so the node's account
        ({"hostNetwork": True}, True, NODE, True),
        ({"hostNetwork": False}, True, KUBERNETES, False),
    ],
)
def test_who_the_pods_are(pod, wi, via, warned):
    ident = pod_identity(
        template(**pod), "team", managed=True, workload_identity=wi, service_account=SA
    )
    assert ident.via == via
    assert (ident.warning is not None) == warned
    assert SA in ident.principal
    if warned:
        assert "team/default" in (ident.warning or "") and SA in (ident.warning or "")
        assert "hostNetwork: false" in (ident.warning or "")


def test_the_kubernetes_service_account_is_named():
    ident = pod_identity(
        template(hostNetwork=False, serviceAccountName="trainer"),
        "team",
        managed=True,
        workload_identity=True,
        service_account=None,
    )
    assert "Kubernetes service account team/trainer" in ident.principal
    assert COMPUTE_DEFAULT_ACCOUNT in ident.principal  # who pulls the images


def test_existing_pools_are_not_the_operators_to_describe():
    ident = pod_identity(
        template(), "team", managed=False, workload_identity=True, service_account=SA
    )
    assert ident.via == EXISTING and SA not in ident.principal


def test_the_default_node_identity_is_named():
    text = node_identity(False, None, [])
    assert COMPUTE_DEFAULT_ACCOUNT in text and "cloud-platform" in text
    wi = node_identity(True, SA, ["https://www.googleapis.com/auth/cloud-platform"])
    assert SA in wi and "GKE_METADATA" in wi and "auth/cloud-platform" in wi
