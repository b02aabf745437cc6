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
    assert any(e.startswith("GangProvisioned") for e in event_lines(stack.api, ns, "ironwood"))
