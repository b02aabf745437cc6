"""The GKE simulator against issue 41: rules matched to their sources, workload-policy inserts
that race, and dynamic slicing (sub-blocks, the Slice controller)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from google.api_core import exceptions as gexc
from google.cloud import container_v1

from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from tests.unit.test_gke_sim import (
    CLUSTER,
    LATENCY,
    close,
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
