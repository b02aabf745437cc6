"""`multislice-operator demo`: the whole story on one machine, narrated.

Builds what is missing, starts the local default (a real control plane with kwok TPU nodes, the
GKE API simulator and the operator), applies a MultisliceJob, drives one scenario, shows the job
live and a timeline at the end, checks the outcome, shows where the job's TPU time went (the
goodput breakdown of `multislice-operator status`), and cleans everything up (Ctrl-C included).

With ``--kubeconfig`` it borrows a running cluster of the local ``cluster`` profile's kind (the
``kueue`` profile for the queue scenario; the e2e tests pass their session's) instead of starting
one: only the GKE simulator and the operator are started, the operator watches only the demo's
namespaces (``--namespace``), and what the demo created there is deleted at the end.
"""

from __future__ import annotations

import argparse
import copy
import json
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.gke_sim import Faults
from multislice_local.inplace_agent import AgentPlayer, restart_all_containers
from multislice_local.nodes import NODE_SHUTDOWN, RUN_DURATION_ANNOTATION, fail_pod, label_nodes
from multislice_local.stack import PROJECT, ZONE, ExistingCluster, LocalStack, StackOptions
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.planning.plan import load_job, node_pool_name, plan_job
from multislice_operator.render.kueue_workload import workload_name
from multislice_operator.render.preflight import SHAPE_LABEL

NAMESPACE = "demo"
JOB = "llm-v5e"
RETRYABLE_EXIT = 17
FATAL_EXIT = 78  # the workload's configuration error (42 asks for a restart)
INPLACE_AGENT_IMAGE = "example.invalid/in-place-restart-agent:v0.12.0"  # never pulled (kwok)
DEMO_VOCAB = 4096  # the --run-workload tokenizer's vocabulary (the model reads it from the file)
# The --run-workload training: the last process crashes after WORKLOAD_CRASH_STEP, past the
# checkpoint of WORKLOAD_CHECKPOINT_EVERY, and every process resumes from it. Four JAX processes
# of 4 CPU devices each on 2 cores: on a loaded machine a step took 5-9 s and each attempt's
# compile about 100 s, so the run is as short as the story allows (40 steps took 832 s there).
WORKLOAD_STEPS, WORKLOAD_CHECKPOINT_EVERY, WORKLOAD_CRASH_STEP = 20, 5, 12
# Past the workload's deadline, how long to wait for its launcher to stop the processes and return.
LAUNCHER_MARGIN_S = 60.0
LAST_STEPS = {"step": 120, "checkpointStep": 100}  # restart scenario: 20 steps lost
# maintenance scenario: announced this far ahead, a checkpoint asked this long before it.
MAINTENANCE_IN_S, CHECKPOINT_AHEAD_S, SAVED_STEP = 15, 8, 120
# elastic scenario: 4 slices that may run on 3, shrinking 5 s after a loss (at once on a stockout).
ELASTIC_SLICES, ELASTIC_MIN, ELASTIC_WAIT_S = 4, 3, 5


def in_place_row(result: Any, attempt: int) -> dict[str, Any]:
    """Process 0's coordinator address, restored step (None: a fresh start), train-step compile
    seconds and compilation-cache hits on one attempt of a launch (`LaunchResult`)."""
    config = [e for e in result.events_named("train_config", attempt) if e["launch_process"] == 0]
    restored = [e for e in result.events_named("restored", attempt) if e["launch_process"] == 0]
    first = config[0] if config else {}
    return {
        "coordinator": first.get("coordinator_address"),
        "restored": restored[0]["step"] if restored else None,
        "compile_seconds": first.get("compile_seconds"),
        "cache_hits": first.get("compilation_cache_hits"),
    }


def workload_args(corpus: Path) -> list[str]:
    """The --run-workload training on the prepared corpus (its tokenizer.json comes with it)."""
    return [
        "train",
        "--dataset", str(corpus),
        "--steps", str(WORKLOAD_STEPS),
        "--learning_rate", "3e-3",
        "--checkpoint_every", str(WORKLOAD_CHECKPOINT_EVERY),
        "--log_every", "2",
        "--eval_every", str(WORKLOAD_STEPS // 2),
    ]  # fmt: skip


def workload_problems(
    result: Any, restored: list[Any], learned: bool, timeout_s: float
) -> list[str]:
    """What the --run-workload story lacks in a launch's result (`LaunchResult`): none when it
    succeeded after a restart that resumed from a checkpoint, with the loss down."""
    problems = []
    last = result.attempts[-1]
    if last.outcome == "timeout":
        problems.append(
            f"not finished {timeout_s:.0f} s after its start (--timeout): attempt {last.attempt}"
            " stopped"
        )
    elif not result.succeeded:
        problems.append(f"exit {result.exit_code} ({last.outcome})")
    if result.restarts < 1:
        problems.append("no restart")
    if not restored:
        problems.append("no restore from a checkpoint")
    if not learned:
        problems.append("the loss did not go down")
    return problems


def loss_curve(events: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(step, loss) of process 0's events, the last attempt's value for a step run twice."""
    by_step = {e["step"]: e["loss"] for e in events if e.get("launch_process", 0) == 0}
    return sorted(by_step.items())


class BackgroundLaunch:
    """`multislice_workload.local.launch` in a thread while the story goes on. The launcher owns
    the deadline (`timeout_s` from the start): there it stops every process and returns a
    "timeout" outcome. So a run still making progress is never judged while it runs (the demo's
    own shorter wait once gave up on one still training, and left its processes running) and no
    process outlives the demo."""

    def __init__(self, timeout_s: float, **launch_kwargs: Any) -> None:
        self.timeout_s = timeout_s
        self._kwargs = launch_kwargs
        self._result: Any = None
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._work, name="workload", daemon=True)

    def _work(self) -> None:
        from multislice_workload.local import launch

        try:
            self._result = launch(timeout_s=self.timeout_s, **self._kwargs)
        except Exception as exc:  # reported by wait(): the story goes on
            self._error = exc

    def start(self) -> None:
        self._thread.start()

    def wait(self) -> tuple[Any, str]:
        """(the `LaunchResult`, "") once the launcher returns, or (None, why there is none)."""
        self._thread.join(timeout=self.timeout_s + LAUNCHER_MARGIN_S)
        if self._result is not None:
            return self._result, ""
        if self._error is not None:
            return None, f"the launcher failed: {self._error}"
        return None, f"the launcher did not return {LAUNCHER_MARGIN_S:.0f} s past its deadline"


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    expect_phase: str | None  # None: the job is deleted
    expect_restarts: int = 0
    run: str = "8s"  # how long each pod runs (kwok)
    faults: Faults = field(default_factory=Faults)
    kueue: bool = False  # the kueue profile, examples/kueue/queues.yaml, the job queued


# The preflight scenario's model: about 2.1 B parameters, whose float32 weights and Adam state
# (~26 GB) fit a v5e chip (16 GB of HBM) only when sharded (FSDP), not replicated (data).
PREFLIGHT_ARGS = [
    *("train", "--embed", "4096", "--heads", "32", "--head_dim", "128", "--mlp", "16384"),
    *("--num_layers", "8", "--seq_len", "1024", "--batch_size", "32"),
]
REPLICATED = {"data": 16, "fsdp": 1, "tensor": 1}  # ICI layout the preflight refuses

# The fallback scenario (issue 55, docs/provisioning.md#fallback-across-capacity-types-and-shapes).
# Its first job tries a team reservation, flex-start, then spot; the simulator holds no VMs of
# the reservation and no flex-start capacity in the zone (set_capacity), spot is unlimited.
FALLBACK_RESERVATION = "team-v5e"
# The simulator queues a flex-start pool without capacity, as Dynamic Workload Scheduler does
# (waiting is not an error): that option is left when its trySeconds run out.
FLEX_TRY_S = 20
FALLBACK_OPTIONS: list[dict[str, Any]] = [
    {"capacity": {"type": "Reserved", "reservation": FALLBACK_RESERVATION}, "trySeconds": 120},
    {"capacity": {"type": "FlexStart"}, "trySeconds": FLEX_TRY_S},
    {"capacity": {"type": "Spot"}, "trySeconds": 120},
]
# Its second job (spec.preflight): a model whose float32 weights and Adam state fit 16 v5e chips
# a slice (FSDP 16) but not 8 (FSDP 8); its own shape on the exhausted reservation first, then
# 4 x v5litepod-8 (refused by the compiler: never provisioned), then one v6e-32 slice with FSDP
# over its 32 chips, on spot.
# About 6.4 B parameters as 512 narrow layers (embed 1024, MLP 4096) over 256 positions: the
# layers are one lax.scan, so libtpu compiles one layer whatever the depth, and its time goes to
# the backend's code for each layer's per-device matmuls (width and sequence, not depth). The same
# HBM need as 32 layers of embed 4096 over 1024 positions (18.02 against 18.04 GiB on v5e-8), for
# a fifth of the compile time: 18-27 s a shape against 100-140 s on 2 loaded cores (measured).
FALLBACK_MODEL_ARGS = [
    *("train", "--embed", "1024", "--heads", "8", "--head_dim", "128", "--mlp", "4096"),
    *("--num_layers", "512", "--seq_len", "256", "--batch_size", "32"),
]
REFUSED_SHAPE = "v5e-8"
FALLBACK_SHAPES: list[dict[str, Any]] = [
    {"name": REFUSED_SHAPE, "accelerator": "v5litepod-8", "topology": "2x4", "slices": 4,
     "parallelism": {"ici": {"fsdp": 8}, "dcn": {"data": 4}}},
    {"name": "v6e", "accelerator": "v6e-32", "topology": "4x8", "slices": 1,
     "parallelism": {"ici": {"fsdp": 32}}},
]  # fmt: skip
FALLBACK_SHAPE_OPTIONS: list[dict[str, Any]] = [
    FALLBACK_OPTIONS[0],
    {"capacity": {"type": "Spot"}, "shape": REFUSED_SHAPE, "trySeconds": 120},
    {"capacity": {"type": "Spot"}, "shape": "v6e", "trySeconds": 120},
]

SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "restart",
            "one slice's pod fails with a retryable code; all slices restart",
            "Succeeded",
            1,
        ),
        Scenario(
            "stockout",
            "one slice hits a stockout; the gang rolls back and retries",
            "Succeeded",
            0,
            faults=Faults(stockout_next=1),
        ),
        Scenario(
            "preemption",
            "one spot slice is preempted; its pool is replaced, all restart",
            "Succeeded",
            1,
            run="12s",
        ),
        Scenario(
            "fatal", "a pod exits with a non-retryable code; the job fails", "Failed", 0, run="1h"
        ),
        Scenario(
            "inplace",
            "in-place restart (JobSet >= v0.11): a pod's program fails and every pod restarts "
            "in place (names, nodes, UIDs kept, restart counts up); then a spot slice is "
            "preempted and every pod is recreated",
            "Succeeded",
            1,
            run="45s",
        ),
        Scenario("delete", "the job is deleted mid-provisioning; nothing leaks", None),
        Scenario(
            "real",
            "the chart with no values on real kubelet/containerd/runc nodes; the workload image "
            "trains in real pods, restarts in place through JobSet's real agent, then is "
            "recreated after a node drain, resuming from its checkpoint each time "
            "(demo_real.py; root)",
            "Succeeded",
            2,
        ),
        Scenario(
            "multicluster",
            "a MultiKueue manager and two worker clusters: worker a is stocked out, the job "
            "runs on worker b (demo_multicluster.py)",
            "Succeeded",
        ),
        Scenario(
            "maintenance",
            "GKE announces host maintenance on slice 1's nodes; a checkpoint is asked ahead of "
            "it; the maintenance stops the slice and all slices restart: a disruption, not "
            "charged to maxRestarts (0 here), losing no step",
            "Succeeded",
            1,
            run="20s",
        ),
        Scenario(
            "elastic",
            f"{ELASTIC_SLICES} spot slices, spec.elastic minSlices {ELASTIC_MIN}: a busy slice's "
            f"pool is preempted and its replacement stocked out; the job runs on {ELASTIC_MIN} "
            f"slices, grows back to {ELASTIC_SLICES} once the stockout ends (after a checkpoint) "
            "and succeeds: two resizes, charged to no budget",
            "Succeeded",
            2,
            run="60s",
        ),
        Scenario(
            "preflight",
            "spec.preflight: the job's compile command, run here as the operator's CPU Job would "
            "run it, finds that a model replicated on every chip (ICI data 16) does not fit in "
            "v5e HBM: the job fails before any node pool; the same job with FSDP over the 16 "
            "chips of each slice fits, is provisioned and runs",
            "Succeeded",
        ),
        Scenario(
            "fallback",
            "provisioning.mode Fallback: a job tries its team reservation (exhausted: GKE's 429), "
            "flex-start (no capacity: its pools wait until its trySeconds run out), then spot, "
            "and runs there; a second job, with spec.preflight, tries its own shape on the "
            "reservation, then 4 x v5litepod-8 (refused by the TPU compiler: 0 node pools for "
            "it), then one v6e-32 slice with another mesh, which fits and runs",
            "Succeeded",
        ),
        Scenario(
            "ironwood",
            "2 tpu7x-128 slices on GKE dynamic slicing: 3 cubes (4x4x4 sub-blocks, one a spare), "
            "one GKE Slice per slice ACTIVE before the JobSet; a cube under slice 1 fails, its "
            "Slice is re-formed on the spare cube and every slice restarts (a disruption); the "
            "failed cube's pool is made again on a free sub-block (a spare again); nothing is left",
            "Succeeded",
            run="30s",
        ),
        Scenario(
            "queue",
            "two teams share 64 chips through Kueue; the job waits Queued with zero node pools "
            "until quota frees, then gets its gang and runs",
            "Succeeded",
            kueue=True,
        ),
    )
}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# The ironwood scenario: an All Capacity reservation of one block of 4 sub-blocks in the simulator,
# the job's 2 slices of one cube each and 1 spare cube, one free for the failed cube's pool
# (docs/provisioning.md#dynamic-slicing).
IRONWOOD_RESERVATION = "ironwood-demo"
IRONWOOD_SPEC = {
    "accelerator": "tpu7x-128",
    "topology": "4x4x4",
    "slices": 2,
    "spares": 1,
    "parallelism": {"ici": {"fsdp": 128}, "dcn": {"data": 2}},
    "capacity": {"type": "Reserved", "reservation": f"{IRONWOOD_RESERVATION}/reservationBlocks/b1"},
    "provisioning": {"mode": "DynamicSlicing"},
}
# The queue scenario: examples/kueue/queues.yaml, plus team-a's LocalQueue in the demo namespace;
# two other 32-chip jobs take both teams' quota first.
TEAM_QUEUE = "team-a"
OTHER_NAMESPACE = "team-b"  # examples/kueue/queues.yaml's other team


def others(namespace: str) -> tuple[tuple[str, str, str], ...]:
    """(namespace, LocalQueue, job) of the two jobs that fill both teams' quota first."""
    return (
        (OTHER_NAMESPACE, "team-b", "team-b-train"),
        (namespace, TEAM_QUEUE, "team-a-first"),
    )


class Narrator:
    def __init__(self, out: TextIO) -> None:
        self.out, self.t0 = out, time.monotonic()
        self.marks: list[tuple[float, str]] = []

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", file=self.out, flush=True)

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic() - self.t0, what))


def demo_job(
    scenario: Scenario, run_workload: bool = False, namespace: str = NAMESPACE
) -> dict[str, Any]:
    example = Path(__file__).resolve().parents[2] / "examples" / "v5e-16x2-fsdp.yaml"
    import yaml

    body: dict[str, Any] = yaml.safe_load(example.read_text())
    body["metadata"] = {"name": JOB, "namespace": namespace}
    spec = body["spec"]
    # The example's checkpoint directory stays, as a job should name one (without it every
    # restart starts from step 0: NoCheckpoint). The kwok pods write nothing there; with
    # --run-workload the workload checkpoints to a local directory instead (start_workload).
    if scenario.name in ("preemption", "inplace"):
        spec["capacity"] = {"type": "Spot"}
    if scenario.name == "maintenance":
        spec["maintenance"] = {"checkpointAheadSeconds": CHECKPOINT_AHEAD_S}
        spec["failurePolicy"]["maxRestarts"] = 0  # disruptions are not charged to it
    if scenario.name == "elastic":
        spec.update(slices=ELASTIC_SLICES, capacity={"type": "Spot"})
        spec["parallelism"]["dcn"]["data"] = ELASTIC_SLICES  # only dcn.data shrinks
        spec["elastic"] = {"minSlices": ELASTIC_MIN, "waitSeconds": ELASTIC_WAIT_S}
    if scenario.name == "ironwood":
        spec.update(IRONWOOD_SPEC)
    if run_workload:
        # Real JAX runs here on CPU, one process per host: the smallest multi-host slices
        # (Multislice needs them) keep it to four.
        spec.update(accelerator="v5litepod-8", topology="2x4")
        spec["parallelism"] = {"ici": {"fsdp": 8}, "dcn": {"data": 2}}
    if scenario.name == "preflight":
        spec["preflight"] = {}  # the workload's own compile command
        spec["template"]["spec"]["containers"][0]["args"] = PREFLIGHT_ARGS
    if scenario.name == "fallback":  # the second job; fallback_first_job() the first
        del spec["capacity"]  # each option says its own
        spec["preflight"] = {}
        spec["template"]["spec"]["containers"][0]["args"] = FALLBACK_MODEL_ARGS
        fallback = {"options": FALLBACK_SHAPE_OPTIONS, "shapes": FALLBACK_SHAPES}
        spec["provisioning"] = {"mode": "Fallback", "fallback": copy.deepcopy(fallback)}
    template = spec["template"]
    template.setdefault("metadata", {}).setdefault("annotations", {})[RUN_DURATION_ANNOTATION] = (
        scenario.run
    )
    if scenario.kueue:
        body["metadata"]["labels"] = {keys.KUEUE_QUEUE_NAME: TEAM_QUEUE}
    return copy.deepcopy(body)


# A node-pool create as the simulator received it: (capacity type label, machine type, topology).
Create = tuple[str, str, str]


def options_left(st: dict[str, Any]) -> dict[int, str | None]:
    """Each option tried (status.fallback.options) and why it was last left (None: not left)."""
    fb: dict[str, Any] = st.get("fallback") or {}
    return {int(o["option"]): o.get("lastLeft") for o in fb.get("options") or []}


def fallback_first_problems(st: dict[str, Any], creates: list[Create], flex_held: int
                            ) -> list[str]:  # fmt: skip
    """What the fallback scenario's first job lacks: Succeeded on spot (option 3) after leaving
    the reservation (exhausted) and flex-start (its trySeconds); spot's gang created once, no
    flex-start chip still held (`flex_held`)."""
    problems = []
    if st.get("phase") != "Succeeded":
        problems.append(f"phase {st.get('phase')}, expected Succeeded")
    want = {0: "ReservationExhausted", 1: "Timeout", 2: None}
    if options_left(st) != want:
        problems.append(f"options left {options_left(st)}, expected {want}")
    spot = sum(1 for c in creates if c[0] == "Spot")
    if spot != 2:
        problems.append(f"{spot} spot node-pool creates, expected the gang's 2")
    if flex_held:
        problems.append(f"{flex_held} flex-start chips still held")
    return problems


def fallback_second_problems(st: dict[str, Any], creates: list[Create]) -> list[str]:
    """What the second job lacks: it ran on the v6e shape (option 3, one pool), its own shape
    left at the reservation's 429, shape v5e-8 refused by the compiler and never asked of GKE
    (0 creates of its topology)."""
    fb: dict[str, Any] = st.get("fallback") or {}
    problems = []
    want = {0: "ReservationExhausted", 1: "DidNotCompile", 2: None}
    if options_left(st) != want or fb.get("shape") != "v6e":
        problems.append(
            f"options left {options_left(st)} (shape {fb.get('shape')!r}), expected {want}"
        )
    verdicts = {sh.get("name"): sh.get("fits") for sh in fb.get("shapes") or []}
    if verdicts != {"": True, REFUSED_SHAPE: False, "v6e": True}:
        problems.append(f"compiler verdicts {verdicts}")
    refused = next(s for s in FALLBACK_SHAPES if s["name"] == REFUSED_SHAPE)
    asked = sum(1 for c in creates if c[2] == refused["topology"])
    ran = sum(1 for c in creates if c[1].startswith("ct6e"))
    if asked or ran != 1:
        problems.append(f"{asked} creates for the refused shape, {ran} v6e; expected 0 and 1")
    return problems


def fallback_first_job(namespace: str) -> dict[str, Any]:
    """The fallback scenario's first job: the example's, tried as FALLBACK_OPTIONS say."""
    body = demo_job(SCENARIOS["restart"], namespace=namespace)  # the example as it is
    spec = body["spec"]
    del spec["capacity"]  # each option says its own
    spec["provisioning"] = {"mode": "Fallback", "fallback": {"options": FALLBACK_OPTIONS}}
    return copy.deepcopy(body)


class Demo:
    def __init__(self, args: argparse.Namespace, out: TextIO = sys.stdout) -> None:
        self.args = args
        self.scenario = SCENARIOS[args.scenario]
        self.ns: str = getattr(args, "namespace", None) or NAMESPACE
        self.borrowed = bool(getattr(args, "kubeconfig", None))  # a cluster we did not start
        # What the demo created on a borrowed cluster, deleted at the end (jobs first).
        self.created_jobs: list[tuple[str, str]] = []
        self.created_namespaces: list[str] = []
        self.created_queue_objects: list[dict[str, Any]] = []
        self.n = Narrator(out)
        self.stack: LocalStack | None = None
        self.seen_events: set[str] = set()
        self.last_line = ""
        self.injected = False
        # ironwood scenario: the cube failed, the cubes held before, the spare made again
        self.failed_cube = ""
        self.cubes_before: set[str] = set()
        self.spare_back = False
        self.workload: BackgroundLaunch | None = None  # --run-workload's launch
        self.queued_seen = False  # queue scenario: seen Queued
        self.witness: Any = None  # queue scenario: the Workload's quota at each node-pool create
        self.maintenance_at: int | None = None  # maintenance scenario: the announced start
        # inplace scenario: the agents played, what comes next, the pods before the restart
        self.agents: AgentPlayer | None = None
        self.inplace_stage = "fail"
        self.inplace_before: dict[str, tuple[str, str]] = {}
        self.maintenance_stage = "announce"
        self.elastic_stage = "preempt"  # elastic scenario: what comes next
        self.elastic_victim = ""  # the preempted pool
        self.compiles_played: set[str] = set()  # the compile pods played (their UIDs)
        self.fallback_creates_before = 0  # fallback scenario: the creates before the second job

    # -- the story -------------------------------------------------------------------------

    def run(self) -> int:
        s = self.scenario
        self.n.say(f"scenario '{s.name}': {s.summary}")
        from multislice_local.controlplane import ensure_binaries

        self.n.say(
            "checking the control-plane binaries (built once; how long the first build takes: "
            "README.md, 'The two commands'; it prints its progress against the expected total)"
        )
        ensure_binaries()
        self.n.mark("binaries ready")
        if s.kueue and self.args.cluster != "local":
            self.n.say("the queue scenario runs on the local cluster only (its kueue profile)")
            return 2
        if s.name == "elastic" and self.args.run_workload:
            self.n.say(
                "the elastic scenario plays the workload itself (its checkpoint answer); "
                "--run-workload goes with the other scenarios"
            )
            return 2
        profile = "kueue" if s.kueue else "cluster"
        options = StackOptions(
            profile=profile,
            cluster=self.args.cluster,
            op_latency_s=self.args.pool_latency,
            faults=s.faults,
            operator_log=Path(tempfile.mkstemp(prefix="msj-demo-operator-", suffix=".log")[1]),
            slice_controller=s.name == "ironwood",
        )
        if s.name == "inplace":  # no agent image runs under kwok: any name does
            options.operator_env["MSJ_IN_PLACE_AGENT_IMAGE"] = INPLACE_AGENT_IMAGE
        borrowed: ExistingCluster | None = None
        if self.borrowed:
            borrowed = ExistingCluster(Path(self.args.kubeconfig), profile)
            # Off every other job of that cluster; the heartbeat Lease in our namespace, so it
            # goes with it (and no other operator's is read as ours).
            options.namespaces = [self.ns] + ([OTHER_NAMESPACE] if s.kueue else [])
            options.operator_env.update(
                {
                    "MSJ_LEADER_ELECTION_NAMESPACE": self.ns,
                    "MSJ_LEADER_ELECTION_NAME": "multislice-demo",
                }
            )
            self.n.say(
                f"using the running cluster of {borrowed.kubeconfig} ({profile} profile): "
                f"namespace {self.ns}, nothing of the cluster is started or stopped"
            )
            api = borrowed.api_client()
            # Every namespace it watches exists before the operator starts: its heartbeat Lease
            # goes in ours. (team-b, created just after the operator started, once fell into
            # kopf's gap between two namespace listings and its job was never seen; the
            # operator now closes that gap, controller/discovery.py.)
            try:
                for ns in options.namespaces:
                    self.ensure_namespace(api, ns)
            finally:
                api.close()
        self.stack = LocalStack(options, control_plane=borrowed)
        self.stack.start(progress=self.n.say)
        assert self.stack.cp is not None
        if not self.borrowed:
            self.n.say(f"control-plane state in {self.stack.cp.workdir}")
        self.n.mark("local cluster, GKE simulator and operator up")
        if s.kueue:
            self.queues()
        if s.name == "ironwood":
            assert self.stack.sim is not None
            self.stack.sim.add_reservation(IRONWOOD_RESERVATION, {"b1": 4}, project=PROJECT)
            self.n.say(
                f"reservation {IRONWOOD_RESERVATION}: block b1 of 4 sub-blocks (cubes): 3 for "
                "the job (2 slices + 1 spare), 1 free to replace a cube that fails"
            )
        body = demo_job(s, self.args.run_workload, self.ns)
        if s.name == "preflight" and not self.preflight_refusal(body):
            return 1
        if s.name == "fallback" and not self.fallback_first(body):
            return 1
        self.apply(body)
        outcome = self.watch(body)
        self.timeline()
        ok = self.check(outcome)
        self.goodput()
        if self.workload is not None:
            ok = self.workload_result(self.workload) and ok
        if self.args.keep:
            self.keep()
        return 0 if ok else 1

    def ensure_namespace(self, api: Any, name: str) -> None:
        """Create namespace `name` unless it exists (remembered: deleted at the end on a
        borrowed cluster)."""
        core: Any = client.CoreV1Api(api)  # plain dicts in
        try:
            core.create_namespace({"metadata": {"name": name}})
            self.created_namespaces.append(name)
        except ApiException as exc:
            if exc.status != 409:
                raise

    def create_job(self, body: dict[str, Any]) -> None:
        assert self.stack is not None
        meta = body["metadata"]
        client.CustomObjectsApi(self.stack.api).create_namespaced_custom_object(
            models.GROUP, models.VERSION, meta["namespace"], models.PLURAL, body
        )
        self.created_jobs.append((meta["namespace"], meta["name"]))

    def apply(self, body: dict[str, Any]) -> None:
        assert self.stack is not None
        self.ensure_namespace(self.stack.api, self.ns)
        plan = plan_job(load_job(body))
        self.n.say(
            f"applying MultisliceJob {self.ns}/{JOB}: {plan.slices} x {plan.shape.accelerator} "
            f"({plan.shape.hosts} hosts each, {plan.total_chips} chips), "
            f"{plan.capacity}, DCN {plan.advice.verdict}, checkpoints in "
            f"{body['spec'].get('checkpoint', {}).get('directory', 'none')}"
        )
        self.create_job(body)
        self.n.mark("job applied")

    def queues(self) -> None:
        """examples/kueue/queues.yaml, then two other jobs that take both teams' quota."""
        assert self.stack is not None
        from multislice_local import queues

        self.witness = queues.QuotaWitness(self.stack.sim, self.stack.api).install()
        objects = queues.load(EXAMPLES / "kueue" / "queues.yaml")
        for ns in [o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"] + [self.ns]:
            self.ensure_namespace(self.stack.api, ns)
        objects.append(queues.local_queue(self.ns, TEAM_QUEUE, TEAM_QUEUE))
        self.created_queue_objects += queues.apply(self.stack.api, objects)
        for cq in ("team-a", "team-b"):
            queues.wait_active(self.stack.api, cq)
        self.n.say(
            "applied examples/kueue/queues.yaml: ClusterQueues team-a and team-b (32 "
            "google.com/tpu each, cohort tpu), AdmissionCheck multislice-gang (Active: set by "
            "the operator), LocalQueues, WorkloadPriorityClasses"
        )
        self.n.mark("Kueue queues ready")
        for ns, queue, name in others(self.ns):
            other = demo_job(self.scenario)
            other["metadata"] = {
                "name": name,
                "namespace": ns,
                "labels": {keys.KUEUE_QUEUE_NAME: queue},
            }
            self.create_job(other)
            self.n.say(f"submitted {ns}/{name} (32 chips) to LocalQueue {queue}")
        deadline = time.monotonic() + self.args.timeout
        while True:
            phases = [self.status_of(ns, name).get("phase") for ns, _, name in others(self.ns)]
            if all(p in ("Provisioning", "Starting", "Running") for p in phases):
                break
            if time.monotonic() >= deadline:  # the scenario cannot show a wait: say why
                seen = ", ".join(
                    f"{ns}/{n} {p}" for (ns, _, n), p in zip(others(self.ns), phases, strict=True)
                )
                raise RuntimeError(f"both teams' jobs never held their quota together: {seen}")
            time.sleep(0.5)
        self.n.say("both teams' quota is in use: the next 32-chip job has to wait")
        self.n.mark("both teams' quota in use")

    def status_of(self, ns: str, name: str) -> dict[str, Any]:
        assert self.stack is not None
        try:
            obj: Any = client.CustomObjectsApi(self.stack.api).get_namespaced_custom_object(
                models.GROUP, models.VERSION, ns, models.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        st: dict[str, Any] = obj.get("status") or {}
        return st

    def status(self) -> dict[str, Any] | None:
        assert self.stack is not None
        try:
            obj: Any = client.CustomObjectsApi(self.stack.api).get_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL, JOB
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        st: dict[str, Any] = obj.get("status") or {}
        return st

    def watch(self, body: dict[str, Any]) -> dict[str, Any] | None:
        deadline = time.monotonic() + self.args.timeout
        last_phase = None
        while time.monotonic() < deadline:
            st = self.status()
            if st is None:
                self.n.say("the job is gone")
                return None
            self.show(st)
            self.events()
            phase = st.get("phase")
            if self.scenario.kueue and phase == "Queued":
                self.queued_seen = True
            if phase != last_phase:
                self.n.mark(f"phase {phase}")
                last_phase = phase
            self.inject(st)
            if phase in models.TERMINAL_PHASES and self.released():
                return st
            time.sleep(0.5)
        self.n.say(f"timed out after {self.args.timeout:.0f}s")
        return self.status()

    def show(self, st: dict[str, Any]) -> None:
        slices = "  ".join(
            f"[{s['index']}] {s.get('nodePool', '-')} {s.get('readyHosts', 0)}/{s['hosts']} "
            f"{s.get('phase')}"
            for s in st.get("slices", [])
        )
        line = (
            f"{st.get('phase', 'New'):<12} restarts={st.get('restarts', 0)}  {slices}\n"
            f"{'':>10}{st.get('message', '')}"
        )
        q = st.get("queue")
        if q:
            check = q.get("admissionCheck")
            line += (
                f"\n{'':>10}queue: LocalQueue {q.get('localQueue')} -> ClusterQueue "
                f"{q.get('clusterQueue') or '?'}, Workload {q.get('workload') or '-'}, "
                + (f"admission check {check}={q.get('checkState')}" if check else "no check")
                + f", node pools of the job: {len(self.job_pools())}"
            )
        if line != self.last_line:
            self.n.say(line)
            self.last_line = line

    def events(self) -> None:
        """The job's and its JobSet's events (one name), and its Kueue Workload's."""
        assert self.stack is not None
        core = client.CoreV1Api(self.stack.api)
        items = [
            e
            for name in (JOB, workload_name(JOB))
            for e in core.list_namespaced_event(
                self.ns, field_selector=f"involvedObject.name={name}"
            ).items
        ]
        for e in sorted(items, key=lambda e: str(e.last_timestamp or e.event_time or "")):
            key = str(e.metadata.uid)
            if key in self.seen_events:
                continue
            self.seen_events.add(key)
            source = (
                "operator"
                if e.source and e.source.component == "multislice-operator"
                else ("kueue" if e.involved_object.kind == "Workload" else "jobset")
            )
            self.n.say(f"  event {e.type:<7} {e.reason} ({source}): {e.message}")
            if e.reason in (
                "Queued",
                "GangRolledBack",
                "GangProvisioned",
                "SliceLost",
                "RestartingAllSlices",
                "MaintenanceScheduled",
                "CheckpointRequested",
                "CheckpointSaved",
                "ShrinkingSlices",
                "GrowingSlices",
                "FallbackMoved",
            ):
                self.n.mark(e.reason)

    # -- scenario actions ------------------------------------------------------------------

    def inject(self, st: dict[str, Any]) -> None:
        self.play(st)
        # After the scenario's own move: starting four JAX processes takes seconds on a loaded
        # machine, and the restart scenario's pods run 8 s: a failure injected after that found
        # them finished (the job Succeeded with 0 restarts, seen in a fresh-clone run).
        if self.args.run_workload and self.workload is None and st.get("phase") == "Running":
            self.start_workload()

    def play(self, st: dict[str, Any]) -> None:
        """The scenario's move on this pass, if any."""
        if self.scenario.name in ("preflight", "fallback"):
            self.play_compile()
            return
        if self.scenario.name == "maintenance":
            self.maintenance(st)
            return
        if self.scenario.name == "elastic":
            self.elastic(st)
            return
        if self.scenario.name == "inplace":
            self.inplace(st)
        if self.scenario.name == "ironwood":
            self.ironwood(st)
            return
        if self.injected:
            return
        assert self.stack is not None and self.stack.sim is not None
        name = self.scenario.name
        if name == "delete" and st.get("phase") == "Provisioning":
            self.injected = True
            self.n.say("deleting the job while its node pools are being created")
            self.n.mark("delete requested")
            client.CustomObjectsApi(self.stack.api).delete_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL, JOB
            )
        elif st.get("phase") == "Running" and name in ("restart", "fatal", "preemption"):
            self.injected = True
            if name == "preemption":
                pool = node_pool_name(self.ns, JOB, 1)
                self.n.say(f"preempting spot node pool {pool} (slice 1): its nodes disappear")
                self.stack.sim.preempt(pool, recreate_after_s=None)
                self.n.mark("slice 1 preempted")
                return
            pod = self.victim()
            code = RETRYABLE_EXIT if name == "restart" else FATAL_EXIT
            kind = "retryable" if name == "restart" else "non-retryable"
            self.n.say(f"making pod {pod} (slice 1) exit with {kind} code {code}")
            message = None
            if name == "restart":  # what the workload writes on exit (its termination message)
                said = {"v": 1, "reason": "crash", "exitCode": code, **LAST_STEPS}
                message = json.dumps(said)
                step, saved = LAST_STEPS["step"], LAST_STEPS["checkpointStep"]
                self.n.say(
                    f"  its termination message: last step {step}, last checkpoint at step "
                    f"{saved}: every slice restarts and resumes from that checkpoint in the "
                    f"job's checkpoint directory, training steps {saved + 1}-{step} again "
                    f"({step - saved} steps lost)"
                )
            fail_pod(self.stack.api, self.ns, pod, code, message=message)
            self.n.mark(f"pod failed with exit {code}")

    def inplace(self, st: dict[str, Any]) -> None:
        """Play the agents (every pass), then a program failure restarted in place, then a
        preemption recreated (docs/demo.md says what is played)."""
        assert self.stack is not None and self.stack.sim is not None
        if st.get("phase") not in ("Running", "Restarting"):
            return
        if self.agents is None:
            self.agents = AgentPlayer(self.ns, JOB)
            cond = {c["type"]: c for c in st.get("conditions") or []}.get("RestartInPlace", {})
            self.n.say(f"RestartInPlace={cond.get('status')} ({cond.get('message')})")
        for line in self.agents.step(self.stack.api):
            self.n.say(f"  agent {line}")
        js = self.jobset_status() or {}
        current = js.get("currentInPlaceRestartAttempt")
        if self.inplace_stage == "fail" and current == 0:
            self.inplace_before = self.pod_places()
            pod = self.victim()
            self.n.say(
                f"the program of pod {pod} (slice 1) exits 17: its RestartAllContainers "
                "rule fires (kwok plays the kubelet)"
            )
            restart_all_containers(self.stack.api, self.ns, pod, RETRYABLE_EXIT)
            self.n.mark("program failure: restart in place")
            self.inplace_stage = "in-place"
        elif self.inplace_stage == "in-place" and current == 1:
            after = self.pod_places()
            kept = after == self.inplace_before
            self.n.say(
                f"every pod restarted in place on attempt 1: same names, UIDs and nodes "
                f"{'yes' if kept else 'NO'}; JobSet restarts {js.get('restarts', 0)}"
            )
            self.n.mark("restarted in place")
            pool = node_pool_name(self.ns, JOB, 1)
            self.n.say(
                f"preempting spot node pool {pool} (slice 1): its pods are gone, so "
                "every pod is recreated"
            )
            self.stack.sim.preempt(pool, recreate_after_s=None)
            self.n.mark("slice 1 preempted")
            self.inplace_stage = "done"

    def jobset_status(self) -> dict[str, Any] | None:
        assert self.stack is not None
        try:
            js: Any = client.CustomObjectsApi(self.stack.api).get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", self.ns, "jobsets", JOB
            )
        except client.ApiException:
            return None
        return dict(js.get("status") or {})

    def pod_places(self) -> dict[str, tuple[str, str]]:
        assert self.stack is not None
        pods: list[Any] = (
            client.CoreV1Api(self.stack.api)
            .list_namespaced_pod(self.ns, label_selector=f"{keys.JOBSET_NAME}={JOB}")
            .items
        )
        return {p.metadata.name: (p.metadata.uid, p.spec.node_name) for p in pods}

    def job_slices(self) -> list[dict[str, Any]]:
        """The job's GKE Slices (cluster-scoped, labelled with the job)."""
        assert self.stack is not None
        selector = f"{keys.JOB_NAMESPACE}={self.ns},{keys.JOB_NAME}={JOB}"
        api: Any = client.CustomObjectsApi(self.stack.api)
        found = api.list_cluster_custom_object(
            keys.SLICE_GROUP, keys.SLICE_VERSION, keys.SLICE_PLURAL, label_selector=selector
        )
        return list(found["items"])

    def ironwood(self, st: dict[str, Any]) -> None:
        """Play GKE: once both Slices are ACTIVE and the job runs, fail a cube of slice 1's; then
        watch the operator make the failed cube's pool again on the free sub-block."""
        if self.injected:
            self.spare_replaced()
            return
        if st.get("phase") != "Running":
            return
        assert self.stack is not None and self.stack.sim is not None
        slices = sorted(self.job_slices(), key=lambda o: o["metadata"]["name"])
        for o in slices:
            ready = [c for c in o.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
            state = ready[0].get("reason") if ready else "-"
            self.n.say(
                f"  Slice {o['metadata']['name']} {o['spec']['topology']} {state} "
                f"partitionIds {o['spec']['partitionIds']}"
            )
        if len(slices) != 2:
            return
        self.injected = True
        self.cubes_before = {c["partitionId"] for c in self.stack.sim.cubes() if c["pool"]}
        cube = slices[1]["spec"]["partitionIds"][0]
        self.n.say(f"cube {cube} under Slice {slices[1]['metadata']['name']} fails (UNHEALTHY)")
        self.stack.sim.set_cube_state(cube, "UNHEALTHY")
        self.failed_cube = cube
        self.n.mark("a cube failed")

    def spare_replaced(self) -> None:
        """Once: the job's three cube pools on healthy cubes again, none on the failed one."""
        if self.spare_back or not self.failed_cube:
            return
        assert self.stack is not None and self.stack.sim is not None
        cubes = [c for c in self.stack.sim.cubes() if f"/{IRONWOOD_RESERVATION}/" in c["path"]]
        held = [c for c in cubes if c["pool"]]
        if len(held) != 3 or not all(c["state"] == "HEALTHY" and c["nodesReady"] for c in held):
            return
        new = next(c for c in held if c["partitionId"] not in self.cubes_before)
        self.spare_back = True
        self.n.say(
            f"the failed cube's pool was made again on sub-block {new['subBlock']} "
            f"({new['partitionId']}): the job has its spare cube back"
        )
        self.n.mark("spare cube made again")

    def maintenance(self, st: dict[str, Any]) -> None:
        """Play GKE (the node labels, then the host event) and the workload (the checkpoint)."""
        assert self.stack is not None
        pool = node_pool_name(self.ns, JOB, 1)
        stage = self.maintenance_stage
        if stage == "announce" and st.get("phase") == "Running":
            self.maintenance_at = int(time.time()) + MAINTENANCE_IN_S
            when = time.strftime("%H:%M:%S", time.gmtime(self.maintenance_at))
            self.n.say(
                f"GKE announces host maintenance on slice 1 ({pool}) at {when}Z: label "
                f"{keys.GKE_SCHEDULED_MAINTENANCE_TIME}={self.maintenance_at} on its nodes"
            )
            label_nodes(
                self.stack.api,
                pool,
                {keys.GKE_SCHEDULED_MAINTENANCE_TIME: str(self.maintenance_at)},
            )
            self.n.mark("maintenance announced")
            self.maintenance_stage = "checkpoint"
        elif stage == "checkpoint" and (st.get("checkpoint") or {}).get("podsAnnotated", 0) >= 8:
            cp = st["checkpoint"]
            pod = self.pod_of(0)
            self.n.say(
                f"every pod has {keys.CHECKPOINT_REQUEST}={cp['requestId']}: the workload agrees "
                f"on step {SAVED_STEP}, every process saves there, process 0 acknowledges on {pod}"
            )
            ack = json.dumps({"id": cp["requestId"], "step": SAVED_STEP})
            client.CoreV1Api(self.stack.api).patch_namespaced_pod(
                pod, self.ns, {"metadata": {"annotations": {keys.CHECKPOINT_SAVED: ack}}}
            )
            self.maintenance_stage = "host-event"
        elif (
            stage == "host-event"
            and (st.get("checkpoint") or {}).get("savedStep") is not None
            and self.maintenance_at is not None
            and time.time() >= self.maintenance_at
        ):
            self.n.say(
                "the maintenance window opens: GKE's graceful node shutdown stops slice 1's hosts "
                "(pods Failed with DisruptionTarget TerminationByKubelet, exit 143 after their "
                f"checkpoint at step {SAVED_STEP})"
            )
            label_nodes(self.stack.api, pool, {keys.GKE_ACTIVE_NODE_MAINTENANCE: "ONGOING"})
            said = json.dumps(
                {
                    "v": 1,
                    "reason": "preempted",
                    "exitCode": 143,
                    "step": SAVED_STEP,
                    "checkpointStep": SAVED_STEP,
                }
            )
            for pod in self.pods_of(1):
                fail_pod(self.stack.api, self.ns, pod, 143, message=said, disruption=NODE_SHUTDOWN)
            self.n.mark("maintenance: slice 1 stopped")
            self.maintenance_stage = "done"
        elif stage == "done" and int(st.get("restarts") or 0) >= 1:
            self.n.say("maintenance over: GKE removes the labels; the hosts are back")
            label_nodes(
                self.stack.api,
                pool,
                {keys.GKE_SCHEDULED_MAINTENANCE_TIME: None, keys.GKE_ACTIVE_NODE_MAINTENANCE: None},
            )
            self.maintenance_stage = "over"

    def elastic(self, st: dict[str, Any]) -> None:
        """Play GKE (the preemption, a stockout held on its replacement, then capacity back)
        and the workload's process 0 (the checkpoint before the grow)."""
        assert self.stack is not None and self.stack.sim is not None
        stage, full, fewer = self.elastic_stage, ELASTIC_SLICES, ELASTIC_MIN
        if stage == "preempt" and self.running_on(st, full):
            pool = node_pool_name(self.ns, JOB, 1)
            jobs = sorted({self.replicated_job_of(pod) for pod in self.pods_on(pool)})
            self.n.say(
                f"GKE preempts spot node pool {pool} (slice 1; busy: the pods of "
                f"{', '.join(jobs)} run there): its nodes disappear, and every create of a "
                "replacement ends in GCE_STOCKOUT (held)"
            )
            self.stack.sim.set_faults(stockout_next=1000)
            self.stack.sim.preempt(pool, recreate_after_s=None)
            self.elastic_victim = pool
            self.n.mark("slice 1's pool preempted, stockout held")
            self.elastic_stage = "shrunk"
        elif stage == "shrunk" and self.running_on(st, fewer):
            degraded = next(c for c in st.get("conditions") or [] if c["type"] == "Degraded")
            rjob, env = self.jobset_template()
            self.n.say(
                f"running on {fewer} slices: status.activeSlices={st.get('activeSlices')}, "
                f"condition Degraded={degraded['status']} ({degraded['reason']}): "
                f"{degraded.get('message', '')}"
            )
            self.n.say(
                f"  the JobSet was recreated with replicas={rjob['replicas']}, its pod template "
                f"says MEGASCALE_NUM_SLICES={env.get('MEGASCALE_NUM_SLICES')}, "
                f"JAX_PROCESS_COUNT={env.get('JAX_PROCESS_COUNT')}; pool {self.elastic_victim} "
                "is still being replaced"
            )
            self.n.mark(f"running on {fewer} of {full} slices")
            self.n.say("the stockout ends: GKE has v5e capacity again for the replacement pool")
            self.stack.sim.clear_faults()
            self.n.mark("stockout over")
            self.elastic_stage = "checkpoint"
        elif stage == "checkpoint":
            cp = st.get("checkpoint") or {}
            rid = str(cp.get("requestId") or "")
            pods = fewer * int(st["slices"][0]["hosts"])  # every pod of the 3-slice JobSet
            pod = None
            if rid.startswith(f"grow-{full}-") and cp.get("podsAnnotated", 0) >= pods:
                pod = self.asked_pod(rid)
            if pod is None:
                return
            self.n.say(
                f"the replacement pool is Ready: before growing the operator asks for a "
                f"checkpoint, {keys.CHECKPOINT_REQUEST}={rid} on {cp.get('podsAnnotated', 0)} pods"
            )
            self.n.say(
                f"  the workload (played by the demo: the pods are kwok fakes) saves at step "
                f"{SAVED_STEP}; process 0 acknowledges on {pod} ({keys.CHECKPOINT_SAVED})"
            )
            ack = json.dumps({"id": rid, "step": SAVED_STEP})
            client.CoreV1Api(self.stack.api).patch_namespaced_pod(
                pod, self.ns, {"metadata": {"annotations": {keys.CHECKPOINT_SAVED: ack}}}
            )
            self.n.mark("grow checkpoint acknowledged")
            self.elastic_stage = "grown"
        elif stage == "grown" and self.running_on(st, full):
            degraded = next(c for c in st.get("conditions") or [] if c["type"] == "Degraded")
            rjob, env = self.jobset_template()
            self.n.say(
                f"running on all {full} slices again: activeSlices={st.get('activeSlices')}, "
                f"Degraded={degraded['status']} ({degraded['reason']}), JobSet "
                f"replicas={rjob['replicas']}, MEGASCALE_NUM_SLICES="
                f"{env.get('MEGASCALE_NUM_SLICES')}"
            )
            self.n.mark(f"running on {full} slices again")
            self.elastic_stage = "done"

    def running_on(self, st: dict[str, Any], slices: int) -> bool:
        """Running on `slices` slices, each of them with its pods running."""
        if st.get("phase") != "Running" or st.get("activeSlices", ELASTIC_SLICES) != slices:
            return False
        hosts = st["slices"][0]["hosts"]
        every = all(len(self.pods_of(i)) == hosts for i in range(slices))
        return every and not self.pods_of(slices)

    def pods_on(self, pool: str) -> list[Any]:
        """The job's running pods on the nodes of node pool `pool`."""
        assert self.stack is not None
        core = client.CoreV1Api(self.stack.api)
        nodes: list[Any] = core.list_node(label_selector=f"{keys.GKE_NODEPOOL}={pool}").items
        names = {str(n.metadata.name) for n in nodes}
        pods: list[Any] = core.list_namespaced_pod(
            self.ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={JOB}"
        ).items
        return [p for p in pods if p.status.phase == "Running" and p.spec.node_name in names]

    @staticmethod
    def replicated_job_of(pod: Any) -> str:
        """The JobSet's child Job a pod belongs to (llm-v5e-slice-<job index>)."""
        labels = pod.metadata.labels or {}
        return str(labels.get("batch.kubernetes.io/job-name", pod.metadata.name))

    def asked_pod(self, rid: str) -> str | None:
        """Process 0's pod once it carries checkpoint request `rid` (None before)."""
        assert self.stack is not None
        pods: list[Any] = (
            client.CoreV1Api(self.stack.api)
            .list_namespaced_pod(self.ns, label_selector="jobset.sigs.k8s.io/job-index=0")
            .items
        )
        running = sorted(
            (p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp),
            key=lambda p: str(p.metadata.name),
        )
        if (
            not running
            or (running[0].metadata.annotations or {}).get(keys.CHECKPOINT_REQUEST) != rid
        ):
            return None
        return str(running[0].metadata.name)

    def jobset_template(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The JobSet's replicated job and its container's environment (the values set)."""
        assert self.stack is not None
        js: Any = client.CustomObjectsApi(self.stack.api).get_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", self.ns, "jobsets", JOB
        )
        rjob: dict[str, Any] = js["spec"]["replicatedJobs"][0]
        container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
        return rjob, {e["name"]: e.get("value") for e in container.get("env") or []}

    def pods_of(self, slice_index: int) -> list[str]:
        assert self.stack is not None
        pods: list[Any] = (
            client.CoreV1Api(self.stack.api)
            .list_namespaced_pod(
                self.ns, label_selector=f"jobset.sigs.k8s.io/job-index={slice_index}"
            )
            .items
        )
        return sorted(str(p.metadata.name) for p in pods if p.status.phase == "Running")

    def pod_of(self, slice_index: int) -> str:
        return self.pods_of(slice_index)[0]

    def victim(self) -> str:
        assert self.stack is not None
        core = client.CoreV1Api(self.stack.api)
        pods: list[Any] = core.list_namespaced_pod(
            self.ns, label_selector="jobset.sigs.k8s.io/job-index=1"
        ).items
        return str(sorted(str(p.metadata.name) for p in pods)[0])

    def job_pools(self) -> list[str]:
        assert self.stack is not None and self.stack.sim is not None
        prefix = node_pool_name(self.ns, JOB, 0)[:-2]
        return [p for p in self.stack.sim.pools() if p.startswith(prefix)]

    def released(self) -> bool:
        assert self.stack is not None and self.stack.sim is not None
        return not self.stack.sim.pools()

    # -- spec.preflight (the preflight scenario) ----------------------------------------------

    def preflight_refusal(self, body: dict[str, Any]) -> bool:
        """The job with its model replicated on every chip: refused before any node pool; then
        deleted, so that the same job with FSDP can run."""
        assert self.stack is not None and self.stack.sim is not None
        big = copy.deepcopy(body)
        big["spec"]["parallelism"]["ici"] = dict(REPLICATED)
        self.n.say("first with ICI data parallelism 16: every chip holds the whole model")
        self.apply(big)
        st = self.watch(big) or {}
        conds: list[dict[str, Any]] = st.get("conditions") or []
        failed: dict[str, Any] = next((c for c in conds if c.get("type") == "Failed"), {})
        creates = int(self.stack.sim.counters()["calls"].get("create_node_pool", 0))
        if failed.get("reason") != "PreflightFailed" or creates:
            self.n.say(
                f"OUTCOME NOT REACHED: phase {st.get('phase')} ({failed.get('reason')}), "
                f"{creates} node pool creates; expected PreflightFailed and none"
            )
            return False
        self.n.say(f"refused before any node pool (0 created): {failed.get('message')}")
        self.n.mark("refused by the preflight")
        client.CustomObjectsApi(self.stack.api).delete_namespaced_custom_object(
            models.GROUP, models.VERSION, self.ns, models.PLURAL, JOB
        )
        deadline = time.monotonic() + 60
        while self.exists(self.ns, JOB) and time.monotonic() < deadline:
            time.sleep(0.5)
        self.n.say("the same job with FSDP over the 16 chips of each slice (ici fsdp 16)")
        return True

    def play_compile(self) -> None:
        """The compile Job's pod, played (kwok runs nothing; multislice_local/preflight.py):
        its command runs here with its environment, its exit code and termination message are
        written into the pod's status as the kubelet would."""
        from multislice_local.preflight import compile_pod, finish_compile_pod, run_compile

        assert self.stack is not None
        pod = compile_pod(self.stack.api, self.ns, f"{JOB}-preflight")
        if pod is None or pod["metadata"]["uid"] in self.compiles_played:
            return
        self.compiles_played.add(pod["metadata"]["uid"])
        command = pod["spec"]["containers"][0].get("command") or []
        shape = (pod["metadata"].get("labels") or {}).get(SHAPE_LABEL)
        of = "" if shape is None else (f" of shape {shape}" if shape else " of the job's own shape")
        self.n.say(f"compile Job {JOB}-preflight{of} (CPU, no TPU), run here: {' '.join(command)}")
        code, message = run_compile(pod)
        self.n.say(f"  exit {code}: {message[-400:] or '(no message)'}")
        finish_compile_pod(self.stack.api, self.ns, pod, code, message)
        self.n.mark(f"compile exit {code}")

    # -- provisioning.mode Fallback (the fallback scenario) ----------------------------------

    def fallback_first(self, second: dict[str, Any]) -> bool:
        """The first job: no VM free in the reservation, no flex-start capacity, spot has it; it
        runs on spot. Then deleted, so that the second job (`second`: the shapes) can run."""
        assert self.stack is not None and self.stack.sim is not None
        sim = self.stack.sim
        sim.set_capacity(f"reservation/{FALLBACK_RESERVATION}", 0, project=PROJECT)
        sim.set_capacity(f"{ZONE}/FlexStart", 0)
        self.n.say(
            f"GKE simulator: reservation {FALLBACK_RESERVATION} has 0 VMs free, zone {ZONE} 0 "
            "flex-start TPU chips (a flex-start pool waits for capacity, as Dynamic Workload "
            "Scheduler queues it), spot is not limited"
        )
        first = fallback_first_job(self.ns)
        tries = "; ".join(
            f"{o['capacity']['type']} for {o['trySeconds']}s" for o in FALLBACK_OPTIONS
        )
        self.n.say(f"first job: provisioning.mode Fallback, options in order: {tries}")
        before = len(sim.received_creates())
        self.apply(first)
        st = self.watch(first) or {}
        problems = self.fallback_capacity_problems(st, self.creates_since(before))
        if problems:
            self.n.say("OUTCOME NOT REACHED (first job): " + "; ".join(problems))
            return False
        self.n.mark("first job: ran on spot")
        client.CustomObjectsApi(self.stack.api).delete_namespaced_custom_object(
            models.GROUP, models.VERSION, self.ns, models.PLURAL, JOB
        )
        deadline = time.monotonic() + 60
        while self.exists(self.ns, JOB) and time.monotonic() < deadline:
            time.sleep(0.5)
        self.fallback_creates_before = len(sim.received_creates())
        shapes = "; ".join(
            f"{o['capacity']['type']}, shape {o.get('shape', 'its own')}"
            for o in FALLBACK_SHAPE_OPTIONS
        )
        self.n.say(
            "second job: spec.preflight, options in order: "
            f"{shapes}; each shape is compiled before its first option is tried"
        )
        return True

    def creates_since(self, before: int) -> list[Create]:
        """(capacity type label, machine type, TPU topology) of every node-pool create the
        simulator received after the first `before`, accepted or not."""
        assert self.stack is not None and self.stack.sim is not None
        found = []
        for c in self.stack.sim.received_creates()[before:]:
            pool = c.get("nodePool") or {}
            config = pool.get("config") or {}
            found.append(
                (
                    str((config.get("labels") or {}).get(keys.CAPACITY_TYPE, "-")),
                    str(config.get("machineType", "-")),
                    str((pool.get("placementPolicy") or {}).get("tpuTopology", "-")),
                )
            )
        return found

    def fallback_shown(self, st: dict[str, Any], creates: list[Create]) -> None:
        """status.fallback and the node-pool creates the simulator received, said."""
        fb: dict[str, Any] = st.get("fallback") or {}
        ran = int(fb.get("option", 0))
        self.n.say(f"status.fallback: round {fb.get('round')}, option {ran + 1} tried last")
        for o in fb.get("options") or []:
            left = o.get("lastLeft")
            said = str(o.get("message") or "")[:240]
            how = f"left: {left} ({said})" if left else "the job ran on it"
            self.n.say(
                f"  option {o['option'] + 1} ({o['what']}): {o.get('attempts', 0)} attempt(s), "
                f"waited {o.get('waitedSeconds', 0)}s, {how}"
            )
        gib = 1024**3
        for sh in fb.get("shapes") or []:
            need, has = sh.get("hbmBytesPerDevice"), sh.get("hbmCapacityBytes")
            hbm = f"{need / gib:.2f} of {has / gib:.2f} GiB HBM per device" if need and has else ""
            verdict = "fits" if sh.get("fits") else "refused by the compiler"
            self.n.say(f"  shape {sh.get('name') or '(its own)'} ({sh.get('what')}): {verdict}"
                       + (f", {hbm}" if hbm else ""))  # fmt: skip
        counts: dict[Create, int] = {}
        for c in creates:
            counts[c] = counts.get(c, 0) + 1
        self.n.say(
            "node-pool creates the GKE simulator received for it: "
            + (", ".join(f"{n} x {c[0]} {c[1]} {c[2]}" for c, n in counts.items()) or "none")
        )

    def fallback_capacity_problems(self, st: dict[str, Any],
                                   creates: list[Create]) -> list[str]:  # fmt: skip
        assert self.stack is not None and self.stack.sim is not None
        self.fallback_shown(st, creates)
        held = self.stack.sim.capacity()[f"{ZONE}/FlexStart"]["held"]
        problems = fallback_first_problems(st, creates, held)
        if not problems:
            self.n.say(
                "first job: the reservation was left at GKE's 429, flex-start when its "
                f"{FLEX_TRY_S}s ran out (its pools waited with 0 nodes, then were deleted), "
                "and it ran on spot"
            )
        return problems

    def fallback_shapes_problems(self, st: dict[str, Any]) -> list[str]:
        creates = self.creates_since(self.fallback_creates_before)
        self.fallback_shown(st, creates)
        problems = fallback_second_problems(st, creates)
        if not problems:
            self.n.say(
                f"second job: 0 node-pool creates for shape {REFUSED_SHAPE} (the compiler "
                "refused it: no pool ever made), and it ran on the v6e-32 slice"
            )
        return problems

    # -- the real workload (--run-workload) --------------------------------------------------

    def pod_env(self) -> dict[str, str]:
        """The environment the operator injected, as one of the JobSet's pods would see it."""
        assert self.stack is not None
        core = client.CoreV1Api(self.stack.api)
        pods: list[Any] = core.list_namespaced_pod(
            self.ns, label_selector=f"multislice.dev/job-name={JOB}"
        ).items
        pod = sorted(pods, key=lambda p: str(p.metadata.name))[0]
        meta = {
            "metadata.name": pod.metadata.name,
            **{
                f"metadata.annotations['{k}']": v
                for k, v in (pod.metadata.annotations or {}).items()
            },
            **{f"metadata.labels['{k}']": v for k, v in (pod.metadata.labels or {}).items()},
        }
        env: dict[str, str] = {}
        for var in pod.spec.containers[0].env or []:
            if var.value is not None:
                env[var.name] = var.value
            elif var.value_from and var.value_from.field_ref:
                env[var.name] = meta.get(var.value_from.field_ref.field_path, "")
        return env

    def start_workload(self) -> None:
        from multislice_workload import prepare
        from multislice_workload.env import CHECKPOINT_DIR, SETTLE_SAVE_AT_STEP

        env = self.pod_env()
        # The job's directory (gs://...) is not reachable here: the same local one for every
        # process and attempt, so the restart resumes from it.
        ckpt = tempfile.mkdtemp(prefix="msj-demo-ckpt-")
        job_dir = env.get(CHECKPOINT_DIR)
        env[CHECKPOINT_DIR] = ckpt
        corpus = Path(tempfile.mkdtemp(prefix="msj-demo-corpus-"))
        manifest = prepare.prepare(
            prepare.builtin_documents(["python-docs"]), corpus, vocab_size=DEMO_VOCAB
        )
        self.n.say(
            f"--run-workload: corpus prepared in {corpus}: the Python Language Reference CPython "
            f"ships, {manifest['splits']['train']['tokens']:,} training and "
            f"{manifest['splits']['eval']['tokens']:,} held-out tokens in ArrayRecord shards, a "
            f"{manifest['vocab_size']}-token BPE tokenizer trained on it"
        )
        slices, hosts = int(env["MEGASCALE_NUM_SLICES"]), int(env["MULTISLICE_HOSTS_PER_SLICE"])
        chips = int(env["MULTISLICE_CHIPS_PER_HOST"])
        shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith("MEGASCALE"))
        self.n.say(f"--run-workload: real JAX training with the injected environment ({shown})")
        in_place = self.scenario.name == "inplace"
        how = (
            "every process restarts in place (the same pods: the same coordinator address and "
            "port) and resumes"
            if in_place
            else "every process restarts"
        )
        self.n.say(
            f"  {slices} slices x {hosts} hosts x {chips} CPU devices; process {slices * hosts - 1}"
            f" crashes at step {WORKLOAD_CRASH_STEP} and {how} from the last checkpoint"
        )
        self.n.say(f"  checkpoints in {ckpt} (the job names {job_dir}: no cloud here)")
        train_args = workload_args(corpus)
        # The last checkpoint before the crash (in place it settles before the next step, so
        # the crash cannot race it and the step restored is known).
        settled = WORKLOAD_CRASH_STEP - WORKLOAD_CRASH_STEP % WORKLOAD_CHECKPOINT_EVERY
        self.workload = BackgroundLaunch(
            self.args.timeout,
            slices=slices,
            hosts_per_slice=hosts,
            devices_per_host=chips,
            args=train_args,
            extra_env=env,
            max_restarts=3,
            fail_process=slices * hosts - 1,
            fail_at_step=WORKLOAD_CRASH_STEP,
            checkpoint_dir=ckpt,
            job_name=JOB,
            echo=self.n.out,
            restart="in_place" if in_place else "recreate",
            faults={p: {SETTLE_SAVE_AT_STEP: str(settled)} for p in range(slices * hosts)}
            if in_place
            else None,
        )
        self.workload.start()
        self.n.mark("workload started")
        self.n.say(f"  the workload's deadline: {self.args.timeout:.0f} s from now (--timeout)")

    def workload_result(self, workload: BackgroundLaunch) -> bool:
        """The launcher's verdict, waited for (`BackgroundLaunch`)."""
        result, missing = workload.wait()
        if result is None:
            self.n.say(f"WORKLOAD OUTCOME NOT REACHED: {missing}")
            return False
        restored = [e.get("step") for e in result.events_named("restored")]
        for t, what in result.timeline:
            self.n.say(f"  workload {t:6.1f}s  {what}")
        curve = loss_curve(result.events_named("step"))
        held_out = loss_curve(result.events_named("eval"))
        self.n.say("  training loss by step: " + ", ".join(f"{s}: {v:.3f}" for s, v in curve))
        self.n.say("  held-out loss by step: " + ", ".join(f"{s}: {v:.3f}" for s, v in held_out))
        learned = len(curve) >= 2 and curve[-1][1] < curve[0][1]
        self.n.say(
            f"workload: exit {result.exit_code}, {result.restarts} restart(s), "
            f"restored from step {restored[-1] if restored else '-'}, loss "
            f"{'went down' if learned else 'did NOT go down'}; logs in {result.log_dir}"
        )
        problems = workload_problems(result, restored, learned, self.args.timeout)
        if self.scenario.name == "inplace" and not self.in_place_restart_shown(result):
            problems.append("the in-place restart was not shown")
        if problems:
            self.n.say("WORKLOAD OUTCOME NOT REACHED: " + "; ".join(problems))
        return not problems

    def in_place_restart_shown(self, result: Any) -> bool:
        """The workload's half of the in-place restart: per attempt, the coordinator address JAX
        joined, the step it restored, the train step's compile seconds and cache hits (process
        0's: JAX writes the cache from process 0 only, and on CPU the other processes' keys
        differ). Required: one address for both attempts, a restore from the last checkpoint
        attempt 0 made durable, and cache hits on attempt 1."""
        rows = {a: in_place_row(result, a) for a in (0, 1)}
        for attempt, row in rows.items():
            self.n.say(
                f"  attempt {attempt}: coordinator {row['coordinator']}, "
                + ("fresh start" if row["restored"] is None else f"restored step {row['restored']}")
                + f", train step compiled in {row['compile_seconds']} s, "
                f"{row['cache_hits']} compilation-cache hits (process 0)"
            )
        saved = [e["step"] for e in result.events_named("checkpoint_saved", 0)]
        problems = []
        if rows[0]["coordinator"] is None or rows[0]["coordinator"] != rows[1]["coordinator"]:
            problems.append("the coordinator address changed (or was not reported)")
        if not saved or rows[1]["restored"] != max(saved):
            problems.append(f"attempt 1 restored step {rows[1]['restored']}, not {saved[-1:]}")
        if not rows[1]["cache_hits"]:
            problems.append("no compilation-cache hit on attempt 1")
        if None in (rows[0]["compile_seconds"], rows[1]["compile_seconds"]):
            problems.append("compile seconds not reported")
        self.n.say(
            "workload in place: "
            + (
                "; ".join(problems)
                if problems
                else "same coordinator, "
                "resumed from the last checkpoint, programs loaded from the compilation cache"
            )
        )
        return not problems

    # -- the end ---------------------------------------------------------------------------

    def timeline(self) -> None:
        self.n.say("timeline:")
        prev = 0.0
        for t, what in self.n.marks:
            self.n.say(f"  {t:7.1f}s  (+{t - prev:5.1f}s)  {what}")
            prev = t

    def check(self, st: dict[str, Any] | None) -> bool:
        assert self.stack is not None and self.stack.sim is not None
        s = self.scenario
        problems = []
        if s.expect_phase is None:
            if st is not None:
                problems.append("the job still exists")
        elif st is None:
            problems.append("the job disappeared")
        else:
            if st.get("phase") != s.expect_phase:
                problems.append(f"phase {st.get('phase')}, expected {s.expect_phase}")
            if int(st.get("restarts") or 0) < s.expect_restarts:
                problems.append(f"restarts {st.get('restarts')}, expected {s.expect_restarts}")
            if s.name == "maintenance":
                problems += self.maintenance_problems(st)
            if s.name == "elastic":
                problems += self.elastic_problems(st)
            if s.name == "ironwood":
                problems += self.ironwood_restarts(st)
            if s.name == "fallback":
                problems += self.fallback_shapes_problems(st)
        pools = self.stack.sim.pools()
        if pools:
            problems.append(f"node pools left: {', '.join(pools)}")
        if s.name == "ironwood":
            problems += self.ironwood_problems()
        nodes = self.fake_nodes()
        if nodes:
            problems.append(f"fake TPU nodes left: {len(nodes)}")
        if s.kueue:
            if not self.queued_seen:
                problems.append("the job was never seen Queued")
            # Judged where it happens: the Workload read as each create reaches the simulator
            # (a status read and a pool list side by side race the admission).
            creates = self.witness.for_job(f"{self.ns}/{JOB}")
            early = [c.pool for c in creates if not c.quota_reserved]
            if not creates:
                problems.append("no node-pool create of the job reached the simulator")
            elif early:
                problems.append(f"node pools created without quota: {sorted(early)}")
            else:
                self.n.say("the job held 0 node pools while queued: each was created with quota")
        if problems:
            self.n.say("OUTCOME NOT REACHED: " + "; ".join(problems))
            return False
        outcome = s.expect_phase or "deleted"
        self.n.say(f"outcome reached: {outcome}, 0 node pools and 0 TPU nodes left")
        return True

    def ironwood_restarts(self, st: dict[str, Any]) -> list[str]:
        """The lost cube restarts every slice once, as a disruption (not the workload's fault)."""
        by_cause = st.get("restartsByCause") or {}
        if by_cause.get("disruption") != 1 or by_cause.get("workload"):
            return [f"restarts by cause {by_cause}, expected 1 disruption"]
        return []

    def ironwood_problems(self) -> list[str]:
        problems = []
        if not self.injected:
            problems.append("no cube was failed (the Slices never both ran)")
        if "SliceLost" not in {what for _, what in self.n.marks}:
            problems.append("no SliceLost")
        if not self.spare_back:
            problems.append("the failed cube's pool was never made again on a healthy sub-block")
        left = [o["metadata"]["name"] for o in self.job_slices()]
        if left:
            problems.append(f"Slices left: {', '.join(left)}")
        return problems

    def maintenance_problems(self, st: dict[str, Any]) -> list[str]:
        problems = []
        by_cause = st.get("restartsByCause") or {}
        if by_cause.get("disruption") != 1 or by_cause.get("workload"):
            problems.append(f"restarts by cause {by_cause}, expected 1 disruption")
        if (st.get("checkpoint") or {}).get("savedStep") != SAVED_STEP:
            problems.append(f"checkpoint {st.get('checkpoint')}, expected step {SAVED_STEP} saved")
        lost = (st.get("lastRestart") or {}).get("lostSteps")
        if lost != 0:
            problems.append(f"{lost} steps lost, expected 0")
        if not problems:
            self.n.say(
                f"the maintenance cost a restart (cause disruption, maxRestarts 0 untouched) and "
                f"0 steps: the checkpoint at step {SAVED_STEP} was taken just before it"
            )
        return problems

    def elastic_problems(self, st: dict[str, Any]) -> list[str]:
        problems = []
        if self.elastic_stage != "done":
            problems.append(f"the story stopped before stage {self.elastic_stage}")
        by_cause = st.get("restartsByCause") or {}
        if by_cause.get("resize") != 2:
            problems.append(f"restarts by cause {by_cause}, expected 2 resize")
        g = st.get("goodput") or {}
        degraded = int(g.get("degradedChipSeconds") or 0)
        if degraded <= 0:
            problems.append("no degraded chip-seconds in status.goodput")
        if not problems:
            secs, chips = g.get("seconds") or {}, g.get("chipSeconds") or {}
            causes = ", ".join(f"{k} {n}" for k, n in sorted(by_cause.items()) if n)
            self.n.say(
                f"restarts {st.get('restarts')} ({causes}): the shrink and the grow are cause "
                "resize, charged to no budget; goodput: running "
                f"{secs.get('running', 0)}s ({chips.get('running', 0)} chip-seconds, of them "
                f"{degraded} degraded, on {ELASTIC_MIN} slices), repairing "
                f"{secs.get('repairing', 0)}s ({chips.get('repairing', 0)} chip-seconds)"
            )
        return problems

    def goodput(self) -> None:
        """The end of the story: where the job's TPU time went, as `multislice-operator status`
        shows it."""
        assert self.stack is not None
        try:
            obj: Any = client.CustomObjectsApi(self.stack.api).get_namespaced_custom_object(
                models.GROUP, models.VERSION, self.ns, models.PLURAL, JOB
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.n.say("goodput: the job was deleted, and its status with it")
            return
        from rich.console import Console

        from multislice_operator.cli import view

        self.n.say(f"where the TPU time went (multislice-operator status {JOB} -n {self.ns}):")
        view.render(view.view(obj, view.now_utc()), Console(file=self.n.out, highlight=False))

    def fake_nodes(self) -> list[str]:
        """The TPU nodes left: every one on our own cluster; on a borrowed one, those of the node
        pools this demo's simulator was asked for (the cluster may hold others' nodes)."""
        assert self.stack is not None and self.stack.sim is not None
        sim = self.stack.sim
        core = client.CoreV1Api(self.stack.api)

        def ours(pool: str) -> bool:
            if not self.borrowed:
                return True
            asked = {(c.get("body") or {}).get("nodePool", {}).get("name") for c in
                     sim.received_creates()}  # fmt: skip
            return pool in asked

        def names() -> list[str]:
            items: list[Any] = core.list_node(label_selector=keys.GKE_NODEPOOL).items
            return [
                str(n.metadata.name) for n in items if ours(n.metadata.labels[keys.GKE_NODEPOOL])
            ]

        deadline = time.monotonic() + 20
        while names() and time.monotonic() < deadline:  # node deletion trails the pool's
            time.sleep(0.5)
        return names()

    def keep(self) -> None:
        assert self.stack is not None and self.stack.cp is not None and self.stack.op is not None
        self.n.say("--keep: the cluster stays up until Ctrl-C")
        self.n.say(f"  export KUBECONFIG={self.stack.cp.kubeconfig}")
        self.n.say("  kubectl get msj -A ; kubectl describe msj -n demo")
        self.n.say(f"  operator metrics: {self.stack.op.metrics_url}")
        self.n.say(f"  GKE simulator: {self.stack.sim.url if self.stack.sim else '-'}/_sim/state")
        while True:
            time.sleep(3600)

    def stop(self) -> None:
        """Clean a borrowed cluster, then stop every process the demo started, even when the
        clean-up fails (a loaded apiserver once answered 504 and left the operator running)."""
        if self.stack is not None:
            try:
                if self.borrowed:
                    self.clean_borrowed()
            finally:
                self.n.say("stopping every process the demo started")
                self.stack.stop()
                self.stack = None

    def clean_borrowed(self) -> None:
        """Leave a borrowed cluster as found: the jobs deleted while our operator still runs (it
        releases their pools and lifts its finalizer), then the Kueue objects and namespaces
        the demo created."""
        assert self.stack is not None
        if not (self.created_jobs or self.created_namespaces or self.created_queue_objects):
            return
        self.n.say("deleting what the demo created on the borrowed cluster")
        custom = client.CustomObjectsApi(self.stack.api)
        for ns, name in self.created_jobs:
            try:
                custom.delete_namespaced_custom_object(
                    models.GROUP, models.VERSION, ns, models.PLURAL, name
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
            self.exists(ns, name) for ns, name in self.created_jobs
        ):
            time.sleep(0.5)
        from multislice_local import queues

        queues.delete(self.stack.api, self.created_queue_objects)
        core = client.CoreV1Api(self.stack.api)
        for ns in self.created_namespaces:
            try:
                core.delete_namespace(ns)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def exists(self, ns: str, name: str) -> bool:
        assert self.stack is not None
        try:
            client.CustomObjectsApi(self.stack.api).get_namespaced_custom_object(
                models.GROUP, models.VERSION, ns, models.PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="restart",
        help="; ".join(f"{s.name}: {s.summary}" for s in SCENARIOS.values()),
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="leave the cluster running (kubeconfig printed) until Ctrl-C",
    )
    p.add_argument(
        "--pool-latency",
        type=float,
        default=2.0,
        help="simulated seconds for a node-pool create/delete",
    )
    p.add_argument("--timeout", type=float, default=240.0, help="give up after this many seconds")
    p.add_argument(
        "--cluster",
        choices=["local", "kind"],
        default="local",
        help="local: the control plane built from Go modules (default); kind: needs Docker",
    )
    p.add_argument(
        "--kubeconfig",
        help="borrow this running cluster (the local cluster profile, kueue for the queue "
        "scenario; a session's in the e2e tests) instead of starting one: only the GKE simulator "
        "and the operator start, the operator watches only the demo's namespaces, and what the "
        "demo created is deleted at the end",
    )
    p.add_argument(
        "--namespace",
        default=NAMESPACE,
        help="the demo job's namespace (unique per run on a borrowed cluster)",
    )
    p.add_argument(
        "--run-workload",
        action="store_true",
        help="also run the real JAX workload locally with the environment the operator injected",
    )


def run_demo(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    def interrupted(_sig: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous: Callable[..., Any] | int | None = signal.signal(signal.SIGTERM, interrupted)
    try:
        if args.scenario == "multicluster":  # three clusters of its own: demo_multicluster.py
            from multislice_local import demo_multicluster

            try:
                return demo_multicluster.run(args, out)
            except KeyboardInterrupt:
                print("interrupted", file=out, flush=True)
                return 130
        if args.scenario == "real":  # real nodes and the chart: demo_real.py
            from multislice_local import demo_real

            return demo_real.run(args, out)
        demo = Demo(args, out)
        try:
            return demo.run()
        except KeyboardInterrupt:
            demo.n.say("interrupted")
            return 130
        finally:
            demo.stop()
    finally:
        signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)
