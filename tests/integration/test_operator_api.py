"""The operator against a real apiserver (api profile): Existing mode, the JobSet status is
patched by the test as envtest tests do, and the job's phases follow."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.controlplane import bin_dir
from multislice_local.harness import OperatorProcess, install_crds, wait_for
from multislice_local.nodes import register_tpu_nodes
from multislice_operator.api import models
from multislice_operator.reconcile.reasons import Reason
from tests import msj

JS = ("jobset.x-k8s.io", "v1alpha2")


@pytest.fixture(scope="module")
def api(kube_api):
    api_client = kube_api.api_client()
    install_crds(api_client, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
    _ready_pools(api_client, "existing-v5e", 2, 4)
    yield api_client
    api_client.close()


def _ready_pools(api_client, prefix: str, pools: int, hosts: int) -> None:
    core = client.CoreV1Api(api_client)
    for p in range(pools):
        for name in register_tpu_nodes(
            api_client, f"{prefix}-{p}", hosts, "tpu-v5-lite-podslice", "4x4", 4
        ):
            core.patch_node_status(
                name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
            )


@pytest.fixture(scope="module")
def operator(kube_api, api, tmp_path_factory):
    log = tmp_path_factory.mktemp("op") / "operator.log"
    with msj.operator_process(kube_api, log, resync_seconds=2, crds=False) as op:
        yield op


def job(name: str, **spec) -> dict:
    return msj.job(name, existing=True, failure_policy={"maxRestarts": 3}, image="img:1", **spec)


class Cluster:
    def __init__(self, api_client, ns: str, op: OperatorProcess) -> None:
        self.api = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.ns, self.op = ns, op

    def create(self, body: dict) -> dict:
        return msj.create(self.api, self.ns, body)

    def get(self, name: str) -> dict:
        return msj.get(self.api, self.ns, name)

    def patch(self, name: str, patch: dict) -> None:
        self.custom.patch_namespaced_custom_object(
            models.GROUP, models.VERSION, self.ns, models.PLURAL, name, patch
        )

    def jobset(self, name: str) -> dict | None:
        try:
            return self.custom.get_namespaced_custom_object(*JS, self.ns, "jobsets", name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def jobset_status(self, name: str, status: dict) -> None:
        """As the JobSet controller writes it: once the JobSet exists."""
        msj.wait_jobset(self.api, self.ns, name, 30, log=self.op.log_tail)
        self.custom.patch_namespaced_custom_object_status(
            *JS, self.ns, "jobsets", name, {"status": status}
        )

    def phase(self, name: str, phase: str, timeout: float = 30, message: str = "") -> dict:
        """The job once in `phase` with `message` in its status message (a phase has several
        messages over time: wait for the one the test asserts)."""

        def check():
            st = self.get(name).get("status") or {}
            return st.get("phase") == phase and message in (st.get("message") or "")

        what = f"{name} phase {phase}" + (f" saying {message!r}" if message else "")
        return wait_for(
            lambda: check() and self.get(name), timeout, what, on_timeout=self._debug(name)
        )

    def events(self, name: str) -> list[str]:
        return msj.event_lines(self.api, self.ns, name)

    def _debug(self, name: str):
        def show() -> str:
            try:
                status = self.get(name).get("status")
            except ApiException:
                status = "?"
            return f"status={status}\noperator log:\n{self.op.log_tail(40)}"

        return show


@pytest.fixture
def cluster(api, operator, namespace, kube_api) -> Cluster:
    return Cluster(api, namespace(kube_api, "op"), operator)


def rj_status(ready=0, active=0, succeeded=0, failed=0) -> list[dict]:
    return [
        {
            "name": "slice",
            "ready": ready,
            "active": active,
            "succeeded": succeeded,
            "failed": failed,
            "suspended": 0,
        }
    ]


def test_lifecycle_running_restarting_succeeded(cluster: Cluster):
    cluster.create(job("life"))
    starting = cluster.phase("life", "Starting")
    js = wait_for(lambda: cluster.jobset("life"), 10, "JobSet created")
    owner = js["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "MultisliceJob",
        "life",
        starting["metadata"]["uid"],
    )
    assert js["spec"]["replicatedJobs"][0]["replicas"] == 2
    assert starting["status"]["totalChips"] == 32
    assert starting["status"]["jobSet"] == "life"
    cluster.jobset_status("life", {"replicatedJobsStatus": rj_status(ready=2, active=2)})
    running = cluster.phase("life", "Running")
    assert running["status"]["readySlices"] == "2/2"
    cond = {c["type"]: c["status"] for c in running["status"]["conditions"]}
    assert cond["SlicesReady"] == "True" and cond["Validated"] == "True"
    cluster.jobset_status("life", {"restarts": 1, "replicatedJobsStatus": rj_status(active=2)})
    restarting = cluster.phase("life", "Restarting")
    assert restarting["status"]["restarts"] == 1
    cluster.jobset_status("life", {"replicatedJobsStatus": rj_status(ready=2, active=2)})
    cluster.phase("life", "Running")
    cluster.jobset_status(
        "life",
        {
            "terminalState": "Completed",
            "conditions": [
                {
                    "type": "Completed",
                    "status": "True",
                    "reason": "AllJobsCompleted",
                    "message": "done",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "replicatedJobsStatus": rj_status(succeeded=2),
        },
    )
    done = cluster.phase("life", "Succeeded")
    assert done["status"]["completionTime"]
    assert done["status"]["restarts"] == 1
    # Posted after the status write that the phase wait saw: waited for, not read once.
    msj.wait_events(cluster.api, cluster.ns, "life", Reason.RESTARTING_ALL_SLICES, "Succeeded",
                    log=cluster.op.log_tail)  # fmt: skip


def test_jobset_failure_fails_job(cluster: Cluster):
    cluster.create(job("fail"))
    cluster.phase("fail", "Starting")
    cluster.jobset_status(
        "fail",
        {
            "terminalState": "Failed",
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "FailedJobs",
                    "message": "jobset failed",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    )
    failed = cluster.phase("fail", "Failed")
    cond = {c["type"]: c for c in failed["status"]["conditions"]}
    assert cond["Failed"]["status"] == "True"


def test_suspend_and_resume(cluster: Cluster):
    cluster.create(job("sus"))
    cluster.phase("sus", "Starting")
    cluster.patch("sus", {"spec": {"suspend": True}})
    cluster.phase("sus", "Suspended")
    wait_for(
        lambda: (cluster.jobset("sus") or {}).get("spec", {}).get("suspend") is True,
        10,
        "JobSet suspended",
    )
    cluster.patch("sus", {"spec": {"suspend": False}})
    cluster.phase("sus", "Starting")
    wait_for(
        lambda: (cluster.jobset("sus") or {}).get("spec", {}).get("suspend") is False,
        10,
        "JobSet resumed",
    )


def test_waits_for_existing_pools(cluster: Cluster):
    cluster.create(job("big", slices=3))  # only two matching pools exist
    # Pending says "checking the JobSet with the apiserver (dry run)" first: wait for the count.
    pending = cluster.phase("big", "Pending", message="2 ready of 2 found")
    assert "waiting for 3 existing node pools" in pending["status"]["message"]
    msj.wait_reconciles(cluster.op, 2)
    assert cluster.jobset("big") is None
    assert cluster.get("big")["status"]["phase"] == "Pending"


def test_invalid_object_gets_status_and_others_keep_working(cluster: Cluster):
    # ici product is checked by the operator (it needs the catalog), not by the schema.
    bad = job("badici", parallelism={"ici": {"data": 1, "fsdp": 2, "tensor": 1}})
    cluster.create(bad)
    failed = cluster.phase("badici", "Failed")
    cond = {c["type"]: c for c in failed["status"]["conditions"]}
    assert cond["Validated"]["status"] == "False"
    assert "spec.parallelism.ici" in cond["Validated"]["message"]
    cluster.create(job("good"))
    cluster.phase("good", "Starting")


def test_delete_removes_job(cluster: Cluster):
    cluster.create(job("gone"))
    cluster.phase("gone", "Starting")
    cluster.custom.delete_namespaced_custom_object(
        models.GROUP, models.VERSION, cluster.ns, models.PLURAL, "gone"
    )

    def deleted() -> bool:
        try:
            cluster.get("gone")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(deleted, 20, "job deleted through the finalizer")


def test_no_writes_when_idle(cluster: Cluster):
    cluster.create(job("idle"))
    cluster.phase("idle", "Starting")
    cluster.jobset_status("idle", {"replicatedJobsStatus": rj_status(ready=2, active=2)})
    first = cluster.phase("idle", "Running")["metadata"]["resourceVersion"]
    msj.wait_reconciles(cluster.op, 3)  # three passes over an unchanged world
    assert cluster.get("idle")["metadata"]["resourceVersion"] == first


def test_ttl_deletes_finished_job(cluster: Cluster):
    cluster.create(job("ttl", ttlSecondsAfterFinished=2))
    cluster.phase("ttl", "Starting")
    cluster.jobset_status(
        "ttl",
        {
            "terminalState": "Completed",
            "conditions": [
                {
                    "type": "Completed",
                    "status": "True",
                    "reason": "AllJobsCompleted",
                    "message": "done",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
        },
    )
    cluster.phase("ttl", "Succeeded")

    def deleted() -> bool:
        try:
            cluster.get("ttl")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(deleted, 30, "job deleted after ttlSecondsAfterFinished")


def test_metrics_endpoint(cluster: Cluster):
    import urllib.request

    cluster.create(job("metrics"))
    cluster.phase("metrics", "Starting")
    names = (
        'multislice_reconcile_total{result="success"}',
        "multislice_reconcile_time_seconds_bucket",
        f'multislice_jobs{{namespace="{cluster.ns}",phase="Starting"}}',
        "multislice_restarts_total",
        "multislice_provisioning_duration_seconds",
        "multislice_time_to_running_seconds",
        "multislice_slice_failures_total",
    )

    def scrape() -> str:
        with urllib.request.urlopen(cluster.op.metrics_url, timeout=5) as resp:
            return resp.read().decode()

    # The phase gauge is recorded after the status write the phase wait saw.
    text = wait_for(lambda: all(n in (t := scrape()) for n in names) and t, 30, "the series")
    for name in names:
        assert name in text, name


def test_the_local_operator_runs_with_the_images_allocator(operator):
    """Issue 56: the local stack ran the operator on the venv's Python without the image's
    allocator. It now gets the Dockerfile's LD_PRELOAD, PYTHONMALLOC and MALLOC_CONF wherever a
    jemalloc can be had (multislice_local/allocator.py), and the library is loaded."""
    from multislice_local import allocator

    assert operator.proc is not None
    pid = operator.proc.pid
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    environ = dict(v.decode().partition("=")[::2] for v in raw if b"=" in v)
    expected = allocator.operator_env()
    assert {k: environ.get(k) for k in expected} == expected
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert (allocator.LIBRARY in maps) == ("LD_PRELOAD" in expected), expected
