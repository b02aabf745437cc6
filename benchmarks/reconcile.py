"""Benchmark 1: reconcile throughput and latency of N MultisliceJobs against the apiserver's limit.

Each N gets a fresh `api`-profile control plane (etcd + kube-apiserver) with two Existing node
pools of Ready nodes that every job's slices fit (v5litepod-16 x 2, Existing mode).

* operator: the operator runs (a real `multislice-operator run` process, default settings); a
  client with WORKERS threads creates the N jobs; a watch records when each job's JobSet exists
  and when its status says phase Starting.
* baseline: no operator; the same client with the same WORKERS threads does, per job, only the
  writes a reconcile cannot avoid after the job is created (create the pre-rendered JobSet with
  render_jobset, patch the job's status once with the very status decide() gives) and the same
  watch records the same moments. That is the apiserver's limit for this work on this machine.
  It runs before and after the operator; the ratio is to their mean.

Per-job latency: client-side time just before the job's create request -> status observed by the
watch. Writes per job: from the apiserver's apiserver_request_total (GET /metrics), diffed over
the run and settled, minus the client's own N creates.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import (
    JOBSET,
    MSJ,
    WORKERS,
    CpuMeter,
    admin_client,
    count_diff,
    cpu_seconds,
    create_namespace,
    job_body,
    parallel,
    ready_pools,
    request_counts,
    rss_mib,
    save,
    say,
    settle,
    stats,
    table,
    threads_of,
    wait_until,
    writes,
)
from benchmarks.watcher import Spec, Watcher
from multislice_local.controlplane import ControlPlane, bin_dir
from multislice_local.harness import OperatorProcess, install_crds
from multislice_operator.common.pools import PoolState
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.plugins.existing import Found
from multislice_operator.reconcile import (
    Admission,
    DecideConfig,
    JobMeta,
    Observed,
    SliceObservation,
    decide,
)
from multislice_operator.render.jobset import render_jobset

NAMESPACE = "bench"
POOLS, HOSTS = 2, 4  # v5litepod-16: 4 hosts of 4 chips, topology 4x4; 2 slices per job


def names(n: int) -> list[str]:
    return [f"job-{i:05d}" for i in range(n)]


def prepare(cp: ControlPlane) -> client.ApiClient:
    api = admin_client(cp)
    install_crds(api, bin_dir() / "jobset.x-k8s.io_jobsets.yaml")
    ready_pools(api, "pool", POOLS, HOSTS)
    create_namespace(api, NAMESPACE)
    return api


def _timed_creates(
    api: client.ApiClient, n: int, then: Any = None, workers: int = WORKERS
) -> dict[str, float]:
    """Create the N jobs from `workers` threads; `then(name, created)` runs right after each."""
    custom = client.CustomObjectsApi(api)
    sent: dict[str, float] = {}

    def one(name: str) -> None:
        body = job_body(name)
        sent[name] = time.monotonic()
        created = custom.create_namespaced_custom_object(*MSJ[:2], NAMESPACE, MSJ[2], body)
        if then is not None:
            then(name, created)

    parallel(one, names(n), workers)
    return sent


def _measure(
    cp: ControlPlane,
    api: client.ApiClient,
    n: int,
    timeout: float,
    then: Any = None,
    workers: int = WORKERS,
    operator_pid: int | None = None,
) -> dict[str, Any]:
    with Watcher(cp.kubeconfig) as w:
        w.add("starting", Spec(MSJ, NAMESPACE, "phase", ["Starting"]))
        w.add("jobset", Spec(JOBSET, NAMESPACE))
        pids = {"apiserver": cp.pids["kube-apiserver"], "etcd": cp.pids["etcd"]}
        pids |= {"client": os.getpid(), "watcher": w.pid}
        if operator_pid is not None:
            pids["operator"] = operator_pid
        meter = CpuMeter(pids, tree=frozenset({"operator"})).start()
        before = request_counts(api)
        sent = _timed_creates(api, n, then, workers)
        status_at = w.wait("starting", sent, timeout=timeout)
        jobset_at = w.wait("jobset", sent, timeout=timeout)
        cpu = meter.stop()
    start = min(sent.values())
    done = max(max(status_at.values()), max(jobset_at.values()))
    waited = settle(api)
    diff = count_diff(request_counts(api), before)
    latency = [status_at[k] - sent[k] for k in sent]
    total = done - start
    op_writes = writes(diff) - n  # less the client's own creates
    return {
        "n": n,
        "total_s": total,
        "jobs_per_s": n / total,
        "latency_s": stats(latency),
        "jobset_latency_s": stats([jobset_at[k] - sent[k] for k in sent]),
        "writes_per_job": op_writes / n,
        "requests": diff,
        "settle_s": waited,
        "cpu_s": cpu,
    }


def baseline_work(n: int) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Per job, the JobSet render_jobset gives and the status decide() gives (pre-computed)."""
    out = {}
    now = datetime.now(UTC)
    for name in names(n):
        body = copy.deepcopy(job_body(name))
        body["metadata"].update(namespace=NAMESPACE, uid="00000000-0000-0000-0000-000000000000")
        job = load_job(body)
        plan = plan_job(job)
        jobset = render_jobset(plan, job.spec, job.metadata.labels)
        slices = [
            SliceObservation(i, f"pool-{i}", PoolState.READY, plan.shape.hosts)
            for i in range(POOLS)
        ]
        obs = Observed(now=now, slices=slices, capacity=Found(POOLS), admission=Admission())
        decision = decide(JobMeta(NAMESPACE, name, "", 1), job.spec, plan, None, None, obs,
                          DecideConfig.from_settings())  # fmt: skip
        status = decision.status.to_dict()
        out[name] = (jobset, status)
    return out


def run_baseline(n: int, timeout: float, workers: int = WORKERS) -> dict[str, Any]:
    work = baseline_work(n)
    with ControlPlane("api") as cp:
        api = prepare(cp)
        custom = client.CustomObjectsApi(api)

        def unavoidable(name: str, created: dict[str, Any]) -> None:
            jobset, status = copy.deepcopy(work[name])
            meta = created["metadata"]
            jobset["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": created["apiVersion"],
                    "kind": created["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            custom.create_namespaced_custom_object(*JOBSET[:2], NAMESPACE, JOBSET[2], jobset)
            custom.patch_namespaced_custom_object_status(
                *MSJ[:2], NAMESPACE, MSJ[2], name, {"status": status}
            )

        result = _measure(cp, api, n, timeout, unavoidable, workers)
        api.close()  # type: ignore[no-untyped-call]
    return result


def run_operator(
    n: int,
    timeout: float,
    workers: int = WORKERS,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    idle_s: float = 0.0,
) -> dict[str, Any]:
    log = (log_dir or Path(tempfile.mkdtemp(prefix="bench-"))) / f"operator-reconcile-{n}.log"
    with ControlPlane("api") as cp:
        api = prepare(cp)
        op = OperatorProcess(cp.kubeconfig, extra_args or [], env=env, log_path=log)
        try:
            op.start()
            _warm_up(api, op)
            assert op.proc is not None
            pid = op.proc.pid
            result = _measure(cp, api, n, timeout, None, workers, pid)
            result["operator_rss_mib"] = rss_mib(pid)
            result["operator_threads"] = threads_of(pid)
            if idle_s:
                c0, w0 = cpu_seconds(pid), request_counts(api)
                time.sleep(idle_s)
                idle = count_diff(request_counts(api), w0)
                result["idle"] = {
                    "seconds": idle_s,
                    "cpu_percent": 100 * (cpu_seconds(pid) - c0) / idle_s,
                    "writes": writes(idle),
                    "rss_mib": rss_mib(pid),
                }
        finally:
            op.stop()
            api.close()  # type: ignore[no-untyped-call]
    result["operator_log"] = str(log)
    return result


def _warm_up(api: client.ApiClient, op: OperatorProcess) -> None:
    """One job in another namespace: the operator's watches are up before the clock starts."""
    create_namespace(api, "warm-up")
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(*MSJ[:2], "warm-up", MSJ[2], job_body("warm"))

    def starting() -> bool:
        got: dict[str, Any] = custom.get_namespaced_custom_object(  # type: ignore[assignment]
            *MSJ[:2], "warm-up", MSJ[2], "warm"
        )
        return (got.get("status") or {}).get("phase") == "Starting"

    try:
        wait_until(starting, 60, "warm-up job Starting")
    except TimeoutError as err:
        raise TimeoutError(f"{err}\n{op.log_tail(30)}") from err
    settle(api, quiet_s=1.0)


def _others(res: dict[str, Any]) -> float:
    """Cores the rest of the machine kept busy during a run (a shared machine's noise)."""
    return float(res["cpu_s"]["others"] / max(res["cpu_s"]["wall"], 1e-9))


def run(sizes: list[int], workers: int = WORKERS, log_dir: Path | None = None) -> dict[str, Any]:
    """Per N: baseline, operator, baseline again; the ratio is to the mean of the baselines, so
    that load from outside drifting over the run weighs on both sides."""
    rows, results = [], []
    for n in sizes:
        timeout = 120 + n * 0.5
        say(f"reconcile N={n}: baseline")
        before = run_baseline(n, timeout, workers)
        say(f"reconcile N={n}: operator")
        op = run_operator(n, timeout, workers, log_dir=log_dir)
        say(f"reconcile N={n}: baseline again")
        after = run_baseline(n, timeout, workers)
        base_s = (before["total_s"] + after["total_s"]) / 2
        ratio = op["total_s"] / base_s
        results.append(
            {
                "n": n,
                "baseline": before,
                "baseline_again": after,
                "baseline_total_s": base_s,
                "operator": op,
                "ratio": ratio,
            }
        )
        rows.append(
            [
                n,
                base_s,
                op["total_s"],
                ratio,
                op["jobs_per_s"],
                before["latency_s"]["p50"],
                op["latency_s"]["p50"],
                op["latency_s"]["p95"],
                op["latency_s"]["p99"],
                before["writes_per_job"],
                op["writes_per_job"],
                op["cpu_s"]["operator"] / n * 1000,
                max(_others(before), _others(after), _others(op)),
            ]
        )
    text = table(
        f"Reconcile: N jobs to JobSet + status Starting ({workers} client threads)",
        [
            "N",
            "base s",
            "op s",
            "ratio",
            "op jobs/s",
            "base p50",
            "op p50",
            "op p95",
            "op p99",
            "base w/job",
            "op w/job",
            "op cpu ms/job",
            "others' cores",
        ],
        rows,
    )
    out = {"workers": workers, "results": results, "table": text}
    save("reconcile", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default="10,100,1000")
    p.add_argument("--workers", type=int, default=WORKERS)
    args = p.parse_args(argv)
    run([int(s) for s in args.sizes.split(",")], args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
