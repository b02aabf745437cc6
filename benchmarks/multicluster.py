"""MultiKueue (issue 43): what a manager in front of two workers costs, printed, not asserted.

One local MultiCluster (multislice_local.multicluster: a manager and workers a and b, each with
its own Kueue v0.19.2, GKE simulator and operator; pool latency --pool-latency). Jobs of
2 x v5litepod-16 whose pods run --run, one at a time:

1. baseline: the job queued on worker b itself (queue label, no managedBy): create -> Running
   and -> Succeeded, as that worker's status says;
2. dispatched: the same job on the manager with spec.managedBy (both workers free): create ->
   Running and -> Succeeded as the manager's copy says (MultiKueue's admission, the copy to the
   worker, the worker's admission and gang, and the status copied back);
3. handed back: worker a stocked out for every create, b free: which worker each job went to
   first (the AllAtOnce race) and create -> Running on b as the manager's copy says; a job a
   admitted first was handed back (its gang rolled back, its check Retry) and re-dispatched;
4. cut off: one job running on a (b without quota until then), the manager loses a (its
   kubeconfig at a dead port): cut -> Running on b (MultiKueue's workerLostTimeout, 60 s
   locally, then a dispatch; a runs on, unseen), and after the reconnection (at once) which copy
   is left and how soon.

    python -m benchmarks.multicluster [--jobs 5] [--run 2s] [--pool-latency 1]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.common import save, say, stats, table
from multislice_local import queues
from multislice_local.multicluster import MANAGER, QUEUE, MultiCluster, job_body
from multislice_operator.api import models
from multislice_operator.common import keys


def _wait(check: Callable[[], bool], timeout: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():
            return time.monotonic()
        time.sleep(0.1)
    raise TimeoutError(f"not reached in {timeout:.0f}s")


def _times(mc: MultiCluster, where: str, name: str, ns: str, t0: float) -> tuple[float, float]:
    def phase() -> str | None:
        found: str | None = mc.status(where, name, ns).get("phase")
        return found

    running = _wait(lambda: phase() in ("Running", "Succeeded"), 300) - t0
    done = _wait(lambda: phase() == "Succeeded", 300) - t0
    return running, done


def _baseline(mc: MultiCluster, ns: str, name: str, run: str) -> tuple[float, float]:
    from kubernetes import client

    body = job_body(name, run=run, labels={keys.KUEUE_QUEUE_NAME: QUEUE})  # no managedBy
    t0 = time.monotonic()
    client.CustomObjectsApi(mc.workers["b"].api).create_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, body
    )
    return _times(mc, "b", name, ns, t0)


def _dispatched(mc: MultiCluster, ns: str, name: str, run: str) -> tuple[float, float]:
    t0 = time.monotonic()
    mc.create(name, ns, run=run)
    return _times(mc, MANAGER, name, ns, t0)


def _cut_off(mc: MultiCluster, ns: str, run: str) -> dict[str, Any]:
    """Phase 4: a runs the job, the manager loses a, b takes it; then a is back."""

    def on(w: str) -> bool:
        return mc.job(w, "cut", ns) is not None

    def phase(cluster: str) -> str | None:
        found: str | None = mc.status(cluster, "cut", ns).get("phase")
        return found

    mc.set_quota("b", 0)
    mc.create("cut", ns, run=run)
    _wait(lambda: phase("a") == "Running", 300)
    mc.set_quota("b", 64)
    t0 = time.monotonic()
    mc.cut_off("a")
    try:
        on_b = _wait(lambda: phase("b") == "Running", 600) - t0
    finally:
        mc.reconnect("a")
    t1 = time.monotonic()
    one = _wait(lambda: on("a") != on("b"), 300) - t1
    return {"to_running_on_b_s": on_b, "one_left_after_s": one, "left": "a" if on("a") else "b"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=5)
    p.add_argument("--run", default="2s")
    p.add_argument("--pool-latency", type=float, default=1.0)
    args = p.parse_args(argv)
    result: dict[str, Any] = {"jobs": args.jobs, "run": args.run}
    with MultiCluster(op_latency_s=args.pool_latency) as mc:
        say(f"up in {sum(mc.startup_seconds.values()):.1f}s: {mc.startup_seconds}")
        result["startup_s"] = mc.startup_seconds
        result["rss_mib"] = {k: v // 2**20 for k, v in mc.rss().items()}
        ns = mc.namespace(f"bench-{uuid.uuid4().hex[:6]}")
        rows: list[list[Any]] = []
        for label, fn in (("baseline: queued on worker b", _baseline),
                          ("dispatched from the manager", _dispatched)):  # fmt: skip
            times = [fn(mc, ns, f"{label[:4]}-{i}", args.run) for i in range(args.jobs)]
            running, done = stats([t[0] for t in times]), stats([t[1] for t in times])
            result[label] = {"running": running, "succeeded": done}
            rows.append([label, running["p50"], running["max"], done["p50"], done["max"]])
            say(f"{label}: done")
        headers = ["path", "Running p50", "max", "Succeeded p50", "max"]
        table("create -> Running / Succeeded (s)", headers, rows)
        a, b = mc.workers["a"], mc.workers["b"]
        assert a.sim is not None and b.sim is not None
        witness = queues.QuotaWitness(a.sim, a.api).install()
        a.sim.set_faults(stockout_next=10_000)
        back: list[list[Any]] = []
        for i in range(args.jobs):
            name = f"back-{i}"
            t0 = time.monotonic()
            mc.create(name, ns, run=args.run)
            to_running, _ = _times(mc, MANAGER, name, ns, t0)
            cluster = (mc.status(MANAGER, name, ns).get("queue") or {}).get("cluster") or ""
            first = "a (handed back)" if witness.for_job(f"{ns}/{name}") else "b"
            back.append([name, first, cluster.rsplit("/", 1)[-1], to_running])
        witness.uninstall()
        a.sim.clear_faults()
        columns = ["job", "first admitted by", "ran on", "create -> Running (s)"]
        table("worker a stocked out: where each job went", columns, back)
        result["handed_back"] = [dict(zip(("job", "first", "ran_on", "running_s"), r, strict=True))
                                 for r in back]  # fmt: skip
        cut = _cut_off(mc, ns, "600s")
        table("worker a cut off from the manager, then back", list(cut), [list(cut.values())])
        result["cut_off"] = cut
    save("multicluster", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
