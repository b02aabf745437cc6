"""Restart of all slices on real nodes, in place against recreate (issue 52): the honest figure.

Real kubelets, containerd and runc (multislice_local.realnodes), the product installed as users
install it (multislice_local.realstack: the chart with no values, the operator's image, JobSet's
real in-place agent from it), and the workload image training its LM on CPU in real pods: 2
slices x 2 hosts, 4 JAX processes. One repetition is one job: process 3 exits 13 (retryable)
after step K, once; every process resumes from the step-S checkpoint. Measured, from the
workload's own log lines (millisecond timestamps) and the pods:

* restart: from the failing exit (its `injected_failure` line) to every process stepping again
  (each one's first `step` line after it restored), the figure that counts;
* containers: from the failing exit to every process's `start` line (the containers running
  again: the kubelet's restart in place, or JobSet's Job and pod recreation, the scheduler, the
  kubelet's sandbox and container start);
* join: from there to every process's `mesh` line (jax.distributed and the CPU backend up);
* resume: from there to every process stepping again (restore, compile, the first step).

In place: the operator as installed (in-place restart on by default). Recreate: the same chart
upgraded with `inPlaceRestart.enabled: false` (the operator restarts; JobSets it creates then use
`Recreate`). Same nodes, images and job, one mode after the other. The kwok figure at 1,024 pods
(benchmarks/restart_inplace.py) is control-plane work only; this one includes container starts,
the program's re-initialisation and its restore. docs/benchmarks.md.

    .venv/bin/python -m benchmarks.restart_real [--reps 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from kubernetes import client

from benchmarks.common import percentile, save, say, table
from multislice_local import realnodes
from multislice_local.images import build_image
from multislice_local.realstack import (
    CONTAINER,
    RealStack,
    helm,
    job_manifest,
    pod_events,
    wait_for,
)
from multislice_operator.api import models
from multislice_operator.common import keys

MODES = ("inplace", "recreate")
FAIL_AFTER = 6  # process 3 exits 13 after this step, on the first attempt
SETTLED = 5  # ... and the step-5 checkpoint is written before step 6: the restore point
STEPS = 10
CHECKPOINT_EVERY = 5
FAIL_PROCESS = 3
RUN_TIMEOUT = 600.0


class Follower:
    """Every log line each process wrote, gathered while pods and containers come and go, by
    container ID: a recreated pod's logs leave with it, and a real kubelet's restart in place
    removes the previous containers (no `--previous` log is left), so each container's log is
    read while it runs."""

    def __init__(self, core: client.CoreV1Api, ns: str, job: str) -> None:
        self.core, self.ns, self.job = core, ns, job
        self.seen: dict[str, list[dict[str, Any]]] = {}

    def poll(self) -> None:
        pods: list[Any] = self.core.list_namespaced_pod(
            self.ns, label_selector=f"{keys.JOB_NAME}={self.job}"
        ).items
        for pod in pods:
            train = [c for c in pod.status.container_statuses or [] if c.name == CONTAINER]
            for status in train:
                last = status.last_state.terminated if status.last_state else None
                runs = [(status.container_id, False), (last.container_id if last else None, True)]
                for container_id, previous in runs:
                    if not container_id:
                        continue
                    got = pod_events(self.core, self.ns, pod.metadata.name, previous)
                    if len(got) >= len(self.seen.get(container_id, [])):
                        self.seen[container_id] = got

    def events(self) -> list[dict[str, Any]]:
        unique = {
            (e.get("process"), e.get("event"), e.get("time")): e
            for run in self.seen.values()
            for e in run
        }
        return sorted(unique.values(), key=lambda e: float(e["time"]))


def failed_at(events: list[dict[str, Any]]) -> float | None:
    """When process 3 exited: its `injected_failure` line, else (a recreated pod's logs leave
    with it, between two polls) process 0's line of that step, which completes on every
    process right before the hook exits (train.py after_step)."""
    for e in events:
        if e["event"] == "injected_failure":
            return float(e["time"])
    for e in events:
        if e["event"] == "step" and int(e["step"]) == FAIL_AFTER and int(e["attempt"]) == 0:
            return float(e["time"])
    return None


def phases(events: list[dict[str, Any]]) -> dict[str, float] | None:
    """The repetition's figures (seconds), or None while it is not over. Process 0 logs the
    steps; the collectives keep every process on the same one."""
    t0 = failed_at(events)
    if t0 is None:
        return None
    after = [e for e in events if float(e["time"]) > t0]

    def each_first(name: str, since: dict[int, float] | None = None) -> dict[int, float]:
        out: dict[int, float] = {}
        for e in after:
            p = int(e["process"])
            if e["event"] == name and p not in out and float(e["time"]) > (since or {}).get(p, t0):
                out[p] = float(e["time"])
        return out

    started = each_first("start")
    joined = each_first("mesh", started)
    restored = each_first("restored", joined)
    stepped = [
        float(e["time"])
        for e in after
        if e["event"] == "step" and len(restored) == 4 and float(e["time"]) > max(restored.values())
    ]
    if min(len(started), len(joined)) < 4 or not stepped:
        return None
    return {
        "restart": stepped[0] - t0,
        "containers": max(started.values()) - t0,
        "join": max(joined.values()) - max(started.values()),
        "resume": stepped[0] - max(joined.values()),
    }


def one(stack: RealStack, ns: str, name: str) -> dict[str, float]:
    api = stack.api
    core = client.CoreV1Api(api)
    body = job_manifest(
        name,
        ns,
        stack.checkpoints,
        steps=STEPS,
        fail_process=FAIL_PROCESS,
        fail_at_step=FAIL_AFTER,
        settle_at_step=SETTLED,
        checkpoint_every=CHECKPOINT_EVERY,
    )
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, body
    )
    follower = Follower(core, ns, name)

    def measured() -> dict[str, float] | None:
        follower.poll()
        return phases(follower.events())

    figures: dict[str, float] = wait_for(measured, RUN_TIMEOUT, f"{ns}/{name} restarted", 2.0)
    job: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, name
    )
    figures["in_place"] = float(job["status"]["lastRestart"]["strategy"] == "InPlaceRestart")
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, name
    )
    return figures


def run(reps: int) -> dict[str, Any]:
    reason = realnodes.unavailable_reason()
    if reason is not None:
        say(f"restart_real: skipped: {reason}")
        return {"skipped": reason}
    images = build_image("operator"), build_image("workload")
    results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with realnodes.RealCluster() as cluster:
        stack = RealStack(cluster).install(*images)
        core = client.CoreV1Api(stack.api)
        for mode in MODES:
            if mode == "recreate":
                helm(cluster.kubeconfig, "upgrade", stack.release, str(stack.chart), "-n",
                     stack.namespace, "--reuse-values", "--set", "inPlaceRestart.enabled=false",
                     "--wait")  # fmt: skip
                wait_for(lambda: "in-place restart: not used" in stack.operator_log(), 120,
                         "the operator without in-place restart")  # fmt: skip
            ns = f"bench-{mode}"
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
            for rep in range(reps):
                start = time.monotonic()
                figures = one(stack, ns, f"r{rep}")
                took = time.monotonic() - start
                say(f"restart_real: {mode} #{rep + 1}: restart {figures['restart']:.1f}s "
                    f"(in place: {bool(figures['in_place'])}), repetition {took:.0f}s")  # fmt: skip
                results[mode].append(figures)
    return summarize(results)


def summarize(results: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    rows, summary = [], {}
    for mode, reps in results.items():
        by = {k: [float(r[k]) for r in reps] for k in ("restart", "containers", "join", "resume")}
        summary[mode] = {
            k: {"median": percentile(v, 50), "min": min(v), "max": max(v)} for k, v in by.items()
        }
        rows.append(
            [mode, len(reps)]
            + [f"{percentile(v, 50):.1f} ({min(v):.1f}-{max(v):.1f})" for v in by.values()]
        )
    ratio = summary["inplace"]["restart"]["median"] / summary["recreate"]["restart"]["median"]
    table(  # printed
        "restart on real nodes (s, median (min-max)): failing exit -> every process stepping",
        ["mode", "reps", "restart", "containers up", "jax joined", "resumed"],
        rows,
    )
    say(f"restart_real: in place / recreate = {ratio:.2f}")
    return {"results": results, "summary": summary, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    save("restart_real", run(args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
