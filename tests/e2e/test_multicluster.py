"""MultiKueue with real processes: a manager cluster and two workers
(multislice_local.multicluster), each with its own Kueue v0.19 and operator, the workers each with
their own GKE simulator.

The module's ``mc`` fixture is the whole setup, started once (about 30 s and 2.8 GB of RSS on
2 cores); each test gets a namespace with LocalQueue ``team-a`` on all three clusters (``ns``).
What a test uses of it (see :class:`multislice_local.multicluster.MultiCluster`):

* ``mc.manager``, ``mc.workers["a"|"b"]``: LocalStacks (``.api``, ``.sim``, ``.op``, ``.cp``);
* ``mc.create(name, ns, **spec)``: a MultisliceJob on the manager with ``spec.managedBy:
  kueue.x-k8s.io/multikueue`` and the queue label (``managed_by=None``: without managedBy);
* ``mc.status(cluster, name, ns)``, ``mc.job(...)``, ``mc.workload(cluster, name, ns)``, cluster
  ``"manager"``, ``"a"`` or ``"b"``; ``mc.phase(cluster, name, ns, "Running")`` waits (dump on
  timeout);
* ``mc.set_quota(cluster, chips)``, ``mc.workers["a"].sim.set_faults(stockout_next=1)``;
* ``mc.cut_off("a")`` / ``mc.reconnect("a")``: the manager loses worker a and finds it again;
* ``mc.dump(ns)`` for a timeout: each cluster's Workloads and jobs, and the log tails.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from multislice_local import queues
from multislice_local.harness import wait_for
from multislice_local.multicluster import MANAGER, MULTIKUEUE_CHECK, QUEUE, MultiCluster
from multislice_operator.api import models
from multislice_operator.common import keys


@pytest.fixture(scope="module")
def mc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiCluster]:
    setup = MultiCluster(log_dir=tmp_path_factory.mktemp("multicluster"))
    try:  # start() stops whatever it started when it fails
        setup.start()
        yield setup
    finally:
        setup.stop()


@pytest.fixture
def ns(mc: MultiCluster) -> Iterator[str]:
    name = mc.namespace(f"mc-{uuid.uuid4().hex[:6]}")
    yield name
    for stack in mc.workers.values():
        assert stack.sim is not None
        stack.sim.clear_faults()
    mc.delete_namespace(name)


def active(obj: dict[str, object] | None) -> dict[str, object]:
    return queues.condition(obj, "Active")  # type: ignore[arg-type]


def test_the_setup_comes_up_with_both_workers_active(mc: MultiCluster, ns: str) -> None:
    for w in ("a", "b"):
        cluster = mc.multikueue_cluster(w)
        assert active(cluster).get("status") == "True", cluster
    check = mc.admission_check(MANAGER)
    assert check is not None
    assert check["spec"]["controllerName"] == "kueue.x-k8s.io/multikueue"
    assert check["metadata"]["name"] == MULTIKUEUE_CHECK
    assert active(check).get("status") == "True", check
    for c in mc.clusters():
        cq = mc.cluster_queue(c)
        assert active(cq).get("status") == "True", (c, cq)
    # Each worker's operator set its own check Active (Kueue leaves a check of a controller it
    # does not know alone), on its own cluster.
    for w, stack in mc.workers.items():
        gang = mc.admission_check(w)
        assert gang is not None
        assert gang["spec"]["controllerName"] == "multislice.dev/gang-provisioning"
        assert active(gang).get("status") == "True", (w, gang)
        assert stack.op is not None
        assert "admission check multislice-gang Active" in stack.op.log_tail(200)
    # Each worker names its own GKE cluster; the namespace's LocalQueue is on all three.
    assert {w: s.options.gke_cluster for w, s in mc.workers.items()} == {
        "a": "worker-a",
        "b": "worker-b",
    }
    for c, stack in mc.clusters().items():
        lq = client.CustomObjectsApi(stack.api).get_namespaced_custom_object(
            queues.GROUP, queues.VERSION, ns, "localqueues", QUEUE
        )
        assert lq["spec"]["clusterQueue"] == QUEUE, c


# ---------------------------------------------------------------- jobs through MultiKueue


def job_pools(mc: MultiCluster, cluster: str, name: str, ns: str) -> list[str]:
    from multislice_operator.planning.plan import node_pool_name

    prefix = node_pool_name(ns, name, 0)[:-2]
    sim = mc.stack(cluster).sim
    assert sim is not None
    return [p for p in sim.pools() if p.startswith(prefix)]


def runs_in(status: dict[str, Any]) -> str:
    """The worker letter of status.queue.cluster (projects/P/locations/L/clusters/worker-X)."""
    cluster = (status.get("queue") or {}).get("cluster") or ""
    return cluster.rsplit("/worker-", 1)[-1] if "/worker-" in cluster else ""


def gone_everywhere(mc: MultiCluster, name: str, ns: str) -> bool:
    return all(mc.job(w, name, ns) is None and not job_pools(mc, w, name, ns) for w in mc.workers)


def test_a_job_is_dispatched_runs_on_a_worker_and_the_manager_shows_it(mc: MultiCluster, ns: str):
    """Issue 43: admitted on the manager (its quota counts the spare), provisioned and run by the
    worker's operator in that worker's GKE location; the manager's copy shows the worker's status
    and never gets a node pool or a JobSet; the worker's copy and pools go when it ends."""
    mc.create("d", ns, run="4s", spares=1)
    running = mc.phase(MANAGER, "d", ns, "Running", 240)
    worker = runs_in(running)
    assert worker in mc.workers, running.get("queue")
    other = next(w for w in mc.workers if w != worker)
    assert len(job_pools(mc, worker, "d", ns)) == 3  # 2 slices + the spare, in that worker
    assert job_pools(mc, other, "d", ns) == [] and mc.job(other, "d", ns) is None

    def mirrored() -> dict[str, Any] | None:  # the worker's status, slices and all
        here, there = mc.status(MANAGER, "d", ns), mc.status(worker, "d", ns)
        keys_ = ("phase", "readySlices", "slices", "activeSlices", "queue")
        return here if all(here.get(k) == there.get(k) for k in keys_) else None

    st = wait_for(mirrored, 60, "the manager's status the worker's", interval=0.3,
                  on_timeout=lambda: mc.dump(ns))  # fmt: skip
    assert st["readySlices"] == "3/3" and len(st["slices"]) == 3, st  # the spare's pool too
    wl = mc.workload(MANAGER, "d", ns)
    assert wl is not None and wl["status"].get("clusterName") == f"worker-{worker}"
    assigned = {a["name"]: a["resourceUsage"]["google.com/tpu"]
                for a in wl["status"]["admission"]["podSetAssignments"]}  # fmt: skip
    assert assigned == {"slice": "32", "spare": "16"}
    # The worker's copy: the prebuilt Workload adopted, never a second one made.
    copy = mc.job(worker, "d", ns)
    assert copy is not None and "managedBy" not in copy["spec"]
    assert [w["metadata"]["name"] for w in mc.workloads(worker, ns)] == [wl["metadata"]["name"]]
    done = mc.phase(MANAGER, "d", ns, "Succeeded", 240)
    assert runs_in(done) == worker and done.get("restarts") == 0
    assert (done.get("goodput") or {}).get("timeline"), done  # the worker's goodput, copied

    # MultiKueue copies the status as the worker writes it, and finishes the manager's Workload
    # once the worker's is: a moment later.
    def finished() -> bool:
        return queues.condition(mc.workload(MANAGER, "d", ns), "Finished").get("status") == "True"

    wait_for(finished, 60, "the manager's Workload Finished", on_timeout=lambda: mc.dump(ns))
    wait_for(lambda: gone_everywhere(mc, "d", ns), 120, "the worker's copy and pools gone",
             on_timeout=lambda: mc.dump(ns))  # fmt: skip
    manager_sim = mc.manager.sim
    assert manager_sim is not None and not manager_sim.pools()  # never provisioned there
    assert client.CustomObjectsApi(mc.manager.api).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", ns, "jobsets")["items"] == []  # fmt: skip


def test_deleting_the_job_on_the_manager_releases_everything_on_the_worker(mc: MultiCluster,
                                                                           ns: str):  # fmt: skip
    mc.create("del", ns, run="600s")
    running = mc.phase(MANAGER, "del", ns, "Running", 240)
    worker = runs_in(running)
    assert len(job_pools(mc, worker, "del", ns)) == 2
    client.CustomObjectsApi(mc.manager.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "del"
    )
    wait_for(lambda: gone_everywhere(mc, "del", ns), 120, "the worker's copy and pools gone",
             on_timeout=lambda: mc.dump(ns))  # fmt: skip
    wait_for(lambda: mc.workloads(worker, ns) == [] and mc.workloads(MANAGER, ns) == [], 60,
             "no Workload left", on_timeout=lambda: mc.dump(ns))  # fmt: skip


def handed_back(mc: MultiCluster, witness: queues.QuotaWitness, name: str, ns: str) -> bool:
    """Worker a tried the gang and gave the job back: its copy removed by MultiKueue, or (if
    Kueue handed a's quota straight back, so MultiKueue keeps it while no other worker admits the
    job) holding no pool for the cooldown."""
    if not witness.for_job(f"{ns}/{name}"):
        return False
    copy = mc.job("a", name, ns)
    message = ((copy or {}).get("status") or {}).get("message") or ""
    return copy is None or "handed back to MultiKueue" in message


def test_a_worker_that_cannot_provision_hands_the_job_back_and_the_other_runs_it(
    mc: MultiCluster, ns: str
):
    """Issue 43: worker a is the only one with quota and is stocked out: its gang rolls back,
    its check goes Retry, it stops and gives the quota back; MultiKueue dispatches again, a
    leaves the new copy to another worker (cooldown), and b, given quota, runs the job. At no
    moment do both workers hold node pools of the job."""
    a, b = mc.workers["a"], mc.workers["b"]
    assert a.sim is not None and b.sim is not None
    witness = {w: queues.QuotaWitness(s.sim, s.api).install() for w, s in mc.workers.items()}
    overlap: list[tuple[list[str], list[str]]] = []
    try:
        mc.set_quota("b", 0)
        a.sim.set_faults(stockout_next=1000)
        mc.create("rd", ns, run="4s")
        wait_for(lambda: handed_back(mc, witness["a"], "rd", ns), 180,
                 "worker a tried the gang and handed the job back", interval=0.5,
                 on_timeout=lambda: mc.dump(ns))  # fmt: skip
        mc.set_quota("b", 64)

        def on_b() -> dict[str, Any] | None:
            pa, pb = job_pools(mc, "a", "rd", ns), job_pools(mc, "b", "rd", ns)
            if pa and pb:
                overlap.append((pa, pb))
            st = mc.status(MANAGER, "rd", ns)
            return st if st.get("phase") == "Succeeded" else None

        done = wait_for(on_b, 240, "rd Succeeded on b", interval=0.5,
                        on_timeout=lambda: mc.dump(ns))  # fmt: skip
        assert runs_in(done) == "b", done.get("queue")
        assert overlap == []
        assert witness["b"].for_job(f"{ns}/rd") and all(
            c.quota_reserved for w in witness.values() for c in w.for_job(f"{ns}/rd")
        )
        assert job_pools(mc, "a", "rd", ns) == []
    finally:
        for w in witness.values():
            w.uninstall()
        mc.set_quota("b", 64)


def test_a_worker_operator_restarted_in_its_cooldown_still_leaves_the_job_to_another(
    mc: MultiCluster, ns: str
):
    """The cooldown outlives the worker's operator: a hands the job back and its operator is
    killed and started again. While b has no quota, a tries no gang of the job again (the new
    operator read the hand-back from its heartbeat Lease, so its check on the next copy stays
    Pending); once b has quota, b runs the job. An operator that forgot would say Ready at once
    and try (and lose) the gang on a again."""
    a = mc.workers["a"]
    assert a.sim is not None and a.op is not None
    witness = queues.QuotaWitness(a.sim, a.api).install()
    try:
        mc.set_quota("b", 0)
        a.sim.set_faults(stockout_next=1000)
        mc.create("rs", ns, run="4s")
        wait_for(lambda: handed_back(mc, witness, "rs", ns), 180,
                 "worker a tried the gang and handed the job back", interval=0.5,
                 on_timeout=lambda: mc.dump(ns))  # fmt: skip
        tried = len(witness.for_job(f"{ns}/rs"))
        a.op.kill()
        lease = client.CoordinationV1Api(a.api).read_namespaced_lease(
            "multislice-operator-heartbeat", "default"
        )
        assert f'"{ns}/' in (lease.metadata.annotations or {}).get(keys.MULTIKUEUE_LOST, "")
        a.op.start()
        held_until = time.monotonic() + 30
        while time.monotonic() < held_until:  # the new operator's passes, and MultiKueue's
            assert len(witness.for_job(f"{ns}/rs")) == tried, mc.dump(ns)
            time.sleep(0.5)
        mc.set_quota("b", 64)
        done = mc.phase(MANAGER, "rs", ns, "Succeeded", timeout=240)
        assert runs_in(done) == "b", done.get("queue")
        assert len(witness.for_job(f"{ns}/rs")) == tried and job_pools(mc, "a", "rs", ns) == []
    finally:
        witness.uninstall()
        mc.set_quota("b", 64)


def test_an_elastic_job_keeps_its_quota_on_both_clusters_while_it_runs_on_fewer_slices(
    mc: MultiCluster, ns: str
):
    """Issue 43: spec.elastic through MultiKueue. A slice lost on the worker and stocked out:
    the worker's operator runs the job on 1 slice (no hand-back: it is running), the manager
    shows it, and neither Workload gives back or loses its full quota."""
    elastic = {"minSlices": 1, "waitSeconds": 5}
    mc.create("el", ns, run="600s", elastic=elastic, capacity={"type": "Spot"})
    running = mc.phase(MANAGER, "el", ns, "Running", 240)
    worker = runs_in(running)
    stack = mc.workers[worker]
    assert stack.sim is not None
    from multislice_operator.planning.plan import node_pool_name

    stack.sim.set_faults(stockout_next=1000)
    stack.sim.preempt(node_pool_name(ns, "el", 0), recreate_after_s=None)

    def on_one() -> dict[str, Any] | None:
        st = mc.status(MANAGER, "el", ns)  # as copied from the worker
        return st if st.get("phase") == "Running" and st.get("activeSlices") == 1 else None

    wait_for(on_one, 180, "el Running on 1 slice, seen on the manager", interval=0.5,
             on_timeout=lambda: mc.dump(ns))  # fmt: skip
    for cluster in (MANAGER, worker):
        wl = mc.workload(cluster, "el", ns)
        assert queues.holds_quota(wl), (cluster, wl)
        assert queues.condition(wl, "Evicted").get("status") != "True", (cluster, wl)
        used = {a["name"]: a["resourceUsage"]["google.com/tpu"]
                for a in wl["status"]["admission"]["podSetAssignments"]}  # fmt: skip
        assert used == {"slice": "32"}, (cluster, used)  # the full size, kept
    assert runs_in(mc.status(MANAGER, "el", ns)) == worker  # never moved
    stack.sim.clear_faults()
    client.CustomObjectsApi(mc.manager.api).delete_namespaced_custom_object(
        models.GROUP, models.VERSION, ns, models.PLURAL, "el"
    )
    wait_for(lambda: gone_everywhere(mc, "el", ns), 120, "the worker's copy and pools gone",
             on_timeout=lambda: mc.dump(ns))  # fmt: skip


def test_a_worker_cut_off_from_the_manager_is_replaced_and_one_copy_is_left_when_it_is_back(
    mc: MultiCluster, ns: str
):
    """Issue 43, the worker unreachable: a runs the job and the manager loses a (a partition:
    its kubeconfig names a dead port, as Kueue's own tests break a connection; a runs on,
    unseen). Past workerLostTimeout (60 s locally) MultiKueue requeues the manager's Workload and
    b runs the job, while a, cut off, still runs its copy: the overlap docs/kueue.md warns of.
    Once a is reachable again MultiKueue keeps one copy, the one admitted first (a's: Kueue v0.19
    deletes the newer run on b), and the manager shows a; its Workload keeps naming b (Kueue
    cannot change `status.clusterName`), as docs/kueue.md says. The job still ends cleanly."""
    mc.set_quota("b", 0)
    mc.create("cut", ns, run="240s")  # longer than the cut (60 s + a dispatch) and the way back
    assert runs_in(mc.phase(MANAGER, "cut", ns, "Running", 240)) == "a"
    mc.set_quota("b", 64)
    mc.cut_off("a")
    try:
        wait_for(lambda: mc.status("b", "cut", ns).get("phase") == "Running", 300,
                 "cut Running on b", interval=1, on_timeout=lambda: mc.dump(ns))  # fmt: skip
        # Nobody could tell a: it runs on.
        assert mc.status("a", "cut", ns).get("phase") == "Running"
        assert len(job_pools(mc, "a", "cut", ns)) == 2
    finally:
        mc.reconnect("a")

    def one_left() -> str | None:
        on = [w for w in mc.workers if mc.job(w, "cut", ns) or job_pools(mc, w, "cut", ns)]
        if len(on) != 1:
            return None
        st = mc.status(MANAGER, "cut", ns)
        return on[0] if st.get("phase") == "Running" and runs_in(st) == on[0] else None

    winner = wait_for(one_left, 240, "one worker left running cut", interval=1,
                      on_timeout=lambda: mc.dump(ns))  # fmt: skip
    assert winner == "a"  # the copy admitted first; b's newer run is the one deleted
    assert queues.holds_quota(mc.workload("a", "cut", ns))
    assert mc.workloads("b", ns) == [] and job_pools(mc, "b", "cut", ns) == []
    wl = mc.workload(MANAGER, "cut", ns)
    assert wl is not None and wl["status"].get("clusterName") == "worker-b", wl["status"]
    # That state still ends: a's run finishes, so do both Workloads, and nothing is left.
    done = mc.phase(MANAGER, "cut", ns, "Succeeded", 400)
    assert runs_in(done) == "a", done.get("queue")

    def finished() -> bool:
        return queues.condition(mc.workload(MANAGER, "cut", ns), "Finished").get("status") == "True"

    wait_for(finished, 60, "the manager's Workload Finished", on_timeout=lambda: mc.dump(ns))
    wait_for(lambda: gone_everywhere(mc, "cut", ns), 120, "a's copy and pools gone",
             on_timeout=lambda: mc.dump(ns))  # fmt: skip
