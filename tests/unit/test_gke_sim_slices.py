"""The GKE simulator against issue 41: rules matched to their sources, workload-policy inserts
that race, and dynamic slicing (sub-blocks, the Slice controller)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import container_v1

from multislice_local import slices
from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from multislice_local.slices import InMemorySliceStore, SliceAdmissionError
from tests.unit.test_gke_sim import (
    CLUSTER,
    LATENCY,
    REGION,
    close,
    compute_policies,
    gke_client,
    insert_policy,
    tpu7x_pool,
    tpu_pool,
    wait_for,
)

# ---------------------------------------------------------------- rules matched to their sources


def test_tpu7x_pool_naming_only_its_workload_policy_is_accepted(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    """GKE's Ironwood guides and xpk create multi-host tpu7x pools with the workload policy
    alone: the policy's accelerator topology replaces tpuTopology (xpk nodepool.py: "--tpu-topology
    should also not be passed when workload policy is used"). The slice is the policy's."""
    insert_policy(sim, "wp-4x4x8", topology="4x4x8")
    pool = tpu7x_pool("iw-policy-only", policy="wp-4x4x8", topology="")
    pool.initial_node_count = 32
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    wait_for(lambda: registrar.node_count("iw-policy-only") == 32)
    group = registrar.groups["iw-policy-only"]
    assert (group.topology, group.chips_per_host) == ("4x4x8", 4)
    assert sim.pool("iw-policy-only")["status"] == "RUNNING"  # type: ignore[index]


def test_tpu7x_pool_of_the_wrong_size_for_its_policy_is_refused(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    insert_policy(sim, "wp-4x4x8", topology="4x4x8")
    pool = tpu7x_pool("iw-short", policy="wp-4x4x8", topology="")
    pool.initial_node_count = 16
    with pytest.raises(gexc.BadRequest, match="needs initialNodeCount 32"):
        gke.create_node_pool(parent=CLUSTER, node_pool=pool)


def test_networking_dra_driver_label_is_accepted(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    """xpk creates v6e pools with --accelerator-network-profile=auto
    --node-labels=cloud.google.com/gke-networking-dra-driver=true (src/xpk/core/nodepool.py)."""
    pool = tpu_pool("v6e-dra")
    pool.config.machine_type = "ct6e-standard-4t"
    pool.config.labels["cloud.google.com/gke-networking-dra-driver"] = "true"
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    wait_for(lambda: registrar.node_count("v6e-dra") == 4)
    assert registrar.groups["v6e-dra"].labels["cloud.google.com/gke-networking-dra-driver"] == (
        "true"
    )


def test_max_run_duration_is_accepted_outside_flex_start(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    """NodeConfig.max_run_duration: "The maximum duration for the nodes to exist. If unspecified,
    the nodes can exist indefinitely." (container v1 API); nothing ties it to flex-start."""
    pool = tpu_pool("bounded")
    pool.config.max_run_duration = timedelta(hours=4)
    gke.create_node_pool(parent=CLUSTER, node_pool=pool)
    assert sim.counters()["createsAccepted"] == 1
    [received] = sim.received_creates()
    assert received["nodePool"]["config"]["maxRunDuration"] == "14400s"


@pytest.mark.parametrize("duration", [timedelta(0), timedelta(seconds=-5)])
def test_max_run_duration_must_be_positive(
    gke: container_v1.ClusterManagerClient, duration: timedelta
) -> None:
    pool = tpu_pool("bounded")
    pool.config.max_run_duration = duration
    with pytest.raises(gexc.BadRequest, match="maxRunDuration"):
        gke.create_node_pool(parent=CLUSTER, node_pool=pool)


# ---------------------------------------------------------------- workload-policy inserts that race


def _policy_body(name: str = "wp-4x4x4") -> Any:
    from google.cloud import compute_v1

    return compute_v1.ResourcePolicy(
        name=name,
        workload_policy=compute_v1.ResourcePolicyWorkloadPolicy(
            type_="HIGH_THROUGHPUT", accelerator_topology="4x4x4"
        ),
    )


def test_insert_of_a_name_being_created_is_409(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    """Compute Engine reserves the name at insert: a second insert of it while the first one's
    operation runs is 409 alreadyExists, as for any GCE insert of a name in use
    (piercefreeman/cloud-gpu-reliability#5: "The GCE API returns a 409 error on instances.insert
    when the name is already in use ... due to calling insert twice in the same second"). Until
    its operation is DONE the policy reads as CREATING (ResourcePolicy.status) and cannot place a
    node pool."""
    sim.configure(policy_latency_s=1.0)
    client = compute_policies(sim.url)
    client.insert(project="p", region=REGION, resource_policy_resource=_policy_body())
    with pytest.raises(gexc.Conflict, match="already exists"):
        client.insert(project="p", region=REGION, resource_policy_resource=_policy_body())
    assert client.get(project="p", region=REGION, resource_policy="wp-4x4x4").status == "CREATING"
    with pytest.raises(gexc.BadRequest, match="not ready"):
        gke.create_node_pool(parent=CLUSTER, node_pool=tpu7x_pool())
    wait_for(lambda: sim.policies()["wp-4x4x4"]["status"] == "READY")
    assert sim.counters()["policyInsertsAccepted"] == 1
    gke.create_node_pool(parent=CLUSTER, node_pool=tpu7x_pool())
    close(client)


def test_two_tpu7x_jobs_of_one_shape_started_together_share_one_policy(
    sim: GkeSimulator, registrar: InMemoryRegistrar
) -> None:
    """The operator creates the workload policy for both jobs at once: one insert wins, the other
    is answered 409 and waits for the policy ("exists, wait for it"), with no permanent error and
    no pool created on a policy that is not ready; both gangs then come up."""
    from multislice_operator.common.pools import PoolState
    from multislice_operator.provisioning.gke import GkeProvisioner
    from tests.integration.test_gke_provisioner import (
        CLUSTER as PCLUSTER,
    )
    from tests.integration.test_gke_provisioner import (
        FAST_RETRY,
        PROJECT,
        UID,
        ironwood_plan,
        until,
    )
    from tests.integration.test_gke_provisioner import (
        ZONE as PZONE,
    )

    # Long enough that both first passes meet the insert in flight on a busy machine.
    sim.configure(policy_latency_s=3.0)
    prov = GkeProvisioner.from_endpoint(sim.url, PROJECT, PZONE, PCLUSTER, retry=FAST_RETRY)
    plans = [ironwood_plan("iw-a"), ironwood_plan("iw-b")]

    async def start_together_then_reconcile() -> list[list[Any]]:
        first = await asyncio.gather(*(prov.create(p, p.node_pools, UID) for p in plans))
        passes = [[e for r in first for e in r.errors]]
        for _ in range(300):  # the next reconcile passes, as the operator requeues (<= 30 s)
            if not passes[-1]:
                break
            await asyncio.sleep(0.1)
            results = await asyncio.gather(*(prov.create(p, p.node_pools, UID) for p in plans))
            passes.append([e for r in results for e in r.errors])
        for p in plans:
            await until(prov, p, {PoolState.READY})
        return passes

    try:
        passes = asyncio.run(start_together_then_reconcile())
    finally:
        prov.close()
    # Both jobs tried (the second answered 409 and waited), or, where the first insert was
    # already in flight when the second job looked, the second found it creating and waited:
    # which one depends on the interleaving, not on the operator.
    assert len(sim.received_policy_inserts()) in (1, 2)
    assert sim.counters()["policyInsertsAccepted"] == 1  # one was created (a second: 409)
    assert not any(e.permanent for errors in passes for e in errors), passes
    assert passes[-1] == []
    refused = [r for r in sim.counters()["responses"] if r.startswith("400")]
    assert refused == []  # no pool create was sent before its policy was ready
    assert [registrar.node_count(p.name) for plan in plans for p in plan.node_pools] == [16] * 4


# ---------------------------------------------------------------- dynamic slicing: sub-blocks

RES = "projects/p/reservations/iw-res"


@pytest.fixture
def dyn(registrar: InMemoryRegistrar) -> Iterator[GkeSimulator]:
    """A simulator serving Slices from memory, with one All Capacity reservation of two blocks
    (block-1: 3 sub-blocks, block-2: 1) and the PROVISION_ONLY 4x4x4 workload policy."""
    config = SimConfig(op_latency_s=LATENCY, slice_activation_s=0.2, slice_sync_s=0.05)
    with GkeSimulator(config, registrar=registrar, slice_store=InMemorySliceStore()) as s:
        s.add_reservation("iw-res", {"block-1": 3, "block-2": 1})
        s.add_policy(
            "p",
            REGION,
            {
                "name": "wp-cube",
                "workloadPolicy": {
                    "type": "HIGH_THROUGHPUT",
                    "acceleratorTopology": "4x4x4",
                    "acceleratorTopologyMode": "PROVISION_ONLY",
                },
            },
        )
        yield s


@pytest.fixture
def dgke(dyn: GkeSimulator) -> Iterator[container_v1.ClusterManagerClient]:
    client = gke_client(dyn.url)
    yield client
    close(client)


def cube_pool(name: str, target: str = "iw-res/reservationBlocks/block-1") -> Any:
    """A sub-block node pool as GKE's guide creates it: tpu7x-standard-4t, 16 nodes, the
    PROVISION_ONLY policy, no tpuTopology, a specific reservation block or sub-block."""
    from google.cloud.container_v1.types import cluster_service as cs

    pool = tpu7x_pool(name, policy="wp-cube", topology="")
    pool.config.reservation_affinity = cs.ReservationAffinity(
        consume_reservation_type=cs.ReservationAffinity.Type.SPECIFIC_RESERVATION,
        key="compute.googleapis.com/reservation-name",
        values=[target],
    )
    return pool


def make_cubes(
    sim: GkeSimulator, dgke: container_v1.ClusterManagerClient, names: list[str]
) -> dict[str, str]:
    """Create sub-block pools and wait for them: pool name -> partition ID of its nodes."""
    for name in names:
        dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool(name))
    wait_for(lambda: all(c["nodesReady"] for c in sim.cubes() if c["pool"] in names))
    return {c["pool"]: c["partitionId"] for c in sim.cubes() if c["pool"] in names}


def test_a_sub_block_pool_takes_one_cube_and_its_nodes_carry_it(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    ids = make_cubes(dyn, dgke, ["cube-a", "cube-b"])
    assert len(set(ids.values())) == 2 and all(len(p) == 32 for p in ids.values())
    for pool, pid in ids.items():
        group = registrar.groups[pool]
        assert group.count == slices.VMS_PER_CUBE == 16
        assert (group.topology, group.accelerator_label) == ("4x4x4", "tpu7x")
        assert group.labels[slices.PARTITION_ID_LABEL] == pid
        assert group.labels[slices.PARTITION_STATE_LABEL] == "HEALTHY"
        assert group.labels[slices.TOPOLOGY_MODE_LABEL] == "PROVISION_ONLY"
        assert group.labels[slices.BLOCK_LABEL] == "block-1"
    # Aimed at one sub-block: that one.
    target = "iw-res/reservationBlocks/block-2/reservationSubBlocks/block-2-sb-0"
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-c", target))
    wait_for(lambda: registrar.node_count("cube-c") == 16)
    assert registrar.groups["cube-c"].labels[slices.SUBBLOCK_LABEL] == "block-2-sb-0"


def test_more_cubes_than_the_reservation_holds_fail(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    """block-1 has 3 sub-blocks: a 4th pool aimed at it fails (its instance group cannot place
    the VMs) and holds nothing; once a pool is deleted its sub-block is free again."""
    make_cubes(dyn, dgke, ["cube-a", "cube-b", "cube-c"])
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-d"))
    got = wait_for(lambda: (p := dyn.pool("cube-d")) and p["status"] == "ERROR" and p)
    assert "has no free sub-block" in got["statusMessage"]
    assert f"{RES}/reservationBlocks/block-1" in got["statusMessage"]
    assert registrar.node_count("cube-d") == 0
    assert [c["pool"] for c in dyn.cubes() if c["block"] == "block-1"] == [
        "cube-a",
        "cube-b",
        "cube-c",
    ]
    taken = "iw-res/reservationBlocks/block-1/reservationSubBlocks/block-1-sb-0"
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-e", taken))
    wait_for(lambda: (p := dyn.pool("cube-e")) and p["status"] == "ERROR")
    dgke.delete_node_pool(name=f"{CLUSTER}/nodePools/cube-b")
    wait_for(lambda: dyn.pool("cube-b") is None)
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-f"))
    wait_for(lambda: registrar.node_count("cube-f") == 16)


def test_a_pool_aimed_at_the_block_gets_a_healthy_sub_block(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    """A cube that went UNHEALTHY under a pool that is then deleted is not handed out again to a
    pool aimed at the block (what the operator counts on to replace it); aimed at it, it is."""
    ids = make_cubes(dyn, dgke, ["cube-a", "cube-b"])
    dyn.set_cube_state(ids["cube-a"], slices.UNHEALTHY)
    dgke.delete_node_pool(name=f"{CLUSTER}/nodePools/cube-a")
    wait_for(lambda: dyn.pool("cube-a") is None)
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-c"))
    wait_for(lambda: registrar.node_count("cube-c") == 16)
    got = {c["pool"]: c for c in dyn.cubes() if c["block"] == "block-1"}
    assert got["cube-c"]["partitionId"] != ids["cube-a"]
    assert registrar.groups["cube-c"].labels[slices.PARTITION_STATE_LABEL] == "HEALTHY"
    # block-1's 3 sub-blocks: b, c and the unhealthy one; aimed at the block, a 4th pool fails.
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-d"))
    wait_for(lambda: (p := dyn.pool("cube-d")) and p["status"] == "ERROR")
    broken = next(c for c in dyn.cubes() if c["partitionId"] == ids["cube-a"])
    assert broken["pool"] is None
    aimed = f"iw-res/reservationBlocks/block-1/reservationSubBlocks/{broken['subBlock']}"
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-e", aimed))
    wait_for(lambda: registrar.node_count("cube-e") == 16)


def test_a_provision_only_policy_must_be_one_cube(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient
) -> None:
    dyn.add_policy(
        "p",
        REGION,
        {
            "name": "wp-big",
            "workloadPolicy": {
                "type": "HIGH_THROUGHPUT",
                "acceleratorTopology": "4x4x8",
                "acceleratorTopologyMode": "PROVISION_ONLY",
            },
        },
    )
    pool = cube_pool("cube-big")
    pool.placement_policy.policy_name = "wp-big"
    pool.initial_node_count = 32
    with pytest.raises(gexc.BadRequest, match="must be 4x4x4"):
        dgke.create_node_pool(parent=CLUSTER, node_pool=pool)


# ---------------------------------------------------------------- dynamic slicing: Slices


def slice_obj(
    name: str, partition_ids: list[str], topology: str = "4x4x8", **annotations: str
) -> dict[str, Any]:
    return {
        "apiVersion": "accelerator.gke.io/v1beta1",
        "kind": "Slice",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "tpu7x", "topology": topology, "partitionIds": partition_ids},
    }


def store_of(sim: GkeSimulator) -> InMemorySliceStore:
    assert sim.slice_controller is not None
    store = sim.slice_controller.store
    assert isinstance(store, InMemorySliceStore)
    return store


def state(sim: GkeSimulator, name: str) -> str | None:
    obj = store_of(sim).get(name)
    return slices.state_of(obj) if obj is not None else None


def test_a_slice_activates_pins_its_nodes_follows_its_cubes_and_releases_them(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    ids = make_cubes(dyn, dgke, ["cube-a", "cube-b"])
    store = store_of(dyn)
    store.create(slice_obj("job-0", [ids["cube-a"], ids["cube-b"]]))
    wait_for(lambda: state(dyn, "job-0") == slices.ACTIVATING)
    assert slices.SLICE_LABEL not in registrar.groups["cube-a"].labels  # not formed yet
    wait_for(lambda: state(dyn, "job-0") == slices.ACTIVE)
    obj = store.get("job-0")
    assert obj is not None and obj["metadata"]["finalizers"] == [slices.FINALIZER]
    [ready] = obj["status"]["conditions"]
    assert (ready["type"], ready["status"]) == ("Ready", "True")
    for pool in ("cube-a", "cube-b"):
        labels = registrar.groups[pool].labels
        assert labels[slices.SLICE_LABEL] == "job-0"
        assert labels[slices.GKE_TPU_TOPOLOGY] == "4x4x8"
    # A degraded cube: usable, ACTIVE_DEGRADED (Ready stays True); healthy again: ACTIVE.
    dyn.set_cube_state(ids["cube-b"], slices.DEGRADED)
    assert registrar.groups["cube-b"].labels[slices.PARTITION_STATE_LABEL] == "DEGRADED"
    wait_for(lambda: state(dyn, "job-0") == slices.ACTIVE_DEGRADED)
    dyn.set_cube_state("cube-b", slices.HEALTHY)  # by pool name
    wait_for(lambda: state(dyn, "job-0") == slices.ACTIVE)
    # A failed cube: FAILED, Ready False, and it stays so until the Slice is deleted.
    dyn.set_cube_state(ids["cube-a"], slices.UNHEALTHY)
    wait_for(lambda: state(dyn, "job-0") == slices.FAILED)
    obj = store.get("job-0")
    assert obj is not None and obj["status"]["conditions"][0]["status"] == "False"
    dyn.set_cube_state(ids["cube-a"], slices.HEALTHY)
    time.sleep(0.3)
    assert state(dyn, "job-0") == slices.FAILED
    store.delete("job-0")
    wait_for(lambda: store.get("job-0") is None)
    for pool in ("cube-a", "cube-b"):
        labels = registrar.groups[pool].labels
        assert slices.SLICE_LABEL not in labels
        assert labels[slices.GKE_TPU_TOPOLOGY] == "4x4x4"
    # The partitions are free: another Slice forms on them.
    store.create(slice_obj("job-1", [ids["cube-b"], ids["cube-a"]]))
    wait_for(lambda: state(dyn, "job-1") == slices.ACTIVE)


def test_a_deleted_slice_deactivates_and_a_stuck_one_waits_for_its_finalizer(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    """Deleting shows DEACTIVATING (its cube still held) before the Slice goes; one GKE's
    troubleshooting page would call stuck stays DEACTIVATING until its finalizer is removed, as
    GKE's guide deletes a Slice (issue 54, point 3)."""
    ids = make_cubes(dyn, dgke, ["cube-a"])
    store = store_of(dyn)
    store.create(slice_obj("going", [ids["cube-a"]], topology="4x4x4"))
    wait_for(lambda: state(dyn, "going") == slices.ACTIVE)
    dyn.set_slice_stuck("going")
    store.delete("going")
    wait_for(lambda: state(dyn, "going") == slices.DEACTIVATING)
    assert slices.SLICE_LABEL not in registrar.groups["cube-a"].labels
    store.create(slice_obj("next", [ids["cube-a"]], topology="4x4x4"))
    wait_for(lambda: state(dyn, "next") == slices.SLICE_CREATION_FAILED)  # still held
    for _ in range(5):
        dyn.sync_slices()
    assert state(dyn, "going") == slices.DEACTIVATING  # stuck: it never goes by itself
    store.set_finalizer("going", False)  # what GKE's guide (and the operator) does
    assert store.get("going") is None
    store.delete("next")
    wait_for(lambda: store.get("next") is None)
    store.create(slice_obj("again", [ids["cube-a"]], topology="4x4x4"))
    wait_for(lambda: state(dyn, "again") == slices.ACTIVE)  # the cube is free again
    # Not stuck: DEACTIVATING, then gone.
    store.delete("again")
    wait_for(lambda: store.get("again") is None)


def test_one_slices_failing_call_does_not_hold_up_the_others(
    dyn: GkeSimulator,
    dgke: container_v1.ClusterManagerClient,
    registrar: InMemoryRegistrar,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass that fails on one Slice (its nodes' labels cannot be written) still deactivates
    and releases the Slices after it: one error stopped the whole pass, every pass."""
    ids = make_cubes(dyn, dgke, ["cube-a", "cube-b"])
    store = store_of(dyn)
    store.create(slice_obj("first", [ids["cube-a"]], topology="4x4x4"))
    store.create(slice_obj("second", [ids["cube-b"]], topology="4x4x4"))
    wait_for(lambda: state(dyn, "first") == state(dyn, "second") == slices.ACTIVE)
    label = registrar.label

    def broken(pool: str, labels: dict[str, str | None]) -> None:
        if pool == "cube-a":
            raise RuntimeError("the API server refused")
        label(pool, labels)

    monkeypatch.setattr(registrar, "label", broken)
    store.delete("first")
    store.delete("second")
    wait_for(lambda: store.get("second") is None)
    assert state(dyn, "first") == slices.ACTIVE  # its deletion waits for its nodes' labels
    assert dyn.slice_controller is not None
    done = [(name, what) for _, name, what in dyn.slice_controller.history if name == "second"]
    assert done[-2:] == [("second", slices.DEACTIVATING), ("second", "finalizer removed")]
    monkeypatch.setattr(registrar, "label", label)
    wait_for(lambda: store.get("first") is None)
    assert slices.SLICE_LABEL not in registrar.groups["cube-a"].labels


def test_formation_failures_are_reported_as_gke_reports_them(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient
) -> None:
    ids = make_cubes(dyn, dgke, ["cube-a", "cube-b"])
    target = "iw-res/reservationBlocks/block-2/reservationSubBlocks/block-2-sb-0"
    dgke.create_node_pool(parent=CLUSTER, node_pool=cube_pool("cube-x", target))
    wait_for(lambda: any(c["nodesReady"] for c in dyn.cubes() if c["pool"] == "cube-x"))
    other_block = next(c["partitionId"] for c in dyn.cubes() if c["pool"] == "cube-x")
    idle = next(c["partitionId"] for c in dyn.cubes() if c["pool"] is None)
    store = store_of(dyn)
    store.create(slice_obj("owner", [ids["cube-a"]], topology="4x4x4"))
    wait_for(lambda: state(dyn, "owner") == slices.ACTIVE)
    cases = {
        # the count must be A*B*C/64
        "too-few": ([ids["cube-b"]], "4x4x8", slices.SLICE_CREATION_FAILED, "needs 2"),
        # a partition of another Slice
        "busy": ([ids["cube-b"], ids["cube-a"]], "4x4x8", slices.SLICE_CREATION_FAILED, "owner"),
        # a sub-block with no node pool: no nodes
        "no-nodes": ([idle], "4x4x4", slices.SLICE_CREATION_FAILED, idle),
        # partitions of two blocks
        "two-blocks": ([ids["cube-b"], other_block], "4x4x8", slices.FAILED, "same reservation"),
    }
    for name, (pids, topology, _, _) in cases.items():
        store.create(slice_obj(name, pids, topology))
    for name, (_, _, want, words) in cases.items():
        wait_for(lambda n=name, w=want: state(dyn, n) == w)  # type: ignore[misc]
        obj = store.get(name)
        assert obj is not None and words in obj["status"]["conditions"][0]["message"]


def test_retry_on_failure_forms_the_slice_once_its_partition_is_free(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient
) -> None:
    ids = make_cubes(dyn, dgke, ["cube-a"])
    store = store_of(dyn)
    store.create(slice_obj("first", [ids["cube-a"]], topology="4x4x4"))
    wait_for(lambda: state(dyn, "first") == slices.ACTIVE)
    store.create(
        slice_obj("second", [ids["cube-a"]], topology="4x4x4", **{slices.RETRY_ANNOTATION: "true"})
    )
    wait_for(lambda: state(dyn, "second") == slices.SLICE_CREATION_FAILED)
    store.delete("first")
    wait_for(lambda: state(dyn, "second") == slices.ACTIVE)


@pytest.mark.parametrize(
    ("name", "topology", "kind", "words"),
    [
        ("a" * 50, "4x4x8", "tpu7x", "49 characters or fewer"),
        ("Upper", "4x4x8", "tpu7x", "must match"),
        ("ok", "4x8x4", "tpu7x", "non-decreasing"),
        ("ok", "4x4x6", "tpu7x", "multiple of 4"),
        ("ok", "2x2x2", "tpu7x", "multiple of 4"),  # sub-slicing: not modelled, refused
        ("ok", "4x4", "tpu7x", "multiple of 4"),
        ("ok", "16x24x28", "tpu7x", "at most 9216 chips"),  # 10,752 chips
        ("ok", "4x4x8", "v6e", "spec.type must be tpu7x"),
    ],
)
def test_what_gkes_webhook_refuses_is_refused(
    name: str, topology: str, kind: str, words: str
) -> None:
    obj = slice_obj(name, ["p0"], topology)
    obj["spec"]["type"] = kind
    with pytest.raises(SliceAdmissionError, match=words):
        InMemorySliceStore().create(obj)


def test_what_gkes_webhook_accepts_is_accepted() -> None:
    store = InMemorySliceStore()
    store.create(slice_obj("a" * 49, ["p0"], "4x4x4"))
    store.create(slice_obj("big", [f"p{i}" for i in range(144)], "16x24x24"))  # 9,216 chips
    assert len(store.list()) == 2


def test_the_crd_is_the_slice_api_the_contract_names() -> None:
    """The CRD the simulator installs: accelerator.gke.io/v1beta1 Slice, cluster-scoped, with a
    status subresource, the three required spec fields and a CEL rule per webhook refusal."""
    import yaml

    crd = yaml.safe_load(slices.CRD_FILE.read_text())
    assert crd["metadata"]["name"] == "slices.accelerator.gke.io"
    assert (crd["spec"]["group"], crd["spec"]["scope"]) == ("accelerator.gke.io", "Cluster")
    [version] = crd["spec"]["versions"]
    assert (version["name"], version["subresources"]) == ("v1beta1", {"status": {}})
    schema = version["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["required"] == ["type", "topology", "partitionIds"]
    assert spec["properties"]["type"]["enum"] == ["tpu7x"]
    rules = [
        r["rule"] for r in schema["x-kubernetes-validations"] + spec["x-kubernetes-validations"]
    ]
    assert f"self.metadata.name.size() <= {slices.MAX_NAME_LENGTH}" in rules
    assert any("% 4 == 0" in r for r in rules)
    assert any(f"<= {slices.MAX_SLICE_CHIPS}" in r for r in rules)


def test_cubes_over_the_admin_api(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient
) -> None:
    from tests.unit.test_gke_sim import admin

    got = admin(dyn, "POST", "/_sim/reservations", {"name": "other", "blocks": {"b": 2}})
    assert len(got["partitionIds"]) == 2
    cubes = admin(dyn, "GET", "/_sim/cubes")["cubes"]
    assert len(cubes) == 6 and {c["state"] for c in cubes} == {"HEALTHY"}
    pid = got["partitionIds"][0]
    after = admin(dyn, "POST", f"/_sim/cubes/{pid}/state", {"state": "UNHEALTHY"})["cubes"]
    assert [c["state"] for c in after if c["partitionId"] == pid] == ["UNHEALTHY"]


def test_cli_serves_reservations_and_needs_a_cluster_for_slices() -> None:
    import json
    import subprocess
    import sys
    import urllib.request

    base = [sys.executable, "-m", "multislice_local.gke_sim", "--port", "0"]
    refused = subprocess.run([*base, "--slices"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--slices needs --kubeconfig" in refused.stderr
    proc = subprocess.Popen(
        [*base, "--reservation", "res=block-1:2,block-2:1", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        with urllib.request.urlopen(url + "/_sim/cubes", timeout=5) as response:
            cubes = json.loads(response.read())["cubes"]
        assert [(c["block"], c["pool"]) for c in cubes] == [
            ("block-1", None),
            ("block-1", None),
            ("block-2", None),
        ]
        assert all(c["path"].startswith("projects/local-project/reservations/res/") for c in cubes)
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_a_slice_whose_cube_loses_its_nodes_fails(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient
) -> None:
    """A preempted (or deleted) sub-block pool takes its VMs away: the Slice on it is FAILED."""
    ids = make_cubes(dyn, dgke, ["cube-a"])
    store = store_of(dyn)
    store.create(slice_obj("job-0", [ids["cube-a"]], topology="4x4x4"))
    wait_for(lambda: state(dyn, "job-0") == slices.ACTIVE)
    dyn.preempt("cube-a", recreate_after_s=None)
    wait_for(lambda: state(dyn, "job-0") == slices.FAILED)
    obj = store.get("job-0")
    assert obj is not None and "lost their nodes" in obj["status"]["conditions"][0]["message"]


def test_a_sub_block_pool_needs_a_reservation(
    dyn: GkeSimulator, dgke: container_v1.ClusterManagerClient
) -> None:
    pool = cube_pool("cube-od")
    pool.config.reservation_affinity = None  # on demand
    with pytest.raises(gexc.BadRequest, match="must consume a specific All Capacity"):
        dgke.create_node_pool(parent=CLUSTER, node_pool=pool)
