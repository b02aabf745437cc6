"""`make demo SCENARIO=real`: the product as users run it, on real nodes (docs/real-nodes.md).

Real kubelets, containerd and runc under the local control plane (two v5litepod-8 pools of two
hosts and a plain node, :mod:`multislice_local.realnodes`), the operator and workload images built
offline from the repo's recipes (:mod:`multislice_local.images`), the chart installed by ``helm
install`` with no values (:mod:`multislice_local.realstack`). A MultisliceJob of 2 slices x 2
hosts trains the workload's LM on CPU in real pods; process 3 exits 13 after step 8: every
container restarts in place through JobSet's real agent (the operator's own image) and training
resumes from the step-5 checkpoint; then a node is drained and uncordoned: JobSet recreates the
pods and training resumes again; the job succeeds; everything stops and nothing is left.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, TextIO

from kubernetes import client

from multislice_local import realnodes
from multislice_local.demo import Narrator
from multislice_local.images import build_image
from multislice_local.realstack import (
    CONTAINER,
    RealStack,
    chart_image,
    job_manifest,
    progress,
)
from multislice_operator.api import models
from multislice_operator.common import keys

NAMESPACE = "demo-real"
JOB = "llm-real"
STEPS = 30
CHECKPOINT_EVERY = 5
FAIL_AFTER = 8
SETTLED = 5
DRAIN_AFTER = 12
# Four JAX processes on the machine's cores take 2-4 s a step: the job's own time, at the least
# (the kwok scenarios' default --timeout is 240 s).
TIMEOUT = 900.0


class Story:
    """What the narrator has said, so each change is said once."""

    def __init__(self, stack: RealStack, n: Narrator) -> None:
        self.stack, self.n = stack, n
        self.api = stack.api
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.phase: str | None = None
        self.step = 0
        self.restarts: list[dict[str, Any]] = []
        self.restored: set[tuple[int, int]] = set()  # (restart, step) said
        self.drained: str | None = None
        self.uids: dict[str, str] = {}

    def status(self) -> dict[str, Any]:
        obj: Any = self.custom.get_namespaced_custom_object(
            models.GROUP, models.VERSION, NAMESPACE, models.PLURAL, JOB
        )
        return dict(obj.get("status") or {})

    def pods(self) -> list[Any]:
        return sorted(
            self.core.list_namespaced_pod(NAMESPACE, label_selector=f"{keys.JOB_NAME}={JOB}").items,
            key=lambda p: str(p.metadata.name),
        )

    def look(self) -> dict[str, Any]:
        st = self.status()
        if st.get("phase") != self.phase:
            self.phase = st.get("phase")
            self.n.say(f"job {JOB}: {self.phase}  {st.get('message') or ''}")
            self.n.mark(f"phase {self.phase}")
            if self.phase == "Running" and not self.uids:
                self.say_pods()
        last = st.get("lastRestart")
        if last and last.get("restart", 0) > len(self.restarts):
            self.restarts.append(last)
            self.say_restart(st, last)
        self.say_progress()
        return st

    def say_pods(self) -> None:
        for pod in self.pods():
            self.uids[pod.metadata.name] = pod.metadata.uid
            where = f"node {pod.spec.node_name} ({pod.status.pod_ip}, host network)"
            self.n.say(f"  pod {pod.metadata.name} on {where}, uid {pod.metadata.uid[:8]}")

    def say_restart(self, st: dict[str, Any], last: dict[str, Any]) -> None:
        n = self.n
        failure = st.get("lastFailure") or {}
        n.say(f"restart {last['restart']}: cause {last['cause']}, strategy {last['strategy']}"
              + (f"; pod {failure.get('pod')} exited {failure.get('exitCode')}"
                 if last["cause"] == "workload" and failure else ""))  # fmt: skip
        n.mark(f"restart {last['restart']} ({last['strategy']})")
        pods = self.pods()
        kept = [p for p in pods if self.uids.get(p.metadata.name) == p.metadata.uid]
        if last["strategy"] == "InPlaceRestart":
            counts = {
                p.metadata.name.removeprefix(f"{JOB}-"): next(
                    c.restart_count for c in p.status.container_statuses if c.name == CONTAINER
                )
                for p in pods
            }
            n.say(f"  in place: {len(kept)} of {len(pods)} pods kept their name, UID and node; "
                  f"their containers' restart counts: {counts}")  # fmt: skip
        else:
            n.say(f"  recreated: {len(pods) - len(kept)} of {len(pods)} pods are new")
        self.uids = {p.metadata.name: p.metadata.uid for p in pods}

    def say_progress(self) -> None:
        run = progress(self.core, NAMESPACE, JOB)
        for e in run.of("restored"):
            key = (len(self.restarts), int(e["step"]))
            if e.get("process") == 0 and key not in self.restored:
                self.restored.add(key)
                self.n.say(f"  every process restores the step-{e['step']} checkpoint "
                           f"(restart {len(self.restarts)})")  # fmt: skip
        step = run.last_step
        if step and (step // 5 > self.step // 5 or step < self.step):
            losses = [e["loss"] for e in run.of("step") if int(e["step"]) == step]
            loss = f", loss {losses[-1]:.3f}" if losses else ""
            self.n.say(f"  training: step {step} of {STEPS}{loss}")
        self.step = step if step else self.step


def run(args: argparse.Namespace, out: TextIO) -> int:
    n = Narrator(out)
    if args.kubeconfig:
        n.say("the real scenario starts its own cluster with real nodes: it cannot borrow one")
        return 2
    reason = realnodes.unavailable_reason()
    if reason is not None:
        n.say(f"the real scenario needs a host that runs containers: {reason}")
        return 2
    n.say("scenario 'real': the chart installed with no values on real kubelet/containerd/runc "
          "nodes; a 2 x v5litepod-8 job trains in real pods, restarts in place, then is "
          "recreated, and succeeds")  # fmt: skip
    n.say("building the images from the repo's recipes, offline (cached by content: minutes "
          "the first time)")  # fmt: skip
    images = build_image("operator", out=out), build_image("workload", out=out)
    n.mark("images built")
    cluster = realnodes.RealCluster()
    try:
        n.say("starting the control plane and 5 real nodes (tpu-a-0/1, tpu-b-0/1: two "
              "v5litepod-8 pools of 2 hosts; cpu-0: a plain node)")  # fmt: skip
        cluster.start()
        n.mark("cluster and nodes up")
        n.say(f"  kubeconfig {cluster.kubeconfig}; node state under {cluster.workdir}")
        n.say(f"importing the images into the nodes' containerd as {chart_image()} and the "
              "workload image the examples name, then `helm install multislice-operator "
              "charts/multislice-operator` (no values)")  # fmt: skip
        stack = RealStack(cluster).install(*images)
        pod = stack.operator_pod()
        n.say(f"operator pod {pod.metadata.name} Ready on {pod.spec.node_name}: uid 65532, "
              "read-only root, its ServiceAccount, probes and metrics over TLS")  # fmt: skip
        used = [line for line in stack.operator_log().splitlines() if "in-place restart" in line]
        n.say(f"  its log: {used[-1][-120:] if used else '(no in-place line yet)'}")
        n.mark("operator installed")
        return story(stack, n, max(args.timeout, TIMEOUT))
    except KeyboardInterrupt:
        n.say("interrupted")
        return 130
    finally:
        n.say("stopping the nodes and the control plane")
        cluster.stop()  # raises if anything of the nodes is left on the host
        n.say("stopped: no node, container, mount, cgroup, bridge or namespace left")


def story(stack: RealStack, n: Narrator, timeout: float) -> int:
    story = Story(stack, n)
    story.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    body = job_manifest(JOB, NAMESPACE, stack.checkpoints, steps=STEPS,
                        checkpoint_every=CHECKPOINT_EVERY, fail_process=3,
                        fail_at_step=FAIL_AFTER, settle_at_step=SETTLED)  # fmt: skip
    story.custom.create_namespaced_custom_object(
        models.GROUP, models.VERSION, NAMESPACE, models.PLURAL, body
    )
    n.say(f"applied {NAMESPACE}/{JOB}: 2 x v5litepod-8 on the existing pools, the workload "
          f"image training its LM for {STEPS} steps on CPU, checkpoints every "
          f"{CHECKPOINT_EVERY} steps in {stack.checkpoints} (every node sees it: the stand-in "
          f"for gs://); process 3 will exit 13 after step {FAIL_AFTER}")  # fmt: skip
    n.mark("job applied")
    deadline = time.monotonic() + timeout
    st: dict[str, Any] = {}
    while time.monotonic() < deadline:
        st = story.look()
        if story.drained is None and len(story.restarts) == 1 and story.step >= DRAIN_AFTER:
            drain(story)
        if st.get("phase") in models.TERMINAL_PHASES:
            break
        time.sleep(2)
    return check(story, st)


def drain(story: Story) -> None:
    pod = story.pods()[0]
    node = str(pod.spec.node_name)
    story.n.say(f"draining node {node} (its pod {pod.metadata.name} evicted), then uncordoning "
                "it, as a node upgrade does")  # fmt: skip
    story.stack.kubectl("drain", node, "--ignore-daemonsets", "--delete-emptydir-data")
    story.stack.kubectl("uncordon", node)
    story.drained = node
    story.n.mark(f"node {node} drained")


def check(story: Story, st: dict[str, Any]) -> int:
    n = story.n
    problems = []
    if st.get("phase") != "Succeeded":
        problems.append(f"phase {st.get('phase')}, not Succeeded")
    strategies = [r["strategy"] for r in story.restarts]
    if strategies != ["InPlaceRestart", "Recreate"]:
        problems.append(f"restarts {strategies}, not in place then recreated")
    if len(story.restored) < 2:
        problems.append(f"resumed from checkpoints {sorted(story.restored)}: not after both")
    n.say("timeline:")
    prev = 0.0
    for t, what in n.marks:
        n.say(f"  {t:7.1f}s  (+{t - prev:5.1f}s)  {what}")
        prev = t
    if problems:
        n.say("OUTCOME NOT REACHED: " + "; ".join(problems))
        return 1
    n.say("outcome reached: Succeeded in real pods, restarted in place then recreated, training "
          "resumed from its checkpoint both times")  # fmt: skip
    return 0
