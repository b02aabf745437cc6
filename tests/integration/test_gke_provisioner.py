"""GkeProvisioner against the local GKE simulator: the real client library over REST."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import http.server
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest
from google.api_core import exceptions as gexc

from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from multislice_operator.common.pools import PoolState
from multislice_operator.planning.plan import Plan, load_job, make_plan
from multislice_operator.provisioning.base import GangObservation
from multislice_operator.provisioning.gke import (
    GkeProvisioner,
    OwnedPool,
    RetryPolicy,
    read_gke_metadata,
)
from multislice_operator.provisioning.gke_errors import (
    CODE_CLUSTER_BUSY,
    CODE_INVALID_MACHINE_TYPE,
    CODE_NOT_FOUND,
    CODE_NOT_OFFERED,
    CODE_OWNED_BY_OTHER,
    CODE_PERMISSION,
    CODE_QUOTA,
    CODE_RATE_LIMITED,
    CODE_STOCKOUT,
    CODE_UNAVAILABLE,
    classify_exception,
    classify_message,
)
from multislice_operator.provisioning.gke_requests import (
    XPK_NODE_SCOPES,
    NodeOptions,
    build_node_pool,
)

T = TypeVar("T")
PROJECT, ZONE, CLUSTER = "proj", "us-east5-b", "local"
FAST_RETRY = RetryPolicy(attempts=4, initial_s=0.02, max_s=0.1)
LATENCY = 0.2
UID = "0b6e3c1e-1111-4c4c-9a9a-000000000001"

BASE_JOB: dict[str, Any] = {
    "apiVersion": "multislice.dev/v1alpha1",
    "kind": "MultisliceJob",
    "metadata": {"name": "llm", "namespace": "team-a"},
    "spec": {
        "accelerator": "v5litepod-16",
        "slices": 3,
        "template": {"spec": {"containers": [{"name": "train", "image": "img:1"}]}},
    },
}


def plan_of(name: str = "llm", **spec: Any) -> Plan:
    obj = copy.deepcopy(BASE_JOB)
    obj["metadata"]["name"] = name
    obj["spec"].update(spec)
    job = load_job(obj)
    return make_plan(job.spec, job.metadata.namespace, job.metadata.name or "job")


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def until(prov: GkeProvisioner, plan: Plan, statuses: set[str]) -> GangObservation:
    """Observe until every pool of the plan is in one of ``statuses`` (a few seconds at most)."""
    deadline = time.monotonic() + 10
    while True:
        obs = await prov.observe_gang(plan)
        if all(p.status in statuses for p in obs.pools.values()):
            return obs
        assert time.monotonic() < deadline, obs
        await asyncio.sleep(0.05)


@pytest.fixture
def registrar() -> InMemoryRegistrar:
    return InMemoryRegistrar()


@pytest.fixture
def sim(registrar: InMemoryRegistrar) -> Iterator[GkeSimulator]:
    with GkeSimulator(SimConfig(op_latency_s=LATENCY), registrar=registrar) as s:
        yield s


@pytest.fixture
def make_prov(sim: GkeSimulator) -> Iterator[Callable[..., GkeProvisioner]]:
    made: list[GkeProvisioner] = []

    def make(**kwargs: Any) -> GkeProvisioner:
        kwargs.setdefault("retry", FAST_RETRY)
        prov = GkeProvisioner.from_endpoint(sim.url, PROJECT, ZONE, CLUSTER, **kwargs)
        made.append(prov)
        return prov

    yield make
    for prov in made:
        prov.close()


@pytest.fixture
def prov(make_prov: Callable[..., GkeProvisioner]) -> GkeProvisioner:
    return make_prov()


def test_gang_create_all_running_with_specs_on_the_wire(
    sim: GkeSimulator, prov: GkeProvisioner, registrar: InMemoryRegistrar
) -> None:
    plan = plan_of(topology="4x4", capacity={"type": "Spot"})
    sim.configure(op_latency_s=0.8)  # observe PoolState.CREATING before it ends, even under load

    async def scenario() -> GangObservation:
        first = await prov.observe_gang(plan)
        assert {p.status for p in first.pools.values()} == {PoolState.ABSENT}
        result = await prov.create(plan, plan.node_pools, UID)
        assert result.errors == []
        provisioning = await prov.observe_gang(plan)
        assert {p.status for p in provisioning.pools.values()} == {PoolState.CREATING}
        assert all(p.operation_pending for p in provisioning.pools.values())
        return await until(prov, plan, {PoolState.READY})

    obs = run(scenario())
    assert sim.counters()["peakConcurrentOperations"] == 3  # created concurrently
    assert [(p.slice_index, p.node_count, p.owner_uid) for p in obs.pools.values()] == [
        (i, 4, UID) for i in range(3)
    ]
    assert not any(p.operation_pending or p.error for p in obs.pools.values())
    wire = sim.pool(plan.node_pools[1].name)
    assert wire is not None
    assert wire["initialNodeCount"] == 4 and wire["locations"] == [ZONE]
    assert wire["placementPolicy"] == {"type": "COMPACT", "tpuTopology": "4x4"}
    # Auto-upgrade stays on: clusters in a release channel refuse it off (issue 12, defect 2).
    assert wire["management"] == {"autoRepair": True, "autoUpgrade": True}
    config = wire["config"]
    assert config["machineType"] == "ct5lp-hightpu-4t" and config["spot"] is True
    assert "reservationAffinity" not in config
    assert config["labels"]["multislice.dev/job-uid"] == UID
    assert config["labels"]["multislice.dev/slice"] == "1"
    assert config["labels"]["multislice.dev/managed-by"] == "multislice-operator"
    assert "devstorage.full_control" in " ".join(config["oauthScopes"])
    assert config["resourceLabels"] == {
        "managed-by": "multislice-operator",
        "multislice-job-namespace": "team-a",
        "multislice-job-name": "llm",
        "multislice-job-uid": UID,
        "multislice-job-key": plan.job_key,
        "multislice-slice": "1",
    }
    assert {g.pool: g.count for g in registrar.groups.values()} == {
        p.name: 4 for p in plan.node_pools
    }
    assert all(g.topology == "4x4" and g.spot for g in registrar.groups.values())


def test_reservation_affinity_and_single_host_and_taint_option(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner]
) -> None:
    specific = plan_of("a", capacity={"type": "Reserved", "reservation": "res-1"})
    shared_name = "projects/owner-proj/reservations/res-2"
    shared = plan_of(
        "b",
        accelerator="v6e-4",
        slices=1,
        capacity={"type": "Reserved", "reservation": shared_name},
    )
    on_demand = plan_of("c", slices=1)
    wire = build_node_pool(specific, specific.node_pools[0], UID, [ZONE])
    assert wire.config.reservation_affinity.consume_reservation_type.name == (
        "SPECIFIC_RESERVATION"
    )
    assert list(wire.config.reservation_affinity.values) == ["res-1"]
    assert wire.config.reservation_affinity.key == "compute.googleapis.com/reservation-name"
    assert list(wire.config.taints) == []
    tainted = build_node_pool(on_demand, on_demand.node_pools[0], UID, [ZONE], tpu_taint=True)
    assert [(t.key, t.value, t.effect.name) for t in tainted.config.taints] == [
        ("google.com/tpu", "present", "NO_SCHEDULE")
    ]
    prov = make_prov()
    for plan in (specific, shared):
        assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    pools = sim.pools()
    assert pools[specific.node_pools[0].name]["config"]["reservationAffinity"] == {
        "consumeReservationType": "SPECIFIC_RESERVATION",
        "key": "compute.googleapis.com/reservation-name",
        "values": ["res-1"],
    }
    single = pools[shared.node_pools[0].name]
    assert single["config"]["reservationAffinity"]["values"] == [shared_name]
    assert "placementPolicy" not in single  # single-host: no COMPACT placement
    assert single["config"]["machineType"] == "ct6e-standard-4t"


def test_create_is_idempotent_and_adopts(sim: GkeSimulator, prov: GkeProvisioner) -> None:
    plan = plan_of(slices=2)
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []  # 409 -> adopted
    counters = sim.counters()
    assert counters["createsAccepted"] == 2
    assert counters["responses"]["409"] == 2
    assert counters["calls"]["get_node_pool"] == 2


def test_pool_of_another_owner_is_reported_not_adopted(prov: GkeProvisioner) -> None:
    plan = plan_of(slices=1)
    assert run(prov.create(plan, plan.node_pools, "old-uid")).errors == []
    [err] = run(prov.create(plan, plan.node_pools, UID)).errors
    assert (err.code, err.permanent, err.slice_index) == (CODE_OWNED_BY_OTHER, False, 0)
    assert "old-uid" in err.message


def test_delete_missing_is_success_and_delete_reaches_absent(
    sim: GkeSimulator, prov: GkeProvisioner, registrar: InMemoryRegistrar
) -> None:
    plan = plan_of(slices=2)
    sim.configure(op_latency_s=0.8)

    async def scenario() -> None:
        assert (await prov.delete(plan, [p.name for p in plan.node_pools])).errors == []
        await prov.create(plan, plan.node_pools, UID)
        await until(prov, plan, {PoolState.READY})
        assert (await prov.delete(plan, [p.name for p in plan.node_pools])).errors == []
        stopping = await prov.observe_gang(plan)
        assert {p.status for p in stopping.pools.values()} == {PoolState.DELETING}
        # A second delete while PoolState.DELETING ("currently deleting") is success too.
        assert (await prov.delete(plan, [plan.node_pools[0].name])).errors == []
        await until(prov, plan, {PoolState.ABSENT})

    run(scenario())
    assert registrar.node_count() == 0
    assert sim.counters()["livePools"] == 0


def test_delete_while_creating_is_retried_until_accepted(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner]
) -> None:
    prov = make_prov(retry=RetryPolicy(attempts=6, initial_s=0.1, max_s=0.2))
    plan = plan_of(slices=1)

    async def scenario() -> None:
        await prov.create(plan, plan.node_pools, UID)
        assert (await prov.delete(plan, [plan.node_pools[0].name])).errors == []
        await until(prov, plan, {PoolState.ABSENT})

    run(scenario())
    assert sim.counters()["calls"]["delete_node_pool"] >= 2


def test_stockout_on_one_create_surfaces_on_observe(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    plan = plan_of(slices=3)
    sim.set_faults(stockout_on_create=[2])

    async def scenario() -> GangObservation:
        assert (await prov.create(plan, plan.node_pools, UID)).errors == []
        return await until(prov, plan, {PoolState.READY, PoolState.FAILED})

    obs = run(scenario())
    failed = [p for p in obs.pools.values() if p.status == PoolState.FAILED]
    assert len(failed) == 1 and failed[0].error is not None
    assert (failed[0].error.code, failed[0].error.permanent) == (CODE_STOCKOUT, False)
    assert failed[0].error.slice_index == failed[0].slice_index
    assert obs.errors == [failed[0].error]
    # The operation was read to enrich the error (one pool: get_operation, not a list).
    assert sim.counters()["calls"].get("get_operation", 0) >= 1


def test_failed_creates_rolled_back_still_surface_via_operations(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    sim.configure(failed_create_leaves_pool=False)
    sim.set_faults(quota_next=2)
    plan = plan_of(slices=2)

    async def scenario() -> GangObservation:
        await prov.create(plan, plan.node_pools, UID)
        assert sim.wait_idle()
        return await prov.observe_gang(plan)

    obs = run(scenario())
    assert {p.status for p in obs.pools.values()} == {PoolState.ABSENT}
    assert [e.code for e in obs.errors] == [CODE_QUOTA, CODE_QUOTA]
    assert sim.counters()["calls"]["list_operations"] == 1  # two ops: one list call


def test_fresh_provisioner_observes_same_state(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner]
) -> None:
    plan = plan_of(slices=3)
    sim.set_faults(stockout_on_create=[3])
    first = make_prov()

    async def scenario() -> tuple[GangObservation, GangObservation]:
        await first.create(plan, plan.node_pools, UID)
        before = await until(first, plan, {PoolState.READY, PoolState.FAILED})
        restarted = make_prov()  # operator restart: empty operation cache
        return before, await restarted.observe_gang(plan)

    before, after = run(scenario())
    assert {n: p.status for n, p in before.pools.items()} == {
        n: p.status for n, p in after.pools.items()
    }
    [err] = after.errors
    assert (err.code, err.permanent) == (CODE_STOCKOUT, False)
    assert "does not have enough resources" in err.message
    assert all(p.owner_uid == UID for p in after.pools.values())


def test_429_and_5xx_are_retried_then_succeed(sim: GkeSimulator, prov: GkeProvisioner) -> None:
    plan = plan_of(slices=1)
    sim.set_faults(http_429_next=2, http_5xx_next=1)
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    counters = sim.counters()
    assert counters["calls"]["create_node_pool"] == 4  # 3 injected failures + success
    assert counters["responses"]["429"] == 2 and counters["responses"]["503"] == 1
    sim.set_faults(http_5xx_next=2, http_5xx_status=500)
    obs = run(prov.observe_gang(plan))
    assert obs.errors == [] and obs.pools[plan.node_pools[0].name].status != PoolState.ABSENT


def test_transient_errors_reported_after_bounded_retries(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    plan = plan_of(slices=2)
    sim.set_faults(http_429_next=100, http_fault_methods=["create_node_pool"])
    started = time.monotonic()
    errors = run(prov.create(plan, plan.node_pools, UID)).errors
    assert time.monotonic() - started < 2
    assert [(e.code, e.permanent) for e in errors] == [(CODE_RATE_LIMITED, False)] * 2
    assert sim.counters()["calls"]["create_node_pool"] == 2 * FAST_RETRY.attempts
    sim.set_faults(http_429_next=0, http_5xx_next=100, http_fault_methods=["list_node_pools"])
    obs = run(prov.observe_gang(plan))
    assert obs.pools == {} and [e.code for e in obs.errors] == [CODE_UNAVAILABLE]


def test_permanent_error_classified_permanent(sim: GkeSimulator, prov: GkeProvisioner) -> None:
    plan = plan_of(slices=2)
    sim.set_faults(invalid_machine_types=["ct5lp-hightpu-4t"])
    errors = run(prov.create(plan, plan.node_pools, UID)).errors
    assert [(e.code, e.permanent) for e in errors] == [(CODE_INVALID_MACHINE_TYPE, True)] * 2
    assert sim.counters()["calls"]["create_node_pool"] == 2  # no retry of a permanent error


def test_missing_cluster_is_permanent(registrar: InMemoryRegistrar) -> None:
    config = SimConfig(op_latency_s=LATENCY, clusters=["projects/proj/locations/x/clusters/y"])
    with GkeSimulator(config, registrar=registrar) as sim:
        prov = GkeProvisioner.from_endpoint(sim.url, PROJECT, ZONE, CLUSTER, retry=FAST_RETRY)
        plan = plan_of(slices=1)
        [err] = run(prov.create(plan, plan.node_pools, UID)).errors
        prov.close()
    assert (err.code, err.permanent) == (CODE_NOT_FOUND, True)


def test_incompatible_operation_conflict_is_retried(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner]
) -> None:
    sim.configure(max_concurrent_operations=1, op_latency_s=0.05)
    prov = make_prov(retry=RetryPolicy(attempts=10, initial_s=0.05, max_s=0.1))
    plan = plan_of(slices=3)

    async def scenario() -> None:
        assert (await prov.create(plan, plan.node_pools, UID)).errors == []
        await until(prov, plan, {PoolState.READY})

    run(scenario())
    counters = sim.counters()
    assert counters["injected"]["incompatibleOperation"] >= 1
    assert counters["peakConcurrentOperations"] == 1
    assert counters["createsAccepted"] == 3


def test_incompatible_operation_reported_transient_when_retries_run_out(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    sim.configure(max_concurrent_operations=1, op_latency_s=5)
    plan = plan_of(slices=2)
    errors = run(prov.create(plan, plan.node_pools, UID)).errors
    assert [(e.code, e.permanent) for e in errors] == [(CODE_CLUSTER_BUSY, False)]


def test_check_offered(sim: GkeSimulator, prov: GkeProvisioner) -> None:
    assert run(prov.check_offered(plan_of())) is None
    sim.set_offered(ZONE, ["v5p-8", "v5litepod-8", "v5litepod-4"])
    assert run(prov.check_offered(plan_of())) is None  # still cached
    fresh_prov = GkeProvisioner.from_endpoint(
        sim.url, PROJECT, ZONE, CLUSTER, retry=FAST_RETRY, offered_ttl_s=0
    )
    try:
        err = run(fresh_prov.check_offered(plan_of()))
        assert err is not None
        assert (err.code, err.permanent) == (CODE_NOT_OFFERED, True)
        assert "v5litepod-16 is not offered" in err.message
        assert "v5litepod-4, v5litepod-8" in err.message
        assert run(fresh_prov.check_offered(plan_of(accelerator="v5p-8", slices=1))) is None
        sim.set_faults(http_5xx_next=100, http_fault_methods=["list_accelerator_types"])
        assert run(fresh_prov.check_offered(plan_of())) is None  # check failed: do not block
    finally:
        fresh_prov.close()
    assert sim.counters()["calls"]["list_accelerator_types"] >= 3


def test_list_owned_finds_orphans(sim: GkeSimulator, prov: GkeProvisioner) -> None:
    one, two = plan_of("one", slices=2), plan_of("two", slices=1)
    run(prov.create(one, one.node_pools, "uid-1"))
    run(prov.create(two, two.node_pools, "uid-2"))
    sim.wait_idle()
    owned = run(prov.list_owned())
    assert all(isinstance(p, OwnedPool) for p in owned)
    found = {
        (p.name, p.owner_uid, p.namespace, p.job_name, p.slice_index, p.status)
        for p in owned
        if isinstance(p, OwnedPool)
    }
    assert found == {
        (one.node_pools[0].name, "uid-1", "team-a", "one", 0, PoolState.READY),
        (one.node_pools[1].name, "uid-1", "team-a", "one", 1, PoolState.READY),
        (two.node_pools[0].name, "uid-2", "team-a", "two", 0, PoolState.READY),
    }


# ---------------------------------------------------------------- issue 12


def test_quota_403_is_transient_names_quota_and_region_and_rolls_back(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    """Defect 3: GKE's synchronous 403 over quota is capacity: transient, shown by observe as
    the slice's error (so decide rolls the gang back; decide scopes it to its attempt) until the
    pool is created again, naming the quota and the region."""
    plan = plan_of(slices=2)
    sim.set_faults(quota_sync_next=1)

    async def scenario() -> tuple[list[Any], GangObservation, GangObservation]:
        errors = (await prov.create(plan, plan.node_pools, UID)).errors
        first = await prov.observe_gang(plan)
        await prov.create(plan, plan.node_pools, UID)  # the next attempt: no fault left
        return errors, first, await prov.observe_gang(plan)

    errors, first, second = run(scenario())
    [err] = errors
    assert (err.code, err.permanent) == (CODE_QUOTA, False)
    assert err.message.startswith("insufficient quota TPU_LITE_PODSLICE_V5 in region us-east5: ")
    assert first.errors == [err]  # the next observation shows the slice failed...
    assert second.errors == []  # ...until the pool is created again
    sim.set_faults(permission_denied_next=1)
    other = plan_of("perm", slices=1)
    [perm] = run(prov.create(other, other.node_pools, UID)).errors
    assert (perm.code, perm.permanent) == (CODE_PERMISSION, True)  # a real permission error


def test_quota_403_through_decide_rolls_back_with_backoff(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    from datetime import UTC, datetime

    from multislice_operator.api.models import MultisliceJobStatus
    from multislice_operator.reconcile import (
        Admission,
        DecideConfig,
        DeletePools,
        JobMeta,
        Observed,
        SliceObservation,
        decide,
    )

    obj = copy.deepcopy(BASE_JOB)
    obj["spec"]["slices"] = 2
    job = load_job(obj)
    plan = make_plan(job.spec, "team-a", "llm")
    sim.set_faults(quota_sync_next=1)

    async def observe() -> GangObservation:
        await prov.create(plan, plan.node_pools, UID)
        return await prov.observe_gang(plan)

    obs = run(observe())
    slices = [
        SliceObservation(p.slice_index or 0, p.name, p.status, 0, p.error)
        for p in obs.pools.values()
    ]
    now = datetime(2026, 12, 1, tzinfo=UTC)
    old = MultisliceJobStatus(phase="Provisioning", provisioning_attempts=1, attempt_start_time=now)
    d = decide(
        JobMeta("team-a", "llm", UID, 1, has_finalizer=True),
        job.spec,
        plan,
        None,
        old,
        Observed(now=now, slices=slices, admission=Admission()),  # the JobSet was accepted
        DecideConfig.from_settings(),
    )
    status = d.status.to_dict()
    assert status["phase"] == "Provisioning" and "nextAttemptTime" in status
    assert any(isinstance(a, DeletePools) for a in d.actions)
    provisioned = {c["type"]: c for c in status["conditions"]}["Provisioned"]
    assert "TPU_LITE_PODSLICE_V5 in region us-east5" in provisioned["message"]


def test_delete_refused_for_another_pools_delete_is_not_success(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner]
) -> None:
    """Defect 6: "Operation ... is currently deleting a node pool for cluster C" names the
    cluster's running operation; this pool is not being deleted."""
    prov = make_prov(retry=RetryPolicy(attempts=2, initial_s=0.01, max_s=0.02))
    plan = plan_of(slices=2)

    async def scenario() -> list[Any]:
        await prov.create(plan, plan.node_pools, UID)
        await until(prov, plan, {PoolState.READY})
        sim.configure(max_concurrent_operations=1, op_latency_s=2.0)
        first, second = (p.name for p in plan.node_pools)
        assert (await prov.delete(plan, [first])).errors == []
        return (await prov.delete(plan, [second])).errors

    [err] = run(scenario())
    assert (err.code, err.permanent) == (CODE_CLUSTER_BUSY, False)
    assert "currently deleting a node pool" in err.message
    assert sim.pool(plan.node_pools[1].name)["status"] == "RUNNING"  # type: ignore[index]


def test_create_waits_out_a_cluster_upgrade(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner]
) -> None:
    plan = plan_of(slices=1)
    sim.start_cluster_upgrade(f"projects/{PROJECT}/locations/{ZONE}/clusters/{CLUSTER}", 0.3)
    prov = make_prov(retry=RetryPolicy(attempts=8, initial_s=0.1, max_s=0.2))
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    assert sim.counters()["responses"]["400"] >= 1


def test_workload_identity_and_node_service_account(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner]
) -> None:
    """Defect 8: with Workload Identity the nodes get GKE_METADATA (refused by a cluster
    without it, so a wrong setting fails the job, not its first checkpoint)."""
    node = NodeOptions(workload_identity=True, service_account="tpu@proj.iam.gserviceaccount.com")
    prov = make_prov(node=node)
    plan = plan_of("wi", slices=1)
    [err] = run(prov.create(plan, plan.node_pools, UID)).errors
    assert err.permanent and "Workload Identity" in err.message
    sim.configure(workload_identity=True)
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    config = sim.pool(plan.node_pools[0].name)["config"]  # type: ignore[index]
    assert config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
    assert config["serviceAccount"] == "tpu@proj.iam.gserviceaccount.com"
    assert tuple(config["oauthScopes"]) == XPK_NODE_SCOPES  # issue 21: xpk keeps them under WI
    assert sim.node_access(plan.node_pools[0].name) == {"pullImages": True, "writeStorage": True}


def test_dry_run_prints_exactly_what_the_simulator_receives(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner], tmp_path: Any, capsys: Any
) -> None:
    """`render --gke-requests` is the operator's `terraform plan`: the same bodies, byte for
    byte once parsed, that the provisioner sends for the same job and settings."""
    import json

    import yaml

    from multislice_operator.cli.main import main

    obj = copy.deepcopy(BASE_JOB)
    obj["metadata"]["uid"] = UID
    obj["spec"]["capacity"] = {"type": "Spot"}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(obj))
    args = ["--gke-project", PROJECT, "--gke-location", ZONE, "--gke-cluster", CLUSTER]
    args += ["--gke-node-service-account", "tpu@proj.iam.gserviceaccount.com"]
    assert main(["render", "--gke-requests", "-f", str(path), *args]) == 0
    printed = json.loads(capsys.readouterr().out)
    node = NodeOptions(service_account="tpu@proj.iam.gserviceaccount.com")
    prov = make_prov(node=node)
    job = load_job(obj)
    plan = make_plan(job.spec, job.metadata.namespace, job.metadata.name)
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    received = sim.received_creates()
    key = lambda r: r["nodePool"]["name"]  # noqa: E731 - created concurrently
    assert sorted(received, key=key) == sorted(printed, key=key)
    assert len(printed) == 3


def test_gc_finds_pools_of_both_label_schemes() -> None:
    from google.cloud.container_v1.types import cluster_service as cs

    from multislice_operator.provisioning.gke import _is_managed

    def pool(labels: dict[str, str], resource: dict[str, str] | None = None) -> cs.NodePool:
        return cs.NodePool(config=cs.NodeConfig(labels=labels, resource_labels=resource or {}))

    assert _is_managed(pool({"multislice.dev/managed-by": "multislice-operator"}))
    assert _is_managed(pool({"app.kubernetes.io/managed-by": "multislice-operator"}))  # old
    assert _is_managed(pool({}, {"managed-by": "multislice-operator"}))
    assert not _is_managed(pool({"multislice.dev/managed-by": "someone-else"}))


def test_classification_table() -> None:
    def exc(cls: type[gexc.GoogleAPICallError], msg: str) -> tuple[str, bool, bool]:
        c = classify_exception(cls(msg))
        return c.code, c.permanent, c.retry_now

    assert exc(gexc.TooManyRequests, "slow down") == (CODE_RATE_LIMITED, False, True)
    assert exc(gexc.ResourceExhausted, "slow down") == (CODE_RATE_LIMITED, False, True)
    assert exc(gexc.ServiceUnavailable, "x") == (CODE_UNAVAILABLE, False, True)
    assert exc(gexc.DeadlineExceeded, "x") == (CODE_UNAVAILABLE, False, True)
    assert exc(gexc.BadRequest, "Cluster is running incompatible operation op-1.")[0] == (
        CODE_CLUSTER_BUSY
    )
    assert exc(gexc.BadRequest, "Invalid value for field") == ("INVALID_ARGUMENT", True, False)
    assert exc(gexc.Forbidden, "Required 'container.nodePools.create' permission") == (
        "PERMISSION_DENIED",
        True,
        False,
    )
    assert exc(gexc.Forbidden, "Quota 'TPU_CHIPS' exceeded. Limit: 0")[:2] == (CODE_QUOTA, False)
    assert exc(gexc.Conflict, "Already exists: x")[0] == "ALREADY_EXISTS"
    assert classify_message("Code: 'GCE_STOCKOUT' ...") == (CODE_STOCKOUT, False)
    assert classify_message("Reservation 'r' not found in zone") == ("RESERVATION_UNUSABLE", True)
    assert classify_message("something odd") == ("NODE_POOL_ERROR", False)


class _MetadataHandler(http.server.BaseHTTPRequestHandler):
    answers = {
        "/computeMetadata/v1/project/project-id": "my-proj",
        "/computeMetadata/v1/instance/attributes/cluster-name": "tpu-cluster",
        "/computeMetadata/v1/instance/attributes/cluster-location": "us-east5",
        "/computeMetadata/v1/instance/zone": "projects/123/zones/us-east5-b",
    }

    def do_GET(self) -> None:
        body = self.answers.get(self.path)
        ok = body is not None and self.headers.get("Metadata-Flavor") == "Google"
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_metadata_helper_against_fake_server() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetadataHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        meta = read_gke_metadata(f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert (meta.project, meta.cluster, meta.location, meta.zone) == (
        "my-proj",
        "tpu-cluster",
        "us-east5",
        "us-east5-b",
    )


def test_regional_cluster_needs_node_locations(sim: GkeSimulator) -> None:
    with pytest.raises(ValueError, match="region"):
        GkeProvisioner.from_endpoint(sim.url, PROJECT, "us-east5", CLUSTER)
    prov = GkeProvisioner.from_settings(
        project=PROJECT,
        location="us-east5",
        cluster=CLUSTER,
        node_locations=[ZONE],
        simulator=sim.url,
    )
    assert prov.node_locations == [ZONE]
    prov.close()


def test_kube_registrar_registers_gke_like_nodes(kube_api: Any) -> None:
    """Pools become fake GKE TPU nodes in a real kube-apiserver, and go with their pool."""
    from kubernetes import client as kube

    from multislice_local.gke_sim import KubeNodeRegistrar

    # The session's api control plane (conftest builds the binaries when missing).
    with contextlib.closing(kube_api.api_client()) as api_client:
        core = kube.CoreV1Api(api_client)
        config = SimConfig(op_latency_s=LATENCY)
        with GkeSimulator(config, registrar=KubeNodeRegistrar(api_client)) as sim:
            prov = GkeProvisioner.from_endpoint(sim.url, PROJECT, ZONE, CLUSTER, retry=FAST_RETRY)
            plan = plan_of(topology="4x4", slices=2, capacity={"type": "Spot"})

            async def scenario() -> None:
                await prov.create(plan, plan.node_pools, UID)
                await until(prov, plan, {PoolState.READY})

            run(scenario())
            pool = plan.node_pools[1].name
            nodes = core.list_node(label_selector=f"cloud.google.com/gke-nodepool={pool}").items
            assert len(nodes) == 4
            assert nodes[0].metadata is not None and nodes[0].status is not None
            labels = nodes[0].metadata.labels or {}
            assert labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
            assert labels["cloud.google.com/gke-tpu-topology"] == "4x4"
            assert labels["cloud.google.com/gke-spot"] == "true"
            assert labels["multislice.dev/job-uid"] == UID
            assert labels["topology.kubernetes.io/zone"] == ZONE
            assert (nodes[0].status.capacity or {})["google.com/tpu"] == "4"

            async def teardown() -> None:
                await prov.delete(plan, [p.name for p in plan.node_pools])
                await until(prov, plan, {PoolState.ABSENT})

            run(teardown())
            prov.close()
            assert core.list_node(label_selector="multislice.dev/job-uid").items == []
        api_client.close()


def test_availability_answers_expire_and_failures_are_not_remembered(sim: GkeSimulator) -> None:
    """Issue 13: the operator used to keep one availability answer per type forever, so one
    transient failure disabled the check and one "not offered" failed every later job until a
    restart. Now the provisioner alone caches answers, successes only, for offered_ttl_s."""
    short = GkeProvisioner.from_endpoint(
        sim.url, PROJECT, ZONE, CLUSTER, retry=FAST_RETRY, offered_ttl_s=0.3
    )
    try:
        sim.set_faults(http_5xx_next=100, http_fault_methods=["list_accelerator_types"])
        assert run(short.check_offered(plan_of())) is None  # unknown: never blocks
        sim.clear_faults()
        sim.set_offered(ZONE, ["v5p-8"])
        not_offered = run(short.check_offered(plan_of()))
        assert not_offered is not None and not_offered.code == CODE_NOT_OFFERED  # asked again
        sim.set_offered(ZONE, ["v5p-8", "v5litepod-16"])
        time.sleep(0.5)  # past offered_ttl_s: the "not offered" answer expires
        assert run(short.check_offered(plan_of())) is None
    finally:
        short.close()


# ---------------------------------------------------------------- issue 24: Ironwood, flex-start


def ironwood_plan(name: str = "iw", **spec: Any) -> Plan:
    return plan_of(name, accelerator="tpu7x-128", slices=2, **spec)


def test_tpu7x_gang_finds_or_creates_its_workload_policy(
    sim: GkeSimulator, prov: GkeProvisioner, registrar: InMemoryRegistrar
) -> None:
    plan = ironwood_plan()
    assert run(prov.check_offered(plan)) is None  # no Cloud TPU API for tpu7x: not a refusal
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    # One policy for both slices, HIGH_THROUGHPUT with the slice's topology, in the zone's region.
    [insert] = sim.received_policy_inserts()
    body = insert["resourcePolicyResource"]
    assert (insert["region"], body["name"]) == ("us-east5", "msj-tpu7x-4x4x4")
    assert body["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "4x4x4"}
    assert "managed-by=multislice-operator" in body["description"]
    placements = [r["nodePool"]["placementPolicy"] for r in sim.received_creates()]
    assert placements == [{"policyName": "msj-tpu7x-4x4x4", "tpuTopology": "4x4x4"}] * 2
    run(until(prov, plan, {PoolState.READY}))
    assert [registrar.node_count(p.name) for p in plan.node_pools] == [16, 16]
    # A second job of the same shape reuses the policy: no second insert.
    other = ironwood_plan("iw2")
    assert run(prov.create(other, other.node_pools, UID)).errors == []
    assert len(sim.received_policy_inserts()) == 1


def test_tpu7x_policy_of_another_topology_is_a_permanent_error(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    sim.add_policy(
        PROJECT,
        "us-east5",
        {
            "name": "msj-tpu7x-4x4x4",
            "workloadPolicy": {"type": "HIGH_THROUGHPUT", "acceleratorTopology": "4x4x8"},
        },
    )
    plan = ironwood_plan()
    result = run(prov.create(plan, plan.node_pools, UID))
    assert [e.code for e in result.errors] == ["WORKLOAD_POLICY_UNUSABLE"] * 2
    assert all(e.permanent and "4x4x8" in e.message for e in result.errors)
    assert sim.received_creates() == []  # no pool was created on a policy that cannot place it


def test_tpu7x_compact_error_is_permanent() -> None:
    code, permanent = classify_message(
        "Creation of a managed instance group with tpu7x-standard-4t machine type with "
        "placement policy is not supported. Use workload policy instead."
    )
    assert (code, permanent) == ("PLACEMENT_UNSUPPORTED", True)


def test_old_cluster_refuses_tpu7x_and_flex_start_before_any_create(
    sim: GkeSimulator, prov: GkeProvisioner
) -> None:
    sim.configure(cluster_version="1.33.2-gke.1000")
    err = run(prov.check_offered(ironwood_plan()))
    assert err is not None and err.permanent and err.code == "GKE_VERSION_TOO_OLD"
    assert "1.34.0-gke.2201000" in err.message
    prov._cluster_version = None  # the version is cached; a new check reads it again
    sim.configure(cluster_version="1.32.9-gke.1000")
    err = run(prov.check_offered(plan_of("fx", capacity={"type": "FlexStart"})))
    assert err is not None and "flex-start v5e node pools need 1.33.0-gke.1712000" in err.message


def test_flex_start_pool_waits_for_capacity_then_gets_its_nodes(
    sim: GkeSimulator, prov: GkeProvisioner, registrar: InMemoryRegistrar
) -> None:
    sim.set_faults(flex_start_hold=3)
    plan = plan_of("fx", capacity={"type": "FlexStart", "maxRunDurationSeconds": 7200})
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    [req, *_] = sim.received_creates()
    pool = req["nodePool"]
    assert pool["config"]["flexStart"] is True and pool["config"]["maxRunDuration"] == "7200s"
    assert pool.get("initialNodeCount", 0) == 0 and pool["autoscaling"]["maxNodeCount"] == 4
    assert pool["management"] == {"autoUpgrade": True}  # auto-repair off: proto3 JSON omits it
    assert pool["config"]["reservationAffinity"] == {"consumeReservationType": 1}  # NO_RESERVATION
    obs = run(until(prov, plan, {PoolState.READY}))
    # READY and empty: waiting for capacity, said by the provider-neutral flag, not an error.
    assert all(p.waits_for_capacity and p.error is None for p in obs.pools.values())
    assert all(p.max_run_duration_s == 7200 for p in obs.pools.values())
    assert sum(registrar.node_count(p.name) for p in plan.node_pools) == 0
    for p in plan.node_pools:
        sim.grant_flex_start(p.name)
    assert [registrar.node_count(p.name) for p in plan.node_pools] == [4, 4, 4]


def test_dry_run_prints_the_policy_and_pools_the_simulator_receives(
    sim: GkeSimulator, make_prov: Callable[..., GkeProvisioner], tmp_path: Any, capsys: Any
) -> None:
    import json

    import yaml

    from multislice_operator.cli.main import main

    obj = copy.deepcopy(BASE_JOB)
    obj["metadata"]["uid"] = UID
    obj["spec"].update(accelerator="tpu7x-128", slices=2)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(obj))
    args = ["--gke-project", PROJECT, "--gke-location", ZONE, "--gke-cluster", CLUSTER]
    assert main(["render", "--gke-requests", "-f", str(path), *args]) == 0
    printed = json.loads(capsys.readouterr().out)
    prov = make_prov()
    job = load_job(obj)
    plan = make_plan(job.spec, job.metadata.namespace, job.metadata.name)
    assert run(prov.create(plan, plan.node_pools, UID)).errors == []
    assert printed[:1] == sim.received_policy_inserts()
    key = lambda r: r["nodePool"]["name"]  # noqa: E731 - created concurrently
    assert sorted(sim.received_creates(), key=key) == sorted(printed[1:], key=key)
    assert all("type" not in r["nodePool"]["placementPolicy"] for r in printed[1:])


@pytest.mark.parametrize("mutation", ["create", "delete"])
def test_a_listing_taken_while_a_mutation_is_in_flight_is_not_served_after_it(
    sim: GkeSimulator, prov: GkeProvisioner, mutation: str
) -> None:
    """Another job's pass lists the pools while this job's create (or delete) is on the wire,
    and GKE answers the listing before it applies the mutation: that listing is older than the
    mutation, so an observe after it returns must not be served from it (it was, and the job saw
    its new pools ABSENT and wrote its status twice: the write budget's load-only extra write)."""
    plan, other = plan_of(slices=2), plan_of("other", slices=1)
    sim.configure(op_latency_s=3600)  # pools stay as created: only the listing can change
    call = "create_node_pool" if mutation == "create" else "delete_node_pool"
    real = getattr(prov._client, call)
    on_the_wire, listed = threading.Event(), threading.Event()

    def held(*args: Any, **kwargs: Any) -> Any:
        on_the_wire.set()
        assert listed.wait(10)  # GKE answers the other listing first
        return real(*args, **kwargs)

    async def scenario() -> GangObservation:
        if mutation == "delete":  # pools that are Ready, then deleted for an hour
            sim.configure(op_latency_s=0.05)
            assert (await prov.create(plan, plan.node_pools, UID)).errors == []
            await until(prov, plan, {PoolState.READY})
            sim.configure(op_latency_s=3600)
        setattr(prov._client, call, held)
        names = [p.name for p in plan.node_pools]
        task = asyncio.ensure_future(
            prov.create(plan, plan.node_pools, UID)
            if mutation == "create"
            else prov.delete(plan, names)
        )
        while not on_the_wire.is_set():
            await asyncio.sleep(0.01)
        await prov.observe_gang(other, max_age=60)  # the listing, taken mid-mutation
        listed.set()
        assert (await task).errors == []
        return await prov.observe_gang(plan, max_age=60)

    obs = run(scenario())
    want = PoolState.CREATING if mutation == "create" else PoolState.DELETING
    assert {p.status for p in obs.pools.values()} == {want}, obs


def gke_api_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("gke-api"))


def test_the_client_threads_of_a_burst_go_once_it_is_over(
    make_prov: Callable[..., GkeProvisioner],
) -> None:
    """A gang's creates run concurrently, a thread each up to max_concurrency; after a 200-job
    load the operator kept all 32 for the rest of its life (issue 45: threads 2 -> 27, each with
    its own malloc arena). They now go once idle."""
    assert gke_api_threads() == 0
    prov = make_prov(max_concurrency=6, idle_thread_s=0.5)
    plan = plan_of(slices=6)

    async def burst() -> None:
        result = await prov.create(plan, plan.node_pools, UID)
        assert result.errors == []
        await until(prov, plan, {PoolState.READY})

    run(burst())
    assert gke_api_threads() >= 2  # the creates ran side by side
    deadline = time.monotonic() + 5
    while gke_api_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gke_api_threads() == 0
    run(until(prov, plan, {PoolState.READY}))  # and calls still run afterwards
