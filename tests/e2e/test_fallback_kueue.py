"""provisioning.mode Fallback with the real Kueue (issue 55, docs/kueue.md "Fallback: one
Workload per option"): each option's Workload asks for the quota of the option it tries, and its
pods select the option's capacity type, which a ResourceFlavor per capacity type matches. An option
whose flavor has no quota for it within its trySeconds is left; the next option's Workload is
admitted on its own flavor and the job runs there."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes import client

from multislice_local import queues
from multislice_local.harness import wait_for
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.reconcile.reasons import Reason
from tests import msj

SPOT, ON_DEMAND = "fb-v5e-spot", "fb-v5e-ondemand"
CHIPS = 32  # v5litepod-16 x 2 slices


def flavor(name: str, capacity_type: str) -> dict[str, Any]:
    """A flavor per TPU type and capacity type: its nodeLabels are what the option's pods select."""
    body = queues.resource_flavor(name, "tpu-v5-lite-podslice")
    body["spec"]["nodeLabels"][keys.CAPACITY_TYPE] = capacity_type
    return body


@pytest.fixture(scope="module")
def stack(kube_kueue, tmp_path_factory):
    log = tmp_path_factory.mktemp("fallback-kueue") / "operator.log"
    with msj.local_stack(kube_kueue, log, profile="kueue") as s:
        queues.apply(s.api, [flavor(SPOT, "Spot"), flavor(ON_DEMAND, "OnDemand"),
                             queues.admission_check()])  # fmt: skip
        yield s


@pytest.fixture
def env(stack, namespace, kube_kueue):
    ns = namespace(kube_kueue, f"fq{uuid.uuid4().hex[:4]}")
    cq = queues.cluster_queue(f"cq-{ns}", 0, SPOT)  # no spot quota at all
    cq["spec"]["resourceGroups"][0]["flavors"].append(
        {"name": ON_DEMAND, "resources": [{"name": queues.TPU, "nominalQuota": CHIPS}]}
    )
    objs = [cq, queues.local_queue(ns, "lq", cq["metadata"]["name"])]
    queues.apply(stack.api, objs)
    queues.wait_active(stack.api, cq["metadata"]["name"])
    yield stack, ns
    custom = client.CustomObjectsApi(stack.api)
    jobs = (models.GROUP, models.VERSION, ns, models.PLURAL)
    for item in custom.list_namespaced_custom_object(*jobs)["items"]:
        custom.delete_namespaced_custom_object(*jobs, item["metadata"]["name"])
    wait_for(lambda: not custom.list_namespaced_custom_object(*jobs)["items"], 90, "jobs gone")
    queues.delete(stack.api, objs)


OPTIONS = [
    {"capacity": {"type": "Spot"}, "trySeconds": 10},
    {"capacity": {"type": "OnDemand"}, "trySeconds": 120},
]


def test_an_option_without_quota_in_its_flavor_is_left_and_the_next_is_admitted_on_its_own(env):
    stack, ns = env
    provisioning = {"mode": "Fallback", "fallback": {"options": OPTIONS}}
    labels = {keys.KUEUE_QUEUE_NAME: "lq"}
    msj.create(stack.api, ns, msj.job("fq", run="1h", labels=labels, provisioning=provisioning))

    def log(n: int) -> str:
        js = msj.jobset(stack.api, ns, "fq") or {}
        spec = js.get("spec", {})
        tmpl = (spec.get("replicatedJobs") or [{}])[0].get("template", {})
        pod = tmpl.get("spec", {}).get("template", {}).get("spec", {})
        return (
            f"jobset suspend={spec.get('suspend')} nodeSelector={pod.get('nodeSelector')}\n"
            f"{msj.pods_and_nodes(stack.api, ns, 'msj-fq')}\n{stack.op.log_tail(n)}"
        )

    st = msj.wait_phase(stack.api, ns, "fq", "Running", 120, log=log)["status"]
    fb = st["fallback"]
    assert (fb["option"], fb["lastLeft"], fb["lastLeftOption"]) == (1, "Timeout", 0)
    spot = next(o for o in fb["options"] if o["option"] == 0)
    assert "no quota for it in the ClusterQueue's flavors" in spot["message"]
    # The Workload now is option 2's, admitted on the on-demand flavor, never the spot one.
    wl = wait_for(lambda: queues.workloads(stack.api, ns).get("fq"), 30, "fq's Workload")
    assert wl["metadata"]["labels"][keys.QUOTA_KEY] == "1"
    (podset, *_) = wl["status"]["admission"]["podSetAssignments"]
    assert set(podset["flavors"].values()) == {ON_DEMAND}
    for pool in msj.pools_of(stack.sim, ns, "fq").values():
        assert pool["config"]["labels"][keys.CAPACITY_TYPE] == "OnDemand"
    msj.wait_events(stack.api, ns, "fq", f"{Reason.FALLBACK_MOVED}: left option 1 (Spot",
                    log=stack.op.log_tail)  # fmt: skip
