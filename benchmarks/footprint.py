"""Benchmark 4: the operator's footprint at idle with 0, 100 and 1000 jobs, and the API requests
one job's lifecycle costs.

Each size gets a fresh `api`-profile control plane and operator (default settings: resync 10 s).
The jobs (Existing mode, Ready node pools) are created and reconciled to Starting; then, with
nothing changing, over an idle window:

* resident memory: VmRSS of the operator process and its descendants (/proc/<pid>/status);
* CPU: utime + stime over the window (/proc/<pid>/stat), as a percentage of one core;
* API requests the operator makes: apiserver_request_total diffed over the window (the watches
  the benchmark holds were opened before the window; nothing else talks to the apiserver).

Lifecycle (at 100 jobs): create -> Starting -> Running -> Succeeded -> deleted, driven the way the
integration tests drive it (the JobSet status is patched: there is no JobSet controller in the
api profile). Requests counted from before the creates to after the last job is gone, less the
driver's own (one create, two JobSet status patches and one delete per job).

Memory that comes back (issue 23): idle RSS with 0 jobs, again after 10 jobs came and went (the
first jobs' one-time cost), then after each of two rounds of a 200-job load (created, Starting,
Running, Succeeded, deleted, their JobSets deleted too: the api profile has no garbage
collector), idle with 0 jobs: what the load left behind is the difference, and a leak is what
grows from round to round.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import (
    JOBSET,
    MSJ,
    WORKERS,
    admin_client,
    count_diff,
    cpu_seconds,
    create_namespace,
    job_body,
    parallel,
    reads,
    ready_pools,
    request_counts,
    rss_mib,
    save,
    say,
    settle,
    table,
    threads_of,
    writes,
)
from benchmarks.watcher import Spec, Watcher
from multislice_local.controlplane import ControlPlane, bin_dir
from multislice_local.harness import OperatorProcess, install_crds

NAMESPACE = "fp"
RUNNING = {"replicatedJobsStatus": [{"name": "slice", "ready": 2, "active": 2, "succeeded": 0,
                                     "failed": 0, "suspended": 0}]}  # fmt: skip
COMPLETED = {
    "terminalState": "Completed",
    "conditions": [
        {
            "type": "Completed",
            "status": "True",
            "reason": "AllJobsCompleted",
            "message": "done",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ],
    "replicatedJobsStatus": [{"name": "slice", "ready": 0, "active": 0, "succeeded": 2,
                              "failed": 0, "suspended": 0}],
}  # fmt: skip


def names(n: int) -> list[str]:
    return [f"job-{i:05d}" for i in range(n)]


def idle_window(api: client.ApiClient, pid: int, seconds: float) -> dict[str, Any]:
    settle(api, quiet_s=2.0)
    before, cpu0 = request_counts(api), cpu_seconds(pid)
    time.sleep(seconds)
    diff = count_diff(request_counts(api), before)
    cpu = cpu_seconds(pid) - cpu0
    return {
        "seconds": seconds,
        "rss_mib": rss_mib(pid),
        "threads": threads_of(pid),
        "cpu_percent": 100 * cpu / seconds,
        "writes_per_min": writes(diff) * 60 / seconds,
        "reads_per_min": reads(diff) * 60 / seconds,
        "requests": diff,
    }


def start_jobs(api: client.ApiClient, w: Watcher, jobs: list[str], timeout: float) -> None:
    """Create `jobs` and wait until each is Starting with its JobSet."""
    custom = client.CustomObjectsApi(api)
    w.add("settled", Spec(MSJ, NAMESPACE, "phase", ["Starting"]))
    w.add("js", Spec(JOBSET, NAMESPACE))
    parallel(
        lambda name: custom.create_namespaced_custom_object(
            *MSJ[:2], NAMESPACE, MSJ[2], job_body(name)
        ),
        jobs,
        WORKERS,
    )
    if jobs:
        w.wait("settled", jobs, timeout=timeout)
        w.wait("js", jobs, timeout=timeout)


def lifecycle(api: client.ApiClient, w: Watcher, jobs: list[str], timeout: float) -> None:
    custom = client.CustomObjectsApi(api)

    def status(patch: dict[str, Any]) -> Any:
        return lambda name: custom.patch_namespaced_custom_object_status(
            *JOBSET[:2], NAMESPACE, JOBSET[2], name, {"status": patch}
        )

    w.add("running", Spec(MSJ, NAMESPACE, "phase", ["Running"]))
    w.add("succeeded", Spec(MSJ, NAMESPACE, "phase", ["Succeeded"]))
    w.add("gone", Spec(MSJ, NAMESPACE, "deleted"))
    parallel(status(RUNNING), jobs)
    w.wait("running", jobs, timeout=timeout)
    parallel(status(COMPLETED), jobs)
    w.wait("succeeded", jobs, timeout=timeout)
    parallel(
        lambda name: custom.delete_namespaced_custom_object(*MSJ[:2], NAMESPACE, MSJ[2], name),
        jobs,
    )
    w.wait("gone", jobs, timeout=timeout)


@contextlib.contextmanager
def operator_on_api(
    log: Path, env: dict[str, str] | None
) -> Iterator[tuple[ControlPlane, client.ApiClient, int]]:
    """A fresh api-profile control plane with Ready pools and the benchmark's namespace, and a
    default operator on it: (control plane, admin client, the operator's pid)."""
    with ControlPlane("api") as cp:
        api = admin_client(cp)
        install_crds(api, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
        ready_pools(api, "pool", 2, 4)
        create_namespace(api, NAMESPACE)
        op = OperatorProcess(cp.kubeconfig, [], env=env, log_path=log)
        try:
            op.start()
            assert op.proc is not None
            yield cp, api, op.proc.pid
        finally:
            op.stop()
            api.close()  # type: ignore[no-untyped-call]


def run_size(
    n: int,
    idle_s: float,
    with_lifecycle: bool,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    log = (log_dir or Path(tempfile.mkdtemp(prefix="bench-"))) / f"operator-footprint-{n}.log"
    timeout = 120 + n * 0.5
    with operator_on_api(log, env) as (cp, api, pid):
        out: dict[str, Any] = {"jobs": n}
        with Watcher(cp.kubeconfig) as w:
            jobs = names(n)
            before = request_counts(api)
            start_jobs(api, w, jobs, timeout)
            time.sleep(3)  # the reconcile that follows the JobSet's creation
            out["idle"] = idle_window(api, pid, idle_s)
            if with_lifecycle and jobs:
                lifecycle(api, w, jobs, timeout)
                settle(api)
                diff = count_diff(request_counts(api), before)
                driver = {"POST multislicejobs": n, "PATCH jobsets/status": 2 * n,
                          "DELETE multislicejobs": n}  # fmt: skip
                mine = {k: v - driver.get(k, 0) for k, v in diff.items()}
                out["lifecycle"] = {
                    "jobs": n,
                    "requests_per_job": {k: v / n for k, v in mine.items() if v},
                    "writes_per_job": writes(mine) / n,
                    "reads_per_job": reads(mine) / n,
                }
    out["operator_log"] = str(log)
    return out


def peak_rss_mib(pid: int) -> float:
    """The process's own high-water mark of resident memory (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def delete_jobsets(api: client.ApiClient, w: Watcher, jobs: list[str], timeout: float) -> None:
    """Kubernetes' garbage collector's part (the api profile runs none): the jobs' JobSets go."""
    custom = client.CustomObjectsApi(api)
    w.add("js_gone", Spec(JOBSET, NAMESPACE, "deleted"))
    parallel(
        lambda name: custom.delete_namespaced_custom_object(
            *JOBSET[:2], NAMESPACE, JOBSET[2], name
        ),
        jobs,
    )
    w.wait("js_gone", jobs, timeout=timeout)


def churn_once(cp: ControlPlane, api: client.ApiClient, jobs: list[str], timeout: float) -> None:
    """`jobs` created, Starting, Running, Succeeded, deleted, their JobSets gone."""
    with Watcher(cp.kubeconfig) as w:
        start_jobs(api, w, jobs, timeout)
        lifecycle(api, w, jobs, timeout)
        delete_jobsets(api, w, jobs, timeout)


def run_churn(
    n: int,
    idle_s: float,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    warmup: int = 10,
    rounds: int = 2,
) -> dict[str, Any]:
    """Idle RSS with no job, again after `warmup` jobs came and went (what the first jobs cost
    once: lazily imported code, the client's connection pools, the allocator's first arenas),
    then after `n` jobs came, finished and went, `rounds` times: what jobs leave behind is
    after - warm, and a leak grows with every round where a high-water mark does not."""
    log = (log_dir or Path(tempfile.mkdtemp(prefix="bench-"))) / f"operator-churn-{n}.log"
    timeout = 120 + n * 0.5
    with operator_on_api(log, env) as (cp, api, pid):
        cold = idle_window(api, pid, idle_s)
        churn_once(cp, api, names(warmup), timeout)
        warm = idle_window(api, pid, idle_s)
        after_rounds = []
        for _ in range(rounds):
            churn_once(cp, api, names(n), timeout)
            after_rounds.append(idle_window(api, pid, idle_s)["rss_mib"])
        loaded = peak_rss_mib(pid)
        after = {"rss_mib": after_rounds[-1]}
    return {
        "rounds": rounds,
        "rss_after_each_round_mib": after_rounds,
        "jobs": n,
        "warmup_jobs": warmup,
        "idle_seconds": idle_s,
        "rss_cold_mib": cold["rss_mib"],
        "rss_before_mib": warm["rss_mib"],
        "rss_peak_mib": loaded,
        "rss_after_mib": after["rss_mib"],
        "rss_delta_mib": after["rss_mib"] - warm["rss_mib"],
        "operator_log": str(log),
    }


def churn_table(c: dict[str, Any]) -> str:
    return table(
        f"Idle RSS before and after a {c['jobs']}-job load (created -> Succeeded -> deleted; "
        f"{c['idle_seconds']:g}s idle windows; before: after {c['warmup_jobs']} jobs did the same)",
        ["jobs", "RSS at start MiB", "RSS before MiB", "peak MiB", "RSS after each round MiB",
         "delta MiB"],
        [[c["jobs"], c["rss_cold_mib"], c["rss_before_mib"], c["rss_peak_mib"],
          " / ".join(f"{r:.1f}" for r in c["rss_after_each_round_mib"]), c["rss_delta_mib"]]],
    )  # fmt: skip


def run(
    sizes: list[int],
    idle_s: float,
    lifecycle_at: int = 100,
    log_dir: Path | None = None,
    churn: int = 200,
    churn_idle_s: float = 30.0,
) -> dict[str, Any]:
    results, rows = [], []
    for n in sizes:
        say(f"footprint: {n} jobs (idle window {idle_s:g}s)")
        res = run_size(n, idle_s, n == lifecycle_at, log_dir)
        results.append(res)
        idle = res["idle"]
        rows.append(
            [
                n,
                idle["rss_mib"],
                idle["cpu_percent"],
                idle["writes_per_min"],
                idle["writes_per_min"] / n if n else 0.0,
                idle["reads_per_min"],
                idle["threads"],
            ]
        )
    text = (
        ""
        if not rows
        else table(
            f"Footprint at idle (window {idle_s:g}s, resync 10s)",
            ["jobs", "RSS MiB", "CPU %", "writes/min", "writes/min/job", "reads/min", "threads"],
            rows,
        )
    )
    life = next((r["lifecycle"] for r in results if "lifecycle" in r), None)
    if life:
        text += "\n" + table(
            f"API requests per job lifecycle (create -> Running -> Succeeded -> deleted, "
            f"{life['jobs']} jobs)",
            ["request", "per job"],
            [[k, v] for k, v in sorted(life["requests_per_job"].items())]
            + [
                ["= writes", life["writes_per_job"]],
                ["= reads (GET, LIST)", life["reads_per_job"]],
            ],
        )
    out: dict[str, Any] = {"idle_seconds": idle_s, "results": results}
    if churn:
        say(f"footprint: idle RSS before and after {churn} jobs (idle windows {churn_idle_s:g}s)")
        out["churn"] = run_churn(churn, churn_idle_s, log_dir)
        text += "\n" + churn_table(out["churn"])
    out["table"] = text
    save("footprint", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="0,100,1000", help="comma list; empty: none")
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--churn", type=int, default=200, help="jobs of the before/after load; 0: none")
    p.add_argument("--churn-idle", type=float, default=30.0, help="its idle windows, seconds")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    run(sizes, args.idle, churn=args.churn, churn_idle_s=args.churn_idle)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
