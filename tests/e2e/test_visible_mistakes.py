"""Issue 45, section 2, end to end: no gang held for a mistake the operator could see.

Managed mode against the real apiserver, scheduler, JobSet controller and kwok nodes (cluster
profile) and the GKE simulator. Three template mistakes used to hold both pools until the job
was deleted (or 600 s): each now fails before the first pool, or within the unschedulable
deadline (on by default), with a message naming the field. And a running job deleted posts no
RestartingAllSlices (a false alarm that paged on every deletion).
"""

from __future__ import annotations

from typing import Any

import pytest

from multislice_local.harness import wait_for
from multislice_local.stack import LocalStack
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.planning.plan import node_pool_name
from tests import msj
from tests.msj import create, custom, event_lines


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("visible") / "operator.log"
    with msj.local_stack(kube_cluster, log) as s:
        yield s


@pytest.fixture
def env(stack, namespace, kube_cluster):
    ns = namespace(kube_cluster, "visible")
    stack.sim.clear_faults()
    stack.sim.reset_counters()
    yield stack, ns


def job(name: str, run: str = "1h", **pod: Any) -> dict[str, Any]:
    """A job whose pod template has `pod`'s fields besides its container."""
    body = msj.job(name, run=run, failure_policy={"maxRestarts": 5})
    body["spec"]["template"]["spec"].update(pod)
    return body


def pools_of(stack: LocalStack, ns: str, name: str) -> dict[str, Any]:
    names = {node_pool_name(ns, name, i) for i in range(2)}
    return {k: v for k, v in stack.sim.pools().items() if k in names}


def creates(stack: LocalStack) -> int:
    return int(stack.sim.counters()["calls"].get("create_node_pool", 0))


def failed(stack: LocalStack, ns: str, name: str, timeout: float = 60) -> dict[str, Any]:
    log = lambda n: stack.op.log_tail(n)  # noqa: E731 (the operator of the moment)
    st: dict[str, Any] = msj.wait_phase(stack.api, ns, name, "Failed", timeout, log=log)["status"]
    return st


def reason(st: dict[str, Any]) -> str:
    return str({c["type"]: c for c in st["conditions"]}["Failed"]["reason"])


def delete(stack: LocalStack, ns: str, name: str) -> None:
    custom(stack.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, name
    )
    wait_for(
        lambda: msj.get(stack.api, ns, name, missing_ok=True) is None,
        90,
        f"{name} deleted (finalizer removed)",
        interval=0.5,
        on_timeout=lambda: stack.op.log_tail(30),
    )


def test_a_sidecar_on_the_operators_port_is_refused_before_any_pool(env):
    """A metrics sidecar on 8080: on the host network its port would be a duplicate host port
    of the operator's MEGASCALE_PORT, and every pod refused; the dry run cannot see it."""
    stack, ns = env
    sidecar = {"name": "metrics", "image": msj.IMAGE, "ports": [{"containerPort": 8080}]}
    body = job("sidecar")
    body["spec"]["template"]["spec"]["containers"].append(sidecar)
    create(stack.api, ns, body)
    st = failed(stack, ns, "sidecar")
    assert reason(st) == "InvalidSpec", st
    assert "spec.template.spec.containers[1].ports[0].containerPort" in st["message"], st
    assert "TCP//8080" in st["message"] and "hostNetwork: false" in st["message"]
    assert creates(stack) == 0 and not pools_of(stack, ns, "sidecar")
    assert msj.jobset(stack.api, ns, "sidecar") is None
    delete(stack, ns, "sidecar")


def test_a_priority_class_that_does_not_exist_fails_the_job_before_any_pool(env):
    stack, ns = env
    create(stack.api, ns, job("prio", priorityClassName=f"{ns}-missing"))
    st = failed(stack, ns, "prio")
    assert reason(st) == "PriorityClassNotFound", st
    assert "spec.template.spec.priorityClassName" in st["message"], st["message"]
    assert f"{ns}-missing" in st["message"]
    assert creates(stack) == 0 and not pools_of(stack, ns, "prio")
    assert msj.jobset(stack.api, ns, "prio") is None
    delete(stack, ns, "prio")


def test_a_scheduler_that_is_not_there_holds_the_pools_one_grace_then_none(env):
    """Issue 56: schedulerName names a scheduler that is not running, with the issue's
    startupTimeoutSeconds 30 and unschedulableTimeoutSeconds 60 (the startup deadline replaced
    both pools and restarted the job every ~80 s, each restart resetting the unschedulable
    clock: it never failed). Now the pods, which no scheduler looks at, fail the job once the
    scheduler grace (60 s) passed since they were created, with its 2 pools and nothing
    replaced; a job naming that scheduler next, with a sidecar, fails before any pool."""
    stack, ns = env
    body = job("volcano", schedulerName="volcano")
    body["spec"]["failurePolicy"].update(startupTimeoutSeconds=30, unschedulableTimeoutSeconds=60)
    create(stack.api, ns, body)
    wait_for(lambda: len(pools_of(stack, ns, "volcano")) == 2, 60, "pools created")
    st = failed(stack, ns, "volcano", 240)
    assert reason(st) == "SchedulerNotRunning", st
    assert "spec.template.spec.schedulerName is 'volcano'" in st["message"], st["message"]
    assert "within 60s of the first one's creation" in st["message"], st["message"]
    assert creates(stack) == 2  # no pool replaced by the startup deadline
    lines = event_lines(stack.api, ns, "volcano")
    assert not [line for line in lines if line.startswith("StartupDeadlineExceeded")], lines
    wait_for(
        lambda: not pools_of(stack, ns, "volcano"),
        60,
        "the pools of the failed job released",
        on_timeout=lambda: stack.op.log_tail(30),
    )
    # The operator knows now: the next job naming it holds nothing (a native sidecar too).
    second = job("volcano-sidecar", schedulerName="volcano")
    sidecar = {"name": "log", "image": msj.IMAGE, "restartPolicy": "Always"}
    second["spec"]["template"]["spec"]["initContainers"] = [sidecar]
    create(stack.api, ns, second)
    st = failed(stack, ns, "volcano-sidecar")
    assert reason(st) == "SchedulerNotRunning", st
    assert "a scheduler known not to run" in st["message"], st["message"]
    assert f"job {ns}/volcano" in st["message"], st["message"]
    assert creates(stack) == 2 and not pools_of(stack, ns, "volcano-sidecar")
    assert msj.jobset(stack.api, ns, "volcano-sidecar") is None
    delete(stack, ns, "volcano-sidecar")
    delete(stack, ns, "volcano")


def test_pods_the_scheduler_refuses_fail_whatever_the_startup_deadline_does(env):
    """A pod the scheduler refuses (more CPU than a TPU node has) with startupTimeoutSeconds 30
    and unschedulableTimeoutSeconds 60: the startup deadline replaces the pools once, and the
    unschedulable clock it does not reset fails the job (issue 56: it never failed)."""
    stack, ns = env
    body = job("greedy")
    body["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1000"}}
    body["spec"]["failurePolicy"].update(startupTimeoutSeconds=30, unschedulableTimeoutSeconds=60)
    create(stack.api, ns, body)
    st = failed(stack, ns, "greedy", 360)
    assert reason(st) == "Unschedulable", st
    assert "Insufficient cpu" in st["message"], st["message"]
    assert creates(stack) <= 4, stack.sim.counters()  # the first gang and one replacement
    wait_for(
        lambda: not pools_of(stack, ns, "greedy"),
        60,
        "the pools of the failed job released",
        on_timeout=lambda: stack.op.log_tail(30),
    )
    delete(stack, ns, "greedy")


def test_a_job_for_multikueue_without_kueue_says_so_and_holds_nothing(env):
    """Issue 56: spec.managedBy kueue.x-k8s.io/multikueue and a queue, on a cluster whose
    operator does not watch Kueue (none runs here): 0 pools, but no status at all."""
    stack, ns = env
    labels = {keys.KUEUE_QUEUE_NAME: "lq"}
    body = msj.job("mk", run="1h", labels=labels, managedBy=keys.MULTIKUEUE_MANAGED_BY)
    create(stack.api, ns, body)
    pending = lambda s: s.get("phase") == "Pending"  # noqa: E731
    st = msj.wait_status(stack.api, ns, "mk", "Pending", pending, 60, log=stack.op.log_tail)
    st = st["status"]
    assert "does not watch Kueue (run it with --kueue" in st["message"], st["message"]
    admitted = {c["type"]: c for c in st["conditions"]}["Admitted"]
    assert (admitted["status"], admitted["reason"]) == ("False", "NoKueueWorkload"), admitted
    msj.wait_events(stack.api, ns, "mk", "NoKueueWorkload", log=stack.op.log_tail)
    assert creates(stack) == 0 and msj.jobset(stack.api, ns, "mk") is None
    delete(stack, ns, "mk")


def test_a_running_job_deleted_posts_no_restart(env):
    stack, ns = env
    create(stack.api, ns, job("witness"))  # keeps passes coming once the other one is gone
    create(stack.api, ns, job("gone"))
    for name in ("witness", "gone"):
        msj.wait_phase(stack.api, ns, name, "Running", 180, log=stack.op.log_tail)
    delete(stack, ns, "gone")
    msj.wait_reconciles(stack.op, 3)  # the deleting passes' events are posted by now
    lines = event_lines(stack.api, ns, "gone")
    assert not [line for line in lines if line.startswith("RestartingAllSlices")], lines
    assert not pools_of(stack, ns, "gone")
    delete(stack, ns, "witness")
