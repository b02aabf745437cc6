"""Plugins written outside the package, end to end (issue 53): the operator, started with
`MSJ_PLUGINS` naming tests/plugins/labelled.py and tests/plugins/blocking.py, runs a `Labelled`
job (pools reserved for it by a node label) with JobSet's `BlockingRecreate` on the real
apiserver, JobSet controller, scheduler and kwok nodes.

The CRD is installed from the registry with the plugins loaded (its enums and allow-list rules
then name `Labelled` and `BlockingRecreate`), and put back as the package alone makes it when the
module ends. Nothing under operator/ names either plugin.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.controlplane import ControlPlane
from multislice_local.harness import OperatorProcess, install_crds, wait_for
from multislice_local.nodes import fail_pod
from multislice_operator.api import models
from multislice_operator.planning.plan import job_key
from multislice_operator.registry import ENV, REGISTRY
from tests import msj
from tests.msj import create, get
from tests.plugins.labelled import RESERVED_FOR

PLUGINS = ("tests.plugins.labelled:register", "tests.plugins.blocking:register")
ROOT = Path(__file__).resolve().parents[2]
NAME = "reserved"
V5E = ("tpu-v5-lite-podslice", "4x4", 4)  # v5litepod-16: 4 hosts of 4 chips


@pytest.fixture(scope="module")
def op(kube_cluster: ControlPlane, tmp_path_factory: Any) -> Iterator[OperatorProcess]:
    """The operator with the plugins (the repository root on its path, as pytest's), on a CRD
    that the plugins' registry generated; the package's own CRD is put back after."""
    state = REGISTRY.snapshot()
    REGISTRY.load(PLUGINS)
    api = kube_cluster.api_client()
    try:
        install_crds(api)
        log = tmp_path_factory.mktemp("op") / "operator.log"
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        proc = OperatorProcess(
            kube_cluster.kubeconfig,
            ["--resync-seconds", "2"],
            env={ENV: ",".join(PLUGINS), "PYTHONPATH": path},
            log_path=log,
        )
        proc.start()
        try:
            yield proc
        finally:
            proc.stop()
    finally:
        REGISTRY.restore(state)
        install_crds(api)
        api.close()


@pytest.fixture
def env(
    kube_cluster: ControlPlane,
    op: OperatorProcess,
    namespace: Any,
    tpu_nodes: Any,
    kube_client: Any,
) -> tuple[client.ApiClient, str, OperatorProcess]:
    """Four pools of the job's shape, the namespace's own: two reserved for job `reserved`, two
    not; only the label tells them apart."""
    api = kube_client(kube_cluster)
    ns = namespace(kube_cluster, "plugins")
    reserved = {**msj.own_nodes(ns), RESERVED_FOR: job_key(ns, NAME)}
    for p in range(2):
        tpu_nodes(f"{ns}-free-{p}", 4, *V5E, extra_labels=msj.own_nodes(ns))
        tpu_nodes(f"{ns}-reserved-{p}", 4, *V5E, extra_labels=reserved)
    return api, ns, op


def labelled(ns: str, run: str, **spec: Any) -> dict[str, Any]:
    body = msj.job(
        NAME,
        run=run,
        failure_policy={"maxRestarts": 3},
        node_selector=msj.own_nodes(ns),
        **spec,
    )
    body["spec"]["provisioning"] = {"mode": "Labelled"}
    return body


def pods(api: client.ApiClient, ns: str) -> list[Any]:
    return list(
        client.CoreV1Api(api)
        .list_namespaced_pod(ns, label_selector=f"multislice.dev/job-name={NAME}")
        .items
    )


def pools_of(api: client.ApiClient, ps: list[Any]) -> set[str]:
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    return {nodes[p.spec.node_name].metadata.labels["cloud.google.com/gke-nodepool"] for p in ps}


def test_spares_on_a_labelled_job_are_refused_naming_the_field(env: Any) -> None:
    api, ns, _ = env
    with pytest.raises(ApiException) as err:
        create(api, ns, labelled(ns, "1h", spares=1))
    assert err.value.status == 422
    assert "spec.spares needs provisioning.mode: Managed" in str(err.value.body)


def test_a_labelled_job_runs_on_its_pools_restarts_blocking_and_succeeds(env: Any) -> None:
    api, ns, op = env
    create(api, ns, labelled(ns, "8s"))  # long enough for Running to be seen under load
    running = msj.wait_phase(api, ns, NAME, "Running", 120, log=op.log_tail)
    reserved = {f"{ns}-reserved-0", f"{ns}-reserved-1"}
    assert running["status"]["capacity"] == {
        "reservedFor": job_key(ns, NAME),
        "pools": sorted(reserved),
    }
    first = pods(api, ns)
    assert len(first) == 8 and pools_of(api, first) == reserved  # never a free pool
    jobset = msj.jobset(api, ns, NAME)
    assert jobset is not None
    assert jobset["spec"]["failurePolicy"]["restartStrategy"] == "BlockingRecreate"

    victim = sorted(p.metadata.name for p in first)[0]
    fail_pod(api, ns, victim, 17)  # a retryable exit: every slice restarts
    done = msj.wait_phase(api, ns, NAME, "Succeeded", 180, log=op.log_tail)
    status = done["status"]
    assert status["restarts"] == 1
    assert status["lastRestart"]["strategy"] == "BlockingRecreate"
    assert status["restartsByCause"]["workload"] == 1
    attempt = "jobset.sigs.k8s.io/restart-attempt"
    again = [p for p in pods(api, ns) if p.metadata.labels.get(attempt) == "1"]
    assert again and pools_of(api, again) <= reserved

    msj.custom(api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, NAME
    )

    def nothing_left() -> bool:
        return (
            get(api, ns, NAME, missing_ok=True) is None
            and msj.jobset(api, ns, NAME) is None
            and not pods(api, ns)
        )

    wait_for(nothing_left, 120, "the job, its JobSet and its pods gone", on_timeout=op.log_tail)
