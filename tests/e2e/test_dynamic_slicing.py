"""Dynamic slicing end to end (issue 41): tpu7x jobs with provisioning.mode DynamicSlicing on the
local stack with the simulated GKE slice controller (local/multislice_local/slices.py, its
contract docs/dynamic-slicing-contract.md): cube pools created per sub-block, one Slice per slice
ACTIVE before the JobSet, all or nothing (and in time), a failed cube (and a degraded one when the
job asks) re-formed from the spare cube with every slice restarted, a degraded Slice kept running
by default, a Slice stuck deleting released, and nothing left once the job is gone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from multislice_local.harness import wait_for
from multislice_local.queues import condition
from multislice_local.stack import PROJECT, LocalStack
from multislice_operator.common import keys
from tests import msj
from tests.msj import create, pools_of

ACTIVE = "ACTIVE"


@pytest.fixture(scope="module")
def stack(kube_cluster: Any, tmp_path_factory: Any) -> Iterator[LocalStack]:
    """The local stack whose GKE simulator runs the slice controller on the cluster's Slices."""
    log = tmp_path_factory.mktemp("dynamic") / "operator.log"
    with msj.local_stack(kube_cluster, log, op_latency_s=0.5, slice_controller=True) as s:
        yield s


def _job(name: str, reservation: str, slices: int = 2, spares: int = 1, run: str = "600s",
         accelerator: str = "tpu7x-128", timeout: int = 600,
         options: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """`options`: spec.provisioning.dynamicSlicing."""
    devices = {"tpu7x-128": 128, "tpu7x-256": 256}[accelerator]
    provisioning: dict[str, Any] = {"mode": "DynamicSlicing", "timeoutSeconds": timeout}
    if options:
        provisioning["dynamicSlicing"] = options
    return msj.job(
        name,
        run=run,
        accelerator=accelerator,
        slices=slices,
        spares=spares,
        parallelism={"ici": {"fsdp": devices}},
        capacity={"type": "Reserved", "reservation": f"{reservation}/reservationBlocks/block-1"},
        provisioning=provisioning,
    )


def _slices(api: Any, ns: str, name: str) -> list[dict[str, Any]]:
    """The job's Slices (cluster-scoped, labelled with their job)."""
    selector = f"{keys.JOB_NAMESPACE}={ns},{keys.JOB_NAME}={name}"
    return list(
        msj.custom(api).list_cluster_custom_object(
            keys.SLICE_GROUP, keys.SLICE_VERSION, keys.SLICE_PLURAL, label_selector=selector
        )["items"]
    )


def _ready(obj: dict[str, Any]) -> dict[str, Any]:
    """The Slice's Ready condition ({} before the controller wrote one)."""
    return condition(obj, "Ready")


def _state(obj: dict[str, Any]) -> str:
    return str(_ready(obj).get("reason", ""))


def _describe(objs: list[dict[str, Any]]) -> str:
    """Each Slice's state since when, its deletion and its finalizers (a timeout's evidence)."""
    lines = []
    for s in objs:
        meta, since = s["metadata"], _ready(s).get("lastTransitionTime")
        lines.append(
            f"{_name(s)}: {_state(s) or '-'} since {since}, deleted at "
            f"{meta.get('deletionTimestamp')}, finalizers {meta.get('finalizers')}"
        )
    return "\n".join(lines) or "none"


def _active(api: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return [
        s
        for s in _slices(api, ns, name)
        if _state(s) == ACTIVE and not s["metadata"].get("deletionTimestamp")
    ]


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _cubes_by_slice(api: Any, ns: str, name: str) -> dict[str, list[str]]:
    return {_name(s): list(s["spec"]["partitionIds"]) for s in _active(api, ns, name)}


def _nodes_of_slice(api: Any, slice_name: str) -> list[Any]:
    core = client.CoreV1Api(api)
    return list(core.list_node(label_selector=f"{keys.GKE_TPU_SLICE}={slice_name}").items)


def _gone(stack: LocalStack, ns: str, name: str) -> None:
    """Nothing of the job's left: no Slice, no cube pool, the job itself gone."""
    wait_for(lambda: not _slices(stack.api, ns, name), 90, "the job's Slices deleted")
    wait_for(lambda: not pools_of(stack.sim, ns, name), 90, "the job's cube pools deleted")

    wait_for(
        lambda: msj.get(stack.api, ns, name, missing_ok=True) is None,
        60,
        "the job deleted (its finalizer released)",
    )


def _delete(stack: LocalStack, ns: str, name: str) -> None:
    msj.custom(stack.api).delete_namespaced_custom_object(
        "multislice.dev", "v1alpha1", ns, "multislicejobs", name
    )


def test_create_run_and_delete(stack: LocalStack, namespace: Any, kube_cluster: Any) -> None:
    """Three cube pools (two slices + a spare), two Slices ACTIVE, the pods on their nodes; then
    deleted: the Slices, then the cube pools, then the job."""
    ns = namespace(kube_cluster, "dyn")
    assert stack.sim is not None
    stack.sim.add_reservation("iw-create", {"block-1": 3}, project=PROJECT)
    create(stack.api, ns, _job("iw", "iw-create"))
    log = lambda n: stack.op.log_tail(n)  # noqa: E731
    msj.wait_phase(stack.api, ns, "iw", "Running", 180, log=log)
    pools = pools_of(stack.sim, ns, "iw")
    assert len(pools) == 3 and all(p["initialNodeCount"] == 16 for p in pools.values())
    active = _active(stack.api, ns, "iw")
    assert len(active) == 2
    parts = [p for s in active for p in s["spec"]["partitionIds"]]
    assert len(parts) == len(set(parts)) == 2  # one cube each, never shared
    core = client.CoreV1Api(stack.api)
    pods = core.list_namespaced_pod(ns, label_selector=f"{keys.JOB_NAME}=iw").items
    on = {n.metadata.name for s in active for n in _nodes_of_slice(stack.api, _name(s))}
    assert len(on) == 32  # the slice controller labelled both Slices' 16 nodes
    placed = [p.spec.node_name for p in pods if p.spec.node_name]
    assert placed and set(placed) <= on  # the pods run on the job's Slices only
    _delete(stack, ns, "iw")
    _gone(stack, ns, "iw")


def test_all_or_nothing(stack: LocalStack, namespace: Any, kube_cluster: Any) -> None:
    """Two slices on a block of one sub-block: one cube comes, the second pool cannot; no Slice
    is formed alone and no JobSet is created; deleting the job leaves nothing."""
    ns = namespace(kube_cluster, "dyn")
    assert stack.sim is not None
    stack.sim.add_reservation("iw-small", {"block-1": 1}, project=PROJECT)
    create(stack.api, ns, _job("iw", "iw-small", spares=0))
    wait_for(
        lambda: any(
            c["pool"] and c["nodesReady"] for c in stack.sim.cubes() if "iw-small" in c["path"]
        ),
        120,
        "the one cube there is provisioned",
    )
    passes = msj.reconciles(stack.op)
    wait_for(lambda: msj.reconciles(stack.op) > passes + 5, 60, "five more passes")
    assert _slices(stack.api, ns, "iw") == []
    assert msj.jobset(stack.api, ns, "iw") is None
    status = msj.status(stack.api, ns, "iw")
    assert status["phase"] == "Provisioning"
    _delete(stack, ns, "iw")
    _gone(stack, ns, "iw")


def test_slices_not_active_in_time_are_rolled_back(
    stack: LocalStack, namespace: Any, kube_cluster: Any
) -> None:
    """The gang's timeout: two slices on a block of one sub-block never both form; after
    spec.provisioning.timeoutSeconds the attempt is rolled back (its cube pool deleted) and
    retried after the backoff, never with a Slice or a JobSet."""
    ns = namespace(kube_cluster, "dyn")
    assert stack.sim is not None
    stack.sim.add_reservation("iw-late", {"block-1": 1}, project=PROJECT)
    create(stack.api, ns, _job("iw", "iw-late", spares=0, timeout=10))
    log = lambda n: stack.op.log_tail(n)  # noqa: E731
    msj.wait_events(
        stack.api,
        ns,
        "iw",
        "GangRolledBack: attempt 1: 0/2 Slices ACTIVE within spec.provisioning.timeoutSeconds "
        "(10s); deleting the Slices and cube pools of the gang",
        timeout=90,
        log=log,
    )
    msj.wait_status(
        stack.api, ns, "iw", "a second attempt",
        lambda st: (st.get("provisioningAttempts") or 0) >= 2, 60, log=log,
    )  # fmt: skip
    assert _slices(stack.api, ns, "iw") == []
    assert msj.jobset(stack.api, ns, "iw") is None
    _delete(stack, ns, "iw")
    _gone(stack, ns, "iw")


def _swap(stack: LocalStack, ns: str, state: str) -> None:
    """A running job's cube goes `state`: its Slice breaks, the operator re-forms that slice on
    the spare cube, every slice restarts, the job runs again on two ACTIVE Slices."""
    log = lambda n: stack.op.log_tail(n)  # noqa: E731
    msj.wait_phase(stack.api, ns, "iw", "Running", 180, log=log)
    before = _cubes_by_slice(stack.api, ns, "iw")
    assert len(before) == 2
    victim = sorted(before)[1]
    cube = before[victim][0]
    assert stack.sim is not None
    stack.sim.set_cube_state(cube, state)

    def reformed() -> bool:
        now = _cubes_by_slice(stack.api, ns, "iw")
        held = {p for parts in now.values() for p in parts}
        return len(now) == 2 and victim not in now and cube not in held

    why = lambda: stack.op.log_tail(80) + "\n" + msj.pods_and_nodes(stack.api, ns)  # noqa: E731
    wait_for(reformed, 120, f"the slice re-formed off cube {cube} ({state})", on_timeout=why)
    kept = sorted(before)[0]
    assert kept in _cubes_by_slice(stack.api, ns, "iw")  # only the broken slice was re-formed
    events = msj.event_lines(stack.api, ns, "iw")
    assert any(e.startswith("SliceLost") and victim in e for e in events), events
    # The lost slice's pods were evicted: they failed with DisruptionTarget (kwok's pod-terminate,
    # as a kubelet), so JobSet restarted every slice; slice 1 runs again, all 16 pods, on the
    # nodes of its new Slice.
    new = next(n for n in _cubes_by_slice(stack.api, ns, "iw") if n != kept)
    core = client.CoreV1Api(stack.api)

    seen: list[str] = []

    def back_on_the_new_slice() -> bool:
        nodes = {n.metadata.name for n in _nodes_of_slice(stack.api, new)}
        pods = core.list_namespaced_pod(ns, label_selector=f"{keys.JOB_NAME}=iw").items
        seen[:] = [f"{len(nodes)} nodes of {new}"] + [
            f"{p.metadata.name} {p.status.phase} {p.spec.node_name}" for p in pods
        ]
        ran = [
            p
            for p in pods
            if p.status.phase in ("Running", "Succeeded") and p.spec.node_name in nodes
        ]
        return len(ran) == 16

    wait_for(
        back_on_the_new_slice,
        180,
        f"slice 1 running on {new}",
        on_timeout=lambda: why() + "\n" + "\n".join(seen),
    )
    msj.wait_phase(stack.api, ns, "iw", "Running", 180, log=log)
    # Every slice restarted once, as a disruption (charged to no budget), not only slice 1's pods.
    st = msj.status(stack.api, ns, "iw")
    assert st["restarts"] == st["restartsByCause"]["disruption"] == 1, st
    js = msj.jobset(stack.api, ns, "iw")
    assert js is not None and js["status"]["restarts"] == 1, js.get("status")


def test_a_failed_cube_is_swapped_for_the_spare(
    stack: LocalStack, namespace: Any, kube_cluster: Any
) -> None:
    ns = namespace(kube_cluster, "dyn")
    assert stack.sim is not None
    # 3 sub-blocks for the job (2 slices + 1 spare cube), a 4th free for the failed cube's pool.
    stack.sim.add_reservation("iw-spare", {"block-1": 4}, project=PROJECT)
    create(stack.api, ns, _job("iw", "iw-spare", run="90s"))
    _swap(stack, ns, "UNHEALTHY")
    sim = stack.sim

    def spare_back() -> list[dict[str, Any]] | None:
        cubes = [c for c in sim.cubes() if "/iw-spare/" in c["path"]]
        held = [c for c in cubes if c["pool"]]
        ok = len(held) == 3 and all(c["state"] == "HEALTHY" and c["nodesReady"] for c in held)
        return cubes if ok else None

    # The failed cube's pool is made again on the free sub-block: a spare cube again, without
    # waiting for the repair; the failed sub-block holds no pool.
    cubes = wait_for(
        spare_back, 120, "the spare cube made again", on_timeout=lambda: str(sim.cubes())
    )
    assert [c["state"] for c in cubes if not c["pool"]] == ["UNHEALTHY"]
    msj.wait_phase(stack.api, ns, "iw", "Succeeded", 240, log=lambda n: stack.op.log_tail(n))
    _delete(stack, ns, "iw")
    _gone(stack, ns, "iw")


def test_a_degraded_slice_is_reformed_when_asked(
    stack: LocalStack, namespace: Any, kube_cluster: Any
) -> None:
    """dynamicSlicing.degraded: ReplaceWhenSpare, a healthy spare cube there: re-formed on it."""
    ns = namespace(kube_cluster, "dyn")
    assert stack.sim is not None
    stack.sim.add_reservation("iw-degraded", {"block-1": 3}, project=PROJECT)
    create(stack.api, ns, _job("iw", "iw-degraded", options={"degraded": "ReplaceWhenSpare"}))
    # The slice controller keeps the old Slice's name on the degraded cube's nodes a while (GKE's
    # takes its time): slice 1's restarted pods must still land on the new Slice, not there.
    stack.sim.set_slice_unlabel_delay(15)
    try:
        _swap(stack, ns, "DEGRADED")
    finally:
        stack.sim.set_slice_unlabel_delay(0)
    _delete(stack, ns, "iw")
    _gone(stack, ns, "iw")


def test_a_degraded_slice_keeps_running_and_a_stuck_slice_is_released(
    stack: LocalStack, namespace: Any, kube_cluster: Any
) -> None:
    """GKE: a DEGRADED cube is "impaired, still usable to form a slice", an ACTIVE_DEGRADED Slice
    is Ready (issue 54, point 3). By default the job keeps training on it: no Slice re-formed, no
    restart, its running time counted degraded. Deleted, a Slice stuck in DEACTIVATING (GKE's
    troubleshooting page) loses its finalizer after sliceDeletionTimeoutSeconds, as GKE's guide
    deletes a Slice, with an event; nothing is left."""
    ns = namespace(kube_cluster, "dyn")
    assert stack.sim is not None
    stack.sim.add_reservation("iw-keep", {"block-1": 3}, project=PROJECT)
    create(stack.api, ns, _job("iw", "iw-keep", options={"sliceDeletionTimeoutSeconds": 30}))
    log = lambda n: stack.op.log_tail(n)  # noqa: E731
    msj.wait_phase(stack.api, ns, "iw", "Running", 180, log=log)
    before = _cubes_by_slice(stack.api, ns, "iw")
    victim = sorted(before)[1]
    stack.sim.set_cube_state(before[victim][0], "DEGRADED")

    def states() -> dict[str, str]:
        return {_name(s): _state(s) for s in _slices(stack.api, ns, "iw")}

    wait_for(lambda: states().get(victim) == "ACTIVE_DEGRADED", 60, f"{victim} ACTIVE_DEGRADED")
    st = msj.wait_status(
        stack.api, ns, "iw", "running on a degraded Slice",
        lambda st: bool((st.get("goodput") or {}).get("degraded")), 60, log=log,
    )["status"]  # fmt: skip
    assert st["phase"] == "Running" and st.get("restarts", 0) == 0, st
    now = {_name(s): list(s["spec"]["partitionIds"]) for s in _slices(stack.api, ns, "iw")}
    assert now == before  # the same two Slices on the same cubes
    assert not any(e.startswith("SliceLost") for e in msj.event_lines(stack.api, ns, "iw"))
    stack.sim.set_slice_stuck(victim)
    _delete(stack, ns, "iw")

    def seen(n: int) -> str:  # on a timeout: which side was late, the simulator or the operator
        assert stack.sim is not None and stack.sim.slice_controller is not None
        done = [" ".join(h) for h in stack.sim.slice_controller.history if h[1] in before]
        text = stack.op.log_path.read_text(errors="replace").splitlines()
        trouble = [
            line for line in text if any(w in line for w in (" ERROR ", " WARNING ", "Throttl"))
        ]
        return (
            f"Slices now:\n{_describe(_slices(stack.api, ns, 'iw'))}\n"
            "The simulated slice controller:\n" + "\n".join(done) + "\n"
            "The operator's errors and warnings:\n" + "\n".join(trouble[-30:]) + f"\n{log(n)}"
        )

    msj.wait_events(
        stack.api, ns, "iw", f"SliceFinalizerRemoved: Slice {victim} (DEACTIVATING)",
        timeout=120, log=seen,
    )  # fmt: skip
    _gone(stack, ns, "iw")
