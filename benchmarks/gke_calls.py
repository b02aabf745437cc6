"""Benchmark: GKE API calls per minute while N Managed jobs sit idle.

N one-slice Managed jobs (v5litepod-4: one node per pool) on a fresh `api`-profile control plane
and the local GKE simulator; once every job is Running (its pool RUNNING, its JobSet created, and
what the JobSet controller and the kubelet would do played by the benchmark: one Running, Ready pod
on the pool's node, the JobSet's status running), the simulator's counters are reset and the
operator is left alone for `--idle` seconds at its default resync (10 s). Not Starting, nor Running
without pods: such a job's next pass is its startup deadline (minutes), so it lists nothing while
it waits (measured 2026-12-04: 0 listings a minute, which says nothing about the resync). A Running
job re-observes its pools each resync; they share one `list_node_pools` per resync period
(provisioning/gke.py), so the target is 60 / resync listings per minute whatever N is. The per-job
polling it replaced is reported next to it: N listings per resync period.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import MSJ, admin_client, create_namespace, job_body, save, say, table
from benchmarks.gang import ReadyNodeRegistrar, operator_args
from benchmarks.watcher import Spec, Watcher
from multislice_local.controlplane import ControlPlane, bin_dir
from multislice_local.gke_sim import GkeSimulator, SimConfig
from multislice_local.harness import OperatorProcess, install_crds
from multislice_operator.common import keys
from multislice_operator.planning.plan import node_pool_name

NAMESPACE = "idle"
ACCELERATOR = "v5litepod-4"
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
RUNNING = {"replicatedJobsStatus": [{"name": "slice", "ready": 1, "active": 1, "succeeded": 0,
                                     "failed": 0, "suspended": 0}]}  # fmt: skip


def run_pod(api: client.ApiClient, name: str) -> None:
    """The one pod of job `name`'s one slice, Running and Ready on its pool's node, labelled as
    the JobSet controller labels it (what the operator's pod index reads)."""
    jobset = client.CustomObjectsApi(api).get_namespaced_custom_object(
        *JOBSET, NAMESPACE, "jobsets", name
    )
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {
                "name": f"{name}-slice-0-0",
                "labels": {
                    keys.JOB_NAME: name,
                    keys.JOBSET_UID: jobset["metadata"]["uid"],  # type: ignore[index]
                    keys.JOBSET_JOB_INDEX: "0",
                    keys.JOBSET_RESTART_ATTEMPT: "0",
                },
            },
            "spec": {
                "nodeName": f"{node_pool_name(NAMESPACE, name, 0)}-0",
                "containers": [{"name": "train", "image": "example.invalid/t:1"}],
            },
        },  # type: ignore[arg-type]
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = [
        {"type": t, "status": "True", "lastTransitionTime": now}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
    ]
    core.patch_namespaced_pod_status(
        pod.metadata.name, NAMESPACE, {"status": {"phase": "Running", "conditions": ready}}
    )


def run_one(jobs: int, idle_s: float, resync: float, log_dir: Path | None = None) -> dict[str, Any]:
    log = (log_dir or Path(tempfile.mkdtemp(prefix="bench-"))) / f"operator-gke-calls-{jobs}.log"
    with ControlPlane("api") as cp:
        api = admin_client(cp)
        install_crds(api, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
        create_namespace(api, NAMESPACE)
        registrar = ReadyNodeRegistrar(api)
        sim = GkeSimulator(config=SimConfig(op_latency_s=1.0), registrar=registrar).start()
        op = OperatorProcess(cp.kubeconfig, operator_args(sim, resync), log_path=log)
        try:
            op.start()
            custom = client.CustomObjectsApi(api)
            names = [f"job-{i:04d}" for i in range(jobs)]
            with Watcher(cp.kubeconfig) as w:
                w.add("starting", Spec(MSJ, NAMESPACE, "phase", ["Starting"]))
                for name in names:
                    body = job_body(name, ACCELERATOR, 1, mode="Managed")
                    custom.create_namespaced_custom_object(*MSJ[:2], NAMESPACE, MSJ[2], body)
                w.add("running", Spec(MSJ, NAMESPACE, "phase", ["Running"]))
                try:
                    w.wait("starting", names, timeout=120 + jobs)
                    for name in names:  # the JobSet controller's and the kubelet's part
                        run_pod(api, name)
                        custom.patch_namespaced_custom_object_status(
                            *JOBSET, NAMESPACE, "jobsets", name, {"status": RUNNING}
                        )
                    w.wait("running", names, timeout=120 + jobs)
                except TimeoutError as err:
                    raise TimeoutError(f"{err}\n{op.log_tail(30)}") from err
            time.sleep(resync)  # the last jobs' first resync after Starting
            sim.reset_counters()
            time.sleep(idle_s)
            calls = sim.counters()["calls"]
        finally:
            op.stop()
            sim.stop()
            registrar.close()
            api.close()  # type: ignore[no-untyped-call]
    per_minute = {k: v * 60.0 / idle_s for k, v in calls.items()}
    return {
        "jobs": jobs,
        "idle_s": idle_s,
        "resync_s": resync,
        "calls_per_minute": per_minute,
        "list_node_pools_per_minute": per_minute.get("list_node_pools", 0.0),
        "target_per_minute": 60.0 / resync,
        "per_job_polling_per_minute": jobs * 60.0 / resync,
        "operator_log": str(log),
    }


def run(
    sizes: list[int], idle_s: float, resync: float, log_dir: Path | None = None
) -> dict[str, Any]:
    results = []
    for n in sizes:
        say(f"gke calls: {n} idle Managed jobs, {idle_s:g}s idle at resync {resync:g}s")
        results.append(run_one(n, idle_s, resync, log_dir))
    rows = [
        [
            r["jobs"],
            r["list_node_pools_per_minute"],
            r["target_per_minute"],
            r["per_job_polling_per_minute"],
            sum(r["calls_per_minute"].values()),
        ]
        for r in results
    ]
    text = table(
        "GKE calls while idle (list_node_pools per minute; target: one per resync period)",
        ["jobs", "list/min", "target/min", "per-job polling/min", "all calls/min"],
        rows,
    )
    out = {"results": results, "table": text}
    save("gke_calls", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="10,100")
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--resync", type=float, default=10.0)
    args = p.parse_args(argv)
    out = run([int(s) for s in args.sizes.split(",")], args.idle, args.resync)
    print(out["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
