"""Issue 56, part 4: a node whose kubelet stopped heartbeating is not a ready slice.

Under CPU starvation kwok's heartbeats stalled and JobSets were created on nodes whose Ready
condition still said True: the node lifecycle controller marks a node Unknown only once its
heartbeat is --node-monitor-grace-period (50 s) old, at its own pace. The operator now judges the
heartbeat itself, as that controller does: the later of the node Lease's renewTime and the Ready
condition's lastHeartbeatTime, older than the grace, is not Ready.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from multislice_operator.common.pools import PoolState
from multislice_operator.controller import observe as ob
from multislice_operator.controller import reconciler
from multislice_operator.controller.kube import ApiError
from multislice_operator.controller.runtime import Indexes, Runtime
from multislice_operator.provisioning.base import GangObservation, PoolObservation
from multislice_operator.reconcile import CreateJobSet, DecideConfig, JobMeta
from multislice_operator.settings import Settings
from tests.unit import jobs

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10)
OLD = NOW - timedelta(minutes=10)  # a status heartbeat as a kubelet with a Lease leaves it


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, pool: str, heartbeat: datetime = OLD, ready: str = "True") -> dict[str, Any]:
    body = {
        "metadata": {"name": name, "labels": {
            "cloud.google.com/gke-nodepool": pool,
            "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
            "cloud.google.com/gke-tpu-topology": "4x4",
        }},
        "status": {"conditions": [{"type": "Ready", "status": ready,
                                   "lastHeartbeatTime": iso(heartbeat)}]},
    }  # fmt: skip
    return ob.summarize_node(body)


def index(*pools: str) -> dict[str, list[dict[str, Any]]]:
    return {p: [node(f"{p}-{i}", p) for i in range(4)] for p in pools}


def fresh_leases(nodes: dict[str, list[dict[str, Any]]], but: set[str]) -> dict[str, float]:
    """Every node's Lease renewed 5 s ago, except those in `but` (renewed 2 min ago)."""
    t = NOW.timestamp()
    return {n["name"]: t - (120 if n["name"] in but else 5) for ns in nodes.values() for n in ns}


def test_a_ready_node_whose_heartbeats_stalled_is_not_ready():
    nodes = index("pool-a")
    leases = fresh_leases(nodes, but={"pool-a-1", "pool-a-3"})
    view, stale = ob.with_heartbeats(nodes, leases, NOW)
    assert ob.ready_nodes_by_pool(view) == {"pool-a": 2}
    assert stale == {"pool-a": ["pool-a-1 (120s)", "pool-a-3 (120s)"]}
    assert ob.ready_nodes_by_pool(nodes) == {"pool-a": 4}  # the index itself is untouched


def test_the_later_of_the_lease_and_the_ready_condition_is_the_heartbeat():
    # Without a Lease, a Ready condition renewed 10 s ago is a heartbeat (a kubelet without
    # Leases posts its status every 10 s); renewed 2 min ago, it is not.
    nodes = {"p": [node("p-0", "p", heartbeat=NOW - timedelta(seconds=10)), node("p-1", "p")]}
    view, stale = ob.with_heartbeats(nodes, {}, NOW)
    assert [n["ready"] for n in view["p"]] == [True, False] and list(stale) == ["p"]
    # A NotReady node stays so; Leases not readable: every Ready node is trusted.
    assert ob.with_heartbeats({"p": [node("p-0", "p", ready="False")]}, {}, NOW)[1] == {}
    view, stale = ob.with_heartbeats(nodes, None, NOW)
    assert view is nodes and stale == {}
    fresh = {"p": [node("p-0", "p", heartbeat=NOW)]}
    assert ob.with_heartbeats(fresh, {}, NOW)[0] is fresh  # none quiet: the index itself


def test_an_existing_job_waits_for_nodes_whose_heartbeats_stalled_saying_so():
    spec, plan = jobs.spec_and_plan(provisioning={"mode": "Existing"})
    nodes = index("pool-a", "pool-b")
    view, stale = ob.with_heartbeats(nodes, fresh_leases(nodes, but={"pool-b-2"}), NOW)
    obs = ob.assemble(ob.ObserveInputs(plan, "uid-1", view), NOW, None, [])
    obs.stale_nodes = tuple(n for s in obs.slices for n in stale.get(str(s.pool), ()))
    meta = JobMeta("ns", "job", "uid-1", 1)
    d = jobs.run(None, obs, cfg=CFG, meta=meta, plan=(spec, plan))
    assert not [a for a in d.actions if isinstance(a, CreateJobSet)]
    assert d.status.phase == "Pending"
    assert "not counted Ready: pool-b-2 (120s)" in (d.status.message or ""), d.status.message
    healthy = ob.assemble(ob.ObserveInputs(plan, "uid-1", nodes), NOW, None, [])
    up = jobs.run(None, healthy, cfg=CFG, meta=meta, plan=(spec, plan))
    assert [a for a in up.actions if isinstance(a, CreateJobSet)]


def test_a_managed_gang_with_a_quiet_node_is_not_ready():
    spec, plan = jobs.spec_and_plan(provisioning={"mode": "Managed"})
    names = [p.name for p in plan.node_pools]
    nodes = index(*names)
    view, stale = ob.with_heartbeats(nodes, fresh_leases(nodes, but={f"{names[1]}-0"}), NOW)
    gang = GangObservation(
        pools={
            n: PoolObservation(n, i, PoolState.READY, node_count=4, owner_uid="uid-1")
            for i, n in enumerate(names)
        }
    )
    obs = ob.assemble(ob.ObserveInputs(plan, "uid-1", view, gang), NOW, None, [])
    obs.stale_nodes = tuple(n for s in obs.slices for n in stale.get(str(s.pool), ()))
    old = {"phase": "Provisioning", "attemptStartTime": iso(NOW - timedelta(seconds=30))}
    d = jobs.run(old, obs, cfg=CFG, plan=(spec, plan))
    assert not [a for a in d.actions if isinstance(a, CreateJobSet)]
    assert "1/2 ready" in (d.status.message or "") and f"{names[1]}-0" in d.status.message


# ---------------------------------------------------------------- the shell's listing


class Leases:
    """A kube whose node Lease listing is counted (or refused: RBAC)."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls, self.refuse = 0, refuse

    async def list_node_leases(self) -> dict[str, str]:
        self.calls += 1
        await asyncio.sleep(0.01)  # concurrent passes overlap
        if self.refuse:
            raise ApiError({"message": "leases is forbidden"}, status=403, headers={})
        return {"n-0": "2026-12-06T12:00:00.123456Z"}


def runtime(kube: Leases) -> Runtime:
    return Runtime(
        settings=Settings(),
        kube=kube,  # type: ignore[arg-type]
        provisioner=None,
        cfg=CFG,
        indexes=Indexes(jobsets={}, pods={}, nodes={}),
    )


def test_one_listing_serves_every_job_for_a_resync():
    kube = Leases()
    rt = runtime(kube)

    async def passes() -> list[Any]:
        return list(await asyncio.gather(*(reconciler._node_leases(rt) for _ in range(8))))

    found = asyncio.run(passes())
    assert kube.calls == 1
    assert found[0] == {"n-0": datetime(2026, 12, 6, 12, 0, 0, 123456, tzinfo=UTC).timestamp()}
    assert all(f == found[0] for f in found)


def test_leases_that_cannot_be_read_leave_heartbeats_unjudged(caplog):
    kube = Leases(refuse=True)
    rt = runtime(kube)
    caplog.set_level(logging.WARNING, logger="multislice_operator")
    assert asyncio.run(reconciler._node_leases(rt)) is None
    assert asyncio.run(reconciler._node_leases(rt)) is None
    assert kube.calls == 1  # not asked again at once
    (record,) = [r for r in caplog.records if "node Leases not readable" in r.getMessage()]
    assert record.exc_info is None
