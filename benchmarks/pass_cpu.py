"""Operator CPU per pass for one job of N pods (issue 40): pure core, no cluster.

What a pass of the operator computes for one job, with the operator's own functions and the
apiserver's shapes of the objects (v5litepod-256 slices: 64 hosts each, Existing pools, every
pod Running and Ready on its node, the JobSet running):

* index: `summarize_pod` of every pod and `summarize_node` of every node (what kopf's indexes
  run per watch event: each pod event costs one, not one per pod; here all N, i.e. the cost of
  a burst in which every pod changes once);
* pass: `assemble` (the pod index into the observed world: pod records, slices, facts' inputs)
  + `decide()` (facts, verdicts, status) + the status as written (`to_dict`), as
  controller/reconciler.py's `_reconcile` does, on a job already Running (a steady pass) and on
  one whose pods all moved to the next restart attempt (a pass after a restart).

Each is timed with `time.process_time()` (this process's CPU), the median of `--repeats`.
A fit of the pass's CPU against N (least squares) gives the cost per pod and the fixed cost;
linear growth: the cost per pod between neighbouring sizes stays within 1.5x.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from benchmarks.common import job_body, save, say, table
from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common import keys
from multislice_operator.controller import observe as ob
from multislice_operator.controller.handlers import (
    DEPENDENT_EVENT_BATCH_SECONDS,
    DEPENDENT_EVENT_QUIET_SECONDS,
)
from multislice_operator.controller.reconciler import job_meta, parse
from multislice_operator.controller.workqueue import WorkQueue
from multislice_operator.reconcile import decide
from multislice_operator.reconcile.types import DecideConfig
from multislice_operator.render.jobset import JOBSET_API_VERSION, JOBSET_KIND
from multislice_operator.settings import Settings
from multislice_operator.tpu.catalog import slice_shape

ACCELERATOR = "v5litepod-256"  # 64 hosts a slice
NS, NAME, UID, JS_UID = "bench", "train", "job-uid-0", "jobset-uid-0"
SIZES = [256, 1024, 2048, 4096]
BEND = 1.5  # as benchmarks/run.py: a cost per pod this many times the previous one bends
STARTED = "2026-12-04T12:00:00Z"
# Bursts of one job's pod events: (events, over seconds): a restart's 1,024 and 4,096 pods, each
# pod changing 4 times (deleted, created, scheduled, Running), at once and spread out.
BURSTS = [(4096, 0.0), (4096, 2.0), (16384, 5.0)]


def fit(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares line y = a + b x through `points`: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        raise ValueError("a fit needs two different sizes")
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def growth(points: Sequence[tuple[float, float]]) -> tuple[list[float], bool]:
    """The cost per unit between neighbouring sizes, and whether it stays within BEND x of the
    first step's (linear, or better)."""
    pts = sorted(points)
    steps = [(y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(pts)]
    linear = bool(steps) and all(s <= BEND * steps[0] for s in steps)
    return steps, linear


def job(slices: int) -> dict[str, Any]:
    body = job_body(NAME, ACCELERATOR, slices)
    body["metadata"].update(namespace=NS, uid=UID, generation=1, creationTimestamp=STARTED)
    body["metadata"]["finalizers"] = [keys.FINALIZER]
    return body


def nodes(slices: int, hosts: int) -> list[dict[str, Any]]:
    shape = slice_shape(ACCELERATOR)
    out = []
    for p in range(slices):
        for h in range(hosts):
            labels = {
                keys.GKE_NODEPOOL: f"pool-{p}",
                keys.GKE_TPU_ACCELERATOR: shape.generation.gke_accelerator,
                keys.GKE_TPU_TOPOLOGY: shape.topology,
            }
            out.append(
                {
                    "metadata": {"name": f"pool-{p}-{h}", "labels": labels},
                    "spec": {},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
                }
            )
    return out


def jobset(slices: int, attempt: int) -> dict[str, Any]:
    return {
        "apiVersion": JOBSET_API_VERSION,
        "kind": JOBSET_KIND,
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "uid": JS_UID,
            "creationTimestamp": STARTED,
            "labels": {keys.MANAGED_BY: keys.MANAGED_BY_VALUE, keys.JOB_NAME: NAME},
            "ownerReferences": [{"controller": True, "uid": UID, "kind": "MultisliceJob"}],
        },
        "spec": {"replicatedJobs": [{"name": "slice", "replicas": slices}]},
        "status": {
            "restarts": attempt,
            "replicatedJobsStatus": [
                {"name": "slice", "ready": slices, "active": slices, "succeeded": 0}
            ],
        },
    }


def pod(slice_: int, host: int, attempt: int) -> dict[str, Any]:
    """A Running, Ready pod as the apiserver serves it (the fields summarize_pod reads, and the
    bulk of a real pod's status)."""
    labels = {
        keys.JOB_NAME: NAME,
        keys.JOBSET_NAME: NAME,
        keys.JOBSET_UID: JS_UID,
        keys.JOBSET_JOB_INDEX: str(slice_),
        keys.JOBSET_RESTART_ATTEMPT: str(attempt),
        "batch.kubernetes.io/job-completion-index": str(host),
    }
    running = {"running": {"startedAt": STARTED}}
    conds = [
        {"type": t, "status": "True", "lastTransitionTime": STARTED}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
    ]
    conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": STARTED})
    return {
        "metadata": {
            "name": f"{NAME}-slice-{slice_}-{host}-a{attempt}",
            "namespace": NS,
            "uid": f"pod-{slice_}-{host}-{attempt}",
            "labels": labels,
            "annotations": {keys.JOBSET_NAME: NAME},
            "creationTimestamp": STARTED,
        },
        "spec": {"nodeName": f"pool-{slice_}-{host}", "schedulerName": "default-scheduler"},
        "status": {
            "phase": "Running",
            "conditions": conds,
            "containerStatuses": [
                {"name": "train", "ready": True, "restartCount": 0, "state": running}
            ],
            "startTime": STARTED,
        },
    }


def median_cpu(fn: Callable[[], Any], repeats: int) -> float:
    """The median CPU seconds of `fn()` over `repeats` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


class World:
    """One job of `pods` pods as the operator's indexes hold it."""

    def __init__(self, pods: int, attempt: int = 0) -> None:
        hosts = slice_shape(ACCELERATOR).hosts
        if pods % hosts:
            raise ValueError(f"pods must be a multiple of {hosts} (a {ACCELERATOR} slice)")
        self.slices = pods // hosts
        self.body = job(self.slices)
        self.parsed = parse(self.body)
        self.meta = job_meta(self.body)
        self.node_bodies = nodes(self.slices, hosts)
        self.set_attempt(attempt)
        self.cfg = DecideConfig.from_settings(Settings())
        self.status = MultisliceJobStatus()

    def set_attempt(self, attempt: int) -> None:
        hosts = slice_shape(ACCELERATOR).hosts
        self.pod_bodies = [pod(s, h, attempt) for s in range(self.slices) for h in range(hosts)]
        self.jobset_body = jobset(self.slices, attempt)
        self.index()

    def index(self) -> None:
        """What kopf's indexes run: one summary per object."""
        self.pods = [ob.summarize_pod(p) for p in self.pod_bodies]
        by_pool: dict[str, list[dict[str, Any]]] = {}
        for n in self.node_bodies:
            by_pool.setdefault(n["metadata"]["labels"][keys.GKE_NODEPOOL], []).append(
                ob.summarize_node(n)
            )
        self.nodes = by_pool
        self.js = ob.summarize_jobset(self.jobset_body)

    def one_pass(self) -> dict[str, Any]:
        """assemble + decide + the status as written; the next pass starts from it."""
        plan, spec = self.parsed.plan, self.parsed.job.spec
        assert plan is not None
        inputs = ob.ObserveInputs(plan, UID, self.nodes)
        obs = ob.assemble(
            inputs, datetime.now(UTC), self.js, self.pods, provisioner_configured=False
        )
        d = decide(self.meta, spec, plan, None, self.status, obs, self.cfg)
        written = d.status.to_dict()
        self.status = MultisliceJobStatus.from_dict(written)
        return written


def measure(pods: int, repeats: int) -> dict[str, Any]:
    w = World(pods)
    for _ in range(3):  # to Running, and steady
        status = w.one_pass()
    if status.get("phase") != "Running":
        raise RuntimeError(f"the world of {pods} pods is not Running: {status.get('phase')}")
    index_s = median_cpu(w.index, repeats)
    steady_s = median_cpu(w.one_pass, repeats)
    # After a restart: the index holds the next attempt's pods; the first pass sees them.
    restarted = []
    for attempt in range(1, repeats + 1):
        w.set_attempt(attempt)
        t0 = time.process_time()
        w.one_pass()
        restarted.append(time.process_time() - t0)
    return {
        "pods": pods,
        "slices": w.slices,
        "index_s": index_s,
        "pass_s": steady_s,
        "pass_after_restart_s": statistics.median(restarted),
        "index_us_per_pod": index_s / pods * 1e6,
        "pass_us_per_pod": steady_s / pods * 1e6,
    }


async def _burst(events: int, spread_s: float, pass_s: float) -> int:
    """Passes the operator's work queue gives one job while `events` pod events arrive evenly
    over `spread_s` seconds, each debounced as handlers.py's pod handler does, every pass
    taking `pass_s` (a worker as runtime.py's: get, pass, done)."""
    q: WorkQueue[tuple[str, str]] = WorkQueue()
    key, count = (NS, NAME), 0

    async def worker() -> None:
        nonlocal count
        while True:
            k = await q.get()
            count += 1
            await asyncio.sleep(pass_s)
            q.done(k)

    task = asyncio.create_task(worker())
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(events):
        due = start + spread_s * i / events
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        q.debounce(key, DEPENDENT_EVENT_QUIET_SECONDS, DEPENDENT_EVENT_BATCH_SECONDS)
    await asyncio.sleep(DEPENDENT_EVENT_BATCH_SECONDS + pass_s + 0.2)  # the last pass
    task.cancel()
    return count


def pass_bound(burst_s: float) -> int:
    """The most passes a burst of a job's dependent events lasting `burst_s` may cost, as
    controller/workqueue.py's debounce works: a pass is never sooner than the quiet time after
    the first event since the previous pass began (an event during a pass re-adds the job for
    that time, which later events do not move), plus the pass after the last event and one in
    flight when the burst began. Not one per batch window: see docs/benchmarks.md."""
    return math.floor(burst_s / DEPENDENT_EVENT_QUIET_SECONDS) + 2


def window_bound(burst_s: float) -> int:
    """What handlers.py's comment promises: one pass per batch window while a burst lasts, and
    one after its last event."""
    return math.ceil(burst_s / DEPENDENT_EVENT_BATCH_SECONDS) + 1


def bursts(pass_s: float) -> list[dict[str, Any]]:
    out = []
    for events, spread in BURSTS:
        got = asyncio.run(_burst(events, spread, pass_s))
        out.append(
            {
                "events": events,
                "spread_s": spread,
                "passes": got,
                "bound": pass_bound(spread),
                "window_bound": window_bound(spread),
            }
        )
    return out


def run(sizes: list[int], repeats: int) -> dict[str, Any]:
    rows, results = [], []
    for n in sizes:
        say(f"pass CPU: one job of {n} pods")
        r = measure(n, repeats)
        results.append(r)
        rows.append(
            [
                n,
                r["slices"],
                r["index_s"] * 1000,
                r["pass_s"] * 1000,
                r["pass_after_restart_s"] * 1000,
                r["pass_us_per_pod"],
            ]
        )
    out: dict[str, Any] = {"repeats": repeats, "results": results}
    for key in ("pass_s", "index_s", "pass_after_restart_s"):
        pts = [(float(r["pods"]), float(r[key])) for r in results]
        a, b = fit(pts)
        steps, linear = growth(pts)
        out[f"{key}_fit"] = {
            "fixed_ms": a * 1000,
            "us_per_pod": b * 1e6,
            "steps_us_per_pod": [s * 1e6 for s in steps],
            "linear": linear,
        }
    text = table(
        f"CPU per pass, one job (median of {repeats}; v5litepod-256 slices)",
        ["pods", "slices", "index ms", "pass ms", "pass after restart ms", "pass us/pod"],
        rows,
    )
    fits = "\n".join(
        f"{k}: {v['fixed_ms']:.2f} ms + {v['us_per_pod']:.2f} us/pod; steps "
        f"{', '.join(f'{s:.2f}' for s in v['steps_us_per_pod'])} us/pod; "
        f"{'linear' if v['linear'] else 'NOT linear'}"
        for k, v in out.items()
        if k.endswith("_fit")
    )
    big = max(results, key=lambda r: r["pods"])
    out["bursts"] = bursts(big["pass_s"])
    burst_text = table(
        f"Passes for one job's burst of pod events (each pass {big['pass_s'] * 1000:.1f} ms, "
        f"the {big['pods']}-pod pass)",
        ["events", "over s", "passes", "bound (quiet)", "one per window"],
        [
            [b["events"], b["spread_s"], b["passes"], b["bound"], b["window_bound"]]
            for b in out["bursts"]
        ],
    )
    print(fits + burst_text, flush=True)
    out["table"] = text + "\n" + fits + burst_text
    save("pass_cpu", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--quick", action="store_true", help="sizes 256,1024, 3 repeats")
    args = p.parse_args(argv)
    sizes = [256, 1024] if args.quick else [int(s) for s in args.sizes.split(",")]
    run(sizes, 3 if args.quick else args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
