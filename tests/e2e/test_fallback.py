"""provisioning.mode Fallback end to end (issue 55): the operator tries a job's capacity options
in order through the real GKE client library against the local GKE simulator, which holds
capacity per zone, type and reservation: an exhausted reservation (GKE's 429) and a zone's spot
stockout are each left for the next option, and the job runs on the first that has capacity,
with nothing of the options it left still held."""

from __future__ import annotations

import json
from typing import Any

import pytest

from multislice_local.harness import wait_for
from multislice_local.preflight import compile_pod, finish_compile_pod
from multislice_operator.common import keys
from multislice_operator.reconcile.reasons import Reason
from tests import msj
from tests.msj import create, pools_of

ZONE = "us-central2-b"  # the local stack's node location (multislice_local.stack)
PROJECT = "local-project"
GIB = 1024**3


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


def test_a_shape_the_compiler_refuses_gets_no_pool_and_the_next_shape_runs(env):
    """The job's own shape (2 x v5litepod-16) is refused by the preflight compile: no pool is ever
    created for it; the next option's shape (2 x v6e-16) is compiled, passes, and runs."""
    stack, ns = env
    before = len(stack.sim.received_creates())  # the module's other tests' creates
    fallback = {
        "options": [{"capacity": {"type": "OnDemand"}},
                    {"capacity": {"type": "OnDemand"}, "shape": "v6e"}],
        "shapes": [{"name": "v6e", "accelerator": "v6e-16", "slices": 2}],
    }  # fmt: skip
    provisioning = {"mode": "Fallback", "fallback": fallback}
    create(stack.api, ns, msj.job("shapes", run="1h", preflight={}, provisioning=provisioning))
    own = the_compile_pod(stack, ns, "shapes")
    finish_compile_pod(stack.api, ns, own, 78, said(False, 20.5))
    other = the_compile_pod(stack, ns, "shapes", not_named=own["metadata"]["name"])
    assert len(stack.sim.received_creates()) == before  # nothing before the next compile
    finish_compile_pod(stack.api, ns, other, 0, said(True, 9.25))
    st = msj.wait_phase(stack.api, ns, "shapes", "Running", 180, log=stack.op.log_tail)["status"]
    fb = st["fallback"]
    assert (fb["option"], fb["shape"], fb["lastLeft"]) == (1, "v6e", "DidNotCompile")
    verdicts = {s["name"]: s["fits"] for s in fb["shapes"]}
    assert verdicts == {"": False, "v6e": True}
    machines = [
        c["nodePool"]["config"]["machineType"] for c in stack.sim.received_creates()[before:]
    ]
    assert machines == ["ct6e-standard-4t"] * 2, machines  # 0 pools for the refused shape


def the_compile_pod(stack, ns: str, name: str, not_named: str = "") -> dict[str, Any]:
    """The job's compile pod waiting to be played (not `not_named`, the one played before)."""
    found: dict[str, Any] = {}

    def seen() -> bool:
        pod = compile_pod(stack.api, ns, f"{name}-preflight") or {}
        if pod and pod["metadata"]["name"] != not_named:
            found.update(pod)
        return bool(found)

    wait_for(seen, 90, f"{name}'s compile pod", interval=0.5,
             on_timeout=lambda: stack.op.log_tail(30))  # fmt: skip
    return found


def said(fits: bool, need_gib: float) -> str:
    return json.dumps({"fits": fits, "hbm_bytes_per_device": int(need_gib * GIB),
                       "hbm_capacity_bytes": 16 * 10**9})  # fmt: skip
