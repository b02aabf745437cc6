"""Issue 14 end to end: no bad input, update or blip leaves a job holding TPU node pools.

Managed mode against the real apiserver, JobSet controller and webhooks, scheduler and kwok nodes
(cluster profile) and the GKE simulator. Every case ends one of two ways, within a bound: the job
runs, or it is Failed with a message that names the field or quotes the apiserver, and no node
pool of it is left. Cases that need a real pool count the simulator's create/delete calls.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.harness import wait_for
from multislice_local.nodes import RUN_DURATION_ANNOTATION, set_not_ready
from multislice_local.stack import LocalStack
from multislice_operator.api import models
from multislice_operator.planning.plan import node_pool_name
from multislice_operator.reconcile.reasons import Reason
from tests import msj
from tests.msj import create, custom, event_lines

NOT_READY_GRACE_S = 20  # the operator's node NotReady grace period in this module


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    log = tmp_path_factory.mktemp("bad-input") / "operator.log"
    env = {"MSJ_NODE_NOT_READY_GRACE_SECONDS": str(NOT_READY_GRACE_S)}
    with msj.local_stack(kube_cluster, log, operator_env=env) as s:
        yield s


@pytest.fixture
def env(stack, namespace, kube_cluster):
    ns = namespace(kube_cluster, "bad-input")
    stack.sim.clear_faults()
    stack.sim.configure(op_latency_s=1.0)
    stack.sim.reset_counters()
    yield stack, ns
    stack.sim.clear_faults()


def job(name: str, run: str = "1h", **spec: Any) -> dict[str, Any]:
    return msj.job(name, run=run, failure_policy={"maxRestarts": 5}, **spec)


def get(stack: LocalStack, ns: str, name: str) -> dict[str, Any] | None:
    return msj.get(stack.api, ns, name, missing_ok=True)


def status(stack: LocalStack, ns: str, name: str) -> dict[str, Any]:
    return msj.status(stack.api, ns, name, missing_ok=True)


def wait_phase(stack, ns, name, phase, timeout=90) -> dict[str, Any]:
    """The job's status once in `phase`; on timeout, the operator's last 40 log lines."""
    log = lambda n: stack.op.log_tail(n)  # noqa: E731 (the operator of the moment)
    return msj.wait_phase(stack.api, ns, name, phase, timeout, log=log, missing_ok=True)["status"]


def pools_of(stack: LocalStack, ns: str, name: str) -> dict[str, Any]:
    names = {node_pool_name(ns, name, i) for i in range(2)}
    return {k: v for k, v in stack.sim.pools().items() if k in names}


def no_pools_left(stack: LocalStack, ns: str, name: str) -> None:
    wait_for(
        lambda: not pools_of(stack, ns, name),
        60,
        f"no node pool of {name} left",
        interval=0.5,
        on_timeout=lambda: f"{stack.sim.pools()}\n{stack.op.log_tail(30)}",
    )


def calls(stack: LocalStack, method: str) -> int:
    return int(stack.sim.counters()["calls"].get(method, 0))


def delete(stack: LocalStack, ns: str, name: str) -> None:
    custom(stack.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, name
    )
    wait_for(
        lambda: get(stack, ns, name) is None,
        90,
        f"{name} deleted (finalizer removed)",
        interval=0.5,
        on_timeout=lambda: f"{get(stack, ns, name)}\n{stack.op.log_tail(30)}",
    )


def failed_before_any_pool(stack, ns, name, needle: str) -> dict[str, Any]:
    st = wait_phase(stack, ns, name, "Failed", 60)
    assert needle in st["message"], st["message"]
    assert calls(stack, "create_node_pool") == 0, stack.sim.counters()
    assert not pools_of(stack, ns, name)
    assert msj.jobset(stack.api, ns, name) is None
    return st


# ---------------------------------------------------------------- items 1, 2, 3, 6: refused input


def with_template(name: str, **changes: Any) -> dict[str, Any]:
    body = job(name)
    template = body["spec"]["template"]
    for key, value in changes.items():
        if key == "labels":
            template["metadata"]["labels"] = value
        elif key == "annotations":
            template["metadata"]["annotations"].update(value)
        elif key == "containers":
            template["spec"]["containers"] = value
        else:
            template["spec"]["containers"][0][key] = value
    return body


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"labels": {"bad key!": "x"}}, "bad key!"),  # item 3: the Job the JobSet would make
        # Kubernetes 1.36 says "bytes" (1.34 said "characters").
        ({"labels": {"team": "v" * 100}}, "must be no more than 63 bytes"),  # item 3
        ({"ports": [{"containerPort": 99999}]}, "containerPort"),  # what only Job validation sees
        (
            {
                "containers": [
                    {"name": "train", "image": "example.invalid/t:1"},
                    {"name": "train", "image": "example.invalid/s:1"},
                ]
            },
            "Duplicate value",
        ),  # item 2: a JobSet whose Jobs the apiserver refuses
        ({"annotations": {"big": "x" * (300 * 1024)}}, "262144"),  # item 6: pod annotations
    ],
    ids=["label-key", "label-value", "port-range", "duplicate-container", "annotation-300KiB"],
)
def test_refused_template_fails_before_any_pool(env, changes, needle):
    stack, ns = env
    create(stack.api, ns, with_template("refused", **changes))
    st = failed_before_any_pool(stack, ns, "refused", needle)
    assert "the apiserver refuses" in st["message"], st["message"]
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Failed"]["reason"] == Reason.JOBSET_REFUSED
    delete(stack, ns, "refused")


def test_jobset_webhook_refusal_fails_before_any_pool(env):
    """`a.b.c` is a valid object name but no DNS-1035 subdomain: JobSet's webhook says so."""
    stack, ns = env
    try:
        create(stack.api, ns, job("a.b.c"))
    except ApiException as exc:  # refused at admission, naming the name: earlier still
        assert exc.status == 422 and "metadata.name" in str(exc.body), exc.body
        return
    failed_before_any_pool(stack, ns, "a.b.c", "subdomain")
    delete(stack, ns, "a.b.c")


# ---------------------------------------------------------------- item 4: unschedulable pods


def test_unschedulable_pods_fail_the_job_with_the_schedulers_reason(env):
    stack, ns = env
    body = job("nosched", failurePolicy={"maxRestarts": 5, "unschedulableTimeoutSeconds": 10})
    # A label the plan cannot judge (a node-feature-discovery one, under kubernetes.io), which
    # the job's nodes lack: the plan refuses only what the pools can never carry (issue 21).
    body["spec"]["template"]["spec"]["nodeSelector"] = {
        "feature.node.kubernetes.io/storage-nonrotationaldisk": "true"
    }
    create(stack.api, ns, body)
    wait_for(lambda: len(pools_of(stack, ns, "nosched")) == 2, 60, "pools created")
    st = wait_phase(stack, ns, "nosched", "Failed", 120)
    assert "didn't match Pod's node affinity/selector" in st["message"], st["message"]
    assert "spec.failurePolicy.unschedulableTimeoutSeconds" in st["message"]
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Failed"]["reason"] == Reason.UNSCHEDULABLE
    no_pools_left(stack, ns, "nosched")
    wait_for(
        lambda: msj.jobset(stack.api, ns, "nosched") is None, 30, "JobSet of the failed job deleted"
    )
    msj.wait_reconciles(stack.op, 1)  # a pass more (a Failed job: every 6 resyncs)
    assert status(stack, ns, "nosched")["phase"] == "Failed"
    assert not pools_of(stack, ns, "nosched")
    delete(stack, ns, "nosched")


def test_a_namespace_whose_pod_security_refuses_tpu_pods_fails_the_job_before_any_pool(env):
    """The namespace's Pod Security level is read before the first pool: `restricted` refuses
    host-network pods, so the job fails at once, holding nothing (no pool, no JobSet)."""
    stack, ns = env
    client.CoreV1Api(stack.api).patch_namespace(
        ns, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    create(stack.api, ns, job("podsec"))
    st = wait_phase(stack, ns, "podsec", "Failed", 60)
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Failed"]["reason"] == Reason.POD_SECURITY_REFUSED, st
    assert "restricted" in st["message"] and "hostNetwork" in st["message"], st["message"]
    assert not pools_of(stack, ns, "podsec")
    assert msj.jobset(stack.api, ns, "podsec") is None
    delete(stack, ns, "podsec")


def test_pods_the_apiserver_never_creates_fail_the_job_after_the_deadline(env):
    """Refused only when the Job controller creates them (a ResourceQuota of 0 pods counts
    pods, not Jobs, so the dry run passes): no pod ever appears; the deadline still ends it."""
    stack, ns = env
    client.CoreV1Api(stack.api).create_namespaced_resource_quota(
        ns, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}
    )
    create(stack.api, ns, job("nopods", failurePolicy={"unschedulableTimeoutSeconds": 10}))
    wait_for(lambda: len(pools_of(stack, ns, "nopods")) == 2, 60, "pools created")
    st = wait_phase(stack, ns, "nopods", "Failed", 120)
    assert "no pod of slice" in st["message"], st["message"]
    assert "kubectl describe job nopods-slice-" in st["message"]
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Failed"]["reason"] == Reason.PODS_NOT_CREATED
    no_pools_left(stack, ns, "nopods")
    wait_for(
        lambda: msj.jobset(stack.api, ns, "nopods") is None, 30, "JobSet of the failed job deleted"
    )
    delete(stack, ns, "nopods")


# ---------------------------------------------------------------- item 6: a spec over 256 KiB


def test_a_spec_over_256KiB_runs_and_deletes(env):
    """kopf's last-handled-configuration copy of such a spec broke every patch (fixed by the
    redesign: kopf writes nothing to jobs); pod annotations stay under their 256 KiB limit."""
    stack, ns = env
    body = with_template(
        "huge",
        annotations={"notes": "n" * (200 * 1024), RUN_DURATION_ANNOTATION: "3s"},
        env=[{"name": "BLOB", "value": "b" * (100 * 1024)}],
    )
    create(stack.api, ns, body)
    wait_phase(stack, ns, "huge", "Succeeded", 120)
    no_pools_left(stack, ns, "huge")
    delete(stack, ns, "huge")


# ---------------------------------------------------------------- item 7: pool-name collision


def colliding_names(ns: str) -> tuple[str, str]:
    """Two job names of this namespace whose node pools get the same names (6 hex of hash)."""
    stem = "collide-abcdefghijklmnopqrs"  # fills the pool name's stem
    seen: dict[str, str] = {}
    for i in range(1, 200000):
        name = f"{stem}-{i}"
        key = hashlib.sha256(f"{ns}/{name}".encode()).hexdigest()[:6]
        if key in seen:
            return seen[key], name
        seen[key] = name
    raise AssertionError("no collision found")


def test_pool_name_collision_never_touches_the_other_jobs_pools(env):
    stack, ns = env
    first, second = colliding_names(ns)
    assert node_pool_name(ns, first, 0) == node_pool_name(ns, second, 0)
    create(stack.api, ns, job(first))
    wait_phase(stack, ns, first, "Running", 120)
    stack.sim.reset_counters()
    create(stack.api, ns, job(second))
    st = wait_phase(stack, ns, second, "Failed", 60)
    assert Reason.POOL_NAME_TAKEN in {c["reason"] for c in st["conditions"]}
    assert first in st["message"] and node_pool_name(ns, first, 0) in st["message"], st
    msj.wait_reconciles(stack.op, 3)  # several passes over both jobs
    assert calls(stack, "delete_node_pool") == 0, stack.sim.counters()
    running = status(stack, ns, first)
    assert running["phase"] == "Running" and running["restarts"] == 0, running
    assert len(pools_of(stack, ns, first)) == 2
    delete(stack, ns, second)
    assert len(pools_of(stack, ns, first)) == 2  # deleting the loser releases nothing of ours
    delete(stack, ns, first)
    no_pools_left(stack, ns, first)


# ---------------------------------------------------------------- item 8: NotReady is not lost


def test_a_not_ready_blip_is_an_event_not_a_repair(env):
    stack, ns = env
    create(stack.api, ns, job("blip"))
    wait_phase(stack, ns, "blip", "Running", 120)
    stack.sim.reset_counters()
    pool = node_pool_name(ns, "blip", 1)
    set_not_ready(stack.api, pool)
    msj.wait_events(stack.api, ns, "blip", Reason.SLICE_NOT_READY, log=stack.op.log_tail)
    msj.wait_reconciles(stack.op, 2)  # more passes with slice 1's nodes NotReady, within grace
    assert calls(stack, "delete_node_pool") == 0, stack.sim.counters()
    assert not any(e.startswith(Reason.SLICE_LOST) for e in event_lines(stack.api, ns, "blip"))
    set_not_ready(stack.api, pool, False)
    wait_for(
        lambda: any(e.startswith(Reason.SLICE_READY) for e in event_lines(stack.api, ns, "blip")),
        30,
        "a SliceReady event",
        on_timeout=lambda: "\n".join(event_lines(stack.api, ns, "blip")) + stack.op.log_tail(30),
    )
    st = wait_phase(stack, ns, "blip", "Running", 60)
    assert st["restarts"] == 0, st
    assert calls(stack, "delete_node_pool") == 0 and calls(stack, "create_node_pool") == 0
    assert not any(e.startswith(Reason.SLICE_LOST) for e in event_lines(stack.api, ns, "blip"))
    delete(stack, ns, "blip")
    no_pools_left(stack, ns, "blip")


def test_not_ready_past_the_grace_period_replaces_the_slice(env):
    stack, ns = env
    create(stack.api, ns, job("gone"))
    wait_phase(stack, ns, "gone", "Running", 120)
    stack.sim.reset_counters()
    pool = node_pool_name(ns, "gone", 1)
    set_not_ready(stack.api, pool)
    lost = wait_for(
        lambda: [e for e in event_lines(stack.api, ns, "gone") if e.startswith(Reason.SLICE_LOST)],
        NOT_READY_GRACE_S + 40,
        "SliceLost after the grace period",
        on_timeout=lambda: "\n".join(event_lines(stack.api, ns, "gone")) + stack.op.log_tail(30),
    )
    assert "slice 1" in lost[0] and "NotReady" in lost[0], lost
    st = wait_for(
        lambda: (
            (s := status(stack, ns, "gone")).get("restarts", 0) >= 1
            and s.get("phase") == "Running"
            and s
        ),
        120,
        "running again on a new pool",
        interval=0.5,
        on_timeout=lambda: (
            f"{status(stack, ns, 'gone')}\n{stack.op.log_tail(30)}\n"
            + msj.pods_and_nodes(stack.api, ns, "msj-gone-")
        ),
    )
    assert st["slices"][0]["readyHosts"] == 4
    assert calls(stack, "create_node_pool") == 1, stack.sim.counters()  # that slice only
    delete(stack, ns, "gone")
    no_pools_left(stack, ns, "gone")


# ---------------------------------------------------------------- item 10: status is not a command


def test_a_hand_written_terminal_status_releases_nothing(env):
    stack, ns = env
    create(stack.api, ns, job("liar"))
    wait_phase(stack, ns, "liar", "Running", 120)
    stack.sim.reset_counters()
    custom(stack.api).patch_namespaced_custom_object_status(
        models.GROUP,
        models.VERSION,
        ns,
        models.PLURAL,
        "liar",
        {"status": {"phase": "Succeeded", "message": "done (by hand)"}},
    )
    msj.wait_reconciles(stack.op, 2)  # passes that read the hand-written status
    assert calls(stack, "delete_node_pool") == 0, stack.sim.counters()
    assert len(pools_of(stack, ns, "liar")) == 2
    wait_for(
        lambda: any(
            e.startswith(Reason.STATUS_IGNORED) for e in event_lines(stack.api, ns, "liar")
        ),
        30,
        "a StatusIgnored event",
        on_timeout=lambda: "\n".join(event_lines(stack.api, ns, "liar")) + stack.op.log_tail(30),
    )
    st = wait_phase(stack, ns, "liar", "Running", 30)
    msj.wait_reconciles(stack.op, 2)
    assert calls(stack, "delete_node_pool") == 0, stack.sim.counters()
    assert len(pools_of(stack, ns, "liar")) == 2 and st["restarts"] == 0
    delete(stack, ns, "liar")
    no_pools_left(stack, ns, "liar")
