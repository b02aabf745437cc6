"""Recovery after one slice of a running job is lost while its replacement is not to be had.

One `cluster`-profile control plane (real apiserver, scheduler, controller-manager, JobSet
controller, kwok nodes), the GKE simulator and the operator as a real process. Up to five
variants run side by side, each in a namespace of its own, on the same control plane at the same
time. a, b and c: the same Managed job (v5litepod-16, 4 slices of 4 hosts, Spot, pods that run
for an hour):

* a: today's behaviour (no spares, not elastic): it waits for the lost slice's replacement;
* b: elastic, spec.elastic {minSlices: 3, waitSeconds: W}: it should restart on 3 slices (its
  JobSet recreated with 3 replicas) while the stockout holds, and grow back once it ends;
* c: one hot spare, spec.spares: 1: it should restart on the spare at once.

d and e: a job on GKE dynamic slicing (spec.provisioning.mode DynamicSlicing, issue 41): tpu7x-128,
2 slices of one 4x4x4 cube each (16 hosts, 64 chips), Reserved on block-1 of an All Capacity
reservation of its own in the simulator (its cubes plus one free sub-block), the simulator's
slice controller forming the `Slice` objects (local/multislice_local/slices.py):

* d: one spare cube, spec.spares: 1: the lost slice's Slice should be re-formed on the spare
  cube at once and every slice restarted;
* e: no spare: it waits for the failed cube's repair.

Once every variant trains (all pods of its JobSet's attempt Running, on as many node pools as the
JobSet has replicas, a pool's hosts each; d and e: on nodes of the job's ACTIVE Slices), every
node pool create ends in GCE_STOCKOUT (the simulator's stockoutNext, held) and each variant loses
a slice at t0: a, b, c: one busy pool is preempted (its nodes go and do not come back:
`recreateAfterS: None`); d, e: one busy cube's partition state goes UNHEALTHY (as the e2e test
and the demo's ironwood scenario fail it: its Slice goes FAILED, its nodes stay). After
--stockout-s the stockout is lifted and the failed cubes are repaired (HEALTHY again): for e
that is when the replacement capacity returns. d makes its spare again meanwhile (the failed
cube's pool deleted and created for a free sub-block of its reservation): that create is stocked
out like the others until the lift.

Measured per variant, from the loss (t0):

* resume s: until it trains again: every pod of the current attempt created after t0 and
  Running, on a consistent set of slices (3 for b, spec.slices for the others; d, e: on nodes
  of ACTIVE Slices only);
* after lift s: the same, counted from the end of the stockout (for a: how long it waits for
  capacity after it returns; for e: after the cube's repair; negative: it resumed before);
* full s: until it trains on spec.slices again with every pool it holds up (b: grown back to 4;
  c: its spare replaced and up again; d: spec.spares healthy free cubes again, the repaired
  cube or a new one; a, e: as resume); a pool on an unhealthy cube is not up;
* idle chip-s, observed: chips of the job's pools whose nodes are all Ready (and whose cube is
  healthy) but that train nothing (every up pool before it resumes, an unused one after),
  integrated from the nodes and pods seen every --interval seconds over t0..resume and over t0..
  the end of the run; and the chips idle while it trains healthily, before t0;
* idle chip-s, status: the same windows in the operator's own accounting, status.goodput: the
  chip-seconds of every state but `running` plus the spare chip-seconds (spareChipSeconds); the
  JSON also has its running and degraded (spec.elastic: running on fewer slices) parts;
* the operator's status.lastRestart of the restart that resumed it (recoverySeconds, lostSteps)
  and status.goodput.lostSteps: the simulated workload reports no steps, so lostSteps stays
  unset (shown as "-").

Before it grows back, an elastic job asks the workload for a checkpoint on demand
(multislice.dev/checkpoint-request on its pods) and waits for it (or for the operator's own
limit): the bench plays the workload and acknowledges it on process 0's pod
(multislice.dev/checkpoint-saved) --checkpoint-save-s after it is asked; --no-checkpoint-ack
does not.

    .venv/bin/python -m benchmarks.recovery [--stockout-s 60] [--only a,b,c,d,e] [--wait-s 5]

Writes benchmarks/results/recovery.json. About 2.5 minutes on 2 cores with the defaults. The
operator runs with --resync-seconds 1 and gang backoff from 1 s doubling up to 10 s (production
defaults: 30 s up to 600 s), GKE operations take 1 s (a stocked-out create 3 s), a Slice takes
1 s to activate.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from benchmarks.common import JOBSET, MSJ, pool_label, save, say, table
from multislice_local import slices as gke_slices
from multislice_local.harness import wait_for
from multislice_local.nodes import RUN_DURATION_ANNOTATION
from multislice_local.stack import LocalStack, StackOptions
from multislice_operator.api import models
from multislice_operator.common import keys

NAME = "train"
POOL_LABEL = "cloud.google.com/gke-nodepool"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
BACKOFF_MAX_S = 10
STATES = [s.value for s in models.GoodputState]
BLOCK = "block-1"
FREE_SUB_BLOCKS = 1  # sub-blocks of a dynamic variant's reservation beyond its cubes
WAITS = {False: "a", True: "e"}  # the variant that waits, per capacity (cubes or not)


@dataclass(frozen=True)
class Shape:
    accelerator: str
    slices: int
    hosts: int  # per slice, and per node pool
    chips: int  # per node pool


MANAGED = Shape("v5litepod-16", 4, 4, 16)
# tpu7x-128: 64 chips, one 4x4x4 cube of 16 VMs per slice.
CUBES = Shape("tpu7x-128", 2, gke_slices.VMS_PER_CUBE, gke_slices.CHIPS_PER_CUBE)


@dataclass(frozen=True)
class Variant:
    key: str
    label: str
    spec: dict[str, Any]
    shape: Shape = MANAGED
    # The lost slice is a failed cube under a dynamic-slicing job, not a preempted node pool.
    cube: bool = False

    @property
    def spares(self) -> int:
        return int(self.spec.get("spares", 0))

    @property
    def reservation(self) -> str:
        return f"recovery-{self.key}"

    @property
    def sub_blocks(self) -> int:
        return self.shape.slices + self.spares + FREE_SUB_BLOCKS


def variants(wait_s: int) -> dict[str, Variant]:
    return {
        "a": Variant("a", "a: wait (today)", {}),
        "b": Variant(
            "b",
            f"b: elastic 4->3 (wait {wait_s}s)",
            {"elastic": {"minSlices": 3, "waitSeconds": wait_s}},
        ),
        "c": Variant("c", "c: 1 hot spare", {"spares": 1}),
        "d": Variant("d", "d: 1 spare cube", {"spares": 1}, CUBES, cube=True),
        "e": Variant("e", "e: cubes, no spare", {}, CUBES, cube=True),
    }


def job_body(v: Variant) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accelerator": v.shape.accelerator,
        "slices": v.shape.slices,
        "capacity": {"type": "Spot"},
        "failurePolicy": {"maxRestarts": 5},
        "template": {
            "metadata": {"annotations": {RUN_DURATION_ANNOTATION: "1h"}},
            "spec": {"containers": [{"name": "train", "image": "example.invalid/t:1"}]},
        },
        **(_dynamic_spec(v) if v.cube else {}),
        **v.spec,
    }
    return {
        "apiVersion": models.API_VERSION,
        "kind": models.KIND,
        "metadata": {"name": NAME},
        "spec": spec,
    }


def _dynamic_spec(v: Variant) -> dict[str, Any]:
    """What the demo's ironwood scenario asks for, on the variant's own reservation."""
    devices = 2 * v.shape.chips  # tpu7x-N counts TensorCores, two per chip
    return {
        "topology": gke_slices.CUBE_TOPOLOGY,
        "parallelism": {"ici": {"fsdp": devices}, "dcn": {"data": v.shape.slices}},
        "capacity": {
            "type": "Reserved",
            "reservation": f"{v.reservation}/reservationBlocks/{BLOCK}",
        },
        "provisioning": {"mode": "DynamicSlicing"},
    }


# ---------------------------------------------------------------- what one look sees


@dataclass(frozen=True)
class World:
    ready: dict[str, int]  # Ready nodes per node pool
    pool_of: dict[str, str]  # node -> its node pool
    pools: dict[str, dict[str, Any]]  # the simulator's node pools
    broken: frozenset[str] = frozenset()  # pools on a cube whose partition is not HEALTHY
    slice_of: dict[str, str] = field(default_factory=dict)  # node -> its GKE Slice (label)
    active: frozenset[str] = frozenset()  # the Slices that are ACTIVE


@dataclass
class Look:
    """One variant at one moment."""

    t: float  # time.monotonic()
    wall: float  # time.time(), the same moment
    phase: str | None
    status: dict[str, Any]
    replicas: int  # of the JobSet (0: none)
    training: bool  # every pod of the attempt Running on `replicas` pools, all hosts each
    fresh: bool  # and every one of them created after the preemption
    busy_pools: frozenset[str]
    up_pools: frozenset[str]  # the job's pools whose nodes are all Ready
    # A checkpoint the operator asked the current attempt's pods for (multislice.dev/
    # checkpoint-request) that none has acknowledged yet, and the pod to acknowledge it on.
    checkpoint_asked: str | None = None
    checkpoint_pod: str | None = None
    jobset: str = "none"  # the JobSet: none, deleting or "N replicas"
    deleting: int = 0  # the job's pods being deleted
    orphans: int = 0  # of them, those bound to a node that no longer exists
    chips: int = MANAGED.chips  # per node pool

    @property
    def idle_chips(self) -> int:
        busy = self.busy_pools if self.training else frozenset()
        return self.chips * len(self.up_pools - busy)


class Observer:
    def __init__(self, stack: LocalStack) -> None:
        self.stack = stack
        self.core: Any = client.CoreV1Api(stack.api)  # typed models out, unchecked
        self.custom: Any = client.CustomObjectsApi(stack.api)

    def get(self, resource: tuple[str, str, str], ns: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                resource[0], resource[1], ns, resource[2], NAME
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def world(self) -> World:
        """The nodes (Ready ones per node pool, each node's pool, its cube's partition state and
        its Slice), the simulator's pools and, with dynamic slicing, the ACTIVE Slices."""
        ready: dict[str, int] = {}
        pool_of: dict[str, str] = {}
        broken: set[str] = set()
        slice_of: dict[str, str] = {}
        for node in self.core.list_node().items:
            labels = node.metadata.labels or {}
            pool = labels.get(POOL_LABEL)
            if not pool:
                continue
            pool_of[node.metadata.name] = pool
            if (
                labels.get(gke_slices.PARTITION_STATE_LABEL, gke_slices.HEALTHY)
                != gke_slices.HEALTHY
            ):
                broken.add(pool)
            if gke_slices.SLICE_LABEL in labels:
                slice_of[node.metadata.name] = labels[gke_slices.SLICE_LABEL]
            conds = (node.status.conditions or []) if node.status else []
            if any(c.type == "Ready" and c.status == "True" for c in conds):
                ready[pool] = ready.get(pool, 0) + 1
        assert self.stack.sim is not None
        return World(
            ready, pool_of, self.stack.sim.pools(), frozenset(broken), slice_of, self._active()
        )

    def _active(self) -> frozenset[str]:
        if not self.stack.options.slice_controller:
            return frozenset()
        found = self.custom.list_cluster_custom_object(
            gke_slices.GROUP, gke_slices.VERSION, gke_slices.PLURAL
        )
        return frozenset(
            o["metadata"]["name"]
            for o in found["items"]
            if gke_slices.state_of(o) == gke_slices.ACTIVE
            and not o["metadata"].get("deletionTimestamp")
        )

    def look(self, v: Variant, ns: str, uid: str, world: World, since: float) -> Look:
        """`since`: wall-clock time (epoch s) the pods of a resumed attempt must be created at
        or after (0: any)."""
        job = self.get(MSJ, ns) or {}
        st = job.get("status") or {}
        js = self.get(JOBSET, ns)
        mine = {n for n, p in world.pools.items() if pool_label(p, "job-uid") == uid}
        up = frozenset(
            n for n in mine if world.ready.get(n, 0) >= v.shape.hosts and n not in world.broken
        )
        replicas, expected, attempt, jobset = _attempt(js)
        pods = self.core.list_namespaced_pod(ns, label_selector=f"{JOBSET_NAME_LABEL}={NAME}")
        live = [
            p
            for p in pods.items
            if p.metadata.deletion_timestamp is None
            and (p.metadata.labels or {}).get(RESTART_ATTEMPT) == attempt
        ]
        running = [p for p in live if p.status.phase == "Running" and p.spec.node_name]
        deleting = [p for p in pods.items if p.metadata.deletion_timestamp is not None]
        orphans = sum(1 for p in deleting if p.spec.node_name not in world.pool_of)
        per_pool = _per_pool(running, world, v.cube)
        training = (
            replicas > 0
            and len(live) == expected
            and len(running) == expected
            and len(per_pool) == replicas
            and "?" not in per_pool
            and all(n == v.shape.hosts for n in per_pool.values())
        )
        fresh = training and all(
            p.metadata.creation_timestamp.timestamp() >= since for p in running
        )
        pending = _checkpoint_pending(live)
        return Look(
            time.monotonic(),
            time.time(),
            st.get("phase"),
            st,
            replicas,
            training,
            fresh,
            frozenset(per_pool) if training else frozenset(),
            up,
            pending,
            _process_zero(running) if pending else None,
            jobset,
            len(deleting),
            orphans,
            v.shape.chips,
        )

    def acknowledge(self, ns: str, pod: str, request: str, step: int) -> None:
        """What the workload's process 0 does once it saved the requested checkpoint."""
        saved = json.dumps({"id": request, "step": step})
        self.core.patch_namespaced_pod(
            pod, ns, {"metadata": {"annotations": {keys.CHECKPOINT_SAVED: saved}}}
        )


def _attempt(js: dict[str, Any] | None) -> tuple[int, int, str, str]:
    """(replicas, pods expected, the restart attempt, how the JobSet reads) of the JobSet."""
    replicas = expected = 0
    attempt = "0"
    jobset = "none" if js is None else "deleting"
    if js is not None and not (js.get("metadata") or {}).get("deletionTimestamp"):
        for rj in js["spec"]["replicatedJobs"]:
            n = int(rj.get("replicas", 1))
            replicas += n
            expected += n * int(rj["template"]["spec"].get("parallelism", 1))
        attempt = str((js.get("status") or {}).get("restarts", 0))
        jobset = f"{replicas} replicas"
    return replicas, expected, attempt, jobset


def _per_pool(running: list[Any], world: World, cube: bool) -> dict[str, int]:
    """Running pods per node pool; a pod on a node that is gone, or (dynamic slicing) on a node
    of no ACTIVE Slice, is counted under "?": a look with one does not train."""
    per_pool: dict[str, int] = {}
    for p in running:
        node = p.spec.node_name
        pool = world.pool_of.get(node, "?")
        if cube and world.slice_of.get(node) not in world.active:
            pool = "?"
        per_pool[pool] = per_pool.get(pool, 0) + 1
    return per_pool


def _checkpoint_pending(live: list[Any]) -> str | None:
    """The latest checkpoint the operator asked the pods for that none has acknowledged."""
    asked = {(p.metadata.annotations or {}).get(keys.CHECKPOINT_REQUEST) for p in live}
    acked = {
        json.loads(saved).get("id")
        for p in live
        if (saved := (p.metadata.annotations or {}).get(keys.CHECKPOINT_SAVED))
    }
    pending = sorted(a for a in asked - acked if a)
    return pending[-1] if pending else None


def _process_zero(pods: list[Any]) -> str | None:
    """The pod of slice 0's host 0 (the workload's process 0), else the first by name."""
    for p in pods:
        labels, notes = p.metadata.labels or {}, p.metadata.annotations or {}
        if labels.get(JOB_INDEX) == "0" and notes.get(COMPLETION_INDEX) == "0":
            return str(p.metadata.name)
    return str(min(p.metadata.name for p in pods)) if pods else None


# ---------------------------------------------------------------- status.goodput, live


def goodput_now(status: dict[str, Any], now: datetime) -> dict[str, int]:
    """status.goodput's chip-seconds per state, `spare` and `degraded` (of running, those on
    fewer slices: spec.elastic), up to `now`: the closed totals plus the current state's (held
    chips, spare chips) since `since`, as the CLI reads it."""
    g = status.get("goodput") or {}
    chips = {s: int((g.get("chipSeconds") or {}).get(s, 0)) for s in STATES}
    spare = int(g.get("spareChipSeconds", 0))
    degraded = int(g.get("degradedChipSeconds", 0))
    state, since = g.get("state"), g.get("since")
    if state and since:
        began = datetime.fromisoformat(str(since).replace("Z", "+00:00"))
        open_s = max(0, int((now - began).total_seconds()))
        chips[state] = chips.get(state, 0) + open_s * int(g.get("heldChips", 0))
        spare += open_s * int(g.get("spareChips", 0))
        if g.get("degraded") and state == models.GoodputState.RUNNING.value:
            degraded += open_s * int(g.get("heldChips", 0))
    return {**chips, "spare": spare, "degraded": degraded}


def idle_of(before: dict[str, int], after: dict[str, int]) -> tuple[int, int]:
    """(idle chip-seconds: every state but running, and the spares'; running chip-seconds)."""
    idle = sum(after[k] - before[k] for k in after if k not in ("running", "degraded"))
    return idle, after["running"] - before["running"]


# ---------------------------------------------------------------- one variant's record


@dataclass
class Run:
    v: Variant
    ns: str
    uid: str = ""
    victim: str = ""
    healthy_idle_chips: int = 0
    t0: float = 0.0  # the preemption, monotonic
    t0_wall: float = 0.0
    goodput_t0: dict[str, int] = field(default_factory=dict)
    resume: Look | None = None
    goodput_resume: dict[str, int] = field(default_factory=dict)
    full: Look | None = None
    idle_obs: float = 0.0  # chip-seconds, t0..resume
    idle_obs_total: float = 0.0  # chip-seconds, t0..the end of the run
    last: Look | None = None
    # (s since t0, phase, the JobSet, pods being deleted, of them on vanished nodes)
    phases: list[tuple[float, str | None, str, int, int]] = field(default_factory=list)
    asked: dict[str, float] = field(default_factory=dict)  # checkpoint request -> first seen
    restarts: dict[int, dict[str, Any]] = field(default_factory=dict)  # status.lastRestart seen
    pools_up: list[tuple[float, str, bool]] = field(default_factory=list)  # (s, pool, up) changes
    up_before: frozenset[str] = frozenset()  # the job's pools up just before the preemption
    final: dict[str, Any] = field(default_factory=dict)  # the status at the end
    acked: list[str] = field(default_factory=list)

    def record(self, look: Look) -> None:
        """Integrate the idle chips since the previous look (from t0 at the first look: what
        this one sees, as training stopped at t0), note what changed."""
        dt = look.t - (self.last.t if self.last is not None else self.t0)
        idle = self.last.idle_chips if self.last is not None else look.idle_chips
        self.idle_obs_total += dt * idle
        if self.resume is None:
            self.idle_obs += dt * idle
        self.note(look.status)
        before = self.last.up_pools if self.last is not None else self.up_before
        for pool in sorted(before ^ look.up_pools):
            self.pools_up.append((round(look.t - self.t0, 1), pool, pool in look.up_pools))
        seen = (look.phase, look.jobset, look.deleting, look.orphans)
        if not self.phases or self.phases[-1][1:] != seen:
            self.phases.append((round(look.t - self.t0, 1), *seen))
        self.last = look

    def note(self, status: dict[str, Any]) -> None:
        last = status.get("lastRestart")
        if last and "restart" in last:
            self.restarts[int(last["restart"])] = last

    def resume_restart(self) -> dict[str, Any]:
        """status.lastRestart of the restart that made it train again."""
        if self.resume is None:
            return {}
        return self.restarts.get(int(self.resume.status.get("restarts") or 0), {})

    def settled(self) -> bool:
        return self.full is not None

    def is_full(self, look: Look, lifted: bool) -> bool:
        """Training on spec.slices with spec.spares more pools up. a, d and e are not held to
        the lift: a and e have nothing to replace, and d's spare cube could come back (a new
        cube) before the failed one is repaired."""
        v = self.v
        return (
            look.fresh
            and look.replicas == v.shape.slices
            and len(look.up_pools) >= v.shape.slices + v.spares
            and (lifted or v.key == "a" or v.cube)
        )


def run(
    only: Iterable[str] = ("a", "b", "c", "d", "e"),
    stockout_s: float = 60.0,
    wait_s: int = 5,
    post_s: float = 90.0,
    interval: float = 0.5,
    log_dir: Path | None = None,
    checkpoint_save_s: float | None = 2.0,
) -> dict[str, Any]:
    chosen = [variants(wait_s)[k] for k in only]
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "operator-recovery.log"
    started = time.monotonic()
    say("starting the control plane, the GKE simulator and the operator")
    with LocalStack(_options(chosen, log)) as stack:
        assert stack.sim is not None and stack.op is not None
        obs = Observer(stack)
        wait_for(lambda: _served(obs), 60, "MultisliceJobs served")
        runs = [_create(obs, v) for v in chosen]
        say(f"created {', '.join(r.v.label for r in runs)}; waiting until each trains")
        looks = wait_for(lambda: _all_training(obs, runs), 240, "every variant training", 1.0)
        say(f"all training after {time.monotonic() - started:.0f}s")
        _lose(stack.sim, obs, runs, looks)
        t_lift = _watch(stack.sim, obs, runs, stockout_s, post_s, interval, checkpoint_save_s)
        _finals(obs, runs)
        events = {r.v.key: _events(obs, r.ns) for r in runs}
        log_tail = stack.op.log_tail(80)
    say(f"operator log: {log}")
    return report(
        runs,
        stockout_s,
        wait_s,
        checkpoint_save_s,
        t_lift,
        time.monotonic() - started,
        events,
        log_tail,
    )


def _options(chosen: list[Variant], log: Path) -> StackOptions:
    """The stack; with a dynamic-slicing variant, the slice controller and one reservation per
    such variant (its cubes and FREE_SUB_BLOCKS more)."""
    cubes = [v for v in chosen if v.cube]
    return StackOptions(
        resync_seconds=1.0,
        backoff_base_seconds=1.0,
        gc_interval_seconds=5.0,
        op_latency_s=1.0,
        operator_log=log,
        operator_env={"MSJ_BACKOFF_MAX_SECONDS": str(BACKOFF_MAX_S)},
        slice_controller=bool(cubes),
        reservations={v.reservation: {BLOCK: v.sub_blocks} for v in cubes},
    )


def _create(obs: Observer, v: Variant) -> Run:
    r = Run(v, f"recovery-{v.key}")
    obs.core.create_namespace({"metadata": {"name": r.ns}})
    created = obs.custom.create_namespaced_custom_object(*MSJ[:2], r.ns, MSJ[2], job_body(v))
    r.uid = created["metadata"]["uid"]
    return r


def _all_training(obs: Observer, runs: list[Run]) -> dict[str, Look] | None:
    """Every variant's look when each trains on spec.slices with its spares up, else None."""
    world = obs.world()
    looks = {r.v.key: obs.look(r.v, r.ns, r.uid, world, 0.0) for r in runs}
    ok = all(
        lk.phase == models.Phase.RUNNING.value
        and lk.training
        and lk.replicas == r.v.shape.slices
        and len(lk.up_pools) == r.v.shape.slices + r.v.spares
        for r, lk in zip(runs, looks.values(), strict=True)
    )
    return looks if ok else None


def _lose(sim: Any, obs: Observer, runs: list[Run], looks: dict[str, Look]) -> None:
    """t0 of each variant: one busy pool preempted for good, or its cube failed (UNHEALTHY);
    the stockout first, so that no replacement create can get through."""
    for r in runs:
        lk = looks[r.v.key]
        r.healthy_idle_chips = lk.idle_chips
        r.victim = sorted(lk.busy_pools)[0]
    sim.set_faults(stockout_next=1_000_000)
    for r in runs:
        st = (obs.get(MSJ, r.ns) or {}).get("status") or {}
        r.goodput_t0 = goodput_now(st, datetime.now(UTC))
        r.t0, r.t0_wall = time.monotonic(), time.time()
        if r.v.cube:
            sim.set_cube_state(r.victim, gke_slices.UNHEALTHY)
        else:
            sim.preempt(r.victim, recreate_after_s=None)
        r.up_before = looks[r.v.key].up_pools
    lost = ", ".join(f"{r.ns}/{r.victim}{' (cube)' if r.v.cube else ''}" for r in runs)
    say(f"lost {lost}; stockout held")


def _lift(sim: Any, runs: list[Run]) -> None:
    """The replacement capacity returns: the stockout ends and the failed cubes are repaired."""
    sim.clear_faults()
    for r in runs:
        if r.v.cube:
            sim.set_cube_state(r.victim, gke_slices.HEALTHY)


def _watch(sim: Any, obs: Observer, runs: list[Run], stockout_s: float, post_s: float,
           interval: float, checkpoint_save_s: float | None) -> float | None:  # fmt: skip
    """Look at every variant each `interval` until all are at full strength after the lift (or
    `post_s` after it); the lift's monotonic time (None: it never came)."""
    t_first = min(r.t0 for r in runs)
    t_lift: float | None = None
    deadline = t_first + stockout_s + post_s
    while time.monotonic() < deadline:
        if t_lift is None and time.monotonic() - t_first >= stockout_s:
            _lift(sim, runs)
            t_lift = time.monotonic()
            say(f"stockout lifted, cubes repaired after {t_lift - t_first:.1f}s")
        world = obs.world()
        for r in runs:
            lk = obs.look(r.v, r.ns, r.uid, world, float(int(r.t0_wall)))
            r.record(lk)
            if checkpoint_save_s is not None:
                _acknowledge(obs, r, lk, checkpoint_save_s)
            if r.resume is None and lk.fresh:
                r.resume = lk
                r.goodput_resume = goodput_now(lk.status, _at(lk))
                say(f"{r.v.label}: trains again on {lk.replicas} slices after "
                    f"{lk.t - r.t0:.1f}s")  # fmt: skip
            if r.full is None and r.is_full(lk, t_lift is not None):
                r.full = lk
                say(f"{r.v.label}: at full strength after {lk.t - r.t0:.1f}s")
        if t_lift is not None and all(r.settled() for r in runs):
            break
        time.sleep(interval)
    if t_lift is None:
        _lift(sim, runs)
    return t_lift


def _acknowledge(obs: Observer, r: Run, lk: Look, save_s: float) -> None:
    """Play the workload: a checkpoint asked for is saved `save_s` after it was first seen."""
    if not (lk.checkpoint_asked and lk.checkpoint_pod):
        return
    rid = lk.checkpoint_asked
    first = r.asked.setdefault(rid, lk.t)
    if rid not in r.acked and lk.t - first >= save_s:
        step = int(lk.t - r.t0)  # the simulated workload has no steps of its own
        obs.acknowledge(r.ns, lk.checkpoint_pod, rid, step)
        r.acked.append(rid)
        say(f"{r.v.label}: checkpoint {rid} acknowledged on {lk.checkpoint_pod}")


def _finals(obs: Observer, runs: list[Run]) -> None:
    """Each job's last status. The operator writes a restart's recoverySeconds in the pass after
    it saw every slice running: give it a few seconds to."""
    end = time.monotonic() + 10
    while True:
        for r in runs:
            r.final = (obs.get(MSJ, r.ns) or {}).get("status") or {}
            r.note(r.final)
        latest = [r.final.get("lastRestart") or {} for r in runs if r.resume]
        if time.monotonic() > end or all("recoverySeconds" in x for x in latest):
            return
        time.sleep(0.5)


def _at(look: Look) -> datetime:
    return datetime.fromtimestamp(look.wall, UTC)


def _served(obs: Observer) -> bool:
    try:
        obs.custom.list_cluster_custom_object(*MSJ[:2], MSJ[2], limit=1)
    except ApiException:
        return False
    return True


def _events(obs: Observer, ns: str) -> list[str]:
    items = obs.core.list_namespaced_event(ns).items
    items.sort(key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
    return [
        f"{e.reason} ({e.involved_object.kind}): {e.message}"
        for e in items
        if e.involved_object.kind == models.KIND
    ]


# ---------------------------------------------------------------- the report


def _s(x: float | None) -> Any:
    return "-" if x is None else round(x, 1)


def _dash(x: Any) -> Any:
    return "-" if x is None else x


def report(
    runs: list[Run],
    stockout_s: float,
    wait_s: int,
    checkpoint_save_s: float | None,
    t_lift: float | None,
    wall_s: float,
    events: dict[str, list[str]],
    log_tail: str,
) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    for r in runs:
        resume_s = r.resume.t - r.t0 if r.resume else None
        after_lift = r.resume.t - t_lift if r.resume and t_lift is not None else None
        full_s = r.full.t - r.t0 if r.full else None
        idle_status = running_status = idle_status_end = None
        if r.resume:
            idle_status, running_status = idle_of(r.goodput_t0, r.goodput_resume)
        goodput_end = goodput_now(r.last.status, _at(r.last)) if r.last else {}
        if goodput_end:
            idle_status_end = idle_of(r.goodput_t0, goodput_end)[0]
        st = r.final
        last_restart = r.resume_restart()
        results.append(
            {
                "variant": r.v.key,
                "label": r.v.label,
                "spec": r.v.spec,
                "accelerator": r.v.shape.accelerator,
                "slices": r.v.shape.slices,
                "cubes": r.v.cube,
                "victim": r.victim,
                "resumed": r.resume is not None,
                "resume_s": resume_s,
                "resume_after_lift_s": after_lift,
                "resumed_on_slices": r.resume.replicas if r.resume else None,
                "full_s": full_s,
                "idle_chip_s_observed": round(r.idle_obs) if r.resume else None,
                "end_s": round(r.last.t - r.t0, 1) if r.last else None,
                "idle_chip_s_observed_until_end": round(r.idle_obs_total),
                "idle_chip_s_status_until_end": idle_status_end,
                "running_chip_s_status_until_end": (
                    goodput_end["running"] - r.goodput_t0["running"] if goodput_end else None
                ),
                "degraded_chip_s_status_until_end": (
                    goodput_end["degraded"] - r.goodput_t0["degraded"] if goodput_end else None
                ),
                "idle_chips_healthy": r.healthy_idle_chips,
                "idle_chip_s_status": idle_status,
                "running_chip_s_status": running_status,
                "goodput_t0": r.goodput_t0,
                "goodput_resume": r.goodput_resume,
                "goodput_end": goodput_end,
                "last_restart": last_restart,
                "restarts_seen": {str(k): v for k, v in sorted(r.restarts.items())},
                "goodput_lost_steps": (st.get("goodput") or {}).get("lostSteps"),
                "restarts": st.get("restarts"),
                "restarts_by_cause": st.get("restartsByCause"),
                "final_phase": st.get("phase"),
                "final_message": st.get("message"),
                "conditions": [
                    f"{c.get('type')}={c.get('status')} {c.get('reason')}"
                    for c in st.get("conditions") or []
                ],
                "phases": r.phases,
                "pools_up": r.pools_up,
                "checkpoints_asked": {k: round(t - r.t0, 1) for k, t in r.asked.items()},
                "checkpoints_acknowledged": r.acked,
                "events": events.get(r.v.key, []),
            }
        )
    rows = []
    for x in results:
        # Against the variant that waits on the same capacity: a for b and c, e for d.
        base = next(
            (b for b in results if b["variant"] == WAITS[x["cubes"]] and b["resumed"]), None
        )
        vs = "-"
        if base and x["resumed"] and x is not base:
            vs = f"{x['resume_s'] / base['resume_s']:.2f}x"
        lr = x["last_restart"]
        to_resume = "-"
        if x["resumed"]:
            to_resume = f"{x['idle_chip_s_observed']} / {_dash(x['idle_chip_s_status'])}"
        to_end = (
            f"{x['idle_chip_s_observed_until_end']} / {_dash(x['idle_chip_s_status_until_end'])}"
        )
        rows.append(
            [
                x["label"],
                _s(x["resume_s"]) if x["resumed"] else "never",
                x["resumed_on_slices"] or "-",
                vs,
                _s(x["resume_after_lift_s"]),
                _s(x["full_s"]),
                to_resume,
                to_end,
                _s(x["end_s"]),
                x["idle_chips_healthy"],
                _dash(lr.get("recoverySeconds")),
                _dash(lr.get("lostSteps")),
            ]
        )
    text = table(
        f"Recovery after a lost slice (a-c: {MANAGED.slices} x {MANAGED.accelerator}, a pool "
        f"preempted; d-e: {CUBES.slices} x {CUBES.accelerator} on cubes, a cube failed; the "
        f"replacement stocked out, the cube repaired, after {stockout_s:.0f}s); idle chip-s: "
        "observed / status.goodput",
        [
            "variant",
            "resume s",
            "on",
            "vs wait",
            "after lift s",
            "full s",
            "idle chip-s to resume",
            "idle chip-s to end",
            "end s",
            "idle chips healthy",
            "op recovery s",
            "lost steps",
        ],
        rows,
    )
    out = {
        "stockout_s": stockout_s,
        "elastic_wait_s": wait_s,
        "checkpoint_save_s": checkpoint_save_s,
        "operator": {
            "resync_seconds": 1.0,
            "backoff_base_seconds": 1.0,
            "backoff_max_seconds": BACKOFF_MAX_S,
            "gke_op_latency_s": 1.0,
        },
        "wall_s": round(wall_s),
        "results": results,
        "table": text,
        "operator_log_tail": log_tail,
    }
    save("recovery", out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--stockout-s", type=float, default=60.0, help="how long the stockout holds")
    p.add_argument("--only", default="a,b,c,d,e", help="comma list of variants: a, b, c, d, e")
    p.add_argument("--wait-s", type=int, default=5, help="b's spec.elastic.waitSeconds")
    p.add_argument(
        "--post-s", type=float, default=90.0, help="how long to watch after the stockout ends"
    )
    p.add_argument("--interval", type=float, default=0.5, help="seconds between looks")
    p.add_argument("--log-dir", type=Path, default=None, help="where the operator log goes")
    p.add_argument(
        "--checkpoint-save-s",
        type=float,
        default=2.0,
        help="play the workload: acknowledge a checkpoint the operator requests (elastic grow)\n"
        "this long after it is asked (multislice.dev/checkpoint-saved on process 0's pod)",
    )
    p.add_argument(
        "--no-checkpoint-ack",
        action="store_true",
        help="never acknowledge one (the operator then grows b back only after its own wait)",
    )
    args = p.parse_args(argv)
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = set(only) - set(variants(args.wait_s))
    if unknown or not only:
        p.error(f"unknown variants {sorted(unknown)}; choose from a, b, c, d, e")
    save_s = None if args.no_checkpoint_ack else args.checkpoint_save_s
    out = run(only, args.stockout_s, args.wait_s, args.post_s, args.interval, args.log_dir, save_s)
    return 0 if all(x["resumed"] for x in out["results"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
