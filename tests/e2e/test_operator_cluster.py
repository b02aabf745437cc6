"""The operator with the real JobSet controller, scheduler and kwok nodes (cluster profile).

Nobody patches status here: the JobSet controller, the Job controller and kwok drive everything.
"""

from __future__ import annotations

import contextlib
import threading
from datetime import UTC, datetime, timedelta

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.controlplane import KWOK_NODE_ANNOTATION
from multislice_local.harness import wait_for
from multislice_local.nodes import fail_pod, tpu_node_manifest
from multislice_operator.api import models
from multislice_operator.reconcile.reasons import Reason
from tests import msj
from tests.msj import create, events, get


@pytest.fixture(scope="module")
def op(kube_cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("op") / "operator.log"
    with msj.operator_process(kube_cluster, log, resync_seconds=2) as proc:
        yield proc


@pytest.fixture
def env(kube_cluster, op, namespace, tpu_nodes, kube_client):
    api = kube_client(kube_cluster)
    ns = namespace(kube_cluster, "e2e")
    msj.own_pools(tpu_nodes, ns)
    return api, ns, op


def job(name: str, run: str, ns: str, **spec) -> dict:
    return msj.job(
        name,
        run=run,
        failure_policy={"maxRestarts": 3, "nonRetryableExitCodes": [42]},
        existing=True,
        node_selector=msj.own_nodes(ns),
        **spec,
    )


def wait_phase(api, ns, name, phase, op, timeout=90):
    """The job once in `phase`; on timeout, the operator's last 30 log lines."""
    return msj.wait_phase(api, ns, name, phase, timeout, log=op.log_tail, tail=30)


def pods(api, ns, name):
    return (
        client.CoreV1Api(api)
        .list_namespaced_pod(ns, label_selector=f"multislice.dev/job-name={name}")
        .items
    )


def test_job_succeeds_on_its_own(env):
    api, ns, op = env
    create(api, ns, job("ok", "10s", ns))  # long enough for Running to be seen under load
    running = wait_phase(api, ns, "ok", "Running", op)
    assert running["status"]["readySlices"] == "2/2"
    ps = pods(api, ns, "ok")
    assert len(ps) == 8
    # exclusive placement: each slice's pods on one node pool of its own
    pools_by_slice: dict[str, set[str]] = {}
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    for p in ps:
        pool = nodes[p.spec.node_name].metadata.labels["cloud.google.com/gke-nodepool"]
        pools_by_slice.setdefault(p.metadata.labels["jobset.sigs.k8s.io/job-index"], set()).add(
            pool
        )
    assert all(len(v) == 1 for v in pools_by_slice.values())
    assert len(set().union(*pools_by_slice.values())) == 2
    env_names = {e.name for e in ps[0].spec.containers[0].env}
    assert {"MEGASCALE_SLICE_ID", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES"} <= env_names
    done = wait_phase(api, ns, "ok", "Succeeded", op)
    assert done["status"]["restarts"] == 0


@pytest.mark.compat
def test_retryable_failure_restarts_all_slices_then_succeeds(env):
    api, ns, op = env
    create(api, ns, job("retry", "6s", ns))
    wait_phase(api, ns, "retry", "Running", op)
    victim = sorted(p.metadata.name for p in pods(api, ns, "retry"))[0]
    fail_pod(api, ns, victim, 17)

    def restarted():
        status = get(api, ns, "retry").get("status") or {}
        return status if status.get("restarts", 0) >= 1 else None

    wait_for(restarted, 60, "restart counted", interval=0.5, on_timeout=op.log_tail)
    fresh = [
        p
        for p in pods(api, ns, "retry")
        if p.metadata.labels.get("jobset.sigs.k8s.io/restart-attempt") == "1"
    ]
    wait_for(
        lambda: (
            len(
                [
                    p
                    for p in pods(api, ns, "retry")
                    if p.metadata.labels.get("jobset.sigs.k8s.io/restart-attempt") == "1"
                ]
            )
            == 8
        ),
        60,
        "all 8 pods of both slices recreated",
    )
    done = wait_phase(api, ns, "retry", "Succeeded", op)
    assert done["status"]["restarts"] == 1
    assert Reason.RESTARTING_ALL_SLICES in {e.reason for e in events(api, ns, "retry")}
    assert fresh is not None


def test_non_retryable_failure_fails_the_job(env):
    api, ns, op = env
    create(api, ns, job("fatal", "1h", ns))
    wait_phase(api, ns, "fatal", "Running", op)
    victim = sorted(p.metadata.name for p in pods(api, ns, "fatal"))[-1]
    fail_pod(api, ns, victim, 42)
    failed = wait_phase(api, ns, "fatal", "Failed", op)
    assert victim in failed["status"]["message"]
    assert "42" in failed["status"]["message"]
    assert failed["status"]["restarts"] == 0


@pytest.mark.compat
def test_delete_cascades_to_jobset(env):
    api, ns, op = env
    create(api, ns, job("cascade", "1h", ns))
    wait_phase(api, ns, "cascade", "Running", op)
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "cascade"
    )

    def jobset_gone():
        try:
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "cascade"
            )
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(jobset_gone, 60, "JobSet garbage-collected with its owner")


def test_a_job_recreated_under_the_same_name_never_adopts_its_predecessors_jobset(env):
    """Argo CD's Force=true,Replace=true deletes and recreates a job; the garbage collector
    deletes the old JobSet in the background. Matched by name, the new job would adopt the old
    JobSet with its Completed condition and succeed without running (issue 22). It waits for the
    predecessor's JobSet to go, then runs its own."""
    api, ns, op = env
    custom = msj.custom(api)
    create(api, ns, job("again", "2s", ns))
    wait_phase(api, ns, "again", "Succeeded", op)
    old = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "again")
    old_uid = old["metadata"]["uid"]
    # Hold the old JobSet while the garbage collector works on it (what a slow GC looks like).
    hold = {"metadata": {"finalizers": ["e2e.multislice.dev/hold"]}}
    custom.patch_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "again",
                                          hold)  # fmt: skip
    msj.custom(api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "again"
    )
    wait_for(lambda: get(api, ns, "again", missing_ok=True) is None, 30, "the first job gone")
    create(api, ns, job("again", "2s", ns))
    waiting = msj.wait_status(
        api,
        ns,
        "again",
        "the new job waiting for the earlier job's JobSet",
        lambda st: st.get("phase") == "Pending" and "earlier job" in (st.get("message") or ""),
        60,
        log=op.log_tail,
    )
    assert waiting["status"].get("restarts", 0) == 0
    # Its event is posted after the status write the wait saw: waited for, not read once.
    msj.wait_events(api, ns, "again", "OrphanJobSet: ", log=op.log_tail)
    still = custom.get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "again"
    )
    assert still["metadata"]["uid"] == old_uid and still["metadata"].get("deletionTimestamp")
    custom.patch_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "again", {"metadata": {"finalizers": None}}
    )
    running = wait_phase(api, ns, "again", "Running", op)
    new = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "again")
    assert new["metadata"]["uid"] != old_uid
    owner = new["metadata"]["ownerReferences"][0]["uid"]
    assert owner == running["metadata"]["uid"]
    done = wait_phase(api, ns, "again", "Succeeded", op)
    assert done["status"]["restarts"] == 0


class Kubelets:
    """What the kubelets of `nodes` do for their heartbeat, and nothing else: renew each node's
    Lease (kube-node-lease) every few seconds, from a thread, until stopped."""

    def __init__(self, api: client.ApiClient, nodes: list[str]) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.nodes, self.stop = nodes, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            now = datetime.now(UTC)
            for name in self.nodes:
                spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}
                body = {"metadata": {"name": name}, "spec": spec}
                try:  # a patch, not a replace: an update without a resourceVersion is 422
                    self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": spec})
                except ApiException as err:
                    if err.status != 404:
                        raise
                    self.coord.create_namespaced_lease("kube-node-lease", body)
            self.stop.wait(3)

    def __enter__(self) -> Kubelets:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


def test_nodes_whose_kubelet_went_quiet_are_not_a_ready_slice(env):
    """Issue 56, part 4: under CPU starvation kwok's heartbeats stalled and JobSets were created
    on nodes whose Ready condition still said True. Nodes whose kubelet is quiet (no Lease, a
    Ready condition renewed 10 minutes ago: the node lifecycle controller marks them Unknown only
    once it has watched them for its grace) are not counted Ready; once their Leases are renewed,
    they are, and the JobSet is created."""
    api, ns, op = env
    core = client.CoreV1Api(api)
    quiet = {msj.NODE_LABEL: f"{ns}-quiet"}
    old = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    names = [f"{ns}-quiet-{p}-{i}" for p in range(2) for i in range(4)]
    for name in names:
        pool = name.rsplit("-", 1)[0]
        body = tpu_node_manifest(name, pool, "tpu-v5-lite-podslice", "4x4", 4, extra_labels=quiet)
        del body["metadata"]["annotations"][KWOK_NODE_ANNOTATION]  # kwok does not heartbeat it
        body["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason":
            "KubeletReady", "lastHeartbeatTime": old, "lastTransitionTime": old}]  # fmt: skip
        core.create_node(body)
    try:
        create(api, ns, msj.job("quiet", run="1h", existing=True, node_selector=quiet))
        said = lambda st: "not counted Ready" in (st.get("message") or "")  # noqa: E731
        st = msj.wait_status(api, ns, "quiet", "stale heartbeats named", said, 40, log=op.log_tail)
        assert st["status"]["phase"] == "Pending", st["status"]
        assert f"{ns}-quiet-0-0 (" in st["status"]["message"], st["status"]["message"]
        assert msj.jobset(api, ns, "quiet") is None
        with Kubelets(api, names):  # the kubelets are back: the JobSet is created on them
            wait_phase(api, ns, "quiet", "Starting", op, timeout=40)
    finally:
        msj.custom(api).delete_namespaced_custom_object(
            models.GROUP, models.VERSION, ns, models.PLURAL, "quiet"
        )
        coord = client.CoordinationV1Api(api)
        for name in names:
            core.delete_node(name)
            with contextlib.suppress(ApiException):  # Leases only once the kubelets came back
                coord.delete_namespaced_lease(name, "kube-node-lease")
