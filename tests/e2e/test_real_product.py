"""The product as users run it, on real nodes (issue 52; docs/real-nodes.md).

Real kubelets, containerd and runc under the local control plane (the ``real_cluster`` session
fixture); the operator image and the workload image built offline from the repo's recipes and
imported under the names the chart and the examples use; the chart installed by ``helm install``
with no values. So the operator runs as the chart's Deployment (its ServiceAccount, RBAC,
admission policies, probes, metrics over TLS, read-only root, uid 65532), in-place restart is on
with the operator's own image as the agent's, and a MultisliceJob of 2 slices x 2 hosts runs the
workload image in real pods: JAX trains on CPU with the environment the kubelet resolved, a
container's retryable exit restarts every container in place through JobSet's real agent, a
drained node recreates the pods, and training resumes from the checkpoint each time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from multislice_local import realnodes
from multislice_local.images import BuiltImage
from multislice_local.realstack import (
    CONTAINER,
    RealStack,
    chart_image,
    helm,
    job_manifest,
    progress,
    wait_for,
)
from multislice_operator.api import models
from multislice_operator.common import keys

GROUP, VERSION, PLURAL = models.GROUP, models.VERSION, models.PLURAL
# Four JAX processes on a shared 2-core machine (a step takes 2-4 s): bounds for that.
RUN_TIMEOUT = 600.0
STEPS = 30


@pytest.fixture(scope="module")
def stack(
    real_cluster: realnodes.RealCluster, operator_image: BuiltImage, workload_image: BuiltImage
) -> Iterator[RealStack]:
    installed = RealStack(real_cluster).install(operator_image, workload_image)
    yield installed
    installed.uninstall()


@pytest.fixture
def api(stack: RealStack) -> Iterator[client.ApiClient]:
    api_client = stack.api
    yield api_client
    api_client.close()


def _job(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name
    )
    return got


def _status(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    return dict(_job(api, ns, name).get("status") or {})


def _pods(api: client.ApiClient, ns: str, name: str) -> list[Any]:
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod(ns, label_selector=f"{keys.JOB_NAME}={name}")
        .items
    )
    return sorted(pods, key=lambda p: str(p.metadata.name))


def _train(pod: Any) -> Any:
    return next(c for c in pod.status.container_statuses or [] if c.name == CONTAINER)


def test_the_chart_installs_with_no_values_and_runs_the_operator_as_it_says(
    stack: RealStack, api: client.ApiClient
) -> None:
    supplied = helm(stack.cluster.kubeconfig, "get", "values", stack.release, "-n",
                    stack.namespace, "-o", "json")  # fmt: skip
    assert json.loads(supplied) in (None, {})  # installed as a user would: no values
    pod = stack.operator_pod()
    assert pod is not None and pod.spec.node_name == "cpu-0"  # no TPU taint tolerated
    (container,) = pod.spec.containers
    assert container.image == chart_image()  # the chart's default, served by the nodes
    env = {e.name: e.value for e in container.env}
    assert env["MSJ_IN_PLACE_AGENT_IMAGE"] == chart_image()  # the agent: the operator's image
    # What the process really is, asked inside the container (the image has no shell).
    python = "/opt/multislice-operator/bin/python"
    ident = stack.kubectl(
        "exec", "-n", stack.namespace, pod.metadata.name, "--", python, "-c",
        "import os; print(os.getuid(), os.getgid())",
    )  # fmt: skip
    assert ident.split() == ["65532", "65532"]
    write = stack.kubectl(
        "exec", "-n", stack.namespace, pod.metadata.name, "--", python, "-c",
        "open('/opt/x', 'w')", check=False,
    )  # fmt: skip
    assert "Read-only file system" in write, write
    ready = {c.type: c.status for c in pod.status.conditions}
    assert ready["Ready"] == "True"  # the kubelet ran /readyz: caches synced, Lease held
    assert container.liveness_probe.http_get.path == "/healthz"
    assert "in-place restart: used" in stack.operator_log()


def test_metrics_are_served_over_tls_to_the_metrics_reader_only(
    stack: RealStack, api: client.ApiClient
) -> None:
    import ssl
    import urllib.error
    import urllib.request

    pod = stack.operator_pod()
    url = f"https://{pod.status.pod_ip}:8000/metrics"  # the host routes to the node's pods
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # self-signed by default

    def scrape(token: str | None) -> int:
        request = urllib.request.Request(url)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                assert b"multislice_" in response.read()
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    reader = "metrics-scraper"
    stack.kubectl("create", "serviceaccount", reader, "-n", stack.namespace)
    stack.kubectl(
        "create", "clusterrolebinding", f"{stack.release}-test-reader",
        f"--clusterrole={stack.release}-metrics-reader",
        f"--serviceaccount={stack.namespace}:{reader}",
    )  # fmt: skip
    try:
        token = stack.kubectl("create", "token", reader, "-n", stack.namespace).strip()
        own = stack.kubectl("create", "token", stack.release, "-n", stack.namespace).strip()
        assert scrape(None) == 401
        assert scrape(own) == 403  # authenticated, not a metrics reader
        assert wait_for(lambda: scrape(token) == 200, 30, "a reader's scrape")
    finally:
        stack.kubectl("delete", "clusterrolebinding", f"{stack.release}-test-reader")
        stack.kubectl("delete", "serviceaccount", reader, "-n", stack.namespace)


def test_the_admission_policies_hold_against_the_operators_own_account(
    stack: RealStack, api: client.ApiClient, namespace: Any
) -> None:
    """Its ServiceAccount may patch only the multislice.dev/ annotations of a MultisliceJob's
    pods: RBAC grants pods patch, the chart's policy narrows it, here against its real token."""
    from kubernetes import config

    ns = namespace(stack.cluster.control_plane, "rp")
    token = stack.kubectl("create", "token", stack.release, "-n", stack.namespace).strip()
    cfg = client.Configuration()
    admin = config.new_client_from_config(config_file=str(stack.cluster.kubeconfig))
    cfg.host = admin.configuration.host
    cfg.ssl_ca_cert = admin.configuration.ssl_ca_cert
    cfg.api_key = {"authorization": f"Bearer {token}"}
    as_operator = client.CoreV1Api(client.ApiClient(cfg))
    core = client.CoreV1Api(api)
    pod = {
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": {
            "containers": [{"name": "c", "image": stack.cluster.probe_image, "args": ["sleep"]}]
        },
    }
    core.create_namespaced_pod(ns, pod)
    patch = {"metadata": {"annotations": {"multislice.dev/checkpoint-request": "x"}}}
    with pytest.raises(client.ApiException) as refused:
        as_operator.patch_namespaced_pod("web", ns, patch)
    assert refused.value.status == 403
    assert "ValidatingAdmissionPolicy" in str(refused.value.body), refused.value.body


@pytest.mark.timeout(1800)  # the job's own time: 4 JAX processes stepping on a loaded machine
def test_a_job_in_real_pods_restarts_in_place_then_recreates_and_succeeds(
    stack: RealStack, api: client.ApiClient, namespace: Any
) -> None:
    ns = namespace(stack.cluster.control_plane, "rj")
    core = client.CoreV1Api(api)
    # Process 3 (slice 1, worker 1) exits 13 after step 8, on the first attempt only; the step-5
    # checkpoint is settled before step 6, so "the last checkpoint" is known.
    body = job_manifest(
        "llm", ns, stack.checkpoints, steps=STEPS, checkpoint_every=5, fail_process=3,
        fail_at_step=8, settle_at_step=5,
    )  # fmt: skip
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def log() -> str:
        return f"status: {_status(api, ns, 'llm')}\noperator: {stack.operator_log(tail=40)}"

    # Running: four pods, two per TPU pool, each on its own host, with the agent beside train.
    wait_for(lambda: _status(api, ns, "llm").get("phase") == "Running", RUN_TIMEOUT, log())
    pods = _pods(api, ns, "llm")
    assert len(pods) == 4 and len({p.spec.node_name for p in pods}) == 4
    assert all(p.spec.host_network for p in pods)
    assert [c.name for p in pods for c in p.spec.init_containers] == ["in-place-restart-agent"] * 4
    first = {p.metadata.name: p.metadata.uid for p in pods}

    # The environment the kubelet resolved, as the workload reports it: every process joined
    # the coordinator at the first pod's DNS name and sees the 16 devices of both slices.
    started = wait_for(lambda: len(progress(core, ns, "llm").of("mesh")) == 4, RUN_TIMEOUT, log())
    assert started
    run = progress(core, ns, "llm")
    assert {e["global_devices"] for e in run.of("mesh")} == {16}
    assert sorted(e["process_id"] for e in run.of("start")) == [0, 1, 2, 3]

    # In place: process 3 exits 13 after step 8; every container restarts in its pod (same
    # pods, same UIDs), JobSet recreates nothing, and all resume from step 5.
    def restarted_in_place() -> dict[str, Any] | None:
        st = _status(api, ns, "llm")
        last = st.get("lastRestart") or {}
        return st if last.get("strategy") == "InPlaceRestart" else None

    st = wait_for(restarted_in_place, RUN_TIMEOUT, log())
    assert st["lastRestart"]["cause"] == "workload" and st["restartsByCause"]["workload"] == 1
    # The program's exit (13, with its termination message) is in the container's state only
    # until the kubelet removes the containers; the operator names the pod when a pass saw it
    # (it did in every run here), and never another pod.
    failure = st.get("lastFailure")
    if failure is not None:
        assert failure["pod"].startswith("llm-slice-1-1-") and failure["exitCode"] == 13
    pods = _pods(api, ns, "llm")
    assert {p.metadata.name: p.metadata.uid for p in pods} == first
    # What a real kubelet leaves of a restart in place: every container of every pod restarted
    # once, its lastState the removal's record (137), not the exit that fired the rule.
    for pod in pods:
        for status in (pod.status.init_container_statuses or []) + pod.status.container_statuses:
            assert status.restart_count >= 1, pod.metadata.name
            assert status.last_state.terminated.reason == "RestartingAllContainers"
    jobset = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "llm"
    )
    assert jobset["status"].get("restarts", 0) == 0  # nothing recreated

    def resumed(after: int, restored: int) -> bool:
        """Every process (of the pods' current runs) restored one checkpoint, of step
        `restored` or later, and the job stepped past `after` (process 0 logs the steps; the
        collectives keep every process on the same one)."""
        now = progress(core, ns, "llm")
        steps = {e["process"]: e["step"] for e in now.of("restored") if e["step"] >= restored}
        return (
            set(steps) == {0, 1, 2, 3} and len(set(steps.values())) == 1 and (now.last_step > after)
        )

    # Training again: every process restored step 5 and the job stepped past the failure.
    assert wait_for(lambda: resumed(8, 5), RUN_TIMEOUT, log())
    assert {e["step"] for e in progress(core, ns, "llm").of("restored")} == {5}

    # Recreate: the node of process 0 drained (its pod evicted), then back in service. JobSet
    # recreates every pod; all resume from the last checkpoint.
    node = next(p.spec.node_name for p in pods if p.metadata.name.startswith("llm-slice-0-0-"))
    wait_for(lambda: progress(core, ns, "llm").last_step >= 12, RUN_TIMEOUT, log())
    stack.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=120s")
    stack.kubectl("uncordon", node)

    def recreated() -> dict[str, Any] | None:
        st = _status(api, ns, "llm")
        last = st.get("lastRestart") or {}
        return st if last.get("strategy") == "Recreate" else None

    st = wait_for(recreated, RUN_TIMEOUT, log())
    assert st["lastRestart"]["cause"] == "disruption"
    assert st["restartsByCause"]["workload"] == 1 and st["restartsByCause"]["disruption"] == 1
    wait_for(lambda: len(_pods(api, ns, "llm")) == 4, RUN_TIMEOUT, log())
    assert not set(first.values()) & {p.metadata.uid for p in _pods(api, ns, "llm")}
    assert wait_for(lambda: resumed(12, 10), RUN_TIMEOUT, log())  # step 10's or a later one

    done = wait_for(
        lambda: _status(api, ns, "llm").get("phase") in ("Succeeded", "Failed"), RUN_TIMEOUT, log()
    )
    assert done and _status(api, ns, "llm")["phase"] == "Succeeded", log()
    for pod in _pods(api, ns, "llm"):
        end = _train(pod).state.terminated
        assert end.exit_code == 0 and json.loads(end.message)["step"] == STEPS, end

    # Nothing left once the job goes: its JobSet, Jobs and pods.
    client.CustomObjectsApi(api).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "llm")
    wait_for(lambda: not _pods(api, ns, "llm"), 120, "the job's pods gone")
    assert not client.BatchV1Api(api).list_namespaced_job(ns).items
