"""The in-place restart agent of JobSet (kubernetes-sigs/jobset v0.12.0
cmd/in-place-restart-agent/main.go), played for the pods kwok runs, and the kubelet's
RestartAllContainers action it relies on (kwok stage pod-restart-all-containers).

kwok runs no container, so no agent runs in a pod. `AgentPlayer.step` does what every pod's agent
would, against the real JobSet controller: on each start of a pod's agent (a new restartCount of
its sidecar) it writes the pod's attempt annotation, currentInPlaceRestartAttempt + 1 (0 on the
JobSet's first start); when the pod's attempt is <= previousInPlaceRestartAttempt it "exits"
with its restart code, which the kubelet answers by restarting all of the pod's containers
(`restart_all_containers`). What is not played: the barrier (kwok starts the containers at
once, without waiting for the startup probe). docs/demo.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from kubernetes import client

from multislice_operator.common import keys
from multislice_operator.render.inplace import AGENT_CONTAINER, AGENT_EXIT_CODE, ATTEMPT_ANNOTATION

RESTART_ALL_ANNOTATION = "multislice.dev/restart-all-containers"


def restart_all_containers(api: client.ApiClient, namespace: str, pod: str, code: int) -> None:
    """A container of `pod` exits with `code`, matching a RestartAllContainers rule: kwok (as the
    kubelet) restarts every container of the pod, which keeps its name, UID and node."""
    patch = {"metadata": {"annotations": {RESTART_ALL_ANNOTATION: str(code)}}}
    client.CoreV1Api(api).patch_namespaced_pod(pod, namespace, patch)


def _agent_restarts(pod: Any) -> int | None:
    for s in pod.status.init_container_statuses or []:
        if s.name == AGENT_CONTAINER and s.state is not None and s.state.running is not None:
            return int(s.restart_count or 0)
    return None  # not running (yet)


@dataclass
class AgentPlayer:
    """Every pod's agent of one JobSet; `step` is one look at the JobSet and its pods."""

    namespace: str
    jobset: str
    started: set[tuple[str, int]] = field(default_factory=set)  # (pod uid, agent restarts)
    exited: set[tuple[str, int]] = field(default_factory=set)  # executions that asked a restart

    def step(self, api: client.ApiClient) -> list[str]:
        """What the agents did on this step, for a narration."""
        js: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", self.namespace, "jobsets", self.jobset
        )
        status = js.get("status") or {}
        current = status.get("currentInPlaceRestartAttempt")
        previous = status.get("previousInPlaceRestartAttempt")
        core = client.CoreV1Api(api)
        pods: list[Any] = core.list_namespaced_pod(
            self.namespace, label_selector=f"{keys.JOBSET_NAME}={self.jobset}"
        ).items
        done: list[str] = []
        for pod in pods:
            pod = cast(Any, pod)
            if pod.metadata.deletion_timestamp is not None or pod.status.phase != "Running":
                continue
            restarts = _agent_restarts(pod)
            if restarts is None:
                continue
            execution = (pod.metadata.uid, restarts)
            name = pod.metadata.name
            if execution not in self.started:
                attempt = 0 if current is None else int(current) + 1
                patch = {"metadata": {"annotations": {ATTEMPT_ANNOTATION: str(attempt)}}}
                core.patch_namespaced_pod(name, self.namespace, patch)
                self.started.add(execution)
                done.append(f"{name}: attempt {attempt}")
                continue
            mine = (pod.metadata.annotations or {}).get(ATTEMPT_ANNOTATION)
            outdated = previous is not None and mine is not None and int(mine) <= int(previous)
            if outdated and execution not in self.exited:  # an agent exits once
                self.exited.add(execution)
                restart_all_containers(api, self.namespace, name, AGENT_EXIT_CODE)
                done.append(f"{name}: restarts in place (attempt {mine} <= {previous})")
        return done
