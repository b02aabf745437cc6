"""The GKE simulator against issue 41: rules matched to their sources, workload-policy inserts
that race, and dynamic slicing (sub-blocks, the Slice controller)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import container_v1

from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
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


@pytest.fixture
def registrar() -> InMemoryRegistrar:
    return InMemoryRegistrar()


@pytest.fixture
def sim(registrar: InMemoryRegistrar) -> Iterator[GkeSimulator]:
    with GkeSimulator(SimConfig(op_latency_s=LATENCY), registrar=registrar) as s:
        yield s


@pytest.fixture
def gke(sim: GkeSimulator) -> Iterator[container_v1.ClusterManagerClient]:
    client = gke_client(sim.url)
    yield client
    close(client)


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

    sim.configure(policy_latency_s=0.5)
    prov = GkeProvisioner.from_endpoint(sim.url, PROJECT, PZONE, PCLUSTER, retry=FAST_RETRY)
    plans = [ironwood_plan("iw-a"), ironwood_plan("iw-b")]

    async def start_together_then_reconcile() -> list[list[Any]]:
        first = await asyncio.gather(*(prov.create(p, p.node_pools, UID) for p in plans))
        passes = [[e for r in first for e in r.errors]]
        for _ in range(20):  # the next reconcile passes, as the operator requeues
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
    assert len(sim.received_policy_inserts()) == 2  # both jobs tried
    assert sim.counters()["policyInsertsAccepted"] == 1  # one was created
    assert not any(e.permanent for errors in passes for e in errors), passes
    assert passes[-1] == []
    refused = [r for r in sim.counters()["responses"] if r.startswith("400")]
    assert refused == []  # no pool create was sent before its policy was ready
    assert [registrar.node_count(p.name) for plan in plans for p in plan.node_pools] == [16] * 4
