"""Issue 15 end to end: the operator with the real JobSet controller, Job controller, scheduler,
pod garbage collector and kwok nodes (cluster profile). Nobody patches a status here: a
preemption is a pod that kwok fails with the DisruptionTarget condition (as GKE's graceful node
shutdown does), maintenance is GKE's node label, a stuck start is a node taint.

- 3 preemptions with maxRestarts 1: the job still succeeds, restartsByCause.disruption == 3,
  and the JobSet charged none of them (restartsCountTowardsMax 0);
- a workload failure after that is charged: the second one fails the job (ReachedMaxRestarts);
- a maintenance label on a slice's nodes: condition MaintenanceScheduled with the time and the
  slice, a checkpoint request on every pod between `time - checkpointAheadSeconds` and `time`,
  the workload's acknowledgement as status.checkpoint.savedStep, the metrics;
- the node's own condition MaintenancePlanned (Kubernetes 1.37's, written here as the admin
  would): the same condition and a checkpoint request at once, id maint-<lastTransitionTime>;
- a user's annotation on the job reaches every pod;
- a startup deadline fires on the slice whose pods cannot schedule and restarts every slice
  (cause startup); once the capacity is fixed the job succeeds.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from typing import Any

import pytest
from kubernetes import client

from multislice_local.harness import wait_for
from multislice_local.nodes import (
    NODE_SHUTDOWN,
    fail_pod,
    label_nodes,
    taint_nodes,
)
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.reconcile.reasons import Reason
from tests import msj
from tests.msj import create, custom, events, status

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
BLOCKED = "e2e.multislice.dev/blocked"


@pytest.fixture(scope="module")
def op(kube_cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("disruptions") / "operator.log"
    with msj.operator_process(kube_cluster, log, resync_seconds=1) as proc:
        yield proc


@pytest.fixture
def env(kube_cluster, op, namespace, tpu_nodes, kube_client):
    api = kube_client(kube_cluster)
    ns = namespace(kube_cluster, "disr")
    msj.own_pools(tpu_nodes, ns)
    return api, ns, op


def job(name: str, run: str, ns: str, **spec: Any) -> dict[str, Any]:
    failure = {"maxRestarts": 1, **spec.pop("failurePolicy", {})}
    return msj.job(
        name,
        run=run,
        failure_policy=failure,
        existing=True,
        node_selector=msj.own_nodes(ns),
        **spec,
    )


def wait_status(api, ns, name, op, what, check, timeout=120.0) -> dict[str, Any]:
    """The job's status once `check(status)`; on timeout, the operator's last 40 log lines."""
    obj = msj.wait_status(api, ns, name, f"{name}: {what}", check, timeout, log=op.log_tail)
    return obj["status"]


def wait_phase(api, ns, name, phase, op, timeout=120.0) -> dict[str, Any]:
    what = f"{name}: phase {phase}"
    return msj.wait_phase(api, ns, name, phase, timeout, log=op.log_tail, what=what)["status"]


def pods(api, ns: str, name: str, attempt: int | None = None) -> list[Any]:
    items = (
        client.CoreV1Api(api)
        .list_namespaced_pod(ns, label_selector=f"{keys.JOB_NAME}={name}")
        .items
    )
    return [
        p
        for p in items
        if attempt is None or p.metadata.labels.get(keys.JOBSET_RESTART_ATTEMPT) == str(attempt)
    ]


def running(api, ns: str, name: str, attempt: int) -> list[Any]:
    return [
        p
        for p in pods(api, ns, name, attempt)
        if p.status.phase == "Running" and not p.metadata.deletion_timestamp
    ]


def victim(api, ns: str, name: str, attempt: int, op) -> str:
    """A running pod of slice 1 of this attempt."""

    def find() -> str | None:
        ps = [
            p.metadata.name
            for p in running(api, ns, name, attempt)
            if p.metadata.labels.get(keys.JOBSET_JOB_INDEX) == "1"
        ]
        return sorted(ps)[0] if ps else None

    return wait_for(find, 60, f"a running pod of attempt {attempt}", on_timeout=op.log_tail)


def preempt(api, ns: str, name: str, attempt: int, op) -> None:
    """GKE's graceful node shutdown of a preempted VM: the workload saved and exited 143, the
    pod ends Failed with DisruptionTarget (TerminationByKubelet)."""
    said = {"v": 1, "reason": "preempted", "exitCode": 143, "step": 100, "checkpointStep": 100}
    pod = victim(api, ns, name, attempt, op)
    fail_pod(api, ns, pod, 143, message=json.dumps(said), disruption=NODE_SHUTDOWN)


def jobset(api, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom(api).get_namespaced_custom_object(*JOBSET[:2], ns, JOBSET[2], name)
    return obj


# ---------------------------------------------------------------- restarts by cause


def test_three_preemptions_with_max_restarts_one_and_the_job_still_succeeds(env):
    api, ns, op = env
    create(api, ns, job("preempted", "30s", ns))
    for n in range(3):
        wait_phase(api, ns, "preempted", "Running", op)
        preempt(api, ns, "preempted", n, op)
        wait_status(
            api,
            ns,
            "preempted",
            op,
            f"restart {n + 1}",
            lambda s, n=n: s.get("restarts", 0) >= n + 1,
        )
    done = wait_phase(api, ns, "preempted", "Succeeded", op, timeout=180)
    assert done["restarts"] == 3
    assert done["restartsByCause"] == {
        "disruption": 3,
        "workload": 0,
        "hang": 0,
        "startup": 0,
        "resize": 0,
    }
    assert done["lastRestart"]["cause"] == "disruption"
    assert done["lastRestart"]["lostSteps"] == 0  # the pod saved at its last step
    assert done["lastFailure"]["cause"] == "disruption"
    assert done["lastFailure"]["disruption"] == NODE_SHUTDOWN
    js = jobset(api, ns, "preempted")["status"]
    assert js["restarts"] == 3 and js.get("restartsCountTowardsMax", 0) == 0  # JobSet's own view
    restarts = [e for e in events(api, ns, "preempted") if e.reason == Reason.RESTARTING_ALL_SLICES]
    assert len(restarts) == 3
    assert all("cause disruption: not charged to maxRestarts" in e.message for e in restarts)


def test_a_workload_failure_after_the_preemptions_is_charged_and_fails_the_job(env):
    api, ns, op = env
    create(api, ns, job("charged", "1h", ns))
    for n in range(3):
        wait_phase(api, ns, "charged", "Running", op)
        preempt(api, ns, "charged", n, op)
        wait_status(
            api, ns, "charged", op, f"restart {n + 1}", lambda s, n=n: s.get("restarts", 0) >= n + 1
        )
    # The program's own failure: the one restart maxRestarts allows...
    wait_phase(api, ns, "charged", "Running", op)
    fail_pod(api, ns, victim(api, ns, "charged", 3, op), 17)
    st = wait_status(api, ns, "charged", op, "restart 4", lambda s: s.get("restarts", 0) >= 4)
    assert st["restartsByCause"]["workload"] == 1
    # ...and the next one ends the job.
    wait_phase(api, ns, "charged", "Running", op)
    fail_pod(api, ns, victim(api, ns, "charged", 4, op), 17)
    failed = wait_phase(api, ns, "charged", "Failed", op)
    assert failed["restartsByCause"] == {
        "disruption": 3,
        "workload": 1,
        "hang": 0,
        "startup": 0,
        "resize": 0,
    }
    cond = {c["type"]: c for c in failed["conditions"]}["Failed"]
    assert cond["reason"] == "ReachedMaxRestarts"
    assert (
        "restarted 1 times for the program's own failures (workload 1, hang 0)" in cond["message"]
    )
    assert "3 disruption/startup restarts not counted" in cond["message"]


# ---------------------------------------------------------------- maintenance and checkpoints


def slice_pool(api, ns: str, name: str, slice_index: int) -> str:
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    for p in pods(api, ns, name):
        if p.metadata.labels.get(keys.JOBSET_JOB_INDEX) == str(slice_index) and p.spec.node_name:
            return str(nodes[p.spec.node_name].metadata.labels[keys.GKE_NODEPOOL])
    raise AssertionError(f"no pod of slice {slice_index} on a node")


def annotations_of(api, ns: str, name: str, attempt: int) -> list[str | None]:
    return [
        (p.metadata.annotations or {}).get(keys.CHECKPOINT_REQUEST)
        for p in pods(api, ns, name, attempt)
    ]


def test_maintenance_label_shows_the_condition_and_asks_for_a_checkpoint_in_time(env):
    api, ns, op = env
    ahead = 15
    create(api, ns, job("maint", "1h", ns, maintenance={"checkpointAheadSeconds": ahead}))
    wait_phase(api, ns, "maint", "Running", op)
    pool = slice_pool(api, ns, "maint", 1)
    when = int(time.time()) + 40
    label_nodes(api, pool, {keys.GKE_SCHEDULED_MAINTENANCE_TIME: str(when)})
    st = wait_status(
        api, ns, "maint", op, "MaintenanceScheduled", lambda s: bool(s.get("maintenance"))
    )
    cond = {c["type"]: c for c in st["conditions"]}["MaintenanceScheduled"]
    assert (cond["status"], cond["reason"]) == ("True", Reason.MAINTENANCE_SCHEDULED)
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))
    assert iso in cond["message"] and "slice 1" in cond["message"]
    assert st["maintenance"]["slices"] == [1] and st["maintenance"]["nodes"] == 4
    # Metrics are recorded after the status write and its events: poll, do not race the pass.
    wait_for(
        lambda: (
            msj.metric(op, "multislice_job_maintenance_time_seconds", namespace=ns, name="maint")
            == when
        ),
        10,
        "the maintenance time metric",
        on_timeout=op.log_tail,
    )
    # The request reaches every pod, no earlier than `ahead` before the window, before it.
    rid = f"maint-{when}"
    wait_for(
        lambda: annotations_of(api, ns, "maint", 0) == [rid] * 8,
        90,
        "the checkpoint request on all 8 pods",
        on_timeout=op.log_tail,
    )
    cp = status(api, ns, "maint")["checkpoint"]
    asked = calendar.timegm(time.strptime(cp["requestTime"], "%Y-%m-%dT%H:%M:%SZ"))
    assert when - ahead <= asked <= when, (cp, when)
    assert (cp["requestId"], cp["source"]) == (rid, "maintenance")
    # The workload's acknowledgement (process 0 patches its own pod).
    first = sorted(p.metadata.name for p in pods(api, ns, "maint", 0))[0]
    ack = json.dumps({"id": rid, "step": 240})
    client.CoreV1Api(api).patch_namespaced_pod(
        first, ns, {"metadata": {"annotations": {keys.CHECKPOINT_SAVED: ack}}}
    )
    saved = wait_status(
        api, ns, "maint", op, "saved step", lambda s: (s.get("checkpoint") or {}).get("savedStep")
    )
    assert saved["checkpoint"]["savedStep"] == 240 and saved["checkpoint"]["podsAnnotated"] == 8
    # CheckpointSaved is posted after the status write just seen: waited for, not read once.
    msj.wait_events(api, ns, "maint", Reason.MAINTENANCE_SCHEDULED, Reason.CHECKPOINT_REQUESTED,
                    Reason.CHECKPOINT_SAVED, log=op.log_tail)  # fmt: skip
    reasons = {e.reason for e in events(api, ns, "maint")}
    assert {
        Reason.MAINTENANCE_SCHEDULED,
        Reason.CHECKPOINT_REQUESTED,
        Reason.CHECKPOINT_SAVED,
    } <= reasons
    wait_for(
        lambda: (
            msj.metric(
                op, "multislice_checkpoint_requests_total", namespace=ns, source="maintenance"
            )
            >= 1
        ),
        60,
        "the checkpoint request counted",
        on_timeout=op.log_tail,
    )
    # Maintenance over: the labels go, so does the condition's True.
    label_nodes(api, pool, {keys.GKE_SCHEDULED_MAINTENANCE_TIME: None})
    over = wait_status(api, ns, "maint", op, "maintenance over", lambda s: not s.get("maintenance"))
    cond = {c["type"]: c for c in over["conditions"]}["MaintenanceScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", Reason.NO_MAINTENANCE_SCHEDULED)


def set_node_condition(api, pool: str, kind: str, value: str, since: int) -> None:
    """A node condition on every node of `pool`, as an admin (or the admin's tooling) sets the
    node lifecycle conditions (strategic merge: by type, the kubelet's own conditions stay)."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    core = client.CoreV1Api(api)
    for node in core.list_node(label_selector=f"{keys.GKE_NODEPOOL}={pool}").items:
        condition = {
            "type": kind,
            "status": value,
            "reason": "E2E",
            "message": "host firmware update",
            "lastTransitionTime": when,
            "lastHeartbeatTime": when,
        }
        core.patch_node_status(node.metadata.name, {"status": {"conditions": [condition]}})


def test_maintenance_planned_condition_asks_for_a_checkpoint_at_once(env):
    api, ns, op = env
    create(api, ns, job("planned", "1h", ns, maintenance={"checkpointAheadSeconds": 600}))
    wait_phase(api, ns, "planned", "Running", op)
    pool = slice_pool(api, ns, "planned", 0)
    since = int(time.time())
    set_node_condition(api, pool, "MaintenancePlanned", "True", since)
    st = wait_status(
        api, ns, "planned", op, "MaintenanceScheduled", lambda s: bool(s.get("maintenance"))
    )
    cond = {c["type"]: c for c in st["conditions"]}["MaintenanceScheduled"]
    assert (cond["status"], cond["reason"]) == ("True", Reason.MAINTENANCE_SCHEDULED)
    assert "MaintenancePlanned" in cond["message"] and "slice 0" in cond["message"]
    assert st["maintenance"]["slices"] == [0] and st["maintenance"]["nodes"] == 4
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    assert st["maintenance"]["time"] == iso
    rid = f"maint-{since}"
    wait_for(
        lambda: annotations_of(api, ns, "planned", 0) == [rid] * 8,
        60,
        "the checkpoint request on all 8 pods",
        on_timeout=op.log_tail,
    )
    # The admin clears it: the condition's True goes.
    set_node_condition(api, pool, "MaintenancePlanned", "False", int(time.time()))
    over = wait_status(
        api, ns, "planned", op, "maintenance over", lambda s: not s.get("maintenance")
    )
    cond = {c["type"]: c for c in over["conditions"]}["MaintenanceScheduled"]
    assert (cond["status"], cond["reason"]) == ("False", Reason.NO_MAINTENANCE_SCHEDULED)


def test_a_users_checkpoint_request_reaches_every_pod(env):
    api, ns, op = env
    create(api, ns, job("asked", "1h", ns))
    wait_phase(api, ns, "asked", "Running", op)
    custom(api).patch_namespaced_custom_object(
        models.GROUP,
        models.VERSION,
        ns,
        models.PLURAL,
        "asked",
        {"metadata": {"annotations": {keys.CHECKPOINT_REQUEST: "1733050000"}}},
    )
    wait_for(
        lambda: annotations_of(api, ns, "asked", 0) == ["1733050000"] * 8,
        60,
        "the user's request on all 8 pods",
        on_timeout=op.log_tail,
    )
    cp = wait_status(
        api,
        ns,
        "asked",
        op,
        "8 pods annotated",
        lambda s: (s.get("checkpoint") or {}).get("podsAnnotated") == 8,
    )["checkpoint"]
    assert (cp["requestId"], cp["source"], cp["restartAttempt"]) == ("1733050000", "user", 0)


# ---------------------------------------------------------------- the startup deadline


def test_startup_deadline_fires_on_the_slice_whose_pods_cannot_schedule(env):
    api, ns, op = env
    # One pool's nodes are Ready but take no pod: the slice that needs it cannot schedule.
    taint_nodes(api, f"{ns}-pool-1", BLOCKED)
    # The slice that does schedule runs well past the deadline: had it finished first, its pool
    # would take the slow slice's pods and the start would succeed without a restart (seen
    # under load with a 10 s run).
    body = job("slow", "40s", ns, failurePolicy={"startupTimeoutSeconds": 10})
    create(api, ns, body)
    fired = wait_for(
        lambda: [
            e for e in events(api, ns, "slow") if e.reason == Reason.STARTUP_DEADLINE_EXCEEDED
        ],
        120,
        Reason.STARTUP_DEADLINE_EXCEEDED,
        on_timeout=lambda: f"{status(api, ns, 'slow')}\n{op.log_tail(40)}",
    )
    message = fired[0].message
    match = re.search(r"slice (\d): 0/4 pods running \(unschedulable\)", message)
    assert match, message
    assert "restarting all slices (cause startup" in message
    st = wait_status(
        api,
        ns,
        "slow",
        op,
        "a startup restart",
        lambda s: (s.get("restartsByCause") or {}).get("startup", 0) >= 1,
    )
    assert st["restartsByCause"]["workload"] == 0  # not the program's: maxRestarts untouched
    taint_nodes(api, f"{ns}-pool-1", BLOCKED, on=False)
    done = wait_phase(api, ns, "slow", "Succeeded", op, timeout=180)
    assert done["restarts"] == done["restartsByCause"]["startup"] >= 1
    assert done["lastRestart"]["cause"] == "startup"
    assert "startup" not in done  # the timing is cleared once every pod ran
