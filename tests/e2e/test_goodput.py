"""Goodput end to end (cluster profile: kwok TPU nodes, the GKE simulator, the operator as a
process): a restart reports the steps lost from a real termination message and its recovery time,
the states add up to the wall-clock time by the status' own timestamps, also when the operator is
SIGKILLed mid-run, and `multislice-operator status` shows what the status says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client

from multislice_local.controlplane import bin_dir
from multislice_local.harness import wait_for
from multislice_local.nodes import fail_pod, finish_pod
from multislice_operator.api import models
from multislice_operator.controller.heartbeat import SUFFIX
from tests import msj
from tests.msj import create, custom

# A lease name of our own: no other operator on this apiserver renews our heartbeat.
LEASE = f"goodput-e2e-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("goodput") / "operator.log"
    with msj.local_stack(kube_cluster, log, operator_env={"MSJ_LEADER_ELECTION_NAME": LEASE}) as s:
        yield s


@pytest.fixture
def ns(stack, namespace, kube_cluster):
    return namespace(kube_cluster, "goodput")


def job(name: str, run: str) -> dict[str, Any]:
    return msj.job(name, run=run, failure_policy={"maxRestarts": 3})


def wait_phase(stack, ns: str, name: str, phase: str, timeout: float = 120) -> dict[str, Any]:
    """The job once in `phase`; on timeout, the operator's last 40 log lines."""
    log = lambda n: stack.op.log_tail(n)  # noqa: E731 (the operator of the moment)
    return msj.wait_phase(stack.api, ns, name, phase, timeout, log=log)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def wall_and_parts(obj: dict[str, Any]) -> tuple[float, int]:
    """completionTime - creationTimestamp, and the sum of the states: the status' own numbers."""
    st = obj["status"]
    wall = (ts(st["completionTime"]) - ts(obj["metadata"]["creationTimestamp"])).total_seconds()
    return wall, sum(st["goodput"]["seconds"].values())


def pods_of(stack, ns: str, name: str, slice_index: int) -> list[str]:
    pods = (
        client.CoreV1Api(stack.api)
        .list_namespaced_pod(
            ns,
            label_selector=f"multislice.dev/job-name={name},jobset.sigs.k8s.io/job-index={slice_index}",
        )
        .items
    )
    # A deleting pod still says Running (a suspension's pods, until their grace ends): not one to
    # tell to finish, the JobSet's new pods run on.
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    return sorted(p.metadata.name for p in live if p.status.phase == "Running")


def test_a_restart_reports_lost_steps_and_recovery_and_the_parts_sum(stack, ns):
    create(stack.api, ns, job("restart", run="15s"))
    wait_phase(stack, ns, "restart", "Running")
    victim = wait_for(lambda: pods_of(stack, ns, "restart", 1), 30, "a running pod of slice 1")[0]
    said = {"v": 1, "reason": "injected", "exitCode": 13, "step": 120, "checkpointStep": 100}
    fail_pod(stack.api, ns, victim, 13, message=json.dumps(said))
    done = wait_phase(stack, ns, "restart", "Succeeded", 180)
    st = done["status"]
    assert st["restarts"] == 1
    assert st["lastFailure"]["pod"] == victim
    assert (st["lastFailure"]["step"], st["lastFailure"]["checkpointStep"]) == (120, 100)
    restart = st["lastRestart"]
    assert (restart["restart"], restart["cause"], restart["lostSteps"]) == (1, "workload", 20)
    g = st["goodput"]
    assert g["lostSteps"] == 20
    assert "state" not in g, json.dumps(g)  # finished: the clock stopped
    # Recovery: from the failure (when the slices stopped running, as accounted) to every slice
    # running again; the restarting time is inside it, the job's end after it.
    timeline = [(e["state"], e["since"]) for e in g["timeline"]]
    assert ("restarting", restart["time"]) in timeline, timeline
    failed_at = (ts(restart["time"]) - ts(done["metadata"]["creationTimestamp"])).total_seconds()
    assert restart["recoverySeconds"] >= g["seconds"]["restarting"] > 0
    wall, parts = wall_and_parts(done)
    assert failed_at + restart["recoverySeconds"] <= wall
    assert parts == wall  # every second since creation, once
    assert g["chipSeconds"]["running"] == 32 * g["seconds"]["running"]
    assert sum(g["chipSeconds"].values()) <= 32 * wall
    # The view a person reads says the same (through kubectl, as a user runs it).
    out = subprocess.run(
        [
            sys.executable, "-m", "multislice_operator.cli.main", "status", "restart", "-n", ns,
            "--kubectl", str(bin_dir() / "kubectl"), "-o", "json",
        ],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "KUBECONFIG": str(stack.cp.kubeconfig)},
    )  # fmt: skip
    view = json.loads(out.stdout)
    assert view["goodput"]["seconds"] == g["seconds"]
    assert view["goodput"]["wallSeconds"] == wall
    assert view["lastRestart"] == restart
    text = subprocess.run(
        [
            sys.executable, "-m", "multislice_operator.cli.main", "status", "restart", "-n", ns,
            "--kubectl", str(bin_dir() / "kubectl"),
        ],
        capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "KUBECONFIG": str(stack.cp.kubeconfig)},
    ).stdout  # fmt: skip
    assert "20 steps lost" in text and "restarts: 1 (workload 1)" in text
    # Metrics: the job's goodput gauge is the status' figure, and goes with the job.
    series = f'multislice_job_goodput_ratio{{name="restart",namespace="{ns}"}}'
    # Recorded after the status write (and the phase gauge before it): polled, not read once.
    phases = wait_for(
        lambda: (m := scrape(stack)).get(series) == g["chipGoodput"] and m,
        30,
        "the job's goodput series at the status' figure",
        on_timeout=lambda: f"{scrape(stack).get(series)}\n{stack.op.log_tail(30)}",
    )
    custom(stack.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "restart"
    )

    def without_the_job() -> dict[str, float] | None:
        metrics = scrape(stack)
        return metrics if series not in metrics else None

    gone = wait_for(without_the_job, 60, "the job's series gone", on_timeout=stack.op.log_tail)
    key = f'multislice_jobs{{namespace="{ns}",phase="Succeeded"}}'
    assert gone.get(key, 0) == phases[key] - 1  # deleted jobs stop counting


def scrape(stack) -> dict[str, float]:
    return msj.metrics(stack.op)


def heartbeat(stack) -> datetime:
    lease: Any = client.CoordinationV1Api(stack.api).read_namespaced_lease(
        LEASE + SUFFIX, "default"
    )
    renewed: datetime = lease.spec.renew_time
    return renewed


def test_operator_killed_mid_run_neither_loses_nor_double_counts(stack, ns):
    """SIGKILL while Running; while no operator runs the job is suspended; the next operator
    charges the outage, from the last heartbeat, to Suspended, and the parts still add up.

    The pods run until the test ends them (issue 56: with a 20 s run, a loaded machine's
    operator restart outlasted the pods, the job came back from its suspension Succeeded
    without running again, and `running` was 0 s when the kill came before a heartbeat)."""
    create(stack.api, ns, job("killed", run="1h"))
    running = wait_phase(stack, ns, "killed", "Running")
    since_running = running["status"]["goodput"]["since"]
    stack.op.kill()
    stack.op = None
    custom(stack.api).patch_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "killed", {"spec": {"suspend": True}}
    )
    time.sleep(8)  # nobody watches for a while: the JobSet keeps running, nothing is written
    last_alive = heartbeat(stack)  # what the next operator reads: the killed one's last renewal
    stack.start_operator()
    suspended = wait_phase(stack, ns, "killed", "Suspended")
    g = suspended["status"]["goodput"]
    entries = [(e["state"], e["since"]) for e in g["timeline"]]
    # The outage went to the state found on return, from the previous operator's last renewal
    # (or from when Running began, if the operator was killed before renewing after it).
    alive = max(last_alive.replace(microsecond=0), ts(since_running)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert ("suspended", alive) in entries, (entries, alive)
    assert ("running", since_running) in entries
    custom(stack.api).patch_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "killed", {"spec": {"suspend": False}}
    )
    # Running again (on new pods: the suspension deleted the first ones); then they end.
    msj.wait_status(
        stack.api, ns, "killed", "Running again",
        lambda st: st.get("phase") == "Running" and st["goodput"]["since"] != since_running,
        120, log=lambda n: stack.op.log_tail(n),
    )  # fmt: skip
    # Every host's pod of the resumed JobSet (a fresh-clone run under a CPU burner finished the
    # suspension's terminating pods while the new ones ran on for an hour).
    hosts = sum(s["hosts"] for s in running["status"]["slices"])

    def every_pod() -> list[str] | None:
        found = pods_of(stack, ns, "killed", 0) + pods_of(stack, ns, "killed", 1)
        return found if len(found) == hosts else None

    pods = wait_for(every_pod, 60, f"the resumed JobSet's {hosts} pods running")
    for pod in pods:
        finish_pod(stack.api, ns, pod, after="2s")
    done = wait_phase(stack, ns, "killed", "Succeeded", 180)
    wall, parts = wall_and_parts(done)
    assert abs(parts - wall) <= 0.01 * wall, json.dumps(done["status"])
    final = done["status"]["goodput"]
    states = [e["state"] for e in final["timeline"]]
    assert states[states.index("suspended") - 1] == "running"  # running until the last heartbeat
    resumed = final["timeline"][states.index("suspended") + 1]["since"]
    assert final["seconds"]["suspended"] == (ts(resumed) - ts(alive)).total_seconds()
    # At least the second run: seen Running, its pods then told to end 2 s later.
    assert final["seconds"]["running"] >= 2 and final["chipSeconds"]["suspended"] >= 0
