"""The simulator's GKE Slice CRD on the real apiserver: its CEL rules refuse what GKE's webhook
refuses (the same cases as slices.admission_errors), and the slice controller works through the
Kubernetes store and node labels (issue 41)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1
from google.cloud.container_v1.types import cluster_service as cs
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local import nodes, slices
from multislice_local.gke_sim import GkeSimulator, KubeNodeRegistrar, SimConfig

G, V, P = slices.GROUP, slices.VERSION, slices.PLURAL


@pytest.fixture(scope="module")
def api(kube_api: Any) -> Iterator[client.ApiClient]:
    api_client = kube_api.api_client()
    slices.install_crd(api_client)
    slices.install_crd(api_client)  # as enabling the controller twice: no error
    custom = client.CustomObjectsApi(api_client)
    deadline = time.monotonic() + 30
    while True:  # the CRD is served a moment after it is created
        try:
            custom.list_cluster_custom_object(G, V, P)
            break
        except ApiException:
            assert time.monotonic() < deadline
            time.sleep(0.2)
    yield api_client
    api_client.close()


def slice_obj(name: str, topology: str, partition_ids: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{G}/{V}",
        "kind": slices.KIND,
        "metadata": {"name": name},
        "spec": {"type": "tpu7x", "topology": topology, "partitionIds": partition_ids},
    }


@pytest.mark.parametrize(
    ("name", "topology", "words"),
    [
        ("a" * 50, "4x4x8", "49 characters or fewer"),
        ("ok", "4x8x4", "non-decreasing"),
        ("ok", "4x4x6", "multiple of 4"),
        ("ok", "2x2x2", "multiple of 4"),
        ("ok", "16x24x28", "at most 9216 chips"),
        ("ok", "4x4", "should match"),
    ],
)
def test_the_crd_refuses_what_gkes_webhook_refuses(
    api: client.ApiClient, name: str, topology: str, words: str
) -> None:
    obj = slice_obj(name, topology, ["p0"])
    assert slices.admission_errors(obj)  # the in-memory store refuses it too
    with pytest.raises(ApiException) as err:
        client.CustomObjectsApi(api).create_cluster_custom_object(G, V, P, obj, dry_run="All")
    assert err.value.status == 422
    assert words in str(err.value.body)


@pytest.mark.parametrize(("name", "topology"), [("a" * 49, "4x4x4"), ("big", "16x24x24")])
def test_the_crd_accepts_what_gke_accepts(api: client.ApiClient, name: str, topology: str) -> None:
    obj = slice_obj(name, topology, ["p0"])
    assert slices.admission_errors(obj) == []
    client.CustomObjectsApi(api).create_cluster_custom_object(G, V, P, obj, dry_run="All")


def _until(cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_the_slice_controller_on_the_api_server(api: client.ApiClient) -> None:
    """Two sub-block pools, one 4x4x8 Slice: ACTIVATING, ACTIVE with its 32 nodes labelled, a
    failed cube makes it FAILED, and deleting it removes the labels and the finalizer."""
    config = SimConfig(op_latency_s=0.2, slice_activation_s=0.3, slice_sync_s=0.1)
    registrar = KubeNodeRegistrar(api)
    sim = GkeSimulator(config, registrar=registrar, slice_store=slices.KubeSliceStore(api)).start()
    gke = container_v1.ClusterManagerClient(
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        transport="rest",
        client_options={"api_endpoint": sim.url},
    )
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    pools = ["crd-cube-a", "crd-cube-b"]
    try:
        ids = sim.add_reservation("crd-res", {"b1": 2}, project="proj-1")
        sim.add_policy(
            "proj-1",
            "us-east5",
            {
                "name": "wp-cube",
                "workloadPolicy": {
                    "type": "HIGH_THROUGHPUT",
                    "acceleratorTopology": "4x4x4",
                    "acceleratorTopologyMode": "PROVISION_ONLY",
                },
            },
        )
        for name in pools:
            gke.create_node_pool(
                parent="projects/proj-1/locations/us-east5-b/clusters/c",
                node_pool=cs.NodePool(
                    name=name,
                    initial_node_count=16,
                    locations=["us-east5-b"],
                    config=cs.NodeConfig(
                        machine_type="tpu7x-standard-4t",
                        reservation_affinity=cs.ReservationAffinity(
                            consume_reservation_type=cs.ReservationAffinity.Type.SPECIFIC_RESERVATION,
                            key="compute.googleapis.com/reservation-name",
                            values=["crd-res/reservationBlocks/b1"],
                        ),
                    ),
                    placement_policy=cs.NodePool.PlacementPolicy(policy_name="wp-cube"),
                ),
            )
        _until(lambda: all(c["nodesReady"] for c in sim.cubes()))
        custom.create_cluster_custom_object(G, V, P, slice_obj("crd-job-0", "4x4x8", ids))

        def state() -> str | None:
            return slices.state_of(custom.get_cluster_custom_object(G, V, P, "crd-job-0"))

        _until(lambda: state() == slices.ACTIVATING)
        _until(lambda: state() == slices.ACTIVE)
        obj = custom.get_cluster_custom_object(G, V, P, "crd-job-0")
        assert obj["metadata"]["finalizers"] == [slices.FINALIZER]
        labelled = core.list_node(label_selector=f"{slices.SLICE_LABEL}=crd-job-0").items
        assert len(labelled) == 32
        assert {n.metadata.labels[slices.GKE_TPU_TOPOLOGY] for n in labelled} == {"4x4x8"}
        sim.set_cube_state(ids[0], slices.UNHEALTHY)
        _until(lambda: state() == slices.FAILED)
        selector = f"cloud.google.com/gke-nodepool={pools[0]}"
        states = {n.metadata.labels[slices.PARTITION_STATE_LABEL] for n in core.list_node(
            label_selector=selector).items}  # fmt: skip
        assert states == {"UNHEALTHY"}
        custom.delete_cluster_custom_object(G, V, P, "crd-job-0")

        def gone() -> bool:
            try:
                custom.get_cluster_custom_object(G, V, P, "crd-job-0")
            except ApiException as err:
                return err.status == 404
            return False

        _until(gone)
        assert core.list_node(label_selector=f"{slices.SLICE_LABEL}=crd-job-0").items == []
    finally:
        sim.stop()
        gke.transport.close()
        for name in pools:
            nodes.delete_nodes(api, name)


def test_the_local_stack_runs_the_slice_controller_when_asked(kube_api: Any) -> None:
    from multislice_local.stack import PROJECT, LocalStack, StackOptions

    options = StackOptions(
        profile="api",
        start_operator=False,
        slice_controller=True,
        reservations={"stack-res": {"block-1": 2}},
    )
    stack = LocalStack(options, control_plane=kube_api).start()
    try:
        assert stack.sim is not None and stack.sim.slice_controller is not None
        cubes = stack.sim.cubes()
        assert [c["path"].rsplit("/reservationBlocks/")[0] for c in cubes] == [
            f"projects/{PROJECT}/reservations/stack-res"
        ] * 2
        client.CustomObjectsApi(stack.api).list_cluster_custom_object(G, V, P)  # served
    finally:
        stack.stop()
