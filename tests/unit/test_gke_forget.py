"""Issue 45 (memory after a load): the GKE provisioner keeps a record of each operation it
started on a pool (`_ops`) and each refused create (`_refused`); once the pool is gone and
observed gone, nothing of it may be kept, whichever path deleted it: a job's own release (its
passes observe the gang) or the garbage collector's orphan sweep (it only lists)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from multislice_local.gke_sim import GkeSimulator, InMemoryRegistrar, SimConfig
from multislice_operator.common.pools import PoolState
from multislice_operator.planning.plan import Plan
from multislice_operator.provisioning.gke import GkeProvisioner
from tests.integration.test_gke_provisioner import CLUSTER, FAST_RETRY, PROJECT, UID, ZONE, plan_of


@pytest.fixture
def prov() -> Iterator[GkeProvisioner]:
    with GkeSimulator(SimConfig(op_latency_s=0.1), registrar=InMemoryRegistrar()) as sim:
        p = GkeProvisioner.from_endpoint(sim.url, PROJECT, ZONE, CLUSTER, retry=FAST_RETRY)
        try:
            yield p
        finally:
            p.close()


async def until_owned(prov: GkeProvisioner, want: set[PoolState], count: int) -> None:
    deadline = time.monotonic() + 15
    while True:
        owned = await prov.list_owned()
        if len(owned) == count and all(o.status in want for o in owned):
            return
        if time.monotonic() > deadline:
            raise TimeoutError([(o.name, o.status) for o in owned])
        await asyncio.sleep(0.05)


async def gang_up(prov: GkeProvisioner, plan: Plan) -> None:
    result = await prov.create(plan, plan.node_pools, UID)
    assert result.errors == []
    await until_owned(prov, {PoolState.READY}, len(plan.node_pools))


def test_pools_the_garbage_collector_deleted_leave_no_record(prov: GkeProvisioner) -> None:
    """The orphan sweep deletes by name and then only lists: a listing that no longer holds the
    pool, asked after the delete was answered, is the end of that delete."""
    plan = plan_of("orphan", slices=2)

    async def scenario() -> None:
        await gang_up(prov, plan)
        assert (await prov.delete_named([p.name for p in plan.node_pools])).errors == []
        assert {r.kind for r in prov._ops.values()} == {"delete"}
        await until_owned(prov, set(), 0)

    asyncio.run(scenario())
    assert prov._ops == {} and prov._refused == {}


def test_a_released_gang_leaves_no_record(prov: GkeProvisioner) -> None:
    """A job's own release: its passes observe the gang until every pool is absent."""
    plan = plan_of("released", slices=2)

    async def scenario() -> None:
        await gang_up(prov, plan)
        assert (await prov.delete(plan, [p.name for p in plan.node_pools])).errors == []
        deadline = time.monotonic() + 15
        while {p.status for p in (await prov.observe_gang(plan)).pools.values()} != {
            PoolState.ABSENT
        }:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert prov._ops == {} and prov._refused == {}
