"""Benchmark 3: restart latency, from an injected pod failure to every slice's new pods.

`cluster` profile (kube-controller-manager, scheduler, kwok fake TPU nodes, JobSet controller).
The same JobSet (render_jobset of the same spec: v5litepod-16, S slices of 4 hosts, Existing
pools) runs twice, each on node pools of its own:

* baseline: the JobSet created directly, with the operator not running: the JobSet controller
  alone restarts it;
* operator: a MultisliceJob, the operator creates the JobSet and watches the restart (it counts
  it, posts an event, writes Restarting and Running). The baseline's JobSet keeps running.

One repetition: a running pod of the current attempt gets `fail_pod` (kwok terminates it with a
retryable exit code), the clock starts just before that patch; measured is when the watch has
seen all S x 4 pods of the next restart attempt created, and Running. p50 over the repetitions.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import (
    JOBSET,
    MSJ,
    admin_client,
    create_namespace,
    job_body,
    percentile,
    save,
    say,
    table,
)
from benchmarks.watcher import Spec, Watcher
from multislice_local.controlplane import ControlPlane
from multislice_local.harness import OperatorProcess, install_crds
from multislice_local.nodes import RUN_DURATION_ANNOTATION, fail_pod, register_tpu_nodes
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.render.jobset import render_jobset

ACCELERATOR, ACCEL_LABEL, TOPOLOGY, HOSTS, CHIPS = (
    "v5litepod-16",
    "tpu-v5-lite-podslice",
    "4x4",
    4,
    4,
)
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
ISOLATION = "bench-namespace"
RETRYABLE_EXIT = 17


def body_for(ns: str, slices: int) -> dict[str, Any]:
    template = {
        "metadata": {"annotations": {RUN_DURATION_ANNOTATION: "1h"}},
        "spec": {
            "nodeSelector": {ISOLATION: ns},
            "containers": [{"name": "train", "image": "example.invalid/t:1"}],
        },
    }
    return job_body("train", ACCELERATOR, slices, template=template, max_restarts=10000)


def rendered_jobset(ns: str, slices: int) -> dict[str, Any]:
    body = copy.deepcopy(body_for(ns, slices))
    body["metadata"].update(namespace=ns, uid="")
    job = load_job(body)
    return render_jobset(plan_job(job), job.spec, job.metadata.labels)


def _pods(w: Watcher, ns: str, attempt: int) -> tuple[str, str]:
    created, running = f"{ns}/created/{attempt}", f"{ns}/running/{attempt}"
    w.add(created, Spec("pods", ns, "label", (RESTART_ATTEMPT, str(attempt))))
    w.add(running, Spec("pods", ns, "pod_running", (RESTART_ATTEMPT, str(attempt))))
    return created, running


def measure(
    api: client.ApiClient, w: Watcher, ns: str, slices: int, reps: int, operator: bool
) -> list[dict[str, float]]:
    pods = slices * HOSTS
    _, running = _pods(w, ns, 0)
    first = w.wait(running, count=pods, timeout=180)
    out = []
    for attempt in range(reps):
        victim = sorted(first)[0]
        created, running = _pods(w, ns, attempt + 1)
        noticed = f"{ns}/restarts/{attempt + 1}"
        if operator:
            w.add(noticed, Spec(MSJ, ns, "status", ("restarts", attempt + 1)))
        t0 = time.monotonic()
        fail_pod(api, ns, victim, RETRYABLE_EXIT)
        new = w.wait(created, count=pods, timeout=180)
        first = w.wait(running, count=pods, timeout=180)
        rep = {
            "created_s": max(new.values()) - t0,
            "first_created_s": min(new.values()) - t0,
            "running_s": max(first.values()) - t0,
        }
        if operator:
            rep["status_counted_s"] = w.wait(noticed, ["train"], timeout=60)["train"] - t0
        out.append(rep)
    return out


def run_size(slices: int, reps: int, log_dir: Path | None = None) -> dict[str, Any]:
    log = (log_dir or Path(tempfile.mkdtemp(prefix="bench-"))) / f"operator-restart-{slices}.log"
    with ControlPlane("cluster") as cp:
        api = admin_client(cp)
        install_crds(api)
        custom = client.CustomObjectsApi(api)
        with Watcher(cp.kubeconfig) as w:
            for ns in ("base", "op"):
                create_namespace(api, ns)
                for p in range(slices):
                    register_tpu_nodes(
                        api, f"{ns}-pool-{p}", HOSTS, ACCEL_LABEL, TOPOLOGY, CHIPS, {ISOLATION: ns}
                    )
            say(f"restart S={slices}: JobSet controller alone")
            custom.create_namespaced_custom_object(
                *JOBSET[:2], "base", JOBSET[2], rendered_jobset("base", slices)
            )
            base = measure(api, w, "base", slices, reps, operator=False)
            say(f"restart S={slices}: with the operator")
            op = OperatorProcess(cp.kubeconfig, [], log_path=log)
            try:
                op.start()
                custom.create_namespaced_custom_object(
                    *MSJ[:2], "op", MSJ[2], body_for("op", slices)
                )
                with_op = measure(api, w, "op", slices, reps, operator=True)
            finally:
                op.stop()
        api.close()  # type: ignore[no-untyped-call]

    def p50(reps_: list[dict[str, float]], key: str) -> float:
        return percentile([r[key] for r in reps_], 50)

    return {
        "slices": slices,
        "pods": slices * HOSTS,
        "repetitions": reps,
        "baseline": {"reps": base, **{k: p50(base, k) for k in base[0]}},
        "operator": {"reps": with_op, **{k: p50(with_op, k) for k in with_op[0]}},
        "operator_log": str(log),
    }


def run(sizes: list[int], reps: int, log_dir: Path | None = None) -> dict[str, Any]:
    results, rows = [], []
    for s in sizes:
        res = run_size(s, reps, log_dir)
        res["ratio"] = res["operator"]["created_s"] / res["baseline"]["created_s"]
        results.append(res)
        rows.append(
            [
                s,
                res["pods"],
                res["baseline"]["created_s"],
                res["operator"]["created_s"],
                res["ratio"],
                res["baseline"]["running_s"],
                res["operator"]["running_s"],
                res["operator"]["status_counted_s"],
            ]
        )
    text = table(
        f"Restart: pod failure -> all slices' new pods created (p50 of {reps})",
        [
            "slices",
            "pods",
            "JobSet alone s",
            "with operator s",
            "ratio",
            "alone running s",
            "op running s",
            "op counted s",
        ],
        rows,
    )
    out = {"repetitions": reps, "results": results, "table": text}
    save("restart", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="2,8")
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    run([int(s) for s in args.sizes.split(",")], args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
