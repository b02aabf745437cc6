"""Issue 23 (the gang's operator share): node pools are listed once per resync for every job
(one shared listing), so a pass could see every node of a pool Ready while the listing, taken a
moment before the pool turned RUNNING, still said it was being created; it then waited for the
next resync (about 1 s in the gang benchmark: 2 of 5 runs at 256 slices took 1.2 s more, 10 s
in production). Such a pass asks for a listing at most FRESH_LISTING_SECONDS old."""

from __future__ import annotations

import asyncio
from typing import Any

from multislice_local.nodes import tpu_node_manifest
from multislice_operator.common.pools import PoolState
from multislice_operator.controller import observe as ob
from multislice_operator.controller import reconciler
from multislice_operator.provisioning.base import GangObservation, PoolObservation
from tests.unit.jobs import spec_and_plan
from tests.unit.test_forget import Apiserver, runtime


def index(plan: Any, ready: int, pools: range) -> dict[str, list[dict[str, Any]]]:
    """`ready` Ready nodes in each of `pools` (slice indexes) of the plan."""
    out: dict[str, list[dict[str, Any]]] = {}
    for i in pools:
        name = plan.pools[i].name
        for n in range(ready):
            body = tpu_node_manifest(f"{name}-{n}", name, "tpu-v5-lite-podslice", "4x4", 4)
            body["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            out.setdefault(name, []).append(ob.summarize_node(body))
    return out


def gang(plan: Any, state: PoolState) -> GangObservation:
    g = GangObservation()
    for spec in plan.pools:
        g.pools[spec.name] = PoolObservation(spec.name, spec.slice_index, state)
    return g


def test_a_pool_whose_nodes_are_all_ready_is_not_still_being_created() -> None:
    _, plan = spec_and_plan()
    hosts = plan.shape.hosts
    creating = gang(plan, PoolState.CREATING)
    assert ob.listing_behind_nodes(plan, creating, index(plan, hosts, range(1)))
    assert not ob.listing_behind_nodes(plan, creating, index(plan, hosts - 1, range(2)))
    assert not ob.listing_behind_nodes(
        plan, gang(plan, PoolState.READY), index(plan, hosts, range(2))
    )
    assert not ob.listing_behind_nodes(plan, creating, {})


class Provisioner:
    """Creating in a listing older than 0.5 s, Ready in a fresher one."""

    def __init__(self, plan: Any) -> None:
        self.plan, self.asked = plan, []

    async def observe_gang(self, plan: Any, max_age: float = 0.0) -> GangObservation:
        self.asked.append(max_age)
        return gang(plan, PoolState.READY if max_age <= 0.5 else PoolState.CREATING)

    async def check_offered(self, plan: Any) -> None:
        return None

    async def list_owned(self, max_age: float = 0.0) -> list[Any]:
        return []


def test_a_pass_that_sees_the_nodes_ahead_of_the_listing_asks_for_a_fresh_one() -> None:
    spec, plan = spec_and_plan()
    rt = runtime(Apiserver())
    rt.indexes.nodes = index(plan, plan.shape.hosts, range(len(plan.pools)))
    rt.provisioner = p = Provisioner(plan)  # type: ignore[assignment]
    body: dict[str, Any] = {
        "metadata": {"name": "job", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {},
    }
    obs = asyncio.run(reconciler.observe_job(rt, ("ns", "job"), body, plan, spec))
    assert p.asked == [rt.cfg.resync_seconds, reconciler.FRESH_LISTING_SECONDS], p.asked
    assert {s.pool_state for s in obs.slices} == {PoolState.READY}
    rt.indexes.nodes = {}  # no node yet: the resync's listing is enough
    p.asked.clear()
    asyncio.run(reconciler.observe_job(rt, ("ns", "job"), body, plan, spec))
    assert p.asked == [rt.cfg.resync_seconds]
