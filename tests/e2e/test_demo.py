"""The README's main command, in its non-interactive form: every scenario reaches its outcome,
leaves no node pool, no fake node and no process behind.

One run is the whole standalone command (it boots and stops a control plane of its own: no
process and no state left). The other scenarios borrow the session's control plane
(``--kubeconfig``, ``kube_cluster``, ``kube_kueue`` for the queue scenario) in a namespace of
their own: a control-plane boot each is most of what a demo run costs, and what they test is
the story on a cluster, not the boot (``test_controlplane.py`` and the standalone run test it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from multislice_local.controlplane import ControlPlane
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.reconcile.reasons import Reason


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line names `text` (the demo's control-plane directory, or the
    namespace its operator watches)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def demo(*args: str, env: dict[str, str] | None = None, timeout: float = 420) -> tuple[int, str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "multislice_local.cli",
            "demo",
            "--pool-latency",
            "1.5",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stdout + proc.stderr


def run_standalone(scenario: str, *extra: str) -> tuple[int, str]:
    """The demo as `make demo` runs it: its own control plane, gone afterwards."""
    code, out = demo("--scenario", scenario, *extra)
    match = re.search(r"control-plane state in (\S+)", out)
    assert match, out[-3000:]
    workdir = match.group(1)
    assert not processes_mentioning(workdir), f"processes left running for {workdir}"
    assert not Path(workdir).exists(), "temporary control-plane state left behind"
    return code, out


def run_borrowed(cp: ControlPlane, scenario: str, *extra: str, **kw: Any) -> tuple[int, str]:
    """The demo on `cp` in a namespace of its own; it leaves that cluster as it found it."""
    ns = f"demo-{scenario}-{uuid.uuid4().hex[:6]}"
    code, out = demo(
        "--scenario", scenario, "--kubeconfig", str(cp.kubeconfig), "--namespace", ns, *extra, **kw
    )
    assert f"using the running cluster of {cp.kubeconfig}" in out, out[-3000:]
    assert "control-plane state in" not in out  # it started no control plane
    # Its operator (which watches `-n <ns>`) is gone, and so is everything it created there.
    # What is left is judged with the demo's own story beside it (its end says why).
    tail = out[-4000:]
    assert not processes_mentioning(f"-n {ns} "), f"processes left running for {ns}\n{tail}"
    api = cp.api_client()
    try:
        left = client.CustomObjectsApi(api).list_namespaced_custom_object(
            models.GROUP, models.VERSION, ns, models.PLURAL
        )["items"]
        assert not left, f"{[j['metadata']['name'] for j in left]}\n{tail}"
        namespace = client.CoreV1Api(api).read_namespace(ns)  # deleted in the background
        assert namespace.status.phase == "Terminating" or namespace.metadata.deletion_timestamp
        nodes = client.CoreV1Api(api).list_node(label_selector=f"{keys.JOB_NAMESPACE}={ns}").items
        assert not nodes, f"{[n.metadata.name for n in nodes]}\n{tail}"
    except client.ApiException as exc:
        assert exc.status == 404, exc  # the namespace already gone
    finally:
        api.close()
    return code, out


SCENARIOS = {
    "restart": [
        Reason.RESTARTING_ALL_SLICES,
        "restarts=1",
        Reason.GANG_PROVISIONED,
        "checkpoints in gs://my-bucket/llm-v5e",
        "resumes from that checkpoint",
        "20 steps lost",
    ],
    "stockout": [Reason.GANG_ROLLED_BACK, "GCE_STOCKOUT"],
    "preemption": [Reason.SLICE_LOST, "preempting spot node pool"],
    "fatal": ["exited with non-retryable code 78"],
    "inplace": [
        "RestartInPlace=True",
        "every pod restarted in place on attempt 1: same names, UIDs and nodes yes; JobSet "
        "restarts 0",
        "preempting spot node pool",
        Reason.SLICE_LOST,
    ],
    "maintenance": [
        Reason.MAINTENANCE_SCHEDULED,
        Reason.CHECKPOINT_REQUESTED,
        Reason.CHECKPOINT_SAVED,
        "cause disruption: not charged to maxRestarts",
        "restarts: 1 (disruption 1)",
        "0 steps lost",
    ],
    "elastic": [
        Reason.SHRINKING_SLICES,
        "status.activeSlices=3, condition Degraded=True (FewerSlices)",
        "replicas=3, its pod template says MEGASCALE_NUM_SLICES=3",
        "multislice.dev/checkpoint-request=grow-4-",
        Reason.GROWING_SLICES,
        "running on all 4 slices again: activeSlices=4, Degraded=False (AllSlices)",
        "resize 2",
        "of running, on fewer slices (spec.elastic)",
    ],
    "ironwood": [
        "reservation ironwood-demo: block b1 of 4 sub-blocks",
        "4x4x4 ACTIVE partitionIds",
        "fails (UNHEALTHY)",
        Reason.SLICE_LOST,
        "re-formed at once from spare cubes",
        "the failed cube's pool was made again on sub-block",
    ],
    "delete": ["deleting the job while its node pools are being created", "the job is gone"],
    # The TPU compiler (libtpu) on this CPU: the replicated model is refused before any pool,
    # the FSDP one passes and runs.
    "preflight": [
        "refused before any node pool (0 created): preflight: the program does not fit: it needs",
        "PreflightPassed",
    ],
    # Issue 55: each move with the option left and why (status.fallback, FallbackMoved), the
    # option that ran, and 0 node-pool creates for the shape the compiler refused.
    "fallback": [
        f"{Reason.FALLBACK_MOVED} (operator): left option 1 (Reserved team-v5e, v5litepod-16 x 2)",
        "left: ReservationExhausted (",
        f"{Reason.FALLBACK_MOVED} (operator): left option 2 (FlexStart, v5litepod-16 x 2)",
        "left: Timeout (",
        "option 3 (Spot, v5litepod-16 x 2): 1 attempt(s)",
        "2 x Spot ct5lp-hightpu-4t 4x4",
        "first job: the reservation was left at GKE's 429, flex-start when its 20s ran out",
        "compile Job llm-v5e-preflight of shape v5e-8",
        f"{Reason.FALLBACK_MOVED} (operator): left option 2 (Spot, v5litepod-8 x 4)",
        "its shape did not compile",
        "shape v5e-8 (v5litepod-8 x 4): refused by the compiler",
        "shape v6e (v6e-32 x 1): fits",
        "option 3 (Spot, v6e-32 x 1): 1 attempt(s)",
        "1 x Spot ct6e-standard-4t 4x8",
        "second job: 0 node-pool creates for shape v5e-8",
    ],
    "multicluster": [
        "worker a (us-central2-b): every node-pool create is stocked out",
        'manager event Normal  MultiKueue (Workload): The workload was admitted on "worker-b"',
        "manager: Workload multislicejob-llm-anywhere status.clusterName = worker-b",
        "outcome reached: Succeeded on worker-b, shown on the manager",
    ],
    "queue": [
        "insufficient unused quota for google.com/tpu",
        "the job held 0 node pools while queued",
        "admission check multislice-gang=Ready",
        "Admitted by ClusterQueue team-a",  # Kueue's event on the job's Workload
    ],
}


def check_story(scenario: str, code: int, out: str) -> None:
    assert code == 0, out[-4000:]
    assert "outcome reached" in out
    assert "0 node pools and 0 TPU nodes left" in out
    for needle in SCENARIOS[scenario]:
        assert needle in out, f"{needle!r} missing:\n{out[-3000:]}"
    assert "timeline:" in out
    # The headline job is used as it should be: it names a checkpoint directory, so no warning
    # that every restart starts from step 0 contradicts the steps it says were lost.
    assert Reason.NO_CHECKPOINT not in out
    if scenario != "delete":  # it ends with where the job's TPU time went
        assert re.search(r"goodput  \S+ since creation", out), out[-3000:]
        assert "chip goodput" in out
    else:
        assert "the job was deleted, and its status with it" in out


def test_demo_standalone_boots_runs_and_stops_everything():
    """`make demo` itself (the restart scenario): its own control plane, nothing left."""
    code, out = run_standalone("restart")
    check_story("restart", code, out)


# preflight compiles the job's real program with XLA on this CPU: the second compile took 268 s
# beside the other layers and a CPU burner (the demo's default --timeout is 240 s). fallback's
# second job compiles three shapes one after another (its --timeout is each job's): 20-32 s each
# on 2 cores beside a Go build, the whole run 150 s; 285 s beside make test's real-node layer.
SLOW = {"preflight": ("--timeout", "480"), "fallback": ("--timeout", "600")}
# The whole demo run (its subprocess), where the default is not enough.
DEMO_S = {"fallback": 900}


def scenario_param(name: str) -> Any:
    if name not in DEMO_S:
        return name
    return pytest.param(name, marks=pytest.mark.timeout(DEMO_S[name] + 60))


# restart: the standalone run's; queue: on the kueue profile.
@pytest.mark.parametrize(
    "scenario",
    [scenario_param(s) for s in SCENARIOS if s not in ("restart", "queue", "multicluster")],
)
def test_demo_scenario(scenario, kube_cluster):
    code, out = run_borrowed(
        kube_cluster, scenario, *SLOW.get(scenario, ()), timeout=DEMO_S.get(scenario, 560)
    )
    check_story(scenario, code, out)


def test_demo_queue_scenario(kube_kueue):
    code, out = run_borrowed(kube_kueue, "queue")
    check_story("queue", code, out)


def test_demo_multicluster_scenario():
    """Issue 43: a MultiKueue manager and two workers of its own (it cannot borrow one): worker a
    stocked out, the job runs on b (straight away, or after a hands it back), the manager shows
    it, nothing is left on either worker, and every process of the three clusters is gone."""
    code, out = demo("--scenario", "multicluster")
    workdirs = re.findall(r"control-plane state in (\S+) \((manager|a|b)\)", out)
    assert sorted(w for _, w in workdirs) == ["a", "b", "manager"], out[-3000:]
    check_story("multicluster", code, out)
    assert (
        "status.queue.cluster = projects/local-project/locations/us-east5-b/clusters/worker-b"
        in out
    )
    assert "runs in projects/local-project/locations/us-east5-b/clusters/worker-b" in out
    handed_back = "worker a handed the job back" in out
    assert handed_back == ("worker a admitted the job first" in out), out[-3000:]
    if handed_back:  # Kueue's own word on the manager's Workload
        assert "EvictedDueToAdmissionCheck (Workload)" in out, out[-3000:]
    for workdir, _ in workdirs:
        assert not processes_mentioning(workdir), f"processes left running for {workdir}"
        assert not Path(workdir).exists(), "temporary control-plane state left behind"
    code, out = demo("--scenario", "multicluster", "--kubeconfig", "/nonexistent")
    assert code == 2 and "cannot borrow" in out


# The workload tests' compile flag (tests/workload/conftest.py): compiling, not running, is what
# four JAX processes spend their time on (about 6x less at level 0); the launcher passes it on.
FAST_COMPILE = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}


# Four JAX processes on a loaded 2-core machine: the workload's deadline (the demo's --timeout,
# from the workload's start; its launcher stops every process there). Under load 20-26 (a cold
# suite, two CPU burners) one run's attempts took 376 s and more than 240 s (issue 56 part 5);
# about 90 s on a quiet machine.
WORKLOAD_DEADLINE_S = 900
# The story before the workload starts, and the verdicts and clean-up after its deadline.
DEMO_MARGIN_S = 240


@pytest.mark.timeout(WORKLOAD_DEADLINE_S + DEMO_MARGIN_S + 60)
def test_demo_runs_the_real_workload_with_the_injected_environment(kube_cluster):
    code, out = run_borrowed(
        kube_cluster,
        "restart",
        "--run-workload",
        "--timeout",
        str(WORKLOAD_DEADLINE_S),
        env=FAST_COMPILE,
        timeout=WORKLOAD_DEADLINE_S + DEMO_MARGIN_S,
    )
    # The verdict lines first: four processes' logs fill the tail.
    verdicts = [line for line in out.splitlines() if "OUTCOME" in line]
    assert code == 0, "\n".join(verdicts) + "\n" + out[-4000:]
    assert "MEGASCALE_NUM_SLICES=2" in out  # read back from a JobSet pod
    assert re.search(r"workload: exit 0, [1-9] restart\(s\), restored from step [1-9]", out), out[
        -3000:
    ]
