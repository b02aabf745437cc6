"""Ironwood end to end (issue 24): the tpu7x-128 two-slice example on the local stack, its node
pools placed by a workload policy the operator created through the Compute Engine API (the real
google-cloud-compute client against the simulator), no COMPACT, 16 tpu7x nodes per slice, run to
Succeeded and released; the policy stays."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from multislice_local.harness import wait_for
from multislice_operator.reconcile.reasons import Reason
from tests import msj
from tests.msj import RUN_DURATION_ANNOTATION, create, event_lines, pools_of

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tpu7x-128x2.yaml"


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    with msj.local_stack(kube_cluster, tmp_path_factory.mktemp("ironwood") / "operator.log") as s:
        yield s


def test_tpu7x_128_two_slices_run_on_workload_policy_pools(stack, namespace, kube_cluster):
    ns = namespace(kube_cluster, "iw")
    body = yaml.safe_load(EXAMPLE.read_text())
    body = copy.deepcopy(body)
    body["metadata"] = {"name": "ironwood"}
    body["spec"].pop("checkpoint")
    body["spec"]["template"]["spec"]["containers"][0]["image"] = msj.IMAGE
    body["spec"]["template"]["metadata"] = {"annotations": {RUN_DURATION_ANNOTATION: "4s"}}
    create(stack.api, ns, body)
    running = msj.wait_phase(
        stack.api, ns, "ironwood", "Running", 120, log=lambda n: stack.op.log_tail(n)
    )["status"]
    assert running["totalChips"] == 128 and running["readySlices"] == "2/2"
    assert [s["hosts"] for s in running["slices"]] == [16, 16]
    pools = pools_of(stack.sim, ns, "ironwood")
    assert len(pools) == 2
    for pool in pools.values():
        assert pool["placementPolicy"] == {"policyName": "msj-tpu7x-4x4x4", "tpuTopology": "4x4x4"}
        assert pool["config"]["machineType"] == "tpu7x-standard-4t"
        assert pool["maxPodsConstraint"] == {"maxPodsPerNode": "15"}
        nodes = (
            client.CoreV1Api(stack.api)
            .list_node(label_selector=f"cloud.google.com/gke-nodepool={pool['name']}")
            .items
        )
        assert len(nodes) == 16
        assert {n.metadata.labels["cloud.google.com/gke-tpu-accelerator"] for n in nodes} == {
            "tpu7x"
        }
        assert {n.metadata.labels["cloud.google.com/gke-tpu-topology"] for n in nodes} == {"4x4x4"}
    policy = stack.sim.policies()["msj-tpu7x-4x4x4"]
    assert policy["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "4x4x4"}
    msj.wait_phase(stack.api, ns, "ironwood", "Succeeded", 120, log=lambda n: stack.op.log_tail(n))
    wait_for(lambda: not pools_of(stack.sim, ns, "ironwood"), 60, "pools deleted after success")
    assert "msj-tpu7x-4x4x4" in stack.sim.policies()  # shared, never deleted by the operator
    assert any(
        e.startswith(Reason.GANG_PROVISIONED) for e in event_lines(stack.api, ns, "ironwood")
    )


def test_flex_start_waits_without_rollback_then_runs(stack, namespace, kube_cluster):
    """Flex-start (DWS): pools up but empty for longer than provisioning.timeoutSeconds are no
    failure: no rollback, no timeout; once the capacity comes, the job runs to Succeeded."""
    ns = namespace(kube_cluster, "flex")
    stack.sim.set_faults(flex_start_hold=2)
    body = msj.job(
        "flex",
        run="3s",
        capacity={"type": "FlexStart", "maxRunDurationSeconds": 3600},
        provisioning={"timeoutSeconds": 10},
    )
    create(stack.api, ns, body)
    log = lambda n: stack.op.log_tail(n)  # noqa: E731

    def waiting(st: dict) -> bool:
        cond = {c["type"]: c for c in st.get("conditions") or []}.get("Provisioned") or {}
        return cond.get("reason") == Reason.WAITING_FOR_FLEX_START_CAPACITY and bool(
            st.get("jobSet")
        )

    first = msj.wait_status(stack.api, ns, "flex", "waiting for flex-start", waiting, 60, log=log)
    since = first["status"]["attemptStartTime"]
    # Past timeoutSeconds (10 s) and several passes: still waiting, nothing rolled back.
    passes = msj.reconciles(stack.op)
    wait_for(lambda: msj.reconciles(stack.op) > passes + 10, 60, "ten more passes")
    later = msj.wait_status(stack.api, ns, "flex", "still waiting", waiting, 30, log=log)
    assert later["status"]["attemptStartTime"] == since
    assert not [
        e for e in event_lines(stack.api, ns, "flex") if e.startswith(Reason.GANG_ROLLED_BACK)
    ]
    creates = [c for c in stack.sim.received_creates() if "msj-flex-" in str(c)]
    assert len(creates) == 2  # one create per slice, never again
    for name in pools_of(stack.sim, ns, "flex"):
        stack.sim.grant_flex_start(name)
    msj.wait_phase(stack.api, ns, "flex", "Succeeded", 120, log=log)
