"""Kueue objects for the local cluster (the ``kueue`` profile), and a witness of pool creates.

The objects are the ones docs/kueue.md explains (examples/kueue/ holds the complete example):
a ResourceFlavor per TPU type, ClusterQueues with ``google.com/tpu`` quota that list the operator's
AdmissionCheck, LocalQueues, WorkloadPriorityClasses. Used by the e2e tests, the demo and the
benchmark.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_operator.common import keys

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
PLURALS = {
    "ResourceFlavor": "resourceflavors",
    "AdmissionCheck": "admissionchecks",
    "ClusterQueue": "clusterqueues",
    "Cohort": "cohorts",
    "LocalQueue": "localqueues",
    "WorkloadPriorityClass": "workloadpriorityclasses",
    "MultiKueueCluster": "multikueueclusters",  # multicluster.py: a MultiKueue manager's
    "MultiKueueConfig": "multikueueconfigs",
}
CHECK = "multislice-gang"
TPU = keys.TPU_RESOURCE


def resource_flavor(name: str, gke_accelerator: str) -> dict[str, Any]:
    """A flavor per TPU type: Kueue adds nodeLabels to the pods' nodeSelector at admission."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": {keys.GKE_TPU_ACCELERATOR: gke_accelerator}},
    }


def admission_check(name: str = CHECK) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": {"controllerName": keys.GANG_CHECK_CONTROLLER},
    }


def cluster_queue(
    name: str,
    chips: int,
    flavor: str,
    check: str | None = CHECK,
    cohort: str | None = None,
    strategy: str = "StrictFIFO",
    preemption: dict[str, Any] | None = None,
    borrowing_limit: int | None = None,
) -> dict[str, Any]:
    quota: dict[str, Any] = {"name": TPU, "nominalQuota": chips}
    if borrowing_limit is not None:
        quota["borrowingLimit"] = borrowing_limit
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": strategy,
        "resourceGroups": [
            {"coveredResources": [TPU], "flavors": [{"name": flavor, "resources": [quota]}]}
        ],
    }
    if check:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": check}]}
    if cohort:
        spec["cohortName"] = cohort
    if preemption:
        spec["preemption"] = preemption
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(namespace: str, name: str, cluster_queue: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue},
    }


def priority_class(name: str, value: int, description: str = "") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
        "description": description,
    }


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def apply(api: client.ApiClient, objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Create each Kueue object, or replace its spec when it exists (cluster-scoped ones are
    shared by every test of a session). Returns the objects it created (not those it found)."""
    custom = client.CustomObjectsApi(api)
    created: list[dict[str, Any]] = []
    for obj in objects:
        if obj.get("apiVersion") != API_VERSION:
            continue
        plural = PLURALS[obj["kind"]]
        ns = obj["metadata"].get("namespace")
        try:
            if ns:
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, plural, obj)
            else:
                custom.create_cluster_custom_object(GROUP, VERSION, plural, obj)
            created.append(obj)
        except ApiException as exc:
            if exc.status != 409:
                raise
            body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
            name = obj["metadata"]["name"]
            if ns:
                custom.patch_namespaced_custom_object(GROUP, VERSION, ns, plural, name, body)
            else:
                custom.patch_cluster_custom_object(GROUP, VERSION, plural, name, body)
    return created


def delete(api: client.ApiClient, objects: Iterable[dict[str, Any]]) -> None:
    custom = client.CustomObjectsApi(api)
    for obj in reversed(list(objects)):
        if obj.get("apiVersion") != API_VERSION:
            continue
        plural, name = PLURALS[obj["kind"]], obj["metadata"]["name"]
        ns = obj["metadata"].get("namespace")
        try:
            if ns:
                custom.delete_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
            else:
                custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype:
            found: dict[str, Any] = cond
            return found
    return {}


def get_cluster_queue(api: client.ApiClient, name: str) -> dict[str, Any]:
    custom: Any = client.CustomObjectsApi(api)
    got: dict[str, Any] = custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)
    return got


def wait_active(api: client.ApiClient, cluster_queue: str, timeout: float = 60) -> None:
    """Until the ClusterQueue is Active (its AdmissionChecks Active: the operator's job)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition(get_cluster_queue(api, cluster_queue), "Active").get("status") == "True":
            return
        time.sleep(0.3)
    cq = get_cluster_queue(api, cluster_queue)
    raise TimeoutError(f"ClusterQueue {cluster_queue} not Active: {condition(cq, 'Active')}")


def workloads(api: client.ApiClient, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's Workloads by the name of the MultisliceJob that owns them."""
    custom: Any = client.CustomObjectsApi(api)
    items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]
    out: dict[str, dict[str, Any]] = {}
    for wl in items:
        for owner in wl["metadata"].get("ownerReferences") or []:
            if owner.get("kind") == "MultisliceJob":
                out[owner["name"]] = wl
    return out


def holds_quota(wl: dict[str, Any] | None) -> bool:
    return condition(wl, "QuotaReserved").get("status") == "True"


@dataclass
class Create:
    pool: str
    job: str  # namespace/name, from the pool's node labels
    at: float  # time.monotonic()
    quota_reserved: bool  # the job's Workload held quota when the create reached "GKE"


@dataclass
class QuotaWitness:
    """Looks at the job's Workload at the moment each node-pool create reaches the simulator.

    Wraps ``GkeSimulator.handle`` of an in-process simulator (the test's own), so every create
    the operator sends is seen before it is accepted."""

    sim: Any
    api: client.ApiClient
    creates: list[Create] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _inner: Any = None

    def install(self) -> QuotaWitness:
        inner = self._inner = self.sim.handle

        def handle(
            method: str, path: str, body: bytes, fields: str | None = None
        ) -> tuple[int, dict[str, Any]]:
            if method == "POST" and path.endswith("/nodePools"):
                self._witness(body)
            result: tuple[int, dict[str, Any]] = inner(method, path, body, fields)
            return result

        self.sim.handle = handle
        return self

    def uninstall(self) -> None:
        if self._inner is not None:
            self.sim.handle = self._inner
            self._inner = None

    def _witness(self, body: bytes) -> None:
        try:
            doc = json.loads(body or b"{}")
        except ValueError:
            return
        pool = doc.get("nodePool") or doc.get("node_pool") or doc
        labels = (pool.get("config") or {}).get("labels") or {}
        ns, name = labels.get(keys.JOB_NAMESPACE), labels.get(keys.JOB_NAME)
        if not ns or not name:
            return
        wl = workloads(self.api, ns).get(name)
        entry = Create(str(pool.get("name")), f"{ns}/{name}", time.monotonic(), holds_quota(wl))
        with self._lock:
            self.creates.append(entry)

    def without_quota(self) -> list[Create]:
        with self._lock:
            return [c for c in self.creates if not c.quota_reserved]

    def for_job(self, job: str) -> list[Create]:
        with self._lock:
            return [c for c in self.creates if c.job == job]
