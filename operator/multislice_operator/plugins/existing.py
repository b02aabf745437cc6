"""Capacity model `ExistingPools` (spec.provisioning.mode Existing): node pools that are there.

The slices run on node pools of the cluster that match the job's accelerator and topology. The
operator creates none, replaces none and releases none of them (only a stray pool labelled with
the job's uid, left by an earlier Managed spec): the job waits in Pending until enough are ready,
and once its JobSet runs, the pools are the JobSet's business. Pure.

Registered (`register`) with how it observes the pools (`observe`: the cluster's pools of the
job's accelerator, topology and nodeSelector). It accepts no spares and no elastic slice count:
the operator keeps neither where it creates no pool. tests/plugins/labelled.py subclasses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from multislice_operator.api.models import MultisliceJobStatus, Phase
from multislice_operator.common.pools import PoolState
from multislice_operator.controller.observe import ObserveInputs
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.capacity import (
    PROVISIONED,
    Capacity,
    HoldsNothing,
    Size,
    Slices,
    slice_ready,
    stale_note,
)
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    DecideConfig,
    JobSetObservation,
    Observed,
    SliceObservation,
)
from multislice_operator.registry import CapacityPlugin, Feature, Registry

if TYPE_CHECKING:
    from multislice_operator.reconcile.facts import Facts

MODE = "Existing"
NOTHING_TO_PROVISION = (
    "Existing mode: the slices run on node pools that exist; nothing to provision"
)


class ExistingPools(HoldsNothing):
    """Node pools that exist already (Existing): none of them the job's own, so what it holds
    and releases is what `HoldsNothing` says (only strays)."""

    name = "ExistingPools"  # the JobSet is created at once: the create itself is its judgement

    def slices(self, old: MultisliceJobStatus, obs: Observed, plan: Plan, cfg: DecideConfig,
               now: datetime) -> Slices:  # fmt: skip
        """Ready pools only: an Existing pool is never lost or repaired by the operator."""
        hosts = plan.shape.hosts
        ready = frozenset(s.index for s in obs.slices if slice_ready(s, hosts))
        up = len(ready) >= plan.slices
        return Slices(hosts, ready, all_ready=up, up=len(ready), complete=True, need=plan.slices)

    def size(self, plan: Plan, old: MultisliceJobStatus, slices: Slices, obs: Observed,
             js: JobSetObservation | None, now: datetime) -> Size:  # fmt: skip
        return Size(plan.slices, plan.slices)  # spec.elastic resizes node pools of its own only

    def clock_ready(self, slices: Slices) -> bool:
        return True  # the JobSet runs: its pools are there

    def provide(self, f: Facts, b: Builder, started: bool) -> Capacity:
        """Waits for the pools before the JobSet runs; a queued job's are Kueue's to judge."""
        assert f.plan is not None
        js = f.js
        if f.queue or (js is not None and not js.suspended):
            return Capacity(True)  # Existing pools are the JobSet's business once it runs
        ready = len(f.slices.ready)
        if f.slices.all_ready:
            b.cond(PROVISIONED, "True", Reason.EXISTING_NODE_POOLS, f"{ready} matching node pools")
            return Capacity(True)
        message = self.waiting(f)
        b.cond(PROVISIONED, "False", Reason.WAITING_FOR_NODE_POOLS, message)
        b.requeue_in(f.cfg.resync_seconds)
        return Capacity(False, Phase.PENDING, message)

    def waiting(self, f: Facts) -> str:
        """What the job waits for (a subclass says which pools it looks for)."""
        assert f.plan is not None
        plan, found = f.plan, f.obs.capacity
        return (
            f"waiting for {plan.slices} existing node pools with {plan.shape.hosts} Ready nodes "
            f"labelled {plan.shape.generation.gke_accelerator} / {plan.shape.topology}: "
            f"{len(f.slices.ready)} ready of {found.found if isinstance(found, Found) else 0} "
            f"found{stale_note(f.obs)}"
        )

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        return Capacity(False, preexisting=NOTHING_TO_PROVISION)

    def chips_held(self, f: Facts, b: Builder, plan: Plan, in_use: bool) -> int:
        """The pools are not the job's: it holds its slices' chips while its JobSet runs on them."""
        return plan.total_chips if in_use else 0


EXISTING_POOLS = ExistingPools()


# ---------------------------------------------------------------- its other parts


@dataclass(frozen=True)
class Found:
    """What it observes besides the slices (`Observed.capacity`): the matching pools found,
    ready or not."""

    found: int = 0


def matching_pools(plan: Plan, nodes: Mapping[Any, Iterable[dict[str, Any]]],
                   labels: Mapping[str, str]) -> tuple[list[SliceObservation], int]:  # fmt: skip
    """Node pools of the cluster, not another job's own, whose every node has the job's
    accelerator, topology and `labels`: the first spec.slices of them (Ready ones first), and
    how many there are."""
    accel, topo = plan.shape.generation.gke_accelerator, plan.shape.topology
    matching = []
    for pool, members in sorted(nodes.items(), key=lambda kv: str(kv[0])):
        members = list(members)
        if not members or any(n["jobKey"] for n in members):  # another job's Managed pool
            continue
        if all(
            n["accelerator"] == accel
            and n["topology"] == topo
            and all(n["labels"].get(k) == v for k, v in labels.items())
            for n in members
        ):
            matching.append((str(pool), sum(1 for n in members if n["ready"])))
    # Ready pools first, so `slices` of them are enough.
    matching.sort(key=lambda p: (p[1] < plan.shape.hosts, p[0]))
    slices = [
        SliceObservation(i, pool, PoolState.READY, ready)
        for i, (pool, ready) in enumerate(matching)
    ][: plan.slices]
    return slices, len(matching)


def observe(i: ObserveInputs) -> tuple[list[SliceObservation], Found]:
    """The pools the template's nodeSelector selects among those of the job's shape."""
    slices, found = matching_pools(i.plan, i.nodes, i.node_selector)
    return slices, Found(found)


DOCS = """\
Node pools of the cluster whose every node has the job's accelerator and topology labels and the
template's `nodeSelector` (not another job's own pools): the job waits in `Pending` until enough
are Ready; nothing is created, replaced or released (but pools labelled with the job's uid, an
earlier spec's). `status.capacity`: none.
"""


DESCRIPTION = (
    "the slices run on node pools that already exist with the matching accelerator and "
    "topology labels."
)
PLUGIN = CapacityPlugin(
    MODE,
    EXISTING_POOLS,
    DESCRIPTION,
    accepts={Feature.FLEX_START: ""},
    observe=observe,
    waits_for_nodes=True,
    docs=DOCS,
)


def register(r: Registry) -> None:
    r.add_model(PLUGIN)
