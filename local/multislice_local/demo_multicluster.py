"""`make demo SCENARIO=multicluster`: one Kueue queue in front of two clusters (MultiKueue).

A manager and workers a and b (:mod:`multislice_local.multicluster`: three real control planes,
each with Kueue v0.19.2 and the operator; a GKE simulator per worker). Worker a is stocked out
for every node pool; b has capacity. The job is applied on the manager with ``spec.managedBy:
kueue.x-k8s.io/multikueue``; the story is what the manager shows (phase, the cluster that runs it,
Kueue's events on its Workload) and what each worker tried. MultiKueue copies the Workload to both
workers at once: b may admit it first, or a may, fail to get the capacity, hand it back and leave
it to b. Either way the job must succeed on b, and nothing may be left on either worker.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from kubernetes import client

from multislice_local import queues
from multislice_local.demo import Narrator
from multislice_local.multicluster import MANAGER, MultiCluster, WorkerSpec, job_body
from multislice_operator.api import models
from multislice_operator.common import keys

NAMESPACE = "demo-multicluster"
JOB = "llm-anywhere"
CHECKPOINTS = "gs://my-bucket/llm-anywhere"
HANDED_BACK = "handed back to MultiKueue"


class Story:
    def __init__(self, mc: MultiCluster, n: Narrator) -> None:
        self.mc, self.n = mc, n
        self.said: set[str] = set()
        self.witness = {w: queues.QuotaWitness(s.sim, s.api).install()
                        for w, s in mc.workers.items()}  # fmt: skip
        self.creates_said = {w: 0 for w in mc.workers}
        self.events_seen: set[str] = set()
        self.phase: str | None = None
        self.first_admitted: str | None = None
        self.both_held: list[str] = []

    def once(self, key: str, message: str, mark: str | None = None) -> None:
        if key not in self.said:
            self.said.add(key)
            self.n.say(message)
            if mark:
                self.n.mark(mark)

    def look(self) -> dict[str, Any]:
        mc, n = self.mc, self.n
        st = mc.status(MANAGER, JOB, NAMESPACE)
        phase = st.get("phase")
        if phase != self.phase:
            self.phase = phase
            n.say(f"manager: {JOB} {phase}  {st.get('message') or ''}")
            n.mark(f"manager: phase {phase}")
        cluster = (st.get("queue") or {}).get("cluster")
        if cluster:
            self.once(f"runs:{cluster}", f"manager: status.queue.cluster = {cluster}")
        wl = mc.workload(MANAGER, JOB, NAMESPACE)
        where = ((wl or {}).get("status") or {}).get("clusterName")
        if where:
            self.once(f"wl:{where}", f"manager: Workload {wl['metadata']['name']} "  # type: ignore[index]
                      f"status.clusterName = {where}", f"dispatched to {where}")  # fmt: skip
        self._events()
        pools = {}
        for w, witness in self.witness.items():
            creates = witness.for_job(f"{NAMESPACE}/{JOB}")
            if self.first_admitted is None and creates:
                self.first_admitted = w
            for c in creates[self.creates_said[w] :]:
                stocked = " (stocked out: every create fails GCE_STOCKOUT)" if w == "a" else ""
                n.say(f"worker {w}: the operator creates node pool {c.pool}{stocked}")
            self.creates_said[w] = len(creates)
            copy = mc.job(w, JOB, NAMESPACE)
            message = ((copy or {}).get("status") or {}).get("message") or ""
            if HANDED_BACK in message:
                self.once(f"back:{w}", f"worker {w}: {message}", f"worker {w} handed the job back")
            pools[w] = pool_names(mc, w)
        held = [w for w, p in pools.items() if p]
        if len(held) > 1:
            self.both_held.append(f"{held}")
        return st

    def _events(self) -> None:
        core = client.CoreV1Api(self.mc.manager.api)
        for e in core.list_namespaced_event(NAMESPACE).items:
            uid = str(e.metadata.uid if e.metadata else "")
            if uid in self.events_seen:
                continue
            self.events_seen.add(uid)
            kind = e.involved_object.kind
            if kind in ("Workload", models.KIND):
                self.n.say(f"  manager event {e.type:7} {e.reason} ({kind}): {e.message}")


def pool_names(mc: MultiCluster, worker: str) -> list[str]:
    from multislice_operator.planning.plan import node_pool_name

    sim = mc.workers[worker].sim
    assert sim is not None
    prefix = node_pool_name(NAMESPACE, JOB, 0)[:-2]
    return [p for p in sim.pools() if p.startswith(prefix)]


def tpu_nodes(mc: MultiCluster, worker: str) -> list[str]:
    core = client.CoreV1Api(mc.workers[worker].api)
    selector = f"{keys.JOB_NAMESPACE}={NAMESPACE}"
    return [
        str(n.metadata.name) for n in core.list_node(label_selector=selector).items if n.metadata
    ]


def run(args: argparse.Namespace, out: TextIO) -> int:
    n = Narrator(out)
    if args.kubeconfig:
        n.say("the multicluster scenario starts its own three clusters: it cannot borrow one")
        return 2
    n.say("scenario 'multicluster': one Kueue queue on a MultiKueue manager in front of two "
          "worker clusters; worker a is stocked out, b has capacity")  # fmt: skip
    workers = {
        "a": WorkerSpec(location="us-central2-b"),
        "b": WorkerSpec(location="us-east5-b"),
    }
    mc = MultiCluster(workers=workers, op_latency_s=args.pool_latency)
    story: Story | None = None
    try:
        n.say("starting the manager (Kueue with MultiKueue) and workers a and b (each: Kueue, "
              "JobSet, kwok, its own GKE simulator and operator)")  # fmt: skip
        mc.start(progress=n.say)
        for name, stack in mc.clusters().items():
            assert stack.cp is not None
            n.say(f"control-plane state in {getattr(stack.cp, 'workdir', '?')} ({name})")
        n.mark("three clusters up, MultiKueue Active")
        mc.namespace(NAMESPACE)
        sim_a = mc.workers["a"].sim
        assert sim_a is not None
        sim_a.set_faults(stockout_next=1_000_000)
        n.say("worker a (us-central2-b): every node-pool create is stocked out (GCE_STOCKOUT)")
        story = Story(mc, n)
        body = job_body(JOB, run="8s", labels={keys.KUEUE_QUEUE_NAME: "team-a"})
        body["spec"]["managedBy"] = keys.MULTIKUEUE_MANAGED_BY
        body["spec"]["checkpoint"] = {"directory": CHECKPOINTS}
        client.CustomObjectsApi(mc.manager.api).create_namespaced_custom_object(
            models.GROUP, models.VERSION, NAMESPACE, models.PLURAL, body
        )
        n.say(f"applied MultisliceJob {NAMESPACE}/{JOB} on the manager: 2 x v5litepod-16, "
              f"spec.managedBy {keys.MULTIKUEUE_MANAGED_BY}, LocalQueue team-a, checkpoints in "
              f"{CHECKPOINTS}")  # fmt: skip
        n.mark("job applied on the manager")
        st = watch(mc, story, args.timeout)
        ok = check(mc, story, st)
        timeline(n)
        goodput(mc, n)
        return 0 if ok else 1
    finally:
        n.say("stopping every process the demo started")
        for w in story.witness.values() if story is not None else ():
            w.uninstall()
        mc.stop()


def watch(mc: MultiCluster, story: Story, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        st = story.look()
        done = st.get("phase") in models.TERMINAL_PHASES
        left = any(mc.job(w, JOB, NAMESPACE) or pool_names(mc, w) for w in mc.workers)
        if done and not left:
            story.n.mark("the worker's copy and pools gone")
            return st
        time.sleep(0.5)
    story.n.say(f"timed out after {timeout:.0f}s")
    return st


def check(mc: MultiCluster, story: Story, st: dict[str, Any]) -> bool:
    n = story.n
    problems = []
    cluster = (st.get("queue") or {}).get("cluster") or ""
    if st.get("phase") != "Succeeded":
        problems.append(f"phase {st.get('phase')}, not Succeeded")
    if not cluster.endswith("/worker-b"):
        problems.append(f"ran in {cluster or 'no cluster'}, not worker-b")
    for w in mc.workers:
        if mc.job(w, JOB, NAMESPACE) is not None:
            problems.append(f"a copy of the job left on worker {w}")
        if pool_names(mc, w) or tpu_nodes(mc, w):
            problems.append(f"node pools or TPU nodes left on worker {w}")
    manager_sim = mc.manager.sim
    if manager_sim is not None and manager_sim.pools():
        problems.append("node pools on the manager")
    if story.both_held:
        problems.append(f"both workers held node pools of the job at once: {story.both_held}")
    first = story.first_admitted
    if first == "a":
        n.say("worker a admitted the job first, could not get the capacity and handed it back; "
              "MultiKueue dispatched it again and worker b ran it")  # fmt: skip
    else:
        n.say("worker b admitted the job first (MultiKueue copies it to both at once); worker "
              "a's copy was deleted before it created anything")  # fmt: skip
    if problems:
        n.say("OUTCOME NOT REACHED: " + "; ".join(problems))
        return False
    n.say("outcome reached: Succeeded on worker-b, shown on the manager; 0 node pools and 0 TPU "
          "nodes left on either worker, none ever on the manager")  # fmt: skip
    return True


def timeline(n: Narrator) -> None:
    n.say("timeline:")
    prev = 0.0
    for t, what in n.marks:
        n.say(f"  {t:7.1f}s  (+{t - prev:5.1f}s)  {what}")
        prev = t


def goodput(mc: MultiCluster, n: Narrator) -> None:
    from rich.console import Console

    from multislice_operator.cli import view

    obj = mc.job(MANAGER, JOB, NAMESPACE)
    if obj is None:
        return
    n.say(f"where the TPU time went, on the manager (multislice-operator status {JOB} -n "
          f"{NAMESPACE}):")  # fmt: skip
    view.render(view.view(obj, view.now_utc()), Console(file=n.out, highlight=False))
