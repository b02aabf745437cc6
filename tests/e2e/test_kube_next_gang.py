"""Gangs at the scheduler on Kubernetes 1.37 (issue 54 point 5): the operator on the newest
lane (kube-apiserver and kube-scheduler 1.37 with the Workload API on, the real JobSet and Job
controllers, kwok nodes) gives a job's JobSet one PodGroup whose gang is every pod of every
slice. While one host of one slice's pool cannot take its pod, no pod of the job binds; once it
can, all do, each slice whole on a pool of its own. Without the gang of every pod (Kubernetes
1.36, or the operator's first gang of each slice's first pod) the other slice's pods and three
of that slice's bind and hold seven hosts for a job that cannot run.

The host is taken by another workload's pod holding its TPU chips: the operator itself counts a
cordoned host as not ready and creates no JobSet until it is back
(test_a_cordoned_host_holds_the_jobset_back), but it cannot see chips another workload holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from multislice_local.harness import OperatorProcess, wait_for
from multislice_local.nodes import delete_nodes, register_tpu_nodes
from tests import msj

# Literal here, not the operator's keys: the test also runs against an operator without them.
PODGROUPS = ("scheduling.k8s.io", "v1beta1", "podgroups")
TPU = "google.com/tpu"
JOB_NAME = "multislice.dev/job-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"


@pytest.fixture(scope="module")
def op(kube_next, tmp_path_factory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("op") / "operator.log"
    with msj.operator_process(kube_next, log, resync_seconds=2) as proc:
        yield proc


@pytest.fixture
def env(kube_next, op, namespace, kube_client) -> Iterator[tuple[client.ApiClient, str, Any]]:
    api = kube_client(kube_next)
    ns = namespace(kube_next, "gang")
    pools = [f"{ns}-pool-{p}" for p in range(2)]
    for pool in pools:  # two pools of 4 v5e hosts, one pod per host
        register_tpu_nodes(api, pool, 4, "tpu-v5-lite-podslice", "4x4", 4,
                           extra_labels=msj.own_nodes(ns))  # fmt: skip
    yield api, ns, op
    for pool in pools:
        delete_nodes(api, pool)


def pods(api: client.ApiClient, ns: str, name: str) -> list[Any]:
    return list(
        client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=f"{JOB_NAME}={name}").items
    )


def unschedulable(pod: Any) -> bool:
    return any(
        c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
        for c in pod.status.conditions or []
    )


def cordon(api: client.ApiClient, node: str, on: bool) -> None:
    client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": on}})


def occupy(api: client.ApiClient, ns: str, node: str) -> str:
    """A pod of another workload holding all of `node`'s TPU chips (kwok runs it)."""
    name = f"other-{node}"[:63]
    client.CoreV1Api(api).create_namespaced_pod(ns, {
        "metadata": {"name": name, "labels": {"app": "other"}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": TPU, "operator": "Exists"}],
            "containers": [{"name": "c", "image": msj.IMAGE, "resources": {"limits": {TPU: "4"}}}],
        },
    })  # fmt: skip
    return name


def test_no_pod_binds_while_one_host_of_a_slices_pool_is_taken_then_all_do(env):
    api, ns, op = env
    other = occupy(api, ns, f"{ns}-pool-1-3")  # one host of four: the slice cannot run there
    msj.create(api, ns, msj.job("gang", run="300s", existing=True,
                                node_selector=msj.own_nodes(ns)))  # fmt: skip

    # The scheduler's verdict on the group, as a whole (schedule_one_podgroup.go: no pod of a
    # rejected group is assumed): none bound. Without the gang of every pod, the first slice's
    # four pods and three of the second's bind and hold seven hosts for a job that cannot run.
    group = wait_for(
        lambda: (g := _pod_group(api, ns, "gang")) and _rejected(g) and g,
        90,
        "the PodGroup found unschedulable",
        on_timeout=lambda: f"{_pod_group(api, ns, 'gang')}\n{op.log_tail()}",
    )
    found = pods(api, ns, "gang")
    assert len(found) == 8, "every pod of every slice exists before any binds"
    assert [p.metadata.name for p in found if p.spec.node_name] == []
    assert msj.get(api, ns, "gang")["status"]["phase"] == "Starting"
    assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": 8}}
    assert group["metadata"]["ownerReferences"][0]["kind"] == "MultisliceJob"
    assert {p.spec.scheduling_group.pod_group_name for p in found} == {"gang"}

    # The case, once the JobSet is there: one host of the other slice's pool cordoned.
    # The taken host freed, the scheduler tries the group again and still binds none of it.
    cordoned = f"{ns}-pool-0-0"
    cordon(api, cordoned, True)
    client.CoreV1Api(api).delete_namespaced_pod(other, ns, grace_period_seconds=0)
    wait_for(
        lambda: any(
            _says(p, "were unschedulable") and not _says(p, "Insufficient")
            for p in pods(api, ns, "gang")
        ),
        90,
        "the group tried again and refused for the cordoned host",
        on_timeout=lambda: f"{[_said(p) for p in pods(api, ns, 'gang')]}\n{op.log_tail()}",
    )
    assert [p.metadata.name for p in pods(api, ns, "gang") if p.spec.node_name] == []

    cordon(api, cordoned, False)
    wait_for(
        lambda: (lambda ps: len(ps) == 8 and all(p.spec.node_name for p in ps))(
            pods(api, ns, "gang")
        ),
        120,
        "all eight pods bound once the host is back",
        on_timeout=op.log_tail,
    )
    # Each slice on a pool of its own, whole: the placement JobSet's exclusive annotation gave.
    pools: dict[str, set[str]] = {}
    for p in pods(api, ns, "gang"):
        pool = p.spec.node_name.rsplit("-", 1)[0]  # the harness names a pool's nodes <pool>-<h>
        pools.setdefault(p.metadata.labels[JOB_INDEX], set()).add(pool)
    assert sorted(map(len, pools.values())) == [1, 1] and len(set.union(*pools.values())) == 2
    running = msj.wait_phase(api, ns, "gang", "Running", 120, log=op.log_tail)
    assert running["status"]["readySlices"] == "2/2"


def test_a_cordoned_host_holds_the_jobset_back(env):
    api, ns, op = env
    cordoned = f"{ns}-pool-1-3"
    cordon(api, cordoned, True)
    msj.create(api, ns, msj.job("held", run="300s", existing=True,
                                node_selector=msj.own_nodes(ns)))  # fmt: skip
    pending = msj.wait_status(
        api, ns, "held", "the job waiting for the cordoned host's pool",
        lambda st: "1 ready of 2 found" in st.get("message", ""), 60, log=op.log_tail,
    )  # fmt: skip
    assert pending["status"]["phase"] == "Pending"
    assert _pod_group(api, ns, "held") is None and pods(api, ns, "held") == []
    cordon(api, cordoned, False)
    running = msj.wait_phase(api, ns, "held", "Running", 120, log=op.log_tail)
    assert running["status"]["readySlices"] == "2/2"
    assert _pod_group(api, ns, "held") is not None


def _said(pod: Any) -> str:
    return " ".join(
        c.message or "" for c in pod.status.conditions or [] if c.type == "PodScheduled"
    )


def _says(pod: Any, text: str) -> bool:
    return text in _said(pod)


def _rejected(group: dict[str, Any]) -> bool:
    return any(
        (c["type"], c["status"], c.get("reason"))
        == ("PodGroupInitiallyScheduled", "False", "Unschedulable")
        for c in (group.get("status") or {}).get("conditions") or []
    )


def _pod_group(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
            PODGROUPS[0], PODGROUPS[1], ns, PODGROUPS[2], name
        )
    except client.ApiException as err:
        if err.status == 404:
            return None
        raise
    return found
