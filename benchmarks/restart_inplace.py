"""Restart of all slices, in place against recreate (issue 40): same run, same control plane.

`cluster` profile on the Kubernetes >= 1.35 / JobSet >= 0.11 binaries (the JobSet controller runs
with its InPlaceRestart gate; kwok plays the kubelet, its `pod-restart-all-containers` stage the
kubelet's RestartAllContainers action). One job of S slices x H hosts (Existing pools, the same
nodes for both) runs twice, one after the other, each with the operator as a real process
watching only its namespace:

* inplace: the operator started with `--in-place-agent-image`, so it renders the JobSet with
  `restartStrategy: InPlaceRestart` and the agent sidecar; the agents of every pod are played
  in a child process (benchmarks/inplace_agents.py), in parallel as real agents are;
* recreate: the operator without it, so JobSet deletes and recreates every Job and pod.

One repetition: the program of one running pod exits with a retryable code (17) - in place, the
kubelet restarts all of that pod's containers (its RestartAllContainers rule); under Recreate
the pod fails. The clock starts just before that write. Measured, from the watch in a child
process: recreate - every pod of the next JobSet restart attempt Running; in place - every pod
Running with its agent on the next attempt (annotation) and the JobSet's barrier lifted
(status.currentInPlaceRestartAttempt moved), when every TPU container may start. Also the
apiserver's writes from the failure until the control plane is quiet again (node heartbeats and
leases left out), and the operator's CPU seconds over the same span.

What kwok leaves out on both sides: image pulls, container starts, the program's
re-initialisation; in place, also the barrier's startup probe period (1 s). docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import (
    JOBSET,
    MSJ,
    CpuMeter,
    admin_client,
    cpu_seconds,
    create_namespace,
    job_body,
    percentile,
    save,
    say,
    table,
    wait_until,
)
from benchmarks.inplace_agents import EXIT, AgentProcess
from benchmarks.pass_cpu import pass_bound, window_bound
from benchmarks.watcher import Spec, Watcher
from multislice_local.apimetrics import WRITE_VERBS, count_diff, request_counts, settle
from multislice_local.controlplane import ControlPlane
from multislice_local.harness import OperatorProcess, install_crds
from multislice_local.inplace_agent import restart_all_containers
from multislice_local.nodes import RUN_DURATION_ANNOTATION, fail_pod, register_tpu_nodes
from multislice_operator.render.inplace import ATTEMPT_ANNOTATION
from multislice_operator.tpu.catalog import slice_shape

RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
AGENT_IMAGE = "example.invalid/in-place-restart-agent:v0.12.0"  # never pulled: kwok
RETRYABLE_EXIT = 17
NAME = "train"
MODES = ("inplace", "recreate")
QUICK = [(2, "v5litepod-16"), (2, "v5litepod-32")]  # 8 and 16 pods
FULL = [(64, "v5litepod-16"), (16, "v5litepod-256")]  # 256 and 1,024 pods
GOAL = 0.25  # in place at most a quarter of recreate's time, at 1,024 pods
GOAL_PODS = 1024
# Writes that go on whatever happens (kwok's node heartbeats, leases): not the restart's.
BACKGROUND = frozenset({"leases", "nodes", "nodes/status"})
# Writes only the harness makes, per in-place restart of a pod: the annotation that asks kwok to
# play the kubelet's action, and kwok removing it (a kubelet writes only the pod's status).
HARNESS_WRITES_PER_POD = 2


def restart_writes(diff: dict[str, int]) -> dict[str, int]:
    """The writes of a count_diff, by 'VERB resource', without the background ones."""
    return {
        k: n
        for k, n in diff.items()
        if k.split()[0] in WRITE_VERBS and k.split()[1] not in BACKGROUND
    }


def summarize(reps: list[dict[str, Any]]) -> dict[str, float]:
    """p50 of every numeric field over the repetitions."""
    keys = [k for k, v in reps[0].items() if isinstance(v, int | float)]
    return {k: percentile([float(r[k]) for r in reps], 50) for k in keys}


def passes_in(metrics_text: str) -> int:
    """The operator's finished passes: the sum of multislice_reconcile_total's samples."""
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("multislice_reconcile_total{") or line.startswith(
            "multislice_reconcile_total "
        ):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def passes(op: OperatorProcess) -> int:
    with urllib.request.urlopen(op.metrics_url, timeout=10) as resp:
        return passes_in(resp.read().decode())


def ratio(inplace_s: float, recreate_s: float) -> float:
    return inplace_s / recreate_s if recreate_s > 0 else float("inf")


def body_for(accelerator: str, slices: int) -> dict[str, Any]:
    template = {
        "metadata": {"annotations": {RUN_DURATION_ANNOTATION: "1h"}},
        "spec": {"containers": [{"name": "train", "image": "example.invalid/t:1"}]},
    }
    return job_body(NAME, accelerator, slices, template=template, max_restarts=10000)


def _watch_running(w: Watcher, ns: str, mode: str, attempt: int) -> str:
    """The watch that sees every pod Running on `attempt`."""
    name = f"{ns}/running/{attempt}"
    if mode == "inplace":
        w.add(name, Spec("pods", ns, "pod_annotated", (ATTEMPT_ANNOTATION, str(attempt))))
    else:
        w.add(name, Spec("pods", ns, "pod_running", (RESTART_ATTEMPT, str(attempt))))
    return name


def _watch_barrier(w: Watcher, ns: str, attempt: int) -> str:
    name = f"{ns}/barrier/{attempt}"
    w.add(name, Spec(JOBSET, ns, "status", ("currentInPlaceRestartAttempt", attempt)))
    return name


class Mode:
    """One job of one mode on the shared control plane: its operator, agents and pods."""

    def __init__(self, cp: ControlPlane, api: client.ApiClient, w: Watcher, mode: str) -> None:
        self.cp, self.api, self.w, self.mode = cp, api, w, mode
        self.ns = mode
        self.agents: AgentProcess | None = None
        self.op: OperatorProcess | None = None

    def start(self, accelerator: str, slices: int, pods: int, log: Path) -> None:
        create_namespace(self.api, self.ns)
        args = ["--in-place-agent-image", AGENT_IMAGE] if self.mode == "inplace" else []
        self.op = OperatorProcess(self.cp.kubeconfig, args, log_path=log, namespaces=[self.ns])
        self.op.start()
        want = "in-place restart: used" if self.mode == "inplace" else "in-place restart: not"
        op = self.op
        wait_until(lambda: want in op.log_tail(300), 60, f"the operator log saying {want!r}")
        if self.mode == "inplace":
            self.agents = AgentProcess(str(self.cp.kubeconfig), self.ns, NAME)
        custom = client.CustomObjectsApi(self.api)
        custom.create_namespaced_custom_object(
            *MSJ[:2], self.ns, MSJ[2], body_for(accelerator, slices)
        )
        first = _watch_running(self.w, self.ns, self.mode, 0)
        self.w.wait(first, count=pods, timeout=120 + pods * 0.5)
        if self.mode == "inplace":
            self.w.wait(_watch_barrier(self.w, self.ns, 0), [NAME], timeout=120)

    def repeat(self, attempt: int, pods: int) -> dict[str, Any]:
        """One restart of all slices onto `attempt`: the failure, then every pod back."""
        assert self.op is not None and self.op.proc is not None
        settle(self.api, quiet_s=2.0, timeout=60)
        core = client.CoreV1Api(self.api)
        listed: list[Any] = core.list_namespaced_pod(self.ns).items
        live = [p for p in listed if p.status.phase == "Running"]
        victim = str(sorted(p.metadata.name for p in live)[0])
        uids = {p.metadata.uid for p in live}
        running = _watch_running(self.w, self.ns, self.mode, attempt)
        barrier = _watch_barrier(self.w, self.ns, attempt) if self.mode == "inplace" else ""
        before, cpu0 = request_counts(self.api), cpu_seconds(self.op.proc.pid)
        passes0 = passes(self.op)
        pids = {**self.cp.pids, "operator": self.op.proc.pid}
        if self.agents is not None:
            pids["agents"] = self.agents.pid
        meter = CpuMeter(pids).start()  # where the machine's time went: what bounds the restart
        t0 = time.monotonic()
        if self.mode == "inplace":
            restart_all_containers(self.api, self.ns, victim, RETRYABLE_EXIT)
        else:
            fail_pod(self.api, self.ns, victim, RETRYABLE_EXIT)
        seen = self.w.wait(running, count=pods, timeout=120 + pods * 0.5)
        rep: dict[str, Any] = {
            "first_back_s": min(seen.values()) - t0,
            "all_running_s": max(seen.values()) - t0,
        }
        if barrier:
            rep["barrier_lifted_s"] = self.w.wait(barrier, [NAME], timeout=120)[NAME] - t0
        rep["recovered_s"] = max(rep["all_running_s"], rep.get("barrier_lifted_s", 0.0))
        settle(self.api, quiet_s=2.0, timeout=120)
        rep["window_s"] = time.monotonic() - t0
        rep["cpu_s"] = meter.stop()
        rep["operator_cpu_s"] = round(cpu_seconds(self.op.proc.pid) - cpu0, 2)
        # The passes from the failure until the control plane is quiet (window_s), against the
        # debounce's bound for a burst that long, and the pod events they covered.
        rep["passes"] = passes(self.op) - passes0
        rep["pass_bound"] = pass_bound(rep["window_s"])
        rep["window_bound"] = window_bound(rep["window_s"])
        writes = restart_writes(count_diff(request_counts(self.api), before))
        rep["writes"] = sum(writes.values())
        rep["writes_by"] = writes
        rep["pod_writes"] = sum(n for k, n in writes.items() if k.split()[1].startswith("pods"))
        after: list[Any] = core.list_namespaced_pod(self.ns).items
        now = {p.metadata.uid for p in after}
        rep["pods_kept"] = len(now & uids)
        return rep

    def stop(self) -> dict[str, int]:
        counts = self.agents.stop() if self.agents is not None else {}
        custom = client.CustomObjectsApi(self.api)
        custom.delete_namespaced_custom_object(*MSJ[:2], self.ns, MSJ[2], NAME)
        core = client.CoreV1Api(self.api)
        wait_until(
            lambda: not core.list_namespaced_pod(self.ns).items, 300, f"{self.ns}'s pods gone"
        )
        if self.op is not None:
            self.op.stop()
        return counts


def run_size(
    slices: int, accelerator: str, reps: int, log_dir: Path | None = None, name: str = ""
) -> dict[str, Any]:
    shape = slice_shape(accelerator)
    pods = slices * shape.hosts
    logs = log_dir or Path(tempfile.mkdtemp(prefix="bench-"))
    out: dict[str, Any] = {"slices": slices, "hosts": shape.hosts, "pods": pods, "reps": reps}
    with ControlPlane("cluster") as cp:
        api = admin_client(cp)
        install_crds(api)
        for p in range(slices):
            register_tpu_nodes(
                api,
                f"pool-{p}",
                shape.hosts,
                shape.generation.gke_accelerator,
                shape.topology,
                shape.chips_per_host,
            )
        with Watcher(cp.kubeconfig) as w:
            for mode in MODES:
                say(f"restart {slices} x {shape.hosts} ({pods} pods): {mode}")
                m = Mode(cp, api, w, mode)
                m.start(accelerator, slices, pods, logs / f"operator-{mode}-{pods}.log")
                try:
                    runs = [m.repeat(attempt, pods) for attempt in range(1, reps + 1)]
                finally:
                    agents = m.stop()
                out[mode] = {"reps": runs, **summarize(runs)}
                if agents:
                    out[mode]["agent_writes"] = agents
                save(f"{name or 'restart_inplace'}-{pods}-partial", out)  # each mode as measured
        api.close()  # type: ignore[no-untyped-call]
    ip, rc = out["inplace"], out["recreate"]
    out["ratio"] = ratio(ip["recovered_s"], rc["recovered_s"])
    # Each restart: one harness annotation per pod asked to restart (the failing pod and every
    # agent's exit) and kwok's removal of it; the kubelet would write neither.
    exits = (ip.get("agent_writes") or {}).get(EXIT, 0) / reps
    ip["writes_less_harness"] = ip["writes"] - HARNESS_WRITES_PER_POD * (exits + 1)
    return out


def run(
    shapes: list[tuple[int, str]], reps: int, log_dir: Path | None = None, name: str = ""
) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    rows = []
    for slices, accelerator in shapes:
        r = run_size(slices, accelerator, reps, log_dir, name)
        results.append(r)
        # Each size's figures kept as soon as they are measured (the largest take long).
        save(name or "restart_inplace", {"repetitions": reps, "results": results})
        ip, rc = r["inplace"], r["recreate"]
        rows.append(
            [
                f"{r['slices']}x{r['hosts']}",
                r["pods"],
                rc["recovered_s"],
                ip["recovered_s"],
                r["ratio"],
                rc["writes"],
                ip["writes"],
                ip["writes_less_harness"],
                rc["operator_cpu_s"],
                ip["operator_cpu_s"],
            ]
        )
    text = table(
        f"Restart of all slices: failing pod -> every pod Running on the new attempt "
        f"(p50 of {reps})",
        [
            "slices x hosts",
            "pods",
            "recreate s",
            "in place s",
            "ratio",
            "recreate writes",
            "in place writes",
            "less harness",
            "recreate op CPU s",
            "in place op CPU s",
        ],
        rows,
    )
    out = {"repetitions": reps, "results": results, "table": text}
    save(name or "restart_inplace", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help=f"small sizes {QUICK}")
    p.add_argument("--shapes", default="", help="e.g. 64:v5litepod-16,16:v5litepod-256")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--name", default="", help="results/<name>.json (default restart_inplace)")
    args = p.parse_args(argv)
    shapes = QUICK if args.quick else FULL
    if args.shapes:
        shapes = [(int(s), a) for s, a in (x.split(":") for x in args.shapes.split(","))]
    run(shapes, args.reps, name=args.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
