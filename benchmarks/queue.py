"""Kueue in front (issue 17): two figures on the local `kueue` profile, printed, not asserted.

1. Quota reservation -> our admission check Ready, beyond the simulated pool latency. N jobs
   (2 x v5litepod-16: a gang of 2 pools of 4 nodes) one after another in an otherwise idle
   ClusterQueue. A watch on the namespace's Workloads timestamps, on this machine, when each
   Workload is first seen with QuotaReserved=True and when its check is first seen Ready; both
   come through the same watch, so its delivery delay cancels. The GKE simulator's create latency
   (SimConfig.op_latency_s) is subtracted: what is left is the operator's share (noticing the
   quota, creating the pools, seeing them RUNNING and their kwok nodes Ready, writing the check)
   plus node registration.
2. M jobs through a quota of 2 jobs (a StrictFIFO ClusterQueue of 64 chips, 32 per job, pods
   running `--run` each): the time for all to succeed, the most Workloads holding quota at once,
   and, from a witness on the simulator's create endpoint that reads the job's Workload at the
   moment each node-pool create arrives, the creates for a job that was not holding quota
   (expected 0) and the pools left at the end (expected 0).

    python -m benchmarks.queue [--latency-jobs 10] [--jobs 50] [--run 2s] [--pool-latency 1]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from typing import Any

from kubernetes import client, watch

from benchmarks.common import save, say, stats, table
from multislice_local import queues
from multislice_local.nodes import RUN_DURATION_ANNOTATION
from multislice_local.stack import LocalStack, StackOptions
from multislice_operator.api import models
from multislice_operator.common import keys

FLAVOR = "tpu-v5e"


class WorkloadClock:
    """First time (monotonic) each JobSet's Workload is seen holding quota, and its check Ready."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.ns = api, namespace
        self.quota: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.holding: set[str] = set()
        self.max_holding = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> WorkloadClock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    custom.list_namespaced_custom_object,
                    queues.GROUP,
                    queues.VERSION,
                    self.ns,
                    "workloads",
                    timeout_seconds=30,
                ):
                    self._see(event["type"], event["object"])
                    if self._stop.is_set():
                        break
            except Exception:  # a dropped watch: start again
                time.sleep(0.2)
            finally:
                w.stop()  # type: ignore[no-untyped-call]

    def _see(self, kind: str, wl: dict[str, Any]) -> None:
        now = time.monotonic()
        owner = next(
            (
                o["name"]
                for o in wl["metadata"].get("ownerReferences") or []
                if o["kind"] == "MultisliceJob"
            ),
            None,
        )
        if owner is None:
            return
        finished = queues.condition(wl, "Finished").get("status") == "True"  # quota freed
        if kind != "DELETED" and queues.holds_quota(wl) and not finished:
            self.quota.setdefault(owner, now)
            self.holding.add(owner)
        else:
            self.holding.discard(owner)
        self.max_holding = max(self.max_holding, len(self.holding))
        for check in (wl.get("status") or {}).get("admissionChecks") or []:
            if check.get("state") == "Ready":
                self.ready.setdefault(owner, now)


def job(name: str, run: str) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": name, "labels": {keys.KUEUE_QUEUE_NAME: "lq"}},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "template": {
                "metadata": {"annotations": {RUN_DURATION_ANNOTATION: run}},
                "spec": {"containers": [{"name": "train", "image": "example.invalid/t:1"}]},
            },
        },
    }


def phases(custom: Any, ns: str) -> dict[str, str]:
    items = custom.list_namespaced_custom_object(models.GROUP, models.VERSION, ns, models.PLURAL)
    return {i["metadata"]["name"]: (i.get("status") or {}).get("phase", "") for i in items["items"]}


def wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise TimeoutError(what)


def setup(stack: LocalStack, ns: str) -> None:
    core: Any = client.CoreV1Api(stack.api)
    core.create_namespace({"metadata": {"name": ns}})
    queues.apply(
        stack.api,
        [
            queues.resource_flavor(FLAVOR, "tpu-v5-lite-podslice"),
            queues.admission_check(),
            queues.cluster_queue(f"cq-{ns}", 64, FLAVOR),
            queues.local_queue(ns, "lq", f"cq-{ns}"),
        ],
    )
    queues.wait_active(stack.api, f"cq-{ns}")


def latency(stack: LocalStack, n: int, pool_latency: float) -> dict[str, Any]:
    ns = f"qlat-{uuid.uuid4().hex[:5]}"
    setup(stack, ns)
    clock = WorkloadClock(stack.api, ns).start()
    custom: Any = client.CustomObjectsApi(stack.api)
    try:
        for i in range(n):
            name = f"lat-{i}"
            custom.create_namespaced_custom_object(
                models.GROUP, models.VERSION, ns, models.PLURAL, job(name, "1s")
            )
            wait(lambda n=name: n in clock.ready, 120, f"{name} check Ready")
            wait(lambda n=name: phases(custom, ns).get(n) == "Succeeded", 120, f"{name} done")
            wait(lambda: not stack.sim.pools(), 60, "pools released")  # type: ignore[union-attr]
    finally:
        clock.stop()
    beyond = [clock.ready[k] - clock.quota[k] - pool_latency for k in clock.ready]
    return {"jobs": n, "poolLatencyS": pool_latency, "beyondPoolLatencyS": stats(beyond)}


def throughput(stack: LocalStack, m: int, run: str) -> dict[str, Any]:
    ns = f"qthr-{uuid.uuid4().hex[:5]}"
    setup(stack, ns)
    assert stack.sim is not None
    witness = queues.QuotaWitness(stack.sim, stack.api).install()
    clock = WorkloadClock(stack.api, ns).start()
    custom: Any = client.CustomObjectsApi(stack.api)
    t0 = time.monotonic()
    try:
        for i in range(m):
            custom.create_namespaced_custom_object(
                models.GROUP, models.VERSION, ns, models.PLURAL, job(f"j-{i:02d}", run)
            )
        wait(
            lambda: list(phases(custom, ns).values()).count("Succeeded") == m,
            60 * m,
            "every job Succeeded",
        )
        elapsed = time.monotonic() - t0
        wait(lambda: not stack.sim.pools(), 60, "pools released")  # type: ignore[union-attr]
    finally:
        clock.stop()
    creates = [c for c in witness.creates if c.job.startswith(f"{ns}/")]
    return {
        "jobs": m,
        "quotaJobs": 2,
        "elapsedS": round(elapsed, 1),
        "jobsPerMinute": round(60 * m / elapsed, 2),
        "poolCreates": len(creates),
        "createsWithoutQuota": len([c for c in creates if not c.quota_reserved]),
        "maxHoldingQuota": clock.max_holding,
        "poolsLeft": len(stack.sim.pools()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.queue")
    p.add_argument("--latency-jobs", type=int, default=10)
    p.add_argument("--jobs", type=int, default=50)
    p.add_argument("--run", default="2s", help="how long each job's pods run (kwok)")
    p.add_argument("--pool-latency", type=float, default=1.0)
    args = p.parse_args(argv)
    say("starting the kueue profile, the GKE simulator and the operator")
    stack = LocalStack(
        StackOptions(profile="kueue", op_latency_s=args.pool_latency, resync_seconds=1.0)
    ).start()
    try:
        say(f"1. quota reserved -> check Ready, {args.latency_jobs} jobs one at a time")
        lat = latency(stack, args.latency_jobs, args.pool_latency)
        say(f"2. {args.jobs} jobs through a 2-job quota")
        thr = throughput(stack, args.jobs, args.run)
    finally:
        stack.stop()
    b = lat["beyondPoolLatencyS"]
    table(
        "Kueue: quota reserved -> check Ready, beyond the pool latency (s)",
        ["jobs", "pool latency", "p50", "p95", "max"],
        [[lat["jobs"], lat["poolLatencyS"], b["p50"], b["p95"], b["max"]]],
    )
    table(
        "Kueue: jobs through a 2-job quota",
        ["jobs", "elapsed s", "jobs/min", "pool creates", "without quota", "max holding",
         "pools left"],
        [[thr["jobs"], thr["elapsedS"], thr["jobsPerMinute"], thr["poolCreates"],
          thr["createsWithoutQuota"], thr["maxHoldingQuota"], thr["poolsLeft"]]],
    )  # fmt: skip
    save("queue", {"latency": lat, "throughput": thr})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
