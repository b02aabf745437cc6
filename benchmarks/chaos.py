"""Randomized crash harness: SIGKILL the operator at random points, inject GKE faults, and check
that no input, fault or crash leaves TPU capacity held, duplicated or leaked (issue 14).

One `cluster`-profile control plane (real apiserver, JobSet controller and webhooks, scheduler,
kwok nodes), the GKE simulator and the operator as a real process. Each trial runs 1-3 jobs in a
fresh namespace, drawn from SCENARIOS (healthy jobs, GKE stockouts, quota, 429/5xx, a template
the apiserver refuses, pods that cannot be scheduled, NotReady blips and longer NotReady spells,
spot preemption, also of a job with a hot spare and of an elastic job whose replacement is
stocked out, a hand-written terminal status, suspend/resume,
delete mid-flight, two jobs whose pool names collide), while a killer thread SIGKILLs the
operator every few seconds or restarts it with a crash point armed (multislice_local.crashpoints:
right after a pool create or delete, a JobSet create or delete, a dry run). GKE faults go through
the simulator's admin API (`POST /_sim/faults`, `POST /_sim/pools/NAME/preempt`).

Invariants, checked every half second and at the end of every trial:

* no duplicate pool: never two live pools for one (job uid, slice);
* no capacity held: a job Succeeded or Failed for RELEASE_BOUND_S holds no pool, and a
  job the apiserver refused never had one;
* no partial gang held: a job never holds some but not all of its pools, without its JobSet,
  for longer than its gang timeout plus the longest backoff and a margin;
* every job terminal or progressing: each reaches the outcome its scenario allows by the trial's
  deadline (a healthy job disturbed only by blips or crashes is never restarted);
* no leak and every finalizer removed: once the trial deletes its jobs they are gone within
  DELETE_BOUND_S and no pool of theirs is left.

    .venv/bin/python -m benchmarks.chaos --trials 30 --seed 7     # ~1-2 min per trial on 2 cores

Writes benchmarks/results/chaos-<time>.json and prints trials, kills, faults and violations;
exits 1 when any invariant was violated.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import signal
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from benchmarks.common import pool_label
from multislice_local.crashpoints import CRASH_POINT_ENV, POINTS
from multislice_local.harness import wait_for
from multislice_local.nodes import RUN_DURATION_ANNOTATION, set_not_ready
from multislice_local.stack import LocalStack, StackOptions
from multislice_operator.api import models
from multislice_operator.planning.plan import node_pool_name

RESULTS = Path(__file__).resolve().parent / "results"
GROUP, VERSION, PLURAL = models.GROUP, models.VERSION, models.PLURAL
GRACE_S = 8  # the operator's --node-not-ready-grace-seconds here
GANG_TIMEOUT_S = 60
BACKOFF_MAX_S = 20
RELEASE_BOUND_S = 60.0  # a finished job's pools are gone this long after it finished
DELETE_BOUND_S = 150.0  # a deleted job is gone (finalizer removed) this long after the delete
TRIAL_S = 240.0  # every job of a trial reaches its outcome within this
TERMINAL = ("Succeeded", "Failed")
ARMED_S = 20.0  # an operator with a crash point armed is left alone this long to reach it


# ---------------------------------------------------------------- jobs and scenarios


def job_body(name: str, run: str = "3s", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": name},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "provisioning": {"timeoutSeconds": GANG_TIMEOUT_S},
            "failurePolicy": {"maxRestarts": 20, "unschedulableTimeoutSeconds": 10},
            "template": {
                "metadata": {"annotations": {RUN_DURATION_ANNOTATION: run}},
                "spec": {"containers": [{"name": "train", "image": "example.invalid/t:1"}]},
            },
        },
    }
    body["spec"].update(spec)
    return body


@dataclass
class Case:
    """One job of a trial: what to create, what to do to it, and which outcomes are allowed."""

    name: str
    kind: str
    body: dict[str, Any]
    outcomes: tuple[str, ...] = ("Succeeded",)  # final phases allowed ("Deleted": we delete it)
    reason: str | None = None  # the Failed reason required
    no_restart: bool = False  # a healthy job that must never be restarted
    never_pooled: bool = False  # refused before any pool: none may ever exist
    after_running: Callable[[Trial, Case], None] | None = None
    delete_after_s: float | None = None  # deleted this long after its creation
    uid: str = ""
    created: float = 0.0
    deleted: bool = False
    done: bool = False


def _fault(trial: Trial, **faults: Any) -> None:
    trial.h.sim_post("/_sim/faults", faults)
    trial.h.counts["faults"] += 1


def scenario(kind: str, name: str, trial: Trial) -> list[Case]:
    h = trial.h
    if kind == "ok":
        return [Case(name, kind, job_body(name))]
    if kind == "stockout":
        _fault(trial, stockoutNext=1)
        return [Case(name, kind, job_body(name))]
    if kind == "quota":
        _fault(trial, quotaNext=1)
        return [Case(name, kind, job_body(name))]
    if kind == "flaky":
        _fault(trial, http429Next=trial.rng.randint(1, 4), http5xxNext=trial.rng.randint(1, 3))
        return [Case(name, kind, job_body(name))]
    if kind == "refused":
        body = job_body(name)
        body["spec"]["template"]["metadata"]["labels"] = {"bad key!": "x"}
        return [Case(name, kind, body, ("Failed",), "JobSetRefused", never_pooled=True)]
    if kind == "unschedulable":
        body = job_body(name, run="1h")
        body["spec"]["template"]["spec"]["nodeSelector"] = {"disktype": "ssd"}
        return [Case(name, kind, body, ("Failed",), "Unschedulable")]
    if kind == "blip":

        def blip(t: Trial, c: Case) -> None:
            pool = node_pool_name(t.ns, c.name, 1)
            set_not_ready(h.api, pool)
            time.sleep(t.rng.uniform(0.5, GRACE_S / 2))
            set_not_ready(h.api, pool, False)

        return [Case(name, kind, job_body(name, run="20s"), no_restart=True, after_running=blip)]
    if kind == "notready":

        def spell(t: Trial, c: Case) -> None:
            pool = node_pool_name(t.ns, c.name, 1)
            set_not_ready(h.api, pool)
            time.sleep(GRACE_S + 6)
            with contextlib.suppress(ApiException):  # replaced by then: its nodes are new ones
                set_not_ready(h.api, pool, False)

        return [Case(name, kind, job_body(name, run="25s"), after_running=spell)]
    if kind == "preempt":

        def preempt(t: Trial, c: Case) -> None:
            pool = node_pool_name(t.ns, c.name, t.rng.randint(0, 1))
            h.sim_post(f"/_sim/pools/{pool}/preempt", {"recreateAfterS": None})
            h.counts["faults"] += 1

        return [Case(name, kind, job_body(name, run="20s"), after_running=preempt)]
    if kind == "spare":
        # One hot spare: any of the 3 pools preempted (a busy one: its slice restarts on the
        # spare at once; the spare: it is replaced while the job runs on).
        def preempt_any(t: Trial, c: Case) -> None:
            pool = node_pool_name(t.ns, c.name, t.rng.randint(0, 2))
            h.sim_post(f"/_sim/pools/{pool}/preempt", {"recreateAfterS": None})
            h.counts["faults"] += 1

        body = job_body(name, run="20s", spares=1)
        return [Case(name, kind, body, after_running=preempt_any)]
    if kind == "elastic":
        # spec.elastic on 3 slices (minSlices 2): any pool preempted while the next creates of
        # its replacement are stocked out: the job shrinks to 2 at once, and may grow back.
        def preempt_stocked_out(t: Trial, c: Case) -> None:
            _fault(t, stockoutNext=t.rng.randint(1, 4))
            pool = node_pool_name(t.ns, c.name, t.rng.randint(0, 2))
            h.sim_post(f"/_sim/pools/{pool}/preempt", {"recreateAfterS": None})
            h.counts["faults"] += 1

        elastic = {"minSlices": 2, "waitSeconds": 3}
        body = job_body(name, run="20s", slices=3, elastic=elastic)
        return [Case(name, kind, body, after_running=preempt_stocked_out)]
    if kind == "statuslie":

        def lie(t: Trial, c: Case) -> None:
            h.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                t.ns,
                PLURAL,
                c.name,
                {"status": {"phase": "Succeeded", "message": "by hand"}},
            )

        return [Case(name, kind, job_body(name, run="20s"), no_restart=True, after_running=lie)]
    if kind == "suspend":

        def suspend(t: Trial, c: Case) -> None:
            h.custom.patch_namespaced_custom_object(
                GROUP, VERSION, t.ns, PLURAL, c.name, {"spec": {"suspend": True}}
            )
            time.sleep(t.rng.uniform(2, 8))
            h.custom.patch_namespaced_custom_object(
                GROUP, VERSION, t.ns, PLURAL, c.name, {"spec": {"suspend": False}}
            )

        return [Case(name, kind, job_body(name, run="15s"), after_running=suspend)]
    if kind == "delete":
        delay = trial.rng.uniform(1, 20)
        return [Case(name, kind, job_body(name, run="1h"), ("Deleted",), delete_after_s=delay)]
    if kind == "collide":
        first, second = colliding_names(trial.ns, name)
        older = Case(first, kind, job_body(first, run="20s"), no_restart=True)

        def rival(t: Trial, c: Case) -> None:
            t.add(Case(second, kind, job_body(second), ("Failed",), "PoolNameTaken"))

        older.after_running = rival
        return [older]
    raise ValueError(kind)


SCENARIOS = (
    "ok",
    "stockout",
    "quota",
    "flaky",
    "refused",
    "unschedulable",
    "blip",
    "notready",
    "preempt",
    "spare",
    "elastic",
    "statuslie",
    "suspend",
    "delete",
    "collide",
)


def colliding_names(ns: str, prefix: str) -> tuple[str, str]:
    """Two job names of `ns` whose node pools get the same names (a birthday search)."""
    stem = f"{prefix}-collide-abcdefghijklmnop"[:27]
    seen: dict[str, str] = {}
    for i in range(1, 1_000_000):
        name = f"{stem}-{i}"
        key = hashlib.sha256(f"{ns}/{name}".encode()).hexdigest()[:6]
        if key in seen and node_pool_name(ns, seen[key], 0) == node_pool_name(ns, name, 0):
            return seen[key], name
        seen[key] = name
    raise AssertionError("no collision")


# ---------------------------------------------------------------- the harness


@dataclass
class Violation:
    trial: int
    invariant: str
    detail: str


class Harness:
    def __init__(self, stack: LocalStack, rng: random.Random, kill: tuple[float, float]) -> None:
        self.stack, self.rng, self.kill = stack, rng, kill
        self.api = stack.api
        self.custom = client.CustomObjectsApi(stack.api)
        self.counts: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._armed_at = 0.0

    # -- the simulator's admin API (over HTTP, as any client would)
    def sim_post(self, path: str, body: dict[str, Any]) -> Any:
        assert self.stack.sim is not None
        request = urllib.request.Request(
            self.stack.sim.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}")

    def sim_clear(self) -> None:
        assert self.stack.sim is not None
        request = urllib.request.Request(self.stack.sim.url + "/_sim/faults", method="DELETE")
        with urllib.request.urlopen(request, timeout=10):
            pass

    def pools(self) -> dict[str, dict[str, Any]]:
        assert self.stack.sim is not None
        return self.stack.sim.pools()

    # -- the operator: killed at random, restarted, sometimes with a crash point armed
    def ensure_operator(self, point: str | None = None) -> None:
        with self._lock:
            op = self.stack.op
            if op is not None and op.proc is not None and op.proc.poll() is None:
                return
            self.stack.op = None
            env = {CRASH_POINT_ENV: point} if point else {}
            self.stack.start_operator(extra_env=env)

    def sigkill(self) -> None:
        with self._lock:
            op = self.stack.op
            if op is None or op.proc is None or op.proc.poll() is not None:
                return
            os.killpg(op.proc.pid, signal.SIGKILL)
            op.proc.wait(10)
            self.counts["sigkill"] += 1

    def killer(self) -> None:
        while not self._stop.wait(self.rng.uniform(*self.kill)):
            try:
                op = self.stack.op
                if op is not None and op.proc is not None and op.proc.poll() is not None:
                    self.counts[f"crash point exit ({op.proc.returncode})"] += 1
                    self.ensure_operator()
                    continue
                armed = op is not None and CRASH_POINT_ENV in op.env
                if armed and time.monotonic() - self._armed_at < ARMED_S:
                    continue  # let this life reach its crash point
                self.sigkill()
                time.sleep(self.rng.uniform(0, 1.5))
                if self.rng.random() < 0.3:  # the next life dies right after a chosen side effect
                    point = self.rng.choice(POINTS)
                    self.counts[f"armed {point}"] += 1
                    self.ensure_operator(point)
                    self._armed_at = time.monotonic()
                else:
                    self.ensure_operator()
            except Exception as exc:  # keep killing; the trial's checks will tell
                self.counts["killer errors"] += 1
                print(f"  killer: {exc}", flush=True)

    def start_killer(self) -> threading.Thread:
        self._stop.clear()
        thread = threading.Thread(target=self.killer, daemon=True)
        thread.start()
        return thread

    def stop_killer(self, thread: threading.Thread) -> None:
        self._stop.set()
        thread.join(30)
        op = self.stack.op
        if op is not None and op.proc is not None and op.proc.poll() is None:
            armed = CRASH_POINT_ENV in op.env
            if armed:  # finish the trial with a plain operator
                self.sigkill()
        self.ensure_operator()


class Trial:
    def __init__(self, h: Harness, index: int, seed: int) -> None:
        self.h, self.index = h, index
        self.rng = random.Random(seed)
        self.ns = f"chaos-{seed % 100000}-{index}"
        self.cases: list[Case] = []
        self.seen_pools: dict[str, set[str]] = {}  # job name -> pool names ever seen
        self.terminal_since: dict[str, float] = {}
        self.partial_since: dict[str, float] = {}

    def violate(self, invariant: str, detail: str) -> None:
        if any(v.trial == self.index and v.invariant == invariant for v in self.h.violations):
            return
        print(f"  VIOLATION {invariant}: {detail}", flush=True)
        self.h.violations.append(Violation(self.index, invariant, detail))

    def add(self, case: Case) -> None:
        created = self.h.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, case.body
        )
        case.uid = created["metadata"]["uid"]
        case.created = time.monotonic()
        self.cases.append(case)

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.h.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.ns, PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def ended(self, name: str, job: dict[str, Any] | None) -> str | None:
        """The job's terminal phase when the world agrees (its JobSet terminal or gone), as the
        operator itself must judge it: a terminal status next to a running JobSet is no end."""
        phase = ((job or {}).get("status") or {}).get("phase")
        if phase not in TERMINAL:
            return None
        js = self.jobset(name)
        if js is None or (js.get("status") or {}).get("terminalState"):
            return str(phase)
        conds = (js.get("status") or {}).get("conditions") or []
        done = any(
            c.get("type") in ("Completed", "Failed") and c.get("status") == "True" for c in conds
        )
        return str(phase) if done else None

    def jobset(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.h.custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", self.ns, "jobsets", name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    # -- invariants over the cloud, every half second
    def pools_of(self, pools: dict[str, dict[str, Any]], case: Case) -> dict[str, dict[str, Any]]:
        mine = {}
        for name, pool in pools.items():
            uid = pool_label(pool, "job-uid")
            if uid == case.uid or (
                not uid and name.startswith(node_pool_name(self.ns, case.name, 0)[:-2])
            ):
                mine[name] = pool
        return mine

    def check(self) -> None:
        pools = self.h.pools()
        by_owner: Counter[tuple[str, str]] = Counter()
        for pool in pools.values():
            uid, sl = pool_label(pool, "job-uid"), pool_label(pool, "slice")
            if uid and pool.get("status") != "STOPPING":
                by_owner[(uid, sl)] += 1
        for (uid, sl), n in by_owner.items():
            if n > 1:
                self.violate("duplicate pool", f"{n} live pools for job uid {uid} slice {sl}")
        now = time.monotonic()
        for case in self.cases:
            mine = self.pools_of(pools, case)
            self.seen_pools.setdefault(case.name, set()).update(mine)
            if case.never_pooled and mine:
                self.violate(
                    "capacity held", f"{case.name} was refused but got pools {sorted(mine)}"
                )
            job = self.get(case.name)
            phase = self.ended(case.name, job)
            if phase is not None:
                since = self.terminal_since.setdefault(case.name, now)
                if mine and now - since > RELEASE_BOUND_S:
                    self.violate(
                        "capacity held",
                        f"{case.name} {phase} for {now - since:.0f}s holds {sorted(mine)}",
                    )
            else:
                self.terminal_since.pop(case.name, None)
            live = [p for p in mine.values() if p.get("status") != "STOPPING"]
            gang = case.body["spec"]["slices"] + case.body["spec"].get("spares", 0)
            partial = job is not None and 0 < len(live) < gang and self.jobset(case.name) is None
            if partial and phase not in TERMINAL:
                since = self.partial_since.setdefault(case.name, now)
                if now - since > GANG_TIMEOUT_S + BACKOFF_MAX_S + 60:
                    self.violate(
                        "partial gang", f"{case.name} holds {sorted(mine)} for {now - since:.0f}s"
                    )
            else:
                self.partial_since.pop(case.name, None)

    # -- one trial
    def run(self, kinds: list[str]) -> None:
        h = self.h
        client.CoreV1Api(h.api).create_namespace({"metadata": {"name": self.ns}})  # type: ignore[arg-type]
        for i, kind in enumerate(kinds):
            for case in scenario(kind, f"{kind[:6]}{i}", self):
                self.add(case)
        killer = h.start_killer()
        deadline = time.monotonic() + TRIAL_S
        started: set[str] = set()
        try:
            while time.monotonic() < deadline:
                self.check()
                for case in list(self.cases):
                    self._step(case, started)
                if all(c.done for c in self.cases):
                    break
                time.sleep(0.5)
        finally:
            h.stop_killer(killer)
        for case in self.cases:
            if not case.done:
                st = (self.get(case.name) or {}).get("status") or {}
                self.violate(
                    "not terminal",
                    f"{case.name} ({case.kind}) is {st.get('phase')} after {TRIAL_S:.0f}s: "
                    f"{st.get('message')}",
                )
        self._cleanup()

    def _step(self, case: Case, started: set[str]) -> None:
        if case.done:
            return
        if case.delete_after_s is not None and not case.deleted:
            if time.monotonic() - case.created >= case.delete_after_s:
                self.h.custom.delete_namespaced_custom_object(
                    GROUP, VERSION, self.ns, PLURAL, case.name
                )
                case.deleted = True
            return
        job = self.get(case.name)
        if job is None:
            case.done = case.deleted or "Deleted" in case.outcomes
            if not case.done:
                self.violate("vanished", f"{case.name} disappeared")
                case.done = True
            return
        st = job.get("status") or {}
        if st.get("phase") == "Running" and case.name not in started and case.after_running:
            started.add(case.name)
            threading.Thread(target=case.after_running, args=(self, case), daemon=True).start()
        phase = self.ended(case.name, job)
        if phase is None or case.deleted:
            return
        case.done = True
        if phase not in case.outcomes:
            self.violate("outcome", f"{case.name} ({case.kind}) {phase}: {st.get('message')}")
            case.done = True
            return
        reasons = {c.get("reason") for c in st.get("conditions") or []}
        if case.reason and case.reason not in reasons:
            self.violate(
                "outcome", f"{case.name} Failed without {case.reason}: {st.get('message')}"
            )
        if case.no_restart and int(st.get("restarts") or 0) > 0:
            self.violate(
                "healthy job restarted", f"{case.name} ({case.kind}) restarts={st['restarts']}"
            )

    def _cleanup(self) -> None:
        h = self.h
        for case in self.cases:
            if self.get(case.name) is not None:
                try:
                    h.custom.delete_namespaced_custom_object(
                        GROUP, VERSION, self.ns, PLURAL, case.name
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        raise
        end = time.monotonic() + DELETE_BOUND_S
        while time.monotonic() < end and any(self.get(c.name) for c in self.cases):
            self.check()
            time.sleep(0.5)
        for case in self.cases:
            job = self.get(case.name)
            if job is not None:
                self.violate(
                    "finalizer not removed",
                    f"{case.name} still there {DELETE_BOUND_S:.0f}s after delete: "
                    f"{(job.get('status') or {}).get('message')}",
                )
        end = time.monotonic() + 30
        while time.monotonic() < end:
            left = {n for c in self.cases for n in self.pools_of(h.pools(), c)}
            if not left:
                break
            time.sleep(0.5)
        else:
            self.violate("leaked pool", f"{sorted(left)} left after every job of the trial is gone")
        h.sim_clear()
        client.CoreV1Api(h.api).delete_namespace(self.ns)


def _served(h: Harness) -> bool:
    try:
        h.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
    except ApiException:
        return False
    return True


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--kill-min", type=float, default=2.0, help="seconds between kills, min")
    parser.add_argument("--kill-max", type=float, default=10.0, help="seconds between kills, max")
    parser.add_argument("--only", default="", help="comma list of scenarios (default: all)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.only.split(",") if k] or list(SCENARIOS)
    rng = random.Random(args.seed)
    log = Path(tempfile.mkstemp(prefix="msj-chaos-operator-", suffix=".log")[1])
    options = StackOptions(
        resync_seconds=1.0,
        backoff_base_seconds=1.0,
        gc_interval_seconds=5.0,
        op_latency_s=1.0,
        operator_log=log,
        operator_env={
            "MSJ_NODE_NOT_READY_GRACE_SECONDS": str(GRACE_S),
            "MSJ_BACKOFF_MAX_SECONDS": str(BACKOFF_MAX_S),
        },
    )
    started = time.monotonic()
    drawn: Counter[str] = Counter()
    with LocalStack(options) as stack:
        h = Harness(stack, rng, (args.kill_min, args.kill_max))
        wait_for(lambda: _served(h), 60, "MultisliceJobs served by the apiserver")
        for index in range(args.trials):
            picked = rng.sample(kinds, k=rng.randint(1, min(3, len(kinds))))
            drawn.update(picked)
            t0 = time.monotonic()
            print(f"trial {index + 1}/{args.trials}: {', '.join(picked)}", flush=True)
            Trial(h, index, rng.randrange(1 << 30)).run(picked)
            print(
                f"  done in {time.monotonic() - t0:.0f}s; kills so far {h.counts['sigkill']}",
                flush=True,
            )
    text = log.read_text(errors="replace")
    result = {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": args.seed,
        "trials": args.trials,
        "wall_s": round(time.monotonic() - started),
        "scenarios": dict(drawn),
        "counts": dict(h.counts),
        "operator_tracebacks": text.count("Traceback"),
        "violations": [v.__dict__ for v in h.violations],
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"chaos-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "violations"}, indent=2))
    print(f"{len(h.violations)} violations; operator log {log}; results {out}")
    for v in h.violations:
        print(f"  trial {v.trial}: {v.invariant}: {v.detail}")
    return 1 if h.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
