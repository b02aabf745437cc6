"""provisioning.mode Fallback end to end (issue 55): the operator tries a job's capacity options
in order through the real GKE client library against the local GKE simulator, which holds
capacity per zone, type and reservation: an exhausted reservation (GKE's 429) and a zone's spot
stockout are each left for the next option, and the job runs on the first that has capacity,
with nothing of the options it left still held."""

from __future__ import annotations

import pytest

from multislice_operator.common import keys
from multislice_operator.reconcile.reasons import Reason
from tests import msj
from tests.msj import create, pools_of

ZONE = "us-central2-b"  # the local stack's node location (multislice_local.stack)
PROJECT = "local-project"


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("fallback") / "operator.log"
    with msj.local_stack(kube_cluster, log) as s:
        yield s


@pytest.fixture
def env(stack, namespace, kube_cluster):
    ns = namespace(kube_cluster, "fb")
    assert stack.sim is not None
    stack.sim.clear_faults()
    stack.sim.configure(op_latency_s=1.0, failed_create_latency_s=2.0)
    stack.sim.set_capacity("reservation/team-v5e", 0, project=PROJECT)
    stack.sim.set_capacity(f"{ZONE}/Spot", 0)
    yield stack, ns
    stack.sim.set_capacity("reservation/team-v5e", None, project=PROJECT)
    stack.sim.set_capacity(f"{ZONE}/Spot", None)


OPTIONS = [
    {"capacity": {"type": "Reserved", "reservation": "team-v5e"}, "trySeconds": 120},
    {"capacity": {"type": "Spot"}, "trySeconds": 120},
    {"capacity": {"type": "OnDemand"}, "trySeconds": 120},
]


def test_the_job_runs_on_the_first_option_with_capacity_and_holds_nothing_of_the_others(env):
    stack, ns = env
    provisioning = {"mode": "Fallback", "fallback": {"options": OPTIONS}}
    create(stack.api, ns, msj.job("fb", run="1h", provisioning=provisioning))
    st = msj.wait_phase(stack.api, ns, "fb", "Running", 180, log=stack.op.log_tail)["status"]
    fb = st["fallback"]
    assert (fb["option"], fb["round"], fb["lastLeft"], fb["lastLeftOption"]) == (
        2,
        1,
        "Stockout",
        1,
    )
    left = {o["option"]: o.get("lastLeft") for o in fb["options"]}
    assert left == {0: "ReservationExhausted", 1: "Stockout", 2: None}
    # The gang is the on-demand option's: its pools, labelled so, and nothing else is held.
    pools = pools_of(stack.sim, ns, "fb")
    assert len(pools) == 2
    for pool in pools.values():
        config = pool["config"]
        assert not config.get("spot") and "reservationAffinity" not in config
        assert config["labels"][keys.CAPACITY_TYPE] == "OnDemand"
    assert stack.sim.capacity()[f"{ZONE}/Spot"] == {"chips": 0, "held": 0}
    lines = msj.wait_events(
        stack.api,
        ns,
        "fb",
        f"{Reason.FALLBACK_MOVED}: left option 1 (Reserved team-v5e",
        f"{Reason.FALLBACK_MOVED}: left option 2 (Spot",
        log=stack.op.log_tail,
    )
    moved = [line for line in lines if line.startswith(Reason.FALLBACK_MOVED)]
    assert len(moved) == 2, moved
    assert "reservation exhausted" in moved[0] or "reservation exhausted" in moved[1]
