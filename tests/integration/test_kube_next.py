"""The newest Kubernetes lane (hack/README.md, "The newest Kubernetes lane"): a ``cluster``
control plane whose kube-apiserver and kube-scheduler are 1.37 with the Workload API on
(``kube_next``). No operator: the apiserver serves PodGroups, and the real scheduler binds a
gang's pods all or nothing, where plain pods bind as they fit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client

from multislice_local.controlplane import ControlPlane, next_bin_dir
from multislice_local.harness import wait_for
from multislice_local.nodes import delete_nodes, register_tpu_nodes
from multislice_operator.common import keys

NEXT_VERSION = re.search(
    r"^require k8s\.io/kubernetes (v\S+)$",
    (Path(__file__).parents[2] / "hack/tools/kube-next/go.mod").read_text(),
    re.M,
)[1]  # type: ignore[index]
GROUP, VERSION = "scheduling.k8s.io", "v1beta1"
HOSTS = 4  # one pod per host: each asks for all of a host's chips
CHIPS = 4
# Bounds for a loaded 2-core machine, not expectations.
TIMEOUT = 60.0
# How long after the scheduler's verdict the gang is watched for a binding. The plain pods'
# case waits for its three bindings within the same window: it shows the window is long enough
# for bindings to land (they are there at the verdict already). The scheduler retries a failed
# pod group on its backoff (1, 3, 5, 9 s apart, at most 10 s: 1.37.2 does not requeue it on the
# node's update), so the window also covers two or three more attempts.
BIND_WINDOW = 10.0


def _pods(core: client.CoreV1Api, ns: str) -> list[dict[str, Any]]:
    # Raw JSON: the Python client's models predate spec.schedulingGroup.
    response = core.list_namespaced_pod(ns, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(response.data)["items"]  # type: ignore[attr-defined]
    return items


def _node(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    response = core.read_node(name, _preload_content=False)
    node: dict[str, Any] = json.loads(response.data)  # type: ignore[attr-defined]
    return node


def _podgroup(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    return cast(
        dict[str, Any], custom.get_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", name)
    )


def _bound(pods: list[dict[str, Any]]) -> dict[str, str]:
    """Pod name -> node name of every bound pod."""
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}


def _bound_all(core: client.CoreV1Api, ns: str, count: int) -> dict[str, str] | None:
    """The bindings once exactly ``count`` pods are bound, else None."""
    bound = _bound(_pods(core, ns))
    return bound if len(bound) == count else None


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = obj.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def _unschedulable(obj: dict[str, Any], kind: str) -> bool:
    condition = _condition(obj, kind)
    return bool(
        condition and (condition["status"], condition.get("reason")) == ("False", "Unschedulable")
    )


def _schedulable_node(node: dict[str, Any]) -> bool:
    """Ready, and its not-ready taint (set at creation) gone."""
    ready = _condition(node, "Ready")
    taints = node.get("spec", {}).get("taints") or []
    return bool(ready and ready["status"] == "True") and not any(
        t["key"] == "node.kubernetes.io/not-ready" for t in taints
    )


def _pod(name: str, pool: str, group: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {keys.GKE_NODEPOOL: pool},
        "tolerations": [{"key": keys.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {keys.TPU_RESOURCE: str(CHIPS)}},
            }
        ],
    }
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_the_lane_runs_the_next_minor_and_serves_podgroups(
    kube_next: ControlPlane, kube_client: Callable[[ControlPlane], client.ApiClient]
) -> None:
    api = kube_client(kube_next)
    assert client.VersionApi(api).get_code().git_version == NEXT_VERSION
    resources = client.CustomObjectsApi(api).get_api_resources(GROUP, VERSION)
    names = {r.name for r in resources.resources}
    assert {"podgroups", "podgroups/status", "workloads"} <= names, names
    scheduler = Path(os.readlink(f"/proc/{kube_next.pids['kube-scheduler']}/exe"))
    assert scheduler == next_bin_dir() / "kube-scheduler"
    version = subprocess.run([scheduler, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.split() == ["Kubernetes", NEXT_VERSION]


@pytest.mark.parametrize("gang", [True, False], ids=["gang", "plain-pods"])
def test_a_gang_binds_only_when_every_host_of_its_pool_can_take_a_pod(
    kube_next: ControlPlane,
    kube_client: Callable[[ControlPlane], client.ApiClient],
    namespace: Callable[..., str],
    gang: bool,
) -> None:
    """Four pods of one host each on a pool of four hosts, one of them cordoned: a gang
    (PodGroup, minCount 4) binds none of them, plain pods bind three; uncordoned, all four
    bind."""
    api = kube_client(kube_next)
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    ns = namespace(kube_next, "gang" if gang else "plain")
    pool = ns  # unique: the pods select this pool's nodes only
    nodes = register_tpu_nodes(api, pool, HOSTS, "tpu-v5-lite-podslice", "4x4", CHIPS)
    try:
        wait_for(
            lambda: all(_schedulable_node(_node(core, n)) for n in nodes),
            TIMEOUT,
            "the pool's nodes to be Ready",
        )
        cordoned = nodes[0]
        core.patch_node(cordoned, {"spec": {"unschedulable": True}})
        group = "slice" if gang else None
        if group is not None:
            custom.create_namespaced_custom_object(
                GROUP,
                VERSION,
                ns,
                "podgroups",
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "PodGroup",
                    "metadata": {"name": group},
                    "spec": {"schedulingPolicy": {"gang": {"minCount": HOSTS}}},
                },
            )
        for i in range(HOSTS):
            pod = _pod(f"worker-{i}", pool, group)
            core.create_namespaced_pod(ns, pod)  # type: ignore[arg-type]
        created = _pods(core, ns)
        if group is not None:  # the apiserver kept the field (it drops it with the gate off)
            assert {p["spec"].get("schedulingGroup", {}).get("podGroupName") for p in created} == {
                group
            }

        # The scheduler's verdict: a pod found unschedulable (a gang's all at once, as a group).
        wait_for(
            lambda: any(_unschedulable(p, "PodScheduled") for p in _pods(core, ns)),
            TIMEOUT,
            "a pod to be found unschedulable",
        )
        # Then the window: the plain pods' three bindings land within it; the gang gets none.
        window_end = time.monotonic() + BIND_WINDOW
        if group is not None:
            while time.monotonic() < window_end:
                assert _bound(_pods(core, ns)) == {}, "a gang pod bound with a host cordoned"
                time.sleep(0.2)
            pg = _podgroup(custom, ns, group)
            assert _unschedulable(pg, "PodGroupInitiallyScheduled"), pg.get("status")
        else:
            bound = wait_for(
                lambda: _bound_all(core, ns, HOSTS - 1), BIND_WINDOW, "three plain pods to bind"
            )
            assert cordoned not in bound.values()
            assert len(set(bound.values())) == HOSTS - 1  # one pod per host

        # Bound at the group's next attempt (its backoff: up to 10 s), plain pods at once.
        core.patch_node(cordoned, {"spec": {"unschedulable": False}})
        bound = wait_for(
            lambda: _bound_all(core, ns, HOSTS),
            TIMEOUT,
            "every pod to bind once the host is uncordoned",
        )
        assert sorted(bound.values()) == sorted(nodes)  # one pod on each host
        if group is not None:
            pg = _podgroup(custom, ns, group)
            condition = _condition(pg, "PodGroupInitiallyScheduled")
            assert condition and condition["status"] == "True", pg.get("status")
    finally:
        delete_nodes(api, pool)
