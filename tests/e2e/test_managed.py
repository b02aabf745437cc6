"""Managed mode end to end: the operator provisions node pools through the real GKE client library
against the local GKE API simulator, whose pools become kwok TPU nodes in the cluster profile."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from multislice_local.gke_sim import KubeNodeRegistrar
from multislice_local.harness import wait_for
from multislice_operator.api import models
from multislice_operator.common import keys
from multislice_operator.planning.plan import node_pool_name
from multislice_operator.reconcile.reasons import Reason
from tests import msj
from tests.msj import create, custom, event_lines, get, pools_of, status

SCHED_LABEL = "feature.node.kubernetes.io/e2e-sched"


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    with msj.local_stack(kube_cluster, tmp_path_factory.mktemp("managed") / "operator.log") as s:
        yield s


@pytest.fixture
def env(stack, namespace, kube_cluster):
    ns = namespace(kube_cluster, "mgd")
    assert stack.sim is not None
    stack.sim.clear_faults()
    stack.sim.configure(op_latency_s=1.0)
    yield stack, ns
    stack.sim.clear_faults()
    stack.sim.configure(op_latency_s=1.0, delete_latency_s=None)


def job(name: str, run: str = "4s", **spec) -> dict:
    """A job whose pods run `run`: a test that waits for Running and reads it there gives it a
    run long enough to be seen (a 4 s Running can pass between two polls under load)."""
    return msj.job(name, run=run, failure_policy={"maxRestarts": 5}, **spec)


def wait_phase(stack, ns, name, phase, timeout=90) -> dict:
    """The job's status once in `phase`; on timeout, the operator's last 40 log lines."""
    obj = msj.wait_phase(stack.api, ns, name, phase, timeout, log=lambda n: stack.op.log_tail(n))
    return obj["status"]


def nodes_of(stack, pool: str) -> list:
    return (
        client.CoreV1Api(stack.api)
        .list_node(label_selector=f"cloud.google.com/gke-nodepool={pool}")
        .items
    )


@pytest.mark.compat
def test_gang_provisioned_runs_succeeds_and_releases(env):
    stack, ns = env
    # Runs long enough for its Running status to be seen under load (what the test reads).
    create(stack.api, ns, job("gang", run="10s"))
    wait_phase(stack, ns, "gang", "Provisioning", 30)
    running = wait_phase(stack, ns, "gang", "Running")
    assert running["readySlices"] == "2/2"
    assert [s["readyHosts"] for s in running["slices"]] == [4, 4]
    pools = pools_of(stack.sim, ns, "gang")
    assert len(pools) == 2
    for name in pools:
        assert len(nodes_of(stack, name)) == 4
    wait_phase(stack, ns, "gang", "Succeeded")
    wait_for(lambda: not pools_of(stack.sim, ns, "gang"), 30, "pools deleted after success")
    for name in pools:
        wait_for(lambda n=name: not nodes_of(stack, n), 30, f"nodes of {name} removed")
    lines = msj.wait_events(stack.api, ns, "gang", Reason.GANG_PROVISIONED, log=stack.op.log_tail)
    assert any(e.startswith(Reason.GANG_PROVISIONED) for e in lines), lines


@pytest.mark.compat
def test_stockout_rolls_back_whole_gang_then_retries(env):
    stack, ns = env
    stack.sim.set_faults(stockout_next=1)
    create(stack.api, ns, job("stock", run="1h"))  # the test ends Running: it stays there

    def rolled_back():
        return [
            e for e in event_lines(stack.api, ns, "stock") if e.startswith(Reason.GANG_ROLLED_BACK)
        ]

    rb = wait_for(rolled_back, 60, "gang rolled back", interval=0.5)
    assert "GCE_STOCKOUT" in rb[0] and "slice" in rb[0]
    st = status(stack.api, ns, "stock")
    cond = {c["type"]: c for c in st["conditions"]}
    assert cond["Provisioned"]["reason"] in (Reason.GANG_SLICE_FAILED, Reason.PROVISIONING)
    # Every pool of the failed attempt goes away before the next attempt.
    wait_for(
        lambda: status(stack.api, ns, "stock").get("provisioningAttempts", 0) >= 2,
        60,
        "second gang attempt",
        interval=0.5,
    )
    done = wait_phase(stack, ns, "stock", "Running")
    assert done["provisioningAttempts"] == 2
    assert len(pools_of(stack.sim, ns, "stock")) == 2


def test_permanent_error_fails_without_leak(env):
    stack, ns = env
    stack.sim.set_faults(invalid_machine_types=["ct5lp-hightpu-4t"])
    create(stack.api, ns, job("perm"))
    failed = wait_phase(stack, ns, "perm", "Failed", 60)
    assert "INVALID" in failed["message"]
    wait_for(lambda: not pools_of(stack.sim, ns, "perm"), 30, "no pools left")


def test_429_and_5xx_are_retried(env):
    stack, ns = env
    stack.sim.reset_counters()
    stack.sim.set_faults(http_429_next=2, http_5xx_next=2)
    create(stack.api, ns, job("flaky", run="1h"))
    wait_phase(stack, ns, "flaky", "Running")
    codes = stack.sim.counters().get("responses", {})
    assert int(codes.get("429", codes.get(429, 0))) >= 1
    assert len(pools_of(stack.sim, ns, "flaky")) == 2


def test_timeout_rolls_back_and_retries(env):
    stack, ns = env
    stack.sim.configure(op_latency_s=40.0)
    create(stack.api, ns, job("slow", provisioning={"timeoutSeconds": 10}))

    def timed_out():
        st = status(stack.api, ns, "slow")
        conds = {c["type"]: c for c in st.get("conditions", [])}
        return conds.get("Provisioned", {}).get("reason") == Reason.GANG_TIMEOUT

    wait_for(timed_out, 40, "gang timeout", interval=0.5)
    stack.sim.configure(op_latency_s=1.0)
    wait_phase(stack, ns, "slow", "Running", 120)


@pytest.mark.compat
def test_delete_mid_provisioning_leaves_nothing(env):
    stack, ns = env
    stack.sim.configure(op_latency_s=5.0)
    create(stack.api, ns, job("midway"))
    wait_for(lambda: len(pools_of(stack.sim, ns, "midway")) == 2, 30, "pools being created")
    custom(stack.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "midway"
    )

    def gone():
        try:
            get(stack.api, ns, "midway")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(
        gone,
        90,
        "job deleted after its pools",
        interval=0.5,
        on_timeout=lambda: f"{stack.sim.pools()}\n{stack.op.log_tail(30)}",
    )
    assert not pools_of(stack.sim, ns, "midway")


def test_spot_preemption_replaces_one_slice_and_restarts_all(env):
    stack, ns = env
    create(stack.api, ns, job("spot", run="12s", capacity={"type": "Spot"}))
    wait_phase(stack, ns, "spot", "Running")
    stack.sim.reset_counters()
    victim = node_pool_name(ns, "spot", 1)
    survivor = node_pool_name(ns, "spot", 0)
    assert stack.sim.pool(victim)["config"].get("spot") is True
    stack.sim.preempt(victim, recreate_after_s=None)

    def restarted():
        st = status(stack.api, ns, "spot")
        return st if st.get("restarts", 0) >= 1 else None

    wait_for(
        restarted,
        90,
        "restart of all slices",
        interval=0.5,
        on_timeout=lambda: f"{status(stack.api, ns, 'spot')}\n{stack.op.log_tail(30)}",
    )
    # Seen once under a loaded CI (load 12 on 2 cores): after the restart slice 0 had Succeeded
    # and slice 1's new pool was Ready with none of its pods running yet 2 minutes later; alone
    # the whole test takes 40 s. Suspected: the old attempt's pods bound to the preempted nodes
    # wait for controller-manager's orphan pod GC. Not proven, so the wait is long, not removed.
    done = msj.wait_phase(
        stack.api, ns, "spot", "Succeeded", 300,
        log=lambda n: f"{stack.op.log_tail(n)}\n{msj.pods_and_nodes(stack.api, ns, 'msj-spot-')}",
    )["status"]  # fmt: skip
    assert done["restarts"] >= 1
    # A lost slice is a disruption: not charged to maxRestarts (issue 15).
    assert done["restartsByCause"]["disruption"] == done["restarts"], done["restartsByCause"]
    assert stack.sim.counters()["calls"].get("create_node_pool", 0) == 1  # only the victim
    lines = msj.wait_events(stack.api, ns, "spot", Reason.SLICE_LOST, log=stack.op.log_tail)
    lost = [e for e in lines if e.startswith(Reason.SLICE_LOST)]
    assert any("slice 1" in e for e in lost), (lost, stack.op.log_tail(60))
    # The survivor's pool was never replaced: the only create after the preemption is the
    # victim's (the release after success deletes both, which is checked elsewhere).
    assert survivor != victim


def busy_pools(stack, ns: str, name: str) -> set[str]:
    """The node pools the job's running pods are on."""
    core = client.CoreV1Api(stack.api)
    pods = core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")
    nodes = {p.spec.node_name for p in pods.items if p.status.phase == "Running"} - {None}
    pools = set()
    for node in nodes:
        labels = core.read_node(node).metadata.labels or {}
        pools.add(labels.get("cloud.google.com/gke-nodepool", "?"))
    return pools


def test_a_spare_takes_a_lost_slices_place_while_its_replacement_is_stocked_out(env):
    """spec.spares: 1. A busy pool is preempted and every create of its replacement ends in
    GCE_STOCKOUT (held): the job restarts all slices on the spare and runs again with no pool
    create on its path, and succeeds; the replacement comes once the stockout ends."""
    stack, ns = env
    create(stack.api, ns, job("spare", run="25s", capacity={"type": "Spot"}, spares=1))
    wait_phase(stack, ns, "spare", "Running")
    held = set(pools_of(stack.sim, ns, "spare"))
    assert len(held) == 3  # 2 slices + 1 spare, provisioned as one gang

    def both_running():
        busy = busy_pools(stack, ns, "spare")
        return busy if len(busy) == 2 else None

    busy = wait_for(both_running, 30, "both slices' pods running")
    (spare,) = held - busy
    victim = sorted(busy)[0]
    stack.sim.set_faults(stockout_next=1000)
    stack.sim.reset_counters()
    stack.sim.preempt(victim, recreate_after_s=None)

    def running_again():
        st = status(stack.api, ns, "spare")
        return st if st.get("restarts", 0) >= 1 and st.get("phase") == "Running" else None

    def explain():
        return f"{status(stack.api, ns, 'spare')}\n{stack.op.log_tail(40)}"

    st = wait_for(running_again, 120, "Running on the spare", interval=0.5, on_timeout=explain)
    # It runs again while the lost pool's replacement has not come: nothing waited for it.
    replacement = stack.sim.pools().get(victim)
    assert replacement is None or replacement["status"] != "RUNNING", replacement
    assert spare in busy_pools(stack, ns, "spare")
    provisioned = next(c for c in st["conditions"] if c["type"] == "Provisioned")
    assert (provisioned["status"], provisioned["reason"]) == ("True", Reason.REPAIRING_SPARE)
    lost = msj.wait_events(stack.api, ns, "spare", Reason.SLICE_LOST, log=stack.op.log_tail)
    assert any("a spare node pool takes its place" in e for e in lost), lost
    assert set(pools_of(stack.sim, ns, "spare")) <= held  # replaced under its own name only
    # And its replacement is tried: after the lost pool's deletion, which the job running again
    # on the spare need not wait for (a plain run once read the count before the first create).
    wait_for(
        lambda: stack.sim.counters()["calls"].get("create_node_pool", 0) >= 1,
        60, "the lost pool's replacement tried", on_timeout=explain,
    )  # fmt: skip
    stack.sim.clear_faults()
    done = wait_phase(stack, ns, "spare", "Succeeded", 300)
    assert done["restartsByCause"]["disruption"] == done["restarts"] >= 1, done


def test_startup_deadline_replaces_the_pool_no_pod_could_schedule_on(env):
    """Issue 15: a Ready pool that takes none of the job's pods (here: its nodes lack a label
    the template selects) is replaced once the start misses startupTimeoutSeconds; the other
    slice keeps its pods, and nothing restarts."""
    stack, ns = env
    body = job("stuck", run="1h", failurePolicy={"maxRestarts": 5, "startupTimeoutSeconds": 10})
    # A label another controller adds to nodes after they join (node-feature-discovery style,
    # under kubernetes.io): the plan cannot know it and lets it through (issue 21).
    body["spec"]["template"]["spec"]["nodeSelector"] = {SCHED_LABEL: "yes"}
    create(stack.api, ns, body)
    wait_phase(stack, ns, "stuck", "Starting")
    good, bad = node_pool_name(ns, "stuck", 0), node_pool_name(ns, "stuck", 1)
    core = client.CoreV1Api(stack.api)

    def label(pool: str) -> list[str]:
        names = [n.metadata.name for n in nodes_of(stack, pool)]
        for name in names:
            core.patch_node(name, {"metadata": {"labels": {SCHED_LABEL: "yes"}}})
        return names

    label(good)  # one slice schedules there; the other has nowhere to go
    before = {n.metadata.uid for n in nodes_of(stack, bad)}
    fired = wait_for(
        lambda: [
            e
            for e in event_lines(stack.api, ns, "stuck")
            if e.startswith(Reason.STARTUP_DEADLINE_EXCEEDED)
        ],
        90,
        Reason.STARTUP_DEADLINE_EXCEEDED,
        interval=0.5,
        on_timeout=lambda: f"{status(stack.api, ns, 'stuck')}\n{stack.op.log_tail(40)}",
    )
    assert f"replacing node pool {bad}, on which no pod of the job could schedule" in fired[0]
    assert "0/4 pods running (unschedulable)" in fired[0]

    def replaced() -> list[str] | None:
        fresh = [n for n in nodes_of(stack, bad) if n.metadata.uid not in before]
        return label(bad) if len(fresh) == 4 else None  # the new pool's nodes work

    wait_for(replaced, 90, f"{bad} replaced", interval=0.5, on_timeout=stack.op.log_tail)
    running = wait_phase(stack, ns, "stuck", "Running", 120)
    assert running["readySlices"] == "2/2"
    assert running.get("restarts", 0) == 0  # the scheduled slice kept its pods: no restart
    msj.wait_events(stack.api, ns, "stuck", Reason.SLICE_LOST, log=stack.op.log_tail)
    custom(stack.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "stuck"
    )
    wait_for(lambda: not pools_of(stack.sim, ns, "stuck"), 90, "pools released", interval=0.5)


def test_crash_between_create_and_status_no_duplicates(env):
    stack, ns = env
    stack.stop_operator()
    stack.sim.reset_counters()
    op = stack.start_operator(extra_env={"MSJ_CRASH_POINT": "after-pool-create"})
    create(stack.api, ns, job("crash", run="1h"))
    assert op.wait_exit(60) == 3  # died right after asking GKE for the pools
    stack.start_operator()
    wait_phase(stack, ns, "crash", "Running")
    assert len(pools_of(stack.sim, ns, "crash")) == 2
    assert stack.sim.counters()["calls"]["create_node_pool"] == 2  # no duplicate create


def test_crash_after_jobset_create_converges(env):
    stack, ns = env
    stack.stop_operator()
    op = stack.start_operator(extra_env={"MSJ_CRASH_POINT": "after-jobset-create"})
    create(stack.api, ns, job("crashjs", run="1h"))
    assert op.wait_exit(90) == 3
    assert "phase" not in status(stack.api, ns, "crashjs") or (
        status(stack.api, ns, "crashjs")["phase"] != "Running"
    )
    stack.start_operator()
    st = wait_phase(stack, ns, "crashjs", "Running")
    assert st["jobSet"] == "crashjs"
    jobsets = custom(stack.api).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets"
    )["items"]
    assert [j["metadata"]["name"] for j in jobsets] == ["crashjs"]


def test_orphaned_pools_are_collected(env):
    stack, ns = env
    create(stack.api, ns, job("orphan", run="1h"))
    wait_phase(stack, ns, "orphan", "Running")
    pools = set(pools_of(stack.sim, ns, "orphan"))
    # The operator is down while the job disappears without its finalizer running.
    stack.stop_operator()
    custom(stack.api).patch_namespaced_custom_object(
        models.GROUP,
        models.VERSION,
        ns,
        models.PLURAL,
        "orphan",
        {"metadata": {"finalizers": []}},
    )
    custom(stack.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "orphan"
    )
    # No operator runs, so nothing can delete them yet: leaked, for now.
    assert set(pools_of(stack.sim, ns, "orphan")) == pools
    stack.start_operator()
    wait_for(
        lambda: not pools_of(stack.sim, ns, "orphan"),
        60,
        "orphans swept by the GC",
        interval=0.5,
        on_timeout=lambda: stack.op.log_tail(30),
    )


def test_suspend_releases_capacity_and_resume_reprovisions(env):
    stack, ns = env
    create(stack.api, ns, job("pause", run="1h"))
    wait_phase(stack, ns, "pause", "Running")
    registrar = stack.sim.registrar
    assert isinstance(registrar, KubeNodeRegistrar)
    shut = len(registrar.shut_down)
    stack.sim.configure(delete_latency_s=0.0)  # a pool deleted too soon ends its pods at once
    custom(stack.api).patch_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "pause", {"spec": {"suspend": True}}
    )
    wait_phase(stack, ns, "pause", "Suspended")
    wait_for(lambda: not pools_of(stack.sim, ns, "pause"), 30, "pools released while suspended")
    js = custom(stack.api).get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "pause"
    )
    assert js["spec"]["suspend"] is True
    custom(stack.api).patch_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "pause", {"spec": {"suspend": False}}
    )
    resumed = wait_phase(stack, ns, "pause", "Running", 120)
    assert len(pools_of(stack.sim, ns, "pause")) == 2
    # The pods ended by the JobSet's suspension, none by the pools' deletion (node shutdown: a
    # disruption JobSet restarts every slice for).
    assert [p for p in registrar.shut_down[shut:] if p.startswith(f"{ns}/pause-")] == []
    assert resumed["restarts"] == 0


def _condition(st: dict, type_: str) -> dict:
    return next(c for c in st.get("conditions") or [] if c["type"] == type_)


def test_an_elastic_job_runs_on_three_slices_under_a_held_stockout_and_grows_back(env):
    """spec.elastic {minSlices: 3}: a busy pool of a 4-slice job is preempted and every create of
    its replacement ends in GCE_STOCKOUT (held): the JobSet is recreated on 3 slices (its
    environment says 3) and the job runs on; once the stockout ends and the replacement is
    Ready, the operator asks for a checkpoint, the workload saves it, and the job grows back to
    4 slices and succeeds."""
    stack, ns = env
    elastic = {"minSlices": 3, "waitSeconds": 5}
    create(stack.api, ns, job("el", run="60s", capacity={"type": "Spot"}, slices=4,
                              elastic=elastic))  # fmt: skip
    wait_phase(stack, ns, "el", "Running", 120)
    held = set(pools_of(stack.sim, ns, "el"))
    assert len(held) == 4

    def all_four():
        busy = busy_pools(stack, ns, "el")
        return busy if len(busy) == 4 else None

    busy = wait_for(all_four, 60, "4 slices' pods running")
    victim = sorted(busy)[0]
    stack.sim.set_faults(stockout_next=1000)
    stack.sim.preempt(victim, recreate_after_s=None)

    def explain():
        return f"{status(stack.api, ns, 'el')}\n{stack.op.log_tail(60)}"

    def on(slices: int):
        def check():
            st = status(stack.api, ns, "el")
            running = st.get("phase") == "Running" and st.get("activeSlices") == slices
            return st if running and len(busy_pools(stack, ns, "el")) == slices else None

        return check

    st = wait_for(on(3), 120, "Running on 3 slices", interval=0.5, on_timeout=explain)
    degraded = _condition(st, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", Reason.FEWER_SLICES), degraded
    assert victim not in busy_pools(stack, ns, "el")
    replacement = stack.sim.pools().get(victim)
    assert replacement is None or replacement["status"] != "RUNNING", replacement
    jobset = custom(stack.api).get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "el"
    )
    rjob = jobset["spec"]["replicatedJobs"][0]
    assert rjob["replicas"] == 3
    env_vars = {e["name"]: e.get("value") for e in
                rjob["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}  # fmt: skip
    assert env_vars["MEGASCALE_NUM_SLICES"] == "3" and env_vars["JAX_PROCESS_COUNT"] == "12"
    shrunk = msj.wait_events(stack.api, ns, "el", Reason.SHRINKING_SLICES, log=stack.op.log_tail)
    assert any("restarting on 3 of 4 slices" in e for e in shrunk), shrunk
    # The stockout ends: the replacement comes, and the operator asks for a checkpoint first.
    stack.sim.clear_faults()

    def grow_request():
        cp = status(stack.api, ns, "el").get("checkpoint") or {}
        rid = cp.get("requestId") or ""
        return rid if rid.startswith("grow-4-") else None

    rid = wait_for(grow_request, 180, "the grow checkpoint request", interval=0.5,
                   on_timeout=explain)  # fmt: skip
    core = client.CoreV1Api(stack.api)

    def asked_pod():
        pods = core.list_namespaced_pod(ns, label_selector="jobset.sigs.k8s.io/jobset-name=el")
        mine = [p.metadata.name for p in pods.items
                if (p.metadata.annotations or {}).get(keys.CHECKPOINT_REQUEST) == rid]  # fmt: skip
        return sorted(mine)[0] if mine else None

    first = wait_for(asked_pod, 60, "a pod carrying the request", interval=0.5)
    ack = json.dumps({"id": rid, "step": 120})  # the workload's process 0 acknowledges
    core.patch_namespaced_pod(
        first, ns, {"metadata": {"annotations": {keys.CHECKPOINT_SAVED: ack}}}
    )
    st = wait_for(on(4), 180, "Running on 4 slices again", interval=0.5, on_timeout=explain)
    assert _condition(st, "Degraded")["status"] == "False"
    grown = msj.wait_events(stack.api, ns, "el", Reason.GROWING_SLICES, log=stack.op.log_tail)
    assert any(f"checkpoint {rid} saved at step 120" in e for e in grown), grown
    done = wait_phase(stack, ns, "el", "Succeeded", 300)
    assert done["restartsByCause"]["resize"] == 2, done["restartsByCause"]
    assert done["restarts"] == sum(done["restartsByCause"].values())
    assert (done["goodput"] or {}).get("degradedChipSeconds", 0) > 0
