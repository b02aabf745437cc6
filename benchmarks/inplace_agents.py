"""JobSet's in-place restart agents of every pod of one JobSet, played in a child process, in
parallel, for the restart benchmark (benchmarks/restart_inplace.py).

kwok runs no container, so no agent runs in a pod (local/multislice_local/inplace_agent.py says
what is played). The harness's `AgentPlayer` looks at the JobSet and lists the pods on each step
and patches one pod after another: right for a test of 8 pods, but at 1,024 pods its serial
patches would be the restart's time. Here, as the real agents (kubernetes-sigs/jobset v0.12.0
cmd/in-place-restart-agent/main.go: one agent per pod, each reconciling on its JobSet's changes
and applying its own pod's annotation), the pods and the JobSet are watched, and the agents' writes
go out from a thread pool: the time measured is the control plane's, not a serial loop's.

`agent_actions` is the agents' logic, pure (tests/unit/test_bench_inplace.py).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from multislice_operator.common import keys
from multislice_operator.render.inplace import AGENT_CONTAINER, AGENT_EXIT_CODE, ATTEMPT_ANNOTATION

ANNOTATE, EXIT = "annotate", "exit"
WORKERS = 16  # agents writing at once (on a real cluster: every pod's agent)


@dataclass
class Agent:
    """One execution of a pod's agent: the sidecar's restart count, the attempt it wrote."""

    execution: int
    attempt: int | None = None
    exited: bool = False


def _agent_restarts(pod: dict[str, Any]) -> int | None:
    for s in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if s.get("name") == AGENT_CONTAINER and "running" in (s.get("state") or {}):
            return int(s.get("restartCount") or 0)
    return None  # not running (yet)


def agent_actions(
    status: dict[str, Any], pods: Iterable[dict[str, Any]], agents: dict[str, Agent]
) -> list[tuple[str, str, int]]:
    """What the agents of `pods` do now, given the JobSet's status: (action, pod, value).

    As main.go's Reconcile: an agent that has just started (a new restart count of the sidecar)
    applies its pod's attempt annotation, currentInPlaceRestartAttempt + 1 (0 when unset); an
    agent whose attempt is <= previousInPlaceRestartAttempt exits with its restart code (which
    the kubelet answers by restarting all of the pod's containers). `agents` (pod uid -> Agent)
    is updated as the actions are decided, so a call never repeats an earlier one."""
    current = status.get("currentInPlaceRestartAttempt")
    previous = status.get("previousInPlaceRestartAttempt")
    out: list[tuple[str, str, int]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Running":
            continue
        restarts = _agent_restarts(pod)
        if restarts is None:
            continue
        uid, name = str(meta.get("uid")), str(meta.get("name"))
        agent = agents.get(uid)
        if agent is None or agent.execution != restarts:
            agent = agents[uid] = Agent(restarts)
        if agent.attempt is None:
            agent.attempt = 0 if current is None else int(current) + 1
            out.append((ANNOTATE, name, agent.attempt))
        if previous is not None and agent.attempt <= int(previous) and not agent.exited:
            agent.exited = True
            out.append((EXIT, name, AGENT_EXIT_CODE))
    return out


# ---------------------------------------------------------------- the child process


class _Agents:
    def __init__(self, kubeconfig: str, namespace: str, jobset: str) -> None:
        from kubernetes import client, config

        cfg = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        cfg.connection_pool_maxsize = WORKERS + 4
        self.api = client.ApiClient(cfg)
        self.ns, self.jobset = namespace, jobset
        self.changed = threading.Condition()
        self.pods: dict[str, dict[str, Any]] = {}
        self.status: dict[str, Any] = {}
        self.agents: dict[str, Agent] = {}
        self.counts = {ANNOTATE: 0, EXIT: 0, "errors": 0}
        self.stopped = False

    def _watch(self, fn: Any, args: list[Any], kw: dict[str, Any], on: Any) -> None:
        from kubernetes import watch

        while not self.stopped:
            try:
                listed = json.loads(fn(*args, _preload_content=False, **kw).data)
                for obj in listed.get("items") or []:
                    on("ADDED", obj)
                rv = listed["metadata"]["resourceVersion"]
                w = watch.Watch()  # type: ignore[no-untyped-call]
                for ev in w.stream(fn, *args, resource_version=rv, deserialize=False, **kw):  # type: ignore[no-untyped-call]
                    on(ev.get("type"), ev["object"])
            except Exception:  # a watch that expired or a control plane going away: list again
                time.sleep(0.2)

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        with self.changed:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = obj
            self.changed.notify_all()

    def _on_jobset(self, kind: str, obj: dict[str, Any]) -> None:
        with self.changed:
            self.status = {} if kind == "DELETED" else dict(obj.get("status") or {})
            self.changed.notify_all()

    def _do(self, action: str, pod: str, value: int) -> None:
        from kubernetes import client

        if action == ANNOTATE:
            body = {"metadata": {"annotations": {ATTEMPT_ANNOTATION: str(value)}}}
        else:  # the agent exits with its code: the kubelet (kwok) restarts all containers
            from multislice_local.inplace_agent import RESTART_ALL_ANNOTATION

            body = {"metadata": {"annotations": {RESTART_ALL_ANNOTATION: str(value)}}}
        try:
            client.CoreV1Api(self.api).patch_namespaced_pod(pod, self.ns, body)
            self.counts[action] += 1
        except Exception:
            self.counts["errors"] += 1

    def run(self, conn: Connection) -> None:
        from kubernetes import client

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        selector = {"label_selector": f"{keys.JOBSET_NAME}={self.jobset}"}
        js_args = ["jobset.x-k8s.io", "v1alpha2", self.ns, "jobsets"]
        by_name = {"field_selector": f"metadata.name={self.jobset}"}
        for fn, args, kw, on in (
            (core.list_namespaced_pod, [self.ns], selector, self._on_pod),
            (custom.list_namespaced_custom_object, js_args, by_name, self._on_jobset),
        ):
            threading.Thread(target=self._watch, args=(fn, args, kw, on), daemon=True).start()
        pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="agent")
        conn.send("ready")
        while not conn.poll(0):
            with self.changed:
                self.changed.wait(0.5)
                actions = agent_actions(self.status, list(self.pods.values()), self.agents)
            for action in actions:
                pool.submit(self._do, *action)
        conn.recv()
        self.stopped = True
        pool.shutdown(wait=True)
        conn.send(dict(self.counts))


def _main(kubeconfig: str, namespace: str, jobset: str, conn: Connection) -> None:
    _Agents(kubeconfig, namespace, jobset).run(conn)


class AgentProcess:
    """The agents of one JobSet in a child process; `stop()` returns how many writes they made."""

    def __init__(self, kubeconfig: str, namespace: str, jobset: str) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        args = (kubeconfig, namespace, jobset, child)
        self._proc = ctx.Process(target=_main, args=args, daemon=True)
        self._proc.start()
        if not self._conn.poll(60):
            raise TimeoutError("agent process did not start")
        self._conn.recv()

    @property
    def pid(self) -> int:
        return int(self._proc.pid or 0)

    def stop(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        with contextlib.suppress(OSError, EOFError):
            self._conn.send("stop")
            if self._conn.poll(30):
                counts = self._conn.recv()
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
        return counts
