"""A job that names a Kueue queue where no Kueue runs (api profile: no Kueue controller, and its
CRDs only if another test installed them): its Workload cannot be made, or nothing looks at it.
The job must not sit forever claiming to be queued: after the bound its status and one event say
so plainly, and it never holds a node pool (the GKE simulator, in memory, sees no create)."""

from __future__ import annotations

import pytest
from kubernetes import client

from multislice_local.controlplane import bin_dir
from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from multislice_local.harness import OperatorProcess, install_crds, wait_for
from multislice_local.stack import CLUSTER, LOCATION, PROJECT, ZONE
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.reconcile.reasons import Reason
from tests import msj

WAIT = 3.0  # --kueue-workload-wait-seconds


@pytest.fixture(scope="module")
def api(kube_api):
    api_client = kube_api.api_client()
    install_crds(api_client, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
    yield api_client
    api_client.close()


@pytest.fixture
def sim():
    with GkeSimulator(SimConfig(op_latency_s=0.2), registrar=InMemoryRegistrar()) as s:
        yield s


def operator(kube_api, sim, ns, tmp_path, *extra: str) -> OperatorProcess:
    return OperatorProcess(
        kube_api.kubeconfig,
        [
            "--resync-seconds", "1", "--gke-project", PROJECT, "--gke-location", LOCATION,
            "--gke-cluster", CLUSTER, "--gke-node-location", ZONE, "--gke-simulator", sim.url,
            "--kueue-workload-wait-seconds", str(WAIT), *extra,
        ],
        namespaces=[ns],
        log_path=tmp_path / "operator.log",
    ).start()  # fmt: skip


def job(name: str) -> dict:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": name, "labels": {keys.KUEUE_QUEUE_NAME: "team-a"}},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "template": {"spec": {"containers": [{"name": "train", "image": "img:1"}]}},
        },
    }


@pytest.mark.parametrize(
    ("flags", "cause"),
    [(["--kueue"], "Kueue is not installed"), ([], "does not watch Kueue (run it with --kueue")],
    ids=["kueue-watched-not-installed", "operator-without-kueue"],
)
def test_a_queued_job_without_any_kueue_workload_says_so_and_holds_no_pool(
    kube_api, api, namespace, sim, tmp_path, flags, cause
):
    ns = namespace(kube_api, "noq")
    op = operator(kube_api, sim, ns, tmp_path, *flags)
    custom = client.CustomObjectsApi(api)
    try:
        custom.create_namespaced_custom_object(
            models.GROUP, models.VERSION, ns, models.PLURAL, job("lonely")
        )

        def status() -> dict:
            obj = custom.get_namespaced_custom_object(
                models.GROUP, models.VERSION, ns, models.PLURAL, "lonely"
            )
            return obj.get("status") or {}

        # Queued while its Workload is awaited (--kueue), or Pending at once: the operator
        # without --kueue knows it cannot queue the job.
        queued = wait_for(lambda: status().get("phase") in ("Queued", "Pending") and status(),
                          30, "Queued", on_timeout=op.log_tail)  # fmt: skip
        assert queued["queue"]["localQueue"] == "team-a"
        st = wait_for(
            lambda: status().get("phase") == "Pending" and status(),
            30,
            "the status to say no Workload exists",
            on_timeout=op.log_tail,
        )
        # Where Kueue's CRDs are served (another test of this session's cluster installed them)
        # the Workload is made and Kueue never looks at it; else it cannot be made. Either way:
        assert "LocalQueue team-a" in st["message"] and "holds no node pools" in st["message"]
        assert cause in st["message"], st
        admitted = {c["type"]: c for c in st["conditions"]}["Admitted"]
        assert (admitted["status"], admitted["reason"]) == ("False", Reason.NO_KUEUE_WORKLOAD)

        def jobset() -> dict | None:  # made in the pass that wrote the status, just after it
            found = custom.list_namespaced_custom_object(*JS, ns, "jobsets")["items"]
            return next((j for j in found if j["metadata"]["name"] == "lonely"), None)

        js = wait_for(jobset, 30, "the suspended JobSet", on_timeout=op.log_tail)
        assert js["spec"]["suspend"] is True  # nothing runs without Kueue's admission
        # The Workload would be the job's own: no queue label for Kueue's JobSet integration.
        assert keys.KUEUE_QUEUE_NAME not in js["metadata"]["labels"]

        def reasons() -> list[str]:
            items = (
                client.CoreV1Api(api)
                .list_namespaced_event(ns, field_selector="involvedObject.name=lonely")
                .items
            )
            return [e.reason for e in items]

        wait_for(lambda: Reason.NO_KUEUE_WORKLOAD in reasons(), 10, "the event")
        # Several resyncs later: still one event, still no pool ever asked for.
        wait_for(
            lambda: msj.reconciles(op) > 10,
            60,
            "more reconciles",
        )
        assert reasons().count(Reason.NO_KUEUE_WORKLOAD) == 1
        assert sim.pools() == {}
        assert sim.counters()["calls"].get("create_node_pool", 0) == 0
        custom.delete_namespaced_custom_object(
            models.GROUP, models.VERSION, ns, models.PLURAL, "lonely"
        )
        wait_for(
            lambda: (
                not custom.list_namespaced_custom_object(
                    models.GROUP, models.VERSION, ns, models.PLURAL
                )["items"]
            ),
            30,
            "the job deleted (its finalizer lifted)",
            on_timeout=op.log_tail,
        )
    finally:
        op.stop()
    # Up to the deletion, no error: kopf found no Kueue resource to watch and carried on.
    log = op.log_path.read_text().split("finalizer removed")[0]
    assert "Traceback" not in log and " ERROR " not in log, log


JS = ("jobset.x-k8s.io", "v1alpha2")
