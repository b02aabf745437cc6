"""In-place restart on the real JobSet controller (v0.12, InPlaceRestart gate on) and
Kubernetes 1.35+ apiserver, kwok playing the kubelet's RestartAllContainers action and the
harness playing JobSet's agent in each pod (local/multislice_local/inplace_agent.py): the
operator finds the feature at start-up, renders the JobSet for it (accepted by JobSet's own
webhook), gives the namespace the agents' account; a program failure restarts every pod in place
(names, UIDs and nodes kept, restart counts up, no JobSet restart) and a preemption recreates.

Needs the Kubernetes 1.36 / JobSet 0.12 binaries (hack/build-bins.sh); with an older JobSet the
operator's start-up check says why it does not use in-place restart and the first test fails."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from multislice_local.harness import OperatorProcess, install_crds, wait_for
from multislice_local.inplace_agent import AgentPlayer, restart_all_containers
from multislice_local.nodes import NODE_SHUTDOWN, fail_pod
from multislice_operator.common import keys
from multislice_operator.render import inplace
from tests import msj

AGENT_IMAGE = "example.invalid/in-place-restart-agent:v0.12.0"
RETRYABLE = 17


@pytest.fixture
def env(kube_cluster, namespace, tpu_nodes, kube_client, tmp_path):
    api = kube_client(kube_cluster)
    ns = namespace(kube_cluster, "inplace")
    msj.own_pools(tpu_nodes, ns)
    setup = kube_cluster.api_client()
    try:
        install_crds(setup)
    finally:
        setup.close()
    args = ["--resync-seconds", "2", "--in-place-agent-image", AGENT_IMAGE]
    op = OperatorProcess(kube_cluster.kubeconfig, args, log_path=tmp_path / "op.log",
                         namespaces=[ns])  # fmt: skip
    op.start()
    try:
        yield api, ns, op
    finally:
        op.stop()


def cluster_view(api: client.ApiClient, ns: str, op: OperatorProcess, lines: int) -> str:
    """On a timeout: the pods with their containers' states, and the operator's log."""
    out = [msj.pods_and_nodes(api, ns)]
    for p in client.CoreV1Api(api).list_namespaced_pod(ns).items:
        for c in [*(p.status.init_container_statuses or []), *(p.status.container_statuses or [])]:
            out.append(f"  {p.metadata.name}/{c.name} restarts={c.restart_count} {c.state}")
    return "\n".join([*out, op.log_tail(lines)])


def pods(api: client.ApiClient, ns: str, name: str) -> list[Any]:
    found = (
        client.CoreV1Api(api)
        .list_namespaced_pod(ns, label_selector=f"{keys.JOB_NAME}={name}")
        .items
    )
    return [p for p in found if p.metadata.deletion_timestamp is None]


def running(api: client.ApiClient, ns: str, name: str) -> list[Any] | None:
    now = pods(api, ns, name)
    return now if len(now) == 8 and all(p.status.phase == "Running" for p in now) else None


def play_until(api, player: AgentPlayer, what: str, done, timeout: float = 60) -> Any:
    """Play the agents until `done()` is true (or a value): the JobSet controller answers."""

    def look() -> Any:
        player.step(api)
        return done()

    def view() -> str:
        lines = [f"jobset status: {status_of(api, player.namespace, player.jobset)}"]
        for p in client.CoreV1Api(api).list_namespaced_pod(player.namespace).items:
            notes = {k: v for k, v in (p.metadata.annotations or {}).items() if "restart" in k}
            lines.append(f"  {p.metadata.name} {p.status.phase} {notes} {restarts_of(p)}")
        return "\n".join(lines)

    return wait_for(look, timeout, what, interval=0.5, on_timeout=view)


def status_of(api, ns, name) -> dict[str, Any]:
    return (msj.jobset(api, ns, name) or {}).get("status") or {}


def restarts_of(pod: Any) -> list[int]:
    statuses = [*(pod.status.init_container_statuses or []), *pod.status.container_statuses]
    return [int(s.restart_count or 0) for s in statuses]


def test_a_program_failure_restarts_in_place_and_a_preemption_recreates(env):
    api, ns, op = env
    wait_for(
        lambda: "in-place restart: used" in op.log_tail(200),
        30,
        "the start-up check finding in-place restart",
        on_timeout=lambda: op.log_tail(40),
    )
    body = msj.job(
        "ip",
        run="1h",
        failure_policy={"maxRestarts": 3},
        existing=True,
        node_selector=msj.own_nodes(ns),
    )
    msj.create(api, ns, body)
    msj.wait_phase(api, ns, "ip", "Running", 90, log=lambda n: cluster_view(api, ns, op, n))
    job = msj.get(api, ns, "ip")
    assert job is not None
    cond = {c["type"]: c for c in job["status"]["conditions"]}["RestartInPlace"]
    assert (cond["status"], cond["reason"]) == ("True", "InPlaceRestart")
    # The JobSet as JobSet's webhook accepted it, and what the operator gave the namespace.
    js = msj.jobset(api, ns, "ip")
    assert js is not None and js["spec"]["failurePolicy"]["restartStrategy"] == "InPlaceRestart"
    first = running(api, ns, "ip")
    assert first is not None
    pod = first[0]
    assert [c.name for c in pod.spec.init_containers] == [inplace.AGENT_CONTAINER]
    assert pod.spec.service_account_name == inplace.AGENT_SERVICE_ACCOUNT
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    assert core.read_namespaced_service_account(inplace.AGENT_SERVICE_ACCOUNT, ns)
    binding = rbac.read_namespaced_role_binding(
        f"{inplace.CLUSTER_ROLE}-{inplace.AGENT_SERVICE_ACCOUNT}", ns
    )
    assert binding.role_ref.name == inplace.CLUSTER_ROLE

    # Every agent reaches attempt 0: the JobSet controller lifts the barrier.
    player = AgentPlayer(ns, "ip")
    play_until(api, player, "attempt 0", lambda: status_of(api, ns, "ip").get(
        "currentInPlaceRestartAttempt") == 0)  # fmt: skip
    before = {p.metadata.name: (p.metadata.uid, p.spec.node_name) for p in first}

    # A program failure: the worker of one pod exits 17, matching its RestartAllContainers rule.
    restart_all_containers(api, ns, pod.metadata.name, RETRYABLE)
    play_until(api, player, "attempt 1 on every pod", lambda: status_of(api, ns, "ip").get(
        "currentInPlaceRestartAttempt") == 1)  # fmt: skip
    after = running(api, ns, "ip")
    assert after is not None
    assert {p.metadata.name: (p.metadata.uid, p.spec.node_name) for p in after} == before
    # Each container of each pod restarted once: the agent and the TPU container.
    assert [restarts_of(p) for p in after] == [[1, 1]] * 8
    assert status_of(api, ns, "ip").get("restarts", 0) == 0  # no Job was recreated
    # No pod failed, yet the restart is the program's, and the pod that exited 17 is named.
    counted = msj.wait_status(
        api, ns, "ip", "the in-place restart counted",
        lambda st: (st.get("restartsByCause") or {}).get("workload") == 1, 60,
        log=lambda n: cluster_view(api, ns, op, n),
    )["status"]  # fmt: skip
    failure = counted["lastFailure"]
    assert (failure["pod"], failure["exitCode"]) == (pod.metadata.name, RETRYABLE), failure

    # A preemption: one pod fails with DisruptionTarget; its Job fails and JobSet recreates.
    victim = after[0].metadata.name
    fail_pod(api, ns, victim, 143, disruption=NODE_SHUTDOWN)
    # The new pods' agents (played) report the next attempt, as real agents do after a recreate:
    # JobSet's currentInPlaceRestartAttempt counts recreates too, and so does the operator.
    play_until(api, player, "a disruption restart counted", lambda: (
        (msj.get(api, ns, "ip").get("status") or {}).get("lastRestart") or {}
    ).get("cause") == "disruption", 90)  # fmt: skip
    last = msj.get(api, ns, "ip")["status"]
    assert last["lastRestart"]["strategy"] == "Recreate"
    assert last["restartsByCause"]["disruption"] == 1
    recreated = wait_for(lambda: running(api, ns, "ip"), 60, "recreated pods")
    assert not {p.metadata.uid for p in recreated} & {uid for uid, _ in before.values()}
