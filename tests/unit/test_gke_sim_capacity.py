"""The GKE simulator holds capacity per zone, capacity type and specific reservation (issue 55):
a test can exhaust one (spot in a zone, a reservation) and leave another, through the real client
library, and the operator reads each answer as the capacity it is."""

from __future__ import annotations

import re
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import container_v1
from google.cloud.container_v1.types import cluster_service as cs

from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar
from multislice_operator.common.pools import CODE_RESERVATION_EXHAUSTED, CODE_STOCKOUT
from multislice_operator.provisioning.gke_errors import classify_exception, classify_message
from tests.unit.test_gke_sim import (
    CLUSTER,
    LOCATION,
    ZONE,
    admin,
    flex_pool,
    tpu_pool,
    wait_for,
)

OTHER_ZONE = "us-east5-c"
CHIPS = 16  # tpu_pool(): 4 hosts of ct5lp-hightpu-4t


def pool(name: str, kind: str = "Spot", zone: str = ZONE, reservation: str | None = None
         ) -> cs.NodePool:  # fmt: skip
    p = tpu_pool(name)
    p.locations = [zone]
    p.config.spot = kind == "Spot"
    if reservation is not None:
        p.config.reservation_affinity = cs.ReservationAffinity(
            consume_reservation_type=cs.ReservationAffinity.Type.SPECIFIC_RESERVATION,
            key="compute.googleapis.com/reservation-name",
            values=[reservation],
        )
    return p


def outcome(sim: GkeSimulator, gke: container_v1.ClusterManagerClient, op: Any) -> str:
    """RUNNING, or the failed create's classified code."""
    assert sim.wait_idle()
    done = gke.get_operation(name=f"{LOCATION}/operations/{op.name}")
    if done.error.message:
        return classify_message(done.error.message)[0]
    return str(sim.pool(op.target_link.rsplit("/", 1)[1])["status"])  # type: ignore[index]


def test_a_zones_spot_capacity_is_exhausted_and_others_are_left(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    sim.configure(op_latency_s=0.05, failed_create_latency_s=0.1)
    sim.set_capacity(f"{ZONE}/Spot", CHIPS)
    first = gke.create_node_pool(parent=CLUSTER, node_pool=pool("spot-a"))
    second = gke.create_node_pool(parent=CLUSTER, node_pool=pool("spot-b"))
    on_demand = gke.create_node_pool(parent=CLUSTER, node_pool=pool("od-a", "OnDemand"))
    elsewhere = gke.create_node_pool(parent=CLUSTER, node_pool=pool("spot-c", zone=OTHER_ZONE))
    assert outcome(sim, gke, first) == "RUNNING"
    assert outcome(sim, gke, second) == CODE_STOCKOUT  # the zone's spot chips are held
    assert outcome(sim, gke, on_demand) == "RUNNING"  # another capacity type: not limited
    assert outcome(sim, gke, elsewhere) == "RUNNING"  # another zone
    assert sim.capacity()[f"{ZONE}/Spot"] == {"chips": CHIPS, "held": CHIPS}
    # A failed pool holds nothing; a deleted one gives its chips back.
    gke.delete_node_pool(name=f"{CLUSTER}/nodePools/spot-b")
    gke.delete_node_pool(name=f"{CLUSTER}/nodePools/spot-a")
    wait_for(lambda: sim.pool("spot-a") is None)
    assert sim.capacity()[f"{ZONE}/Spot"] == {"chips": CHIPS, "held": 0}
    again = gke.create_node_pool(parent=CLUSTER, node_pool=pool("spot-d"))
    assert outcome(sim, gke, again) == "RUNNING"


def test_an_exhausted_specific_reservation_answers_its_429(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient
) -> None:
    sim.set_capacity("reservation/res-a", CHIPS)
    gke.create_node_pool(parent=CLUSTER, node_pool=pool("res-1", "Reserved", reservation="res-a"))
    with pytest.raises(gexc.TooManyRequests) as err:
        gke.create_node_pool(parent=CLUSTER, node_pool=pool("res-2", "Reserved",
                                                            reservation="res-a"))  # fmt: skip
    assert 'specific reservation "res-a" is insufficient for node pool "res-2"' in str(err.value)
    assert "required 4 and short of 4 VM count of machine type ct5lp-hightpu-4t" in str(err.value)
    c = classify_exception(err.value)
    assert (c.code, c.permanent, c.retry_now) == (CODE_RESERVATION_EXHAUSTED, False, False)
    assert sim.pool("res-2") is None
    # Another reservation, and spot in the same zone, are left.
    other = pool("res-3", "Reserved", reservation="res-b")
    gke.create_node_pool(parent=CLUSTER, node_pool=other)
    gke.create_node_pool(parent=CLUSTER, node_pool=pool("spot-1"))
    assert sim.wait_idle() and {n for n in sim.pools()} == {"res-1", "res-3", "spot-1"}


def test_flex_start_without_capacity_waits_and_is_not_an_error(
    sim: GkeSimulator, gke: container_v1.ClusterManagerClient, registrar: InMemoryRegistrar
) -> None:
    sim.configure(op_latency_s=0.05, flex_start_wait_s=0.05)
    sim.set_capacity(f"{ZONE}/FlexStart", 0)
    op = gke.create_node_pool(parent=CLUSTER, node_pool=flex_pool())
    assert outcome(sim, gke, op) == "RUNNING"
    (held,) = sim.state()["pools"]
    assert held["flexHeld"] and held["nodes"] == 0  # Dynamic Workload Scheduler queues it
    assert registrar.node_count("flex-a") == 0
    sim.grant_flex_start("flex-a")  # capacity found: the whole slice comes, and is held
    assert registrar.node_count("flex-a") == 4
    assert sim.capacity()[f"{ZONE}/FlexStart"] == {"chips": 0, "held": CHIPS}


def test_capacity_over_the_admin_api_and_bad_keys(sim: GkeSimulator) -> None:
    got = admin(sim, "POST", "/_sim/capacity", {f"{ZONE}/OnDemand": 32, "reservation/r": 8})
    assert got[f"{ZONE}/OnDemand"] == {"chips": 32, "held": 0}
    assert got["reservation/projects/p/reservations/r"] == {"chips": 8, "held": 0}
    with pytest.raises(ValueError, match=re.escape("ZONE/OnDemand, ZONE/Spot, ZONE/FlexStart")):
        sim.set_capacity(f"{ZONE}/Preemptible", 1)
    sim.set_capacity(f"{ZONE}/OnDemand", None)  # unlimited again
    assert f"{ZONE}/OnDemand" not in sim.capacity()
