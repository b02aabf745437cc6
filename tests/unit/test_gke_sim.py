"""The local GKE API simulator, driven by the real client library over REST and by raw HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1, tpu_v2
from google.cloud.container_v1.types import cluster_service as cs

from multislice_local.gke_sim import (
    Faults,
    GkeSimulator,
    InMemoryRegistrar,
    NodeGroup,
    SimConfig,
    default_offered_types,
)

ZONE = "us-east5-b"
CLUSTER = f"projects/p/locations/{ZONE}/clusters/c"
LOCATION = f"projects/p/locations/{ZONE}"
LATENCY = 0.2


def _options(url: str) -> dict[str, Any]:
    return {
        "credentials": AnonymousCredentials(),  # type: ignore[no-untyped-call]
        "transport": "rest",
        "client_options": {"api_endpoint": url},
    }


def gke_client(url: str) -> container_v1.ClusterManagerClient:
    return container_v1.ClusterManagerClient(**_options(url))


def tpu_client(url: str) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(**_options(url))


def close(client: Any) -> None:
    client.transport.close()


def wait_for(cond: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def tpu_pool(name: str = "pool-a", nodes: int = 4, topology: str | None = "4x4") -> cs.NodePool:
    pool = cs.NodePool(
        name=name,
        initial_node_count=nodes,
        locations=[ZONE],
        config=cs.NodeConfig(
            machine_type="ct5lp-hightpu-4t",
            spot=True,
            labels={"multislice.dev/job-uid": "u1"},
            resource_labels={"managed-by": "multislice-operator"},
        ),
    )
    if topology:
        pool.placement_policy = cs.NodePool.PlacementPolicy(
            type_=cs.NodePool.PlacementPolicy.Type.COMPACT, tpu_topology=topology
        )
    return pool


def admin(sim: GkeSimulator, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(sim.url + path, data=data, method=method)
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_create_provisioning_then_running_registers_nodes(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    # Held: a loaded machine once took longer than LATENCY between the create and the list.
    with sim.operations_held():
        op = gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
        assert op.status == cs.Operation.Status.RUNNING
        assert op.operation_type == cs.Operation.Type.CREATE_NODE_POOL
        assert op.target_link.endswith("/clusters/c/nodePools/pool-a")
        listed = gke.list_node_pools(parent=CLUSTER).node_pools
        assert [(p.name, p.status) for p in listed] == [("pool-a", cs.NodePool.Status.PROVISIONING)]
        assert registrar.node_count() == 0

    wait_for(lambda: sim.pool("pool-a")["status"] == "RUNNING")  # type: ignore[index]
    done = gke.get_operation(name=f"{LOCATION}/operations/{op.name}")
    assert done.status == cs.Operation.Status.DONE and not done.error.message
    group = registrar.groups["pool-a"]
    assert (group.count, group.topology, group.accelerator_label, group.chips_per_host) == (
        4,
        "4x4",
        "tpu-v5-lite-podslice",
        4,
    )
    assert group.labels["cloud.google.com/gke-nodepool"] == "pool-a"
    assert group.labels["cloud.google.com/gke-spot"] == "true"
    assert group.labels["multislice.dev/job-uid"] == "u1"
    # The pool as stored is what the client sent (enums as strings in responses).
    wire = sim.pool("pool-a")
    assert wire is not None
    assert wire["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
    assert wire["config"]["spot"] is True


def test_single_host_pool_gets_single_host_topology(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    pool = tpu_pool("single", nodes=1, topology=None)
    pool.config.machine_type = "ct6e-standard-8t"
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    wait_for(lambda: "single" in registrar.groups)
    group = registrar.groups["single"]
    assert (group.accelerator_label, group.topology, group.chips_per_host) == (
        "tpu-v6e-slice",
        "2x4",
        8,
    )


def test_delete_stopping_then_gone_and_nodes_removed(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    with sim.operations_held():  # while the operations run, however slow the machine
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
        # GKE names the running operation and the cluster, not the pool.
        with pytest.raises(gexc.BadRequest, match="currently creating a node pool for cluster c"):
            gke.delete_node_pool(name=f"{CLUSTER}/nodePools/pool-a")
    assert sim.wait_idle()
    with sim.operations_held():
        op = gke.delete_node_pool(name=f"{CLUSTER}/nodePools/pool-a")
        assert op.operation_type == cs.Operation.Type.DELETE_NODE_POOL
        assert gke.get_node_pool(name=f"{CLUSTER}/nodePools/pool-a").status.name == "STOPPING"
        with pytest.raises(gexc.BadRequest, match="currently deleting a node pool for cluster c"):
            gke.delete_node_pool(name=f"{CLUSTER}/nodePools/pool-a")
    assert sim.wait_idle()
    assert gke.list_node_pools(parent=CLUSTER).node_pools == []
    assert registrar.node_count() == 0
    assert registrar.events == [("register", "pool-a", 4), ("unregister", "pool-a", 4)]
    with pytest.raises(gexc.NotFound):
        gke.delete_node_pool(name=f"{CLUSTER}/nodePools/pool-a")


def test_create_existing_is_409(sim: GkeSimulator, gke: container_v1.ClusterManagerClient) -> None:
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    with pytest.raises(gexc.Conflict, match="Already exists"):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda p: setattr(p, "name", "Bad_Name"), "Invalid node pool name"),
        (lambda p: setattr(p.config, "machine_type", "ct9-mega-4t"), "Invalid machine type"),
        (lambda p: p.config.resource_labels.update({"job": "Has.Dots"}), "Invalid resource label"),
        (lambda p: setattr(p, "initial_node_count", 3), "needs initialNodeCount 4"),
        (lambda p: p.locations.append("us-east5-a"), "must be in one zone"),
    ],
)
def test_validation_errors_are_400(
    gke: container_v1.ClusterManagerClient, mutate: Callable[[cs.NodePool], None], match: str
) -> None:
    pool = tpu_pool()
    mutate(pool)
    with pytest.raises(gexc.BadRequest, match=match):
        gke.create_node_pool(parent=CLUSTER, node_pool=pool)


# ---------------------------------------------------------------- GKE's rules (issue 12)
# Each refusal below is one rule of GkeSimulator._validate, with its public source there.


def _shape(pool: cs.NodePool, machine: str, topology: str, nodes: int) -> None:
    pool.config.machine_type = machine
    pool.placement_policy.tpu_topology = topology
    pool.initial_node_count = nodes


def _label(key: str) -> Callable[[cs.NodePool], None]:
    return lambda p: p.config.labels.update({key: "x"})


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (_label("app.kubernetes.io/managed-by"), "Applying kubernetes label is not allowed"),
        (_label("node.k8s.io/x"), "Applying kubernetes label is not allowed"),
        (_label("kubernetes.io/role"), "Applying kubernetes label is not allowed"),
        (_label("cloud.google.com/gke-nodepool"), "reserved for GKE"),
        (_label("bad key/x"), "Invalid node label"),
        (lambda p: p.config.labels.update({"ok": "-bad-"}), "Invalid node label"),
        (lambda p: p.config.labels.update({"ok": "v" * 64}), "Invalid node label"),
        (lambda p: p.config.resource_labels.update({"Key": "v"}), "Invalid resource label"),
        (
            lambda p: p.config.resource_labels.update({f"k{i}": "v" for i in range(64)}),
            "Too many resource labels",
        ),
        (
            lambda p: setattr(p, "management", cs.NodeManagement(auto_repair=True)),
            "Auto_upgrade cannot be false when release_channel REGULAR is set",
        ),
        (
            lambda p: setattr(p, "management", cs.NodeManagement(auto_upgrade=True)),
            "Auto_repair cannot be false",
        ),
        # tpuTopology on one VM: v5e 2x2 on a 4t, 2x4 on an 8t
        (lambda p: _shape(p, "ct5lp-hightpu-4t", "2x2", 1), "single-host slice"),
        (lambda p: _shape(p, "ct5lp-hightpu-8t", "2x4", 1), "single-host slice"),
        (lambda p: _shape(p, "ct5lp-hightpu-4t", "4x4", 3), "needs initialNodeCount 4"),
        (lambda p: setattr(p.placement_policy, "tpu_topology", "2x2x4"), "Invalid TPU topology"),
        # Larger than the largest v5p slice, 16x16x24 (Cloud TPU "TPU v5p"; issue 54)
        (
            lambda p: _shape(p, "ct5p-hightpu-4t", "16x20x20", 1600),
            "Invalid TPU topology 16x20x20 for machine type ct5p-hightpu-4t",
        ),
        (lambda p: setattr(p.placement_policy, "tpu_topology", "4x2"), "Invalid TPU topology"),
        (
            lambda p: setattr(p.config, "machine_type", "ct5p-hightpu-4t"),
            "Invalid TPU topology 4x4 for machine type ct5p-hightpu-4t",
        ),
        (lambda p: setattr(p.config, "machine_type", "n2-standard-8"), "needs a TPU machine type"),
        (lambda p: p.config.oauth_scopes.append("storage-full"), "Invalid OAuth scope"),
        (
            lambda p: setattr(
                p.config,
                "workload_metadata_config",
                cs.WorkloadMetadataConfig(mode=cs.WorkloadMetadataConfig.Mode.GKE_METADATA),
            ),
            "Workload Identity must be enabled",
        ),
        (
            lambda p: setattr(
                p.config,
                "reservation_affinity",
                cs.ReservationAffinity(
                    consume_reservation_type=cs.ReservationAffinity.Type.SPECIFIC_RESERVATION,
                    key="compute.googleapis.com/reservation-name",
                    values=["Bad_Name"],
                ),
            ),
            "SPECIFIC_RESERVATION needs",
        ),
    ],
)
def test_gke_rules_refuse_through_the_client(
    gke: container_v1.ClusterManagerClient, mutate: Callable[[cs.NodePool], Any], match: str
) -> None:
    pool = tpu_pool()
    mutate(pool)
    with pytest.raises(gexc.BadRequest, match=match) as err:
        gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    assert err.value.response.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_one_zone_per_tpu_pool_even_single_host(gke: container_v1.ClusterManagerClient) -> None:
    pool = tpu_pool("single", nodes=2, topology=None)
    pool.locations.append("us-east5-a")
    with pytest.raises(gexc.BadRequest, match="must be in one zone"):
        gke.create_node_pool(parent=CLUSTER, node_pool=pool)


def test_what_gke_accepts_is_accepted(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    # The same requests, made valid: management on, shared reservation, user-settable GKE label,
    # single-host pools of several independent VMs, Workload Identity on a cluster that has it.
    pool = tpu_pool("ok-a")
    pool.management = cs.NodeManagement(auto_repair=True, auto_upgrade=True)
    pool.config.labels["cloud.google.com/gke-tpu-ici-resiliency"] = "false"
    pool.config.reservation_affinity = cs.ReservationAffinity(
        consume_reservation_type=cs.ReservationAffinity.Type.SPECIFIC_RESERVATION,
        key="compute.googleapis.com/reservation-name",
        values=["projects/owner-proj/reservations/tpu-res"],
    )
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool("ok-b", nodes=3, topology=None))
    sim.configure(workload_identity=True, release_channel=None)
    wi = tpu_pool("ok-c")
    wi.management = cs.NodeManagement(auto_repair=False, auto_upgrade=False)  # no channel
    wi.config.workload_metadata_config = cs.WorkloadMetadataConfig(
        mode=cs.WorkloadMetadataConfig.Mode.GKE_METADATA
    )
    gke.create_node_pool(parent=CLUSTER, node_pool=wi)
    assert sim.counters()["createsAccepted"] == 3


def test_a_tpu_pool_without_scopes_is_accepted_and_flagged(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    """GKE adds no scopes to a pool created without them (only logging and monitoring): it
    accepts the pool, whose nodes then cannot pull an image or write gs://. So does the
    simulator, and it says so."""
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool("bare"))
    assert sim.node_access("bare") == {"pullImages": False, "writeStorage": False}
    read_only = tpu_pool("read")
    read_only.config.oauth_scopes.append("https://www.googleapis.com/auth/devstorage.read_only")
    gke.create_node_pool(parent=CLUSTER, node_pool=read_only)
    assert sim.node_access("read") == {"pullImages": True, "writeStorage": False}
    assert sim.counters()["tpuPoolsWithoutStorageAccess"] == 2
    assert sim.counters()["createsAccepted"] == 2


def test_the_operators_workload_identity_pool_can_pull_and_write(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    """Issue 21: in Workload Identity mode the operator sent no scopes (fails on that code)."""
    from multislice_operator.planning.plan import load_job, plan_job
    from multislice_operator.provisioning.gke_requests import NodeOptions, build_node_pool

    sim.configure(workload_identity=True)
    plan = plan_job(
        load_job(
            {
                "apiVersion": "multislice.dev/v1alpha1",
                "kind": "MultisliceJob",
                "metadata": {"name": "wi"},
                "spec": {
                    "accelerator": "v5litepod-16",
                    "slices": 1,
                    "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
                },
            }
        )
    )
    pool = build_node_pool(
        plan, plan.node_pools[0], "uid", [ZONE], node=NodeOptions(workload_identity=True)
    )
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    assert sim.node_access(pool.name) == {"pullImages": True, "writeStorage": True}
    assert sim.counters()["tpuPoolsWithoutStorageAccess"] == 0


def test_quota_is_a_synchronous_403(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    sim.set_faults(quota_sync_next=1, permission_denied_next=1)
    with pytest.raises(
        gexc.Forbidden, match="Insufficient regional quota to satisfy request"
    ) as err:
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    body = err.value.response.json()["error"]
    assert body["status"] == "PERMISSION_DENIED" and "TPU_LITE_PODSLICE_V5" in body["message"]
    with pytest.raises(gexc.Forbidden, match="permission"):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    assert sim.pools() == {} and sim.counters()["createsAccepted"] == 0


def test_stockout_runs_long_and_blocks_deletes_meanwhile(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    sim.configure(op_latency_s=0.1, failed_create_latency_s=1.0)
    sim.set_faults(stockout_next=1)
    op = gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    assert sim.config.failed_create_latency() > sim.config.op_latency_s
    with pytest.raises(gexc.BadRequest, match=f"Operation {op.name} is currently creating a node"):
        gke.delete_node_pool(name=f"{CLUSTER}/nodePools/pool-a")
    assert sim.wait_idle()
    failed = gke.get_operation(name=f"{LOCATION}/operations/{op.name}")
    assert failed.error.message.startswith("Not all instances running in IGM after")
    assert "[GCE_STOCKOUT]" in failed.error.message
    gke.delete_node_pool(name=f"{CLUSTER}/nodePools/pool-a")  # accepted once the create ended


def test_cluster_upgrade_makes_pool_operations_wait(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool("before"))
    assert sim.wait_idle()
    upgrade = sim.start_cluster_upgrade(CLUSTER, duration_s=0.8)
    with pytest.raises(
        gexc.BadRequest, match=f"Operation {upgrade} is currently upgrading cluster c"
    ):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    with pytest.raises(gexc.BadRequest, match="currently upgrading cluster"):
        gke.delete_node_pool(name=f"{CLUSTER}/nodePools/before")
    assert sim.wait_idle()
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())


def test_serial_cluster_names_another_pools_delete(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    for name in ("p0", "p1"):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool(name))
    assert sim.wait_idle()
    sim.configure(max_concurrent_operations=1, op_latency_s=0.8)
    gke.delete_node_pool(name=f"{CLUSTER}/nodePools/p0")
    with pytest.raises(gexc.BadRequest, match="is currently deleting a node pool for cluster c"):
        gke.delete_node_pool(name=f"{CLUSTER}/nodePools/p1")
    assert sim.pool("p1")["status"] == "RUNNING"  # type: ignore[index]


def test_received_creates_are_the_wire_bodies(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    pool = tpu_pool()
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    [received] = sim.received_creates()
    assert received["parent"] == CLUSTER
    assert received["nodePool"]["placementPolicy"] == {"type": 1, "tpuTopology": "4x4"}


def test_unknown_cluster_is_404(registrar: InMemoryRegistrar) -> None:
    config = SimConfig(op_latency_s=LATENCY, clusters=[CLUSTER])
    with GkeSimulator(config, registrar=registrar) as sim:
        client = gke_client(sim.url)
        with pytest.raises(gexc.NotFound):
            client.list_node_pools(parent="projects/p/locations/us-east5-b/clusters/other")
        assert client.list_node_pools(parent=CLUSTER).node_pools == []
        close(client)


def test_stockout_on_kth_create_leaves_error_pool(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    sim.set_faults(stockout_on_create=[2])
    ops = [gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool(f"p{i}")) for i in range(3)]
    assert sim.wait_idle()
    pools = sim.pools()
    assert [pools[f"p{i}"]["status"] for i in range(3)] == ["RUNNING", "ERROR", "RUNNING"]
    assert "GCE_STOCKOUT" in pools["p1"]["statusMessage"]
    assert "does not have enough resources" in pools["p1"]["statusMessage"]
    failed = gke.get_operation(name=f"{LOCATION}/operations/{ops[1].name}")
    assert failed.status == cs.Operation.Status.DONE
    assert "GCE_STOCKOUT" in failed.error.message
    assert "p1" not in registrar.groups
    assert sim.counters()["injected"] == {"stockout": 1}


def test_quota_next_and_rollback_mode(registrar: InMemoryRegistrar) -> None:
    config = SimConfig(op_latency_s=LATENCY, failed_create_leaves_pool=False)
    with GkeSimulator(config, Faults(quota_next=1), registrar) as sim:
        client = gke_client(sim.url)
        op = client.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
        assert sim.wait_idle()
        assert sim.pools() == {}
        done = client.get_operation(name=f"{LOCATION}/operations/{op.name}")
        assert "GCE_QUOTA_EXCEEDED" in done.error.message
        assert len(client.list_operations(parent=LOCATION).operations) == 1
        close(client)


def test_http_faults_count_down(sim: GkeSimulator, gke: container_v1.ClusterManagerClient) -> None:
    sim.set_faults(http_429_next=2, http_5xx_next=1)
    with pytest.raises(gexc.TooManyRequests):
        gke.list_node_pools(parent=CLUSTER)
    with pytest.raises(gexc.TooManyRequests):
        gke.list_node_pools(parent=CLUSTER)
    # retry=None: the client's default retry would hide a 503 on list calls.
    with pytest.raises(gexc.ServiceUnavailable):
        gke.list_node_pools(parent=CLUSTER, retry=None)
    gke.list_node_pools(parent=CLUSTER)
    counters = sim.counters()
    assert counters["calls"]["list_node_pools"] == 4
    assert counters["responses"] == {"429": 2, "503": 1, "200": 1}


def test_incompatible_operation_conflict_mode(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    sim.configure(max_concurrent_operations=1, op_latency_s=0.8)
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool("p0"))
    with pytest.raises(gexc.BadRequest, match="incompatible operation") as err:
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool("p1"))
    assert err.value.response.json()["error"]["status"] == "FAILED_PRECONDITION"
    assert sim.wait_idle()
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool("p1"))
    assert sim.counters()["peakConcurrentOperations"] == 1


def test_concurrent_creates_by_default(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    sim.configure(op_latency_s=1.0)  # all four creates overlap even on a loaded machine
    for i in range(4):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool(f"p{i}"))
    assert sim.counters()["peakConcurrentOperations"] == 4
    assert sim.wait_idle()
    assert sim.counters()["livePools"] == 4


def test_preempt_removes_nodes_and_they_come_back(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    assert sim.wait_idle()
    sim.preempt("pool-a", recreate_after_s=None)
    assert registrar.node_count("pool-a") == 0
    assert sim.pool("pool-a")["status"] == "RUNNING"  # type: ignore[index]
    sim.preempt("pool-a", recreate_after_s=0.05)
    wait_for(lambda: registrar.node_count("pool-a") == 4)


def test_break_pool_sets_error(sim: GkeSimulator, gke: container_v1.ClusterManagerClient) -> None:
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    assert sim.wait_idle()
    sim.break_pool("pool-a", "repair failed")
    pool = gke.get_node_pool(name=f"{CLUSTER}/nodePools/pool-a")
    assert (pool.status.name, pool.status_message) == ("ERROR", "repair failed")


def test_accelerator_types_per_zone(sim: GkeSimulator) -> None:
    sim.set_offered("us-east5-a", ["v5p-8"])
    tpu = tpu_client(sim.url)
    default = [t.type_ for t in tpu.list_accelerator_types(parent="projects/p/locations/x-y1-z")]
    assert default == default_offered_types()
    assert {"v4-8", "v5litepod-16", "v5p-8", "v6e-256"} <= set(default)
    custom = list(tpu.list_accelerator_types(parent="projects/p/locations/us-east5-a"))
    assert [(t.type_, t.accelerator_configs[0].topology) for t in custom] == [("v5p-8", "2x2x1")]
    close(tpu)


def test_admin_http_api(sim: GkeSimulator, gke: container_v1.ClusterManagerClient) -> None:
    faults = admin(sim, "POST", "/_sim/faults", {"stockoutNext": 1, "http429Next": 1})
    assert (faults["stockoutNext"], faults["http429Next"]) == (1, 1)
    with pytest.raises(gexc.TooManyRequests):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    assert sim.wait_idle()
    state = admin(sim, "GET", "/_sim/state")
    assert [p["status"] for p in state["pools"]] == ["ERROR"]
    assert admin(sim, "GET", "/_sim/counters")["createsAccepted"] == 1
    assert admin(sim, "DELETE", "/_sim/faults")["stockoutNext"] == 0
    admin(sim, "POST", "/_sim/config", {"opLatencyS": 0.05})
    assert sim.config.op_latency_s == 0.05
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool("p2"))
    assert sim.wait_idle()
    assert admin(sim, "POST", "/_sim/pools/p2/break", {"message": "x"})["status"] == "ERROR"
    admin(sim, "POST", "/_sim/offered", {"z-a1-b": ["v6e-8"]})
    assert sim.config.offered["z-a1-b"] == ["v6e-8"]
    with pytest.raises(urllib.error.HTTPError) as err:
        admin(sim, "POST", "/_sim/faults", {"noSuchFault": 1})
    assert err.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as err:
        admin(sim, "POST", "/_sim/pools/missing/preempt", {})
    assert err.value.code == 404
    assert admin(sim, "POST", "/_sim/counters/reset")["calls"] == {}


def test_registrar_failure_marks_running_with_error(
    gke: container_v1.ClusterManagerClient, sim: GkeSimulator
) -> None:
    class Broken:
        def register(self, group: NodeGroup) -> None:
            raise RuntimeError("apiserver down")

        def unregister(self, pool: str) -> None:
            pass

    sim.registrar = Broken()
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    assert sim.wait_idle()
    pool = sim.pool("pool-a")
    assert pool is not None
    assert pool["status"] == "RUNNING_WITH_ERROR"
    assert "apiserver down" in pool["statusMessage"]


def test_cli_prints_url_and_serves() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "multislice_local.gke_sim",
            "--port",
            "0",
            "--op-latency",
            "0.1",
            "--stockout-next",
            "1",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/_sim/state", timeout=5) as response:
            assert json.loads(response.read())["faults"]["stockoutNext"] == 1
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


# ---------------------------------------------------------------- issue 24: Ironwood, flex-start,
# reservation blocks, the pod range. Each rule cites its source in GkeSimulator._validate and
# the create path; every test below fails on the simulator before issue 24.

REGION = "us-east5"


def compute_policies(url: str) -> Any:
    from google.cloud import compute_v1

    return compute_v1.ResourcePoliciesClient(**_options(url))


def tpu7x_pool(
    name: str = "iw-a", policy: str | None = "wp-4x4x4", topology: str = "4x4x4"
) -> cs.NodePool:
    pool = cs.NodePool(
        name=name,
        initial_node_count=16,
        locations=[ZONE],
        config=cs.NodeConfig(machine_type="tpu7x-standard-4t"),
        placement_policy=cs.NodePool.PlacementPolicy(policy_name=policy, tpu_topology=topology),
    )
    return pool


def insert_policy(sim: GkeSimulator, name: str = "wp-4x4x4", topology: str = "4x4x4") -> None:
    from google.cloud import compute_v1

    client = compute_policies(sim.url)
    client.insert(
        project="p",
        region=REGION,
        resource_policy_resource=compute_v1.ResourcePolicy(
            name=name,
            workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                type_="HIGH_THROUGHPUT", accelerator_topology=topology
            ),
        ),
    )
    wait_for(lambda: sim.policies().get(name, {}).get("status") == "READY")
    close(client)


def test_resource_policy_api_through_the_compute_client(sim: GkeSimulator) -> None:
    from google.cloud import compute_v1

    client = compute_policies(sim.url)
    with pytest.raises(gexc.NotFound):
        client.get(project="p", region=REGION, resource_policy="wp-4x4x4")
    insert_policy(sim)
    got = client.get(project="p", region=REGION, resource_policy="wp-4x4x4")
    assert got.workload_policy.type_ == "HIGH_THROUGHPUT"
    assert got.workload_policy.accelerator_topology == "4x4x4"
    ops = compute_v1.RegionOperationsClient(**_options(sim.url))
    [received] = sim.received_policy_inserts()
    assert received["region"] == REGION and received["project"] == "p"
    with pytest.raises(gexc.Conflict):
        client.insert(
            project="p",
            region=REGION,
            resource_policy_resource=compute_v1.ResourcePolicy(name="wp-4x4x4"),
        )
    # acceleratorTopology only with HIGH_THROUGHPUT (google_compute_resource_policy)
    with pytest.raises(gexc.BadRequest, match="HIGH_THROUGHPUT"):
        client.insert(
            project="p",
            region=REGION,
            resource_policy_resource=compute_v1.ResourcePolicy(
                name="wp-bad",
                workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
                    type_="HIGH_AVAILABILITY", accelerator_topology="4x4x4"
                ),
            ),
        )
    assert [p.name for p in client.list(project="p", region=REGION)] == ["wp-4x4x4"]
    close(client)
    close(ops)


def test_tpu7x_pool_needs_an_existing_workload_policy(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    with pytest.raises(gexc.BadRequest, match="Placement policy wp-4x4x4 was not found"):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu7x_pool())
    with pytest.raises(gexc.BadRequest, match=r"need placementPolicy\.policyName"):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu7x_pool(policy=None))
    insert_policy(sim)
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu7x_pool())
    wait_for(lambda: registrar.node_count("iw-a") == 16)
    group = registrar.groups["iw-a"]
    assert (group.accelerator_label, group.topology, group.chips_per_host) == ("tpu7x", "4x4x4", 4)
    # A policy in use is not deleted (GCE resourceInUseByAnotherResource).
    client = compute_policies(sim.url)
    with pytest.raises(gexc.BadRequest, match="already being used"):
        client.delete(project="p", region=REGION, resource_policy="wp-4x4x4")
    close(client)


def test_tpu7x_compact_placement_goes_to_error(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    pool = tpu7x_pool(policy=None)
    pool.placement_policy.type_ = cs.NodePool.PlacementPolicy.Type.COMPACT
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)  # accepted, then ERROR
    got = wait_for(lambda: (p := sim.pool("iw-a")) and p["status"] == "ERROR" and p)
    assert (
        "with placement policy is not supported. Use workload policy instead."
        in (got["statusMessage"])
    )
    assert registrar.node_count("iw-a") == 0


def test_workload_policy_of_another_topology_fails_the_create(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    insert_policy(sim, "wp-4x4x4", topology="4x4x8")
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu7x_pool())
    got = wait_for(lambda: (p := sim.pool("iw-a")) and p["status"] == "ERROR" and p)
    assert "does not match the TPU topology 4x4x4" in got["statusMessage"]


def test_reservation_blocks_and_sub_blocks_are_accepted(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    for i, value in enumerate(
        [
            "res/reservationBlocks/block-1",
            "projects/owner-proj/reservations/res/reservationBlocks/b/reservationSubBlocks/s-2",
        ]
    ):
        pool = tpu_pool(f"blk-{i}")
        pool.config.spot = False
        pool.config.reservation_affinity = cs.ReservationAffinity(
            consume_reservation_type=cs.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key="compute.googleapis.com/reservation-name",
            values=[value],
        )
        gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    bad = tpu_pool("blk-bad")
    bad.config.reservation_affinity = cs.ReservationAffinity(
        consume_reservation_type=cs.ReservationAffinity.Type.SPECIFIC_RESERVATION,
        key="compute.googleapis.com/reservation-name",
        values=["res/reservationSubBlocks/s"],
    )
    with pytest.raises(gexc.BadRequest, match="SPECIFIC_RESERVATION needs"):
        gke.create_node_pool(parent=CLUSTER, node_pool=bad)
    assert sim.counters()["createsAccepted"] == 2


def test_pod_range_limits_the_gang_by_max_pods_per_node(
    registrar: InMemoryRegistrar,
) -> None:
    # A /21 pod range (2,048 addresses) and a gang of three 4-node pools: at GKE's default 110
    # pods per node each node takes a /24 (256), 3,072 in all, and the third pool fails; at 15
    # each takes a /27 (32), 384 in all, and the gang fits.
    def gang(max_pods: int | None) -> list[dict[str, Any]]:
        config = SimConfig(op_latency_s=LATENCY, pod_range_prefix=21)
        with GkeSimulator(config, registrar=InMemoryRegistrar()) as sim:
            gke = gke_client(sim.url)
            for name in ("ip-a", "ip-b", "ip-c"):
                pool = tpu_pool(name)
                if max_pods:
                    pool.max_pods_constraint = cs.MaxPodsConstraint(max_pods_per_node=max_pods)
                gke.create_node_pool(parent=CLUSTER, node_pool=pool)
            assert sim.wait_idle(10)
            close(gke)
            return [sim.pools()[n] for n in ("ip-a", "ip-b", "ip-c")]

    default = gang(None)
    assert [p["status"] for p in default] == ["RUNNING", "RUNNING", "ERROR"]
    assert "[IP_SPACE_EXHAUSTED]" in default[2]["statusMessage"]
    assert default[0]["podIpv4CidrSize"] == 24
    small = gang(15)
    assert [p["status"] for p in small] == ["RUNNING"] * 3
    assert small[0]["podIpv4CidrSize"] == 27


def flex_pool(name: str = "flex-a", machine: str = "ct5lp-hightpu-4t") -> cs.NodePool:
    pool = tpu_pool(name)
    pool.config.spot = False
    pool.config.machine_type = machine
    pool.config.flex_start = True
    pool.config.max_run_duration = {"seconds": 3600}
    pool.initial_node_count = 0
    pool.autoscaling = cs.NodePoolAutoscaling(enabled=True, min_node_count=0, max_node_count=4)
    pool.management = cs.NodeManagement(auto_repair=False, auto_upgrade=True)
    return pool


def test_flex_start_pool_waits_then_runs_then_expires(
    registrar: InMemoryRegistrar,
) -> None:
    config = SimConfig(op_latency_s=LATENCY, flex_start_run_scale=0.0005)  # 1 h -> 1.8 s
    with GkeSimulator(config, Faults(flex_start_hold=1), registrar=registrar) as sim:
        gke = gke_client(sim.url)
        gke.create_node_pool(parent=CLUSTER, node_pool=flex_pool())
        # Waiting for capacity is RUNNING with no nodes, not an error.
        wait_for(lambda: (p := sim.pool("flex-a")) and p["status"] == "RUNNING")
        time.sleep(3 * LATENCY)
        assert registrar.node_count("flex-a") == 0 and "statusMessage" not in sim.pool("flex-a")
        sim.grant_flex_start("flex-a")
        assert registrar.node_count("flex-a") == 4
        wait_for(lambda: registrar.node_count("flex-a") == 0, timeout=10)  # max run duration
        assert sim.pool("flex-a")["status"] == "RUNNING"  # type: ignore[index]
        close(gke)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda p: setattr(p.config, "machine_type", "ct4p-hightpu-4t"), "not supported for"),
        (lambda p: setattr(p.config, "spot", True), "cannot be combined with spot"),
        (lambda p: setattr(p.config, "max_run_duration", {"seconds": 8 * 86400}), "7 days"),
        (lambda p: setattr(p, "initial_node_count", 4), "minNodeCount 0"),
        (
            lambda p: setattr(
                p.config,
                "reservation_affinity",
                cs.ReservationAffinity(
                    consume_reservation_type=cs.ReservationAffinity.Type.ANY_RESERVATION
                ),
            ),
            "NO_RESERVATION",
        ),
    ],
)
def test_flex_start_rules(
    gke: container_v1.ClusterManagerClient, mutate: Callable[[cs.NodePool], Any], match: str
) -> None:
    pool = flex_pool()
    mutate(pool)
    if pool.config.machine_type == "ct4p-hightpu-4t":
        pool.placement_policy.tpu_topology = "2x2x2"
        pool.autoscaling.max_node_count = 2
    with pytest.raises(gexc.BadRequest, match=match):
        gke.create_node_pool(parent=CLUSTER, node_pool=pool)


def test_cluster_version_gates_tpu7x_and_flex_start(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    cluster = gke.get_cluster(name=CLUSTER)
    assert cluster.current_master_version == sim.config.cluster_version
    sim.configure(cluster_version="1.32.4-gke.1000")
    insert_policy(sim)
    with pytest.raises(gexc.BadRequest, match=r"requires GKE version 1\.34\.0-gke\.2201000"):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu7x_pool())
    with pytest.raises(gexc.BadRequest, match=r"require GKE version 1\.33\.0-gke\.1712000"):
        gke.create_node_pool(parent=CLUSTER, node_pool=flex_pool())


def test_quota_names_follow_generation_and_provisioning_model(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    # v5e spot: the PREEMPTIBLE_ form; v6e on demand: the family quota (no TPU_V6E metric);
    # flex-start spends preemptible quota (Compute Engine "Provisioning models").
    cases = [
        (tpu_pool("q-a"), "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"),
        (flex_pool("q-b"), "PREEMPTIBLE_TPU_LITE_PODSLICE_V5"),
    ]
    v6e = tpu_pool("q-c")
    v6e.config.spot, v6e.config.machine_type = False, "ct6e-standard-4t"
    cases.append((v6e, "TPUS_PER_TPU_FAMILY"))
    for pool, metric in cases:
        sim.set_faults(quota_sync_next=1)
        with pytest.raises(gexc.Forbidden) as err:
            gke.create_node_pool(parent=CLUSTER, node_pool=pool)
        assert f'resource "{metric}"' in err.value.response.json()["error"]["message"]


def test_accelerator_types_never_list_tpu7x(sim: GkeSimulator) -> None:
    # "The Cloud TPU API is not supported on TPU7x and later TPU versions."
    assert not [t for t in default_offered_types() if t.startswith("tpu7x")]


def test_a_pool_created_again_gets_nodes_of_new_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """GKE names a pool's nodes after its instance group (gke-CLUSTER-POOL-<8 hex>-<4 chars>):
    a pool deleted and created again under its name has new VMs, and new node names. With the
    old names, pods bound to a deleted node looked bound to its namesake in the new pool: the
    NotReady mark the node lifecycle controller had put on the old node's pods stayed on a
    pod of the new, and a restart onto the replaced pool never ran (the NotReady replacement
    of tests/e2e/test_bad_input_holds_no_pools.py, under load)."""
    from multislice_local import gke_sim, nodes

    names: list[str] = []

    class Answer:
        def read(self) -> bytes:
            return b"{}"

    class Api:
        def create_node(self, body: dict[str, Any], _preload_content: bool = True) -> Answer:
            names.append(body["metadata"]["name"])
            return Answer()

    monkeypatch.setattr(nodes, "_api", lambda _: Api())
    group = gke_sim.NodeGroup(
        pool="msj-a-1", count=4, zone="z", machine_type="ct5lp-hightpu-4t",
        accelerator_label="tpu-v5-lite-podslice", topology="4x4", chips_per_host=4,
        spot=False, labels={}, user_labels={},
    )  # fmt: skip
    registrar = gke_sim.KubeNodeRegistrar(object())
    registrar.register(group)
    first = list(names)
    registrar.register(group)
    again = names[len(first) :]
    assert len(first) == len(again) == 4 and len(set(first + again)) == 8, (first, again)
    assert all(n.startswith("msj-a-1-") for n in first + again)


def test_nodes_register_through_one_client_per_kubeconfig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The registrar of a kubeconfig path builds its API client once, not once per pool: a
    client per call read the kubeconfig and opened a new TLS connection for each of a gang's
    256 pools, on the simulator's one worker thread (its 256 operations finished about 0.8 s
    after one did; the gang benchmark's ratio is the simulated cloud's time)."""
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    from multislice_local import gke_sim, nodes

    built: list[str] = []

    def new_client(config_file: str) -> kclient.ApiClient:
        built.append(config_file)
        return kclient.ApiClient(kclient.Configuration())

    seen: list[kclient.ApiClient] = []

    def api(target: Any) -> Any:
        assert isinstance(target, kclient.ApiClient), target
        seen.append(target)

        class Api:
            def create_node(self, body: dict[str, Any], _preload_content: bool = True) -> Any:
                return type("A", (), {"read": lambda self: b"{}"})()

            def list_node(self, **_: Any) -> Any:
                return type("L", (), {"items": []})()

        return Api()

    monkeypatch.setattr(kconfig, "new_client_from_config", new_client)
    monkeypatch.setattr(nodes, "_api", api)
    kubeconfig = tmp_path / "kubeconfig"
    registrar = gke_sim.KubeNodeRegistrar(str(kubeconfig))
    for i in range(5):
        group = gke_sim.NodeGroup(
            pool=f"msj-a-{i}", count=2, zone="z", machine_type="ct5lp-hightpu-4t",
            accelerator_label="tpu-v5-lite-podslice", topology="4x4", chips_per_host=4,
            spot=False, labels={}, user_labels={},
        )  # fmt: skip
        registrar.register(group)
    registrar.label("msj-a-0", {"x": "y"})
    assert built == [str(kubeconfig)], built
    assert len(seen) >= 6 and len({id(c) for c in seen}) == 1, seen


def test_a_failed_node_removal_keeps_the_pool_stopping_until_its_nodes_are_gone(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    """A delete whose node removal fails (the apiserver answered an error) is retried, as GKE's
    instance group retries deleting its VMs: the pool leaves the list only once its nodes are
    gone. Before, the pool went and its nodes stayed: the fake TPU nodes a CI run found left
    after the demo's delete scenario (tests/e2e/test_demo.py) are what that leaves."""

    class Flaky(InMemoryRegistrar):
        def __init__(self) -> None:
            super().__init__()
            self.failures = 2

        def unregister(self, pool: str) -> None:
            if self.failures:
                self.failures -= 1
                raise RuntimeError("etcdserver: request timed out")
            super().unregister(pool)

    registrar = Flaky()
    sim.registrar = registrar
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu_pool())
    assert sim.wait_idle()
    assert registrar.node_count("pool-a") == 4
    op = gke.delete_node_pool(name=f"{CLUSTER}/nodePools/pool-a")
    listed: list[tuple[str, int]] = []  # (pool status, nodes) while the pool is listed
    while sim.pool("pool-a") is not None:
        pool = sim.pool("pool-a")
        if pool is not None:
            listed.append((pool["status"], registrar.node_count("pool-a")))
        time.sleep(0.01)
    assert registrar.node_count("pool-a") == 0, "the pool went, its nodes stayed"
    assert registrar.failures == 0 and {s for s, _ in listed} == {"STOPPING"}, listed
    done = gke.get_operation(name=f"{LOCATION}/operations/{op.name}")
    assert done.status == cs.Operation.Status.DONE and not done.error.message


def test_a_pod_that_cannot_be_shut_down_does_not_keep_its_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node shutdown fails the pods it can and the node goes anyway, as GKE deletes a VM after
    the grace period whatever its pods did: one refused status patch (422) once made the whole
    node removal fail."""
    from types import SimpleNamespace as NS

    from kubernetes import client as kclient

    from multislice_local import gke_sim, nodes

    deleted: list[str] = []
    patched: list[str] = []

    def pod(name: str) -> Any:
        container = NS(name="main", image="i")
        return NS(
            metadata=NS(name=name, namespace="ns"),
            status=NS(phase="Running"),
            spec=NS(containers=[container]),
        )

    class Api:
        def list_node(self, label_selector: str) -> Any:
            return NS(items=[NS(metadata=NS(name="n-0")), NS(metadata=NS(name="n-1"))])

        def list_pod_for_all_namespaces(self, field_selector: str) -> Any:
            node = field_selector.split("=")[1]
            return NS(items=[pod(f"{node}-a"), pod(f"{node}-b")])

        def patch_namespaced_pod_status(self, name: str, ns: str, body: Any) -> None:
            if name == "n-0-a":
                raise kclient.ApiException(status=422, reason="Unprocessable Entity")
            patched.append(name)

        def delete_node(self, name: str) -> None:
            if name == "n-1":
                raise kclient.ApiException(status=404, reason="Not Found")  # gone meanwhile
            deleted.append(name)

    monkeypatch.setattr(nodes, "_api", lambda _: Api())
    registrar = gke_sim.KubeNodeRegistrar(object())
    registrar.unregister("pool")
    assert patched == ["n-0-b", "n-1-a", "n-1-b"]
    assert registrar.shut_down == ["ns/n-0-b", "ns/n-1-a", "ns/n-1-b"]
    assert deleted == ["n-0"]
