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
* ``mc.dump(ns)`` for a timeout: each cluster's Workloads and jobs, and the log tails.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from multislice_local import queues
from multislice_local.multicluster import MANAGER, MULTIKUEUE_CHECK, QUEUE, MultiCluster


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
