"""The ``cluster`` profile: JobSets run to completion and restart on fake TPU nodes."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from multislice_local.controlplane import (
    ControlPlane,
)
from multislice_local.nodes import (
    FAIL_EXIT_CODE_ANNOTATION,
    FAIL_MESSAGE_ANNOTATION,
    RUN_DURATION_ANNOTATION,
    fail_pod,
)
from multislice_operator.common import keys

GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"
ACCELERATOR, TOPOLOGY, CHIPS_PER_HOST = "tpu-v5-lite-podslice", "2x4", 4
HOSTS_PER_SLICE = 2
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
RETRYABLE_EXIT_CODE = 17


def _jobset(name: str, slices: int, isolation: str, run_duration: str) -> dict[str, Any]:
    """A multislice-shaped JobSet: one replicatedJob, one Job per slice, exclusive node pools."""
    pod_spec = {
        "restartPolicy": "Never",
        # ``isolation`` keeps this test's pods on its own node pools in the shared cluster.
        "nodeSelector": {
            "cloud.google.com/gke-tpu-accelerator": ACCELERATOR,
            "cloud.google.com/gke-tpu-topology": TOPOLOGY,
            "multislice.dev/test": isolation,
        },
        "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "worker",
                "image": "example.invalid/trainer:latest",
                "resources": {
                    "requests": {"google.com/tpu": str(CHIPS_PER_HOST)},
                    "limits": {"google.com/tpu": str(CHIPS_PER_HOST)},
                },
            }
        ],
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "annotations": {"alpha.jobset.sigs.k8s.io/exclusive-topology": keys.GKE_NODEPOOL},
        },
        "spec": {
            "failurePolicy": {
                "maxRestarts": 3,
                "rules": [
                    {"action": "RestartJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
                    {"action": "FailJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]},
                ],
            },
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": slices,
                    "template": {
                        "spec": {
                            "parallelism": HOSTS_PER_SLICE,
                            "completions": HOSTS_PER_SLICE,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            # The retryable exit code fails the Job with reason PodFailurePolicy,
                            # which the JobSet answers by restarting every Job.
                            "podFailurePolicy": {
                                "rules": [
                                    {
                                        "action": "FailJob",
                                        "onExitCodes": {
                                            "operator": "In",
                                            "values": [RETRYABLE_EXIT_CODE],
                                        },
                                    }
                                ]
                            },
                            "template": {
                                "metadata": {
                                    "annotations": {RUN_DURATION_ANNOTATION: run_duration}
                                },
                                "spec": pod_spec,
                            },
                        }
                    },
                }
            ],
        },
    }


def _wait(what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def _condition(jobset: dict[str, Any], kind: str) -> bool:
    conditions = jobset.get("status", {}).get("conditions", [])
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


class _Env:
    def __init__(
        self,
        cluster: ControlPlane,
        make_client: Callable[[ControlPlane], client.ApiClient],
        namespace: Callable[..., str],
        tpu_nodes: Callable[..., list[str]],
        pools: int,
    ) -> None:
        api_client = make_client(cluster)
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.ns = namespace(cluster)
        self.isolation = uuid.uuid4().hex[:8]
        self.pools = [f"np-{self.isolation}-{i}" for i in range(pools)]
        for pool in self.pools:
            tpu_nodes(
                pool,
                HOSTS_PER_SLICE,
                ACCELERATOR,
                TOPOLOGY,
                CHIPS_PER_HOST,
                extra_labels={"multislice.dev/test": self.isolation},
            )

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body)

    def jobset(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, name
        )
        return obj

    def pods(self, name: str) -> list[client.V1Pod]:
        selector = f"jobset.sigs.k8s.io/jobset-name={name}"
        return list(self.core.list_namespaced_pod(self.ns, label_selector=selector).items)

    def node_pool(self, node_name: str) -> str:
        labels = self.core.read_node(node_name).metadata.labels  # type: ignore[union-attr]
        return str(labels[keys.GKE_NODEPOOL])


def test_jobset_completes_with_exclusive_node_pools(
    kube_cluster: ControlPlane,
    kube_client: Callable[[ControlPlane], client.ApiClient],
    namespace: Callable[..., str],
    tpu_nodes: Callable[..., list[str]],
) -> None:
    env = _Env(kube_cluster, kube_client, namespace, tpu_nodes, pools=2)
    env.create(_jobset("train", slices=2, isolation=env.isolation, run_duration="2s"))

    done = _wait(
        "JobSet Completed", lambda: _condition(js := env.jobset("train"), "Completed") and js
    )
    assert not _condition(done, "Failed")
    pods = env.pods("train")
    assert len(pods) == 2 * HOSTS_PER_SLICE
    assert all(p.status.phase == "Succeeded" for p in pods)  # type: ignore[union-attr]

    pools_by_job: dict[str, set[str]] = {}
    for pod in pods:
        job = pod.metadata.labels["jobset.sigs.k8s.io/job-index"]  # type: ignore[union-attr,index]
        pools_by_job.setdefault(job, set()).add(env.node_pool(pod.spec.node_name))  # type: ignore[union-attr,arg-type]
    assert len(pools_by_job) == 2
    # Each slice's Job sits on exactly one node pool, and no two slices share one.
    assert all(len(p) == 1 for p in pools_by_job.values()), pools_by_job
    used = [next(iter(p)) for p in pools_by_job.values()]
    assert sorted(used) == sorted(env.pools)
    # And that is the JobSet webhook's doing, not luck: leaders repel other Jobs' leaders per
    # node pool, followers are pinned to their leader's pool.
    for pod in pods:
        index = pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]  # type: ignore[union-attr,index]
        if index == "0":
            anti = pod.spec.affinity.pod_anti_affinity  # type: ignore[union-attr]
            terms = anti.required_during_scheduling_ignored_during_execution  # type: ignore[union-attr]
            assert [t.topology_key for t in terms] == [keys.GKE_NODEPOOL]
        else:
            assert pod.spec.node_selector[keys.GKE_NODEPOOL] == env.node_pool(pod.spec.node_name)  # type: ignore[union-attr,index,arg-type]


def test_retryable_failure_restarts_every_job(
    kube_cluster: ControlPlane,
    kube_client: Callable[[ControlPlane], client.ApiClient],
    namespace: Callable[..., str],
    tpu_nodes: Callable[..., list[str]],
) -> None:
    env = _Env(kube_cluster, kube_client, namespace, tpu_nodes, pools=2)
    # Pods run "forever" until the test makes one fail.
    env.create(_jobset("train", slices=2, isolation=env.isolation, run_duration="1h"))

    def running(attempt: str) -> list[client.V1Pod]:
        pods = [
            p
            for p in env.pods("train")
            if p.metadata.labels.get(RESTART_ATTEMPT) == attempt  # type: ignore[union-attr]
            and p.status.phase == "Running"  # type: ignore[union-attr]
            and not p.metadata.deletion_timestamp  # type: ignore[union-attr]
        ]
        return pods if len(pods) == 2 * HOSTS_PER_SLICE else []

    first = _wait("4 running pods of attempt 0", lambda: running("0"))
    victim = next(
        p
        for p in first
        if p.metadata.labels["jobset.sigs.k8s.io/job-index"] == "1"  # type: ignore[union-attr,index]
    )
    fail_pod(env.core.api_client, env.ns, victim.metadata.name, RETRYABLE_EXIT_CODE)  # type: ignore[union-attr,arg-type]

    def restarted() -> bool:
        jobset = env.jobset("train")
        assert not _condition(jobset, "Failed"), f"JobSet failed instead of restarting: {jobset}"
        return int(jobset.get("status", {}).get("restarts", 0)) >= 1

    _wait("JobSet restart", restarted)
    second = _wait("4 running pods of attempt 1", lambda: running("1"))
    old_uids = {p.metadata.uid for p in first}  # type: ignore[union-attr]
    assert not old_uids & {p.metadata.uid for p in second}  # type: ignore[union-attr]
    jobset = env.jobset("train")
    assert jobset["status"]["restarts"] == 1
    assert not _condition(jobset, "Failed")
    assert not _condition(jobset, "Completed")
    # Every Job was recreated, not only the failed one.
    jobs = client.BatchV1Api(env.core.api_client).list_namespaced_job(env.ns).items
    live = [j for j in jobs if not j.metadata.deletion_timestamp]  # type: ignore[union-attr]
    assert sorted(j.metadata.labels[RESTART_ATTEMPT] for j in live) == ["1", "1"]  # type: ignore[union-attr,index]


def test_kwok_stages_honour_run_and_fail_annotations(
    kube_cluster: ControlPlane,
    kube_client: Callable[[ControlPlane], client.ApiClient],
    namespace: Callable[..., str],
    tpu_nodes: Callable[..., list[str]],
) -> None:
    env = _Env(kube_cluster, kube_client, namespace, tpu_nodes, pools=1)
    batch = client.BatchV1Api(env.core.api_client)

    def job(name: str, annotations: dict[str, str]) -> dict[str, Any]:
        spec = _jobset("unused", 1, env.isolation, "1s")["spec"]["replicatedJobs"][0]["template"]
        spec["spec"]["podFailurePolicy"] = None
        spec["spec"]["template"]["metadata"] = {"annotations": annotations}
        return {
            "metadata": {"name": name},
            "spec": {**spec["spec"], "parallelism": 1, "completions": 1},
        }

    batch.create_namespaced_job(env.ns, job("ok", {RUN_DURATION_ANNOTATION: "1s"}))  # type: ignore[arg-type]
    batch.create_namespaced_job(env.ns, job("bad", {FAIL_EXIT_CODE_ANNOTATION: "42"}))  # type: ignore[arg-type]
    said = '{"v": 1, "reason": "injected", "exitCode": 13, "step": 120, "checkpointStep": 100}'
    told = {FAIL_EXIT_CODE_ANNOTATION: "13", FAIL_MESSAGE_ANNOTATION: said}
    batch.create_namespaced_job(env.ns, job("told", told))  # type: ignore[arg-type]

    def pod_of(name: str, phase: str) -> client.V1Pod | None:
        pods = env.core.list_namespaced_pod(env.ns, label_selector=f"job-name={name}").items
        return next((p for p in pods if p.status.phase == phase), None)  # type: ignore[union-attr]

    ok = _wait("ok pod Succeeded", lambda: pod_of("ok", "Succeeded"))
    assert ok.status.container_statuses[0].state.terminated.exit_code == 0
    bad = _wait("bad pod Failed", lambda: pod_of("bad", "Failed"))
    assert bad.status.container_statuses[0].state.terminated.exit_code == 42
    assert bad.status.container_statuses[0].state.terminated.message == (
        "injected failure, exit code 42"
    )
    # The termination message the workload would write, as the operator reads it.
    told_pod = _wait("told pod Failed", lambda: pod_of("told", "Failed"))
    term = told_pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.message) == (13, said)


def test_cluster_start_stop_leaves_no_process() -> None:
    cp = ControlPlane("cluster")
    try:
        cp.start()
        pids = cp.pids
        workdir = cp.workdir
        assert set(pids) == {
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "jobset-controller",
        }
    finally:
        cp.stop()
    assert [name for name, pid in pids.items() if Path(f"/proc/{pid}").exists()] == []
    assert not workdir.exists()
