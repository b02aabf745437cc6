"""Benchmark: the operator's memory and threads through a full Managed lifecycle load (issue 45).

One `cluster`-profile control plane (real apiserver, scheduler, controller-manager with its
garbage collector, kwok nodes, the JobSet controller), the local GKE simulator and the operator
as a real process (the local stack, as `make demo` runs it). N Managed jobs of 2 x v5litepod-8
(two node pools of two hosts each per job: 2N pools, 4N nodes, 4N pods, real JobSets) are
created at once; the simulator provisions their pools, kwok runs their pods for --run seconds,
the JobSets complete, the jobs Succeed and release their pools; then the jobs are deleted and
the benchmark waits until every job, JobSet, pool and node is gone.

Measured on the operator process (VmRSS of it and its descendants, its thread count):

* idle: after a warm-up of a few jobs that went through the same lifecycle (what the first jobs
  cost once: lazily imported code, the clients' connection pools) and an idle window;
* peak: sampled every second through the load (and the process's own VmHWM);
* after: --after seconds after the last job, pool and node were gone.

What the load left behind is after - idle, in MiB and threads.

The operator runs with the image's allocator (jemalloc, every Python object in it: the
Dockerfile's ENV, multislice_local/allocator.py, as the local stack always runs it; here it must
be found or the benchmark stops) unless `--allocator glibc` (started on the interpreter's
defaults, as a pip-installed operator is: it starts itself again with every Python object in
glibc's malloc on one arena, controller/memory.py) or `--allocator pymalloc` (the interpreter's
defaults kept: MULTISLICE_MEMORY=as-started, the baseline of that change); `--env K=V` adds to
the operator's environment.

`--trace FRAMES` names what the load left alive: the operator runs with tracemalloc
(PYTHONTRACEMALLOC=FRAMES and `benchmarks/memtrace/sitecustomize.py`, which writes a snapshot on
SIGUSR1); a snapshot at idle and one after are compared, and the allocation sites that grew most
are printed and saved. Tracing slows every allocation and holds its traces in the process: a
traced run's RSS and times are not the untraced figures (50 jobs, not 200).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kubernetes import client

from benchmarks.common import (
    JOBSET,
    MSJ,
    WORKERS,
    create_namespace,
    job_body,
    parallel,
    rss_mib,
    save,
    say,
    table,
    threads_of,
)
from benchmarks.memtrace.sitecustomize import DIR_ENV  # installs nothing here: no DIR_ENV set
from benchmarks.watcher import Spec, Watcher
from multislice_local import allocator
from multislice_local.nodes import RUN_DURATION_ANNOTATION
from multislice_local.stack import LocalStack, StackOptions
from multislice_operator.common import keys
from multislice_operator.controller import memory

NAMESPACE = "lifecycle"
ACCELERATOR, SLICES = "v5litepod-8", 2
MEMTRACE = Path(__file__).resolve().parent / "memtrace"  # its sitecustomize.py
TRACE_TOP = 25  # allocation sites listed
STDLIB = re.compile(r"^.*/lib/python3\.\d+/")


class Sampler:
    """The operator's RSS and threads every `interval` seconds, in a thread: the peaks."""

    def __init__(self, pid: int, interval: float = 1.0) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_rss = 0.0
        self.peak_threads = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak_rss = max(self.peak_rss, rss_mib(self.pid))
                self.peak_threads = max(self.peak_threads, threads_of(self.pid))
            except OSError:
                return
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def managed_job(name: str, run: str) -> dict[str, Any]:
    template = {
        "metadata": {"annotations": {RUN_DURATION_ANNOTATION: run}},
        "spec": {"containers": [{"name": "train", "image": "example.invalid/t:1"}]},
    }
    return job_body(name, ACCELERATOR, SLICES, "Managed", template)


def load(stack: LocalStack, jobs: list[str], run: str, timeout: float) -> None:
    """`jobs` created, Succeeded, deleted; returns when they, their JobSets, pools and nodes are
    gone."""
    api = stack.api
    custom = client.CustomObjectsApi(api)
    assert stack.cp is not None and stack.sim is not None
    with Watcher(stack.cp.kubeconfig) as w:
        w.add("succeeded", Spec(MSJ, NAMESPACE, "phase", ["Succeeded"]))
        w.add("gone", Spec(MSJ, NAMESPACE, "deleted"))
        w.add("js_gone", Spec(JOBSET, NAMESPACE, "deleted"))
        parallel(
            lambda name: custom.create_namespaced_custom_object(
                *MSJ[:2], NAMESPACE, MSJ[2], managed_job(name, run)
            ),
            jobs,
            WORKERS,
        )
        w.wait("succeeded", jobs, timeout=timeout)
        parallel(
            lambda name: custom.delete_namespaced_custom_object(*MSJ[:2], NAMESPACE, MSJ[2], name),
            jobs,
        )
        w.wait("gone", jobs, timeout=timeout)
        w.wait("js_gone", jobs, timeout=timeout)
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    while stack.sim.pools() or core.list_node(label_selector=keys.GKE_NODEPOOL).items:
        if time.monotonic() > deadline:
            raise TimeoutError("node pools or nodes left after the jobs were deleted")
        time.sleep(1)


def sockets_of(pid: int) -> int:
    """Open sockets of the process (its connections to the apiserver, the simulator, its own
    servers): what a client's connection pool keeps after a burst."""
    fds = Path(f"/proc/{pid}/fd")
    count = 0
    for fd in fds.iterdir():
        try:
            count += fd.readlink().name.startswith("socket:")
        except OSError:  # closed meanwhile
            continue
    return count


def snapshot(pid: int) -> dict[str, float]:
    return {
        "rss_mib": rss_mib(pid),
        "threads": float(threads_of(pid)),
        "sockets": float(sockets_of(pid)),
    }


def run(
    n: int,
    warmup: int = 3,
    idle_s: float = 30.0,
    after_s: float = 120.0,
    run_s: int = 10,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    image_allocator: bool = True,
    trace: int = 0,
) -> dict[str, Any]:
    env = {**(allocator.image_env() if image_allocator else {}), **(env or {})}
    say(f"lifecycle memory: {n} Managed jobs of {SLICES} x {ACCELERATOR}, {allocator_name(env)}")
    log = (log_dir or Path(tempfile.mkdtemp(prefix="bench-"))) / f"operator-lifecycle-{n}.log"
    trace_dir = log.parent / "memtrace" if trace else None
    if trace_dir is not None:
        env = {**env, **trace_env(env, trace, trace_dir)}
    timeout = 600 + n * 6.0  # a shared 2-core machine took more than 900 s for 200 jobs
    options = StackOptions(
        operator_log=log, operator_env=env, operator_image_allocator=image_allocator
    )
    with LocalStack(options) as stack:
        assert stack.op is not None and stack.op.proc is not None
        pid = stack.op.proc.pid
        create_namespace(stack.api, NAMESPACE)
        time.sleep(idle_s)
        cold = snapshot(pid)
        if warmup:
            load(stack, [f"warm-{i:03d}" for i in range(warmup)], f"{run_s}s", timeout)
        time.sleep(idle_s)
        idle = snapshot(pid)
        traced = [take_trace(pid, trace_dir, 0)] if trace_dir is not None else []
        started = time.monotonic()
        with Sampler(pid) as sampler:
            load(stack, [f"job-{i:05d}" for i in range(n)], f"{run_s}s", timeout)
        load_s = time.monotonic() - started
        time.sleep(after_s)
        after = snapshot(pid)
        if trace_dir is not None:
            traced.append(take_trace(pid, trace_dir, 1))
    out = {
        "jobs": n,
        "accelerator": ACCELERATOR,
        "slices": SLICES,
        "warmup_jobs": warmup,
        "load_seconds": load_s,
        "after_seconds": after_s,
        "cold": cold,
        "idle": idle,
        "peak": {"rss_mib": sampler.peak_rss, "threads": float(sampler.peak_threads)},
        "after": after,
        "rss_delta_mib": after["rss_mib"] - idle["rss_mib"],
        "threads_delta": after["threads"] - idle["threads"],
        "operator_log": str(log),
        "operator_env": env,
        "allocator": allocator_name(env),
    }
    out["table"] = result_table(out)
    if traced:
        kept = retained(traced[0], traced[1])
        out["trace_frames"], out["retained"] = trace, kept
        retained_table(kept, trace)
    save("lifecycle_memory" if not traced else "lifecycle_memory_trace", out)
    return out


def trace_env(env: dict[str, str], frames: int, trace_dir: Path) -> dict[str, str]:
    """The operator's environment for tracing: memtrace's sitecustomize first on its path."""
    trace_dir.mkdir(parents=True, exist_ok=True)
    path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(MEMTRACE), path) if p),
        "PYTHONTRACEMALLOC": str(frames),
        DIR_ENV: str(trace_dir),
    }


def take_trace(pid: int, trace_dir: Path, number: int, timeout: float = 300) -> Path:
    """The operator's `number`-th snapshot (0 first): asked for by SIGUSR1, written whole."""
    target = trace_dir / f"{pid}-{number}.snapshot"
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not target.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no tracemalloc snapshot {target} (is the operator tracing?)")
        time.sleep(0.5)
    return target


def retained(before: Path, after: Path, top: int = TRACE_TOP) -> dict[str, Any]:
    """What grew from one snapshot to the next, by allocation site (the whole traceback)."""
    # The snapshot's own making (sitecustomize's signal handler) is not the load's.
    ignore = [tracemalloc.Filter(False, f, all_frames=True)
              for f in (tracemalloc.__file__, str(MEMTRACE / "*"))]  # fmt: skip
    old = tracemalloc.Snapshot.load(str(before)).filter_traces(ignore)
    new = tracemalloc.Snapshot.load(str(after)).filter_traces(ignore)
    stats = new.compare_to(old, "traceback")
    grew = sorted((s for s in stats if s.size_diff > 0), key=lambda s: -s.size_diff)
    return {
        "net_kib": sum(s.size_diff for s in stats) / 1024,
        "grew_kib": sum(s.size_diff for s in grew) / 1024,
        "sites": [
            {
                "kib": s.size_diff / 1024,
                "blocks": s.count_diff,
                "where": [f"{_short(fr.filename)}:{fr.lineno}" for fr in reversed(s.traceback)],
            }
            for s in grew[:top]
        ],
    }


def _short(filename: str) -> str:
    """A site's file, from its package (or the standard library's top) down."""
    for marker in ("site-packages/", "/operator/", "/local/", "/benchmarks/"):
        if marker in filename:
            return filename.rsplit(marker, 1)[1]
    return STDLIB.sub("", filename)


def retained_table(r: dict[str, Any], frames: int) -> str:
    return table(
        f"What the load left alive (tracemalloc, {frames} frames; idle -> after): net "
        f"{r['net_kib']:.0f} KiB, {r['grew_kib']:.0f} KiB at the sites that grew",
        ["KiB", "blocks", "where (innermost first)"],
        [[f"{x['kib']:.1f}", x["blocks"], " < ".join(x["where"])] for x in r["sites"]],
    )


def result_table(r: dict[str, Any]) -> str:
    return table(
        f"Operator RSS and threads through {r['jobs']} Managed jobs of {r['slices']} x "
        f"{r['accelerator']} ({r.get('allocator', 'glibc')}; real JobSets, GKE simulator; "
        f"idle: after {r['warmup_jobs']} "
        f"warm-up jobs; after: {r['after_seconds']:g}s after the last job was gone)",
        ["", "start", "idle", "peak", "after", "after - idle"],
        [
            ["RSS MiB", r["cold"]["rss_mib"], r["idle"]["rss_mib"], r["peak"]["rss_mib"],
             r["after"]["rss_mib"], r["rss_delta_mib"]],
            ["threads", r["cold"]["threads"], r["idle"]["threads"], r["peak"]["threads"],
             r["after"]["threads"], r["threads_delta"]],
            ["sockets", r["cold"].get("sockets", 0), r["idle"].get("sockets", 0), "-",
             r["after"].get("sockets", 0),
             r["after"].get("sockets", 0) - r["idle"].get("sockets", 0)],
        ],
    )  # fmt: skip


def allocator_name(env: dict[str, str]) -> str:
    if allocator.LIBRARY in env.get("LD_PRELOAD", ""):
        return "jemalloc"
    return "pymalloc" if env.get(memory.CHOICE_ENV) == memory.AS_STARTED else "glibc"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--idle", type=float, default=30.0, help="idle window before the load, s")
    p.add_argument("--after", type=float, default=120.0, help="wait after the load, s")
    p.add_argument("--run", type=int, default=10, help="how long the pods run, s")
    p.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="the operator's environment"
    )
    p.add_argument(
        "--allocator",
        choices=("image", "glibc", "pymalloc"),
        default="image",
        help="image: the operator image's (jemalloc; the Dockerfile's ENV); glibc: started on "
        "the interpreter's defaults (the operator moves to glibc's malloc); pymalloc: kept on them",
    )
    p.add_argument(
        "--trace",
        type=int,
        default=0,
        metavar="FRAMES",
        help="run the operator under tracemalloc with FRAMES frames and list what the load left "
        "alive (slower; its RSS is not the untraced figure)",
    )
    args = p.parse_args(argv)
    env = dict(kv.split("=", 1) for kv in args.env)
    if args.allocator == "pymalloc":
        env[memory.CHOICE_ENV] = memory.AS_STARTED
    image = args.allocator == "image"
    run(args.jobs, args.warmup, args.idle, args.after, args.run, env=env, image_allocator=image,
        trace=args.trace)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
