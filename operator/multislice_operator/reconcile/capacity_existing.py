"""Capacity model `ExistingPools` (spec.provisioning.mode Existing): node pools that are there.

The slices run on node pools of the cluster that match the job's accelerator and topology. The
operator creates none, replaces none and releases none of them (only a stray pool labelled with
the job's uid, left by an earlier Managed spec): the job waits in Pending until enough are ready,
and once its JobSet runs, the pools are the JobSet's business. Pure.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from multislice_operator.api.models import MultisliceJobStatus, Phase
from multislice_operator.common.pools import PoolError
from multislice_operator.planning.plan import Plan
from multislice_operator.reconcile.capacity import (
    PROVISIONED,
    Capacity,
    Released,
    Slices,
    release_pools,
    slice_ready,
    stale_note,
    strays,
)
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.elastic import Size
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    DecideConfig,
    JobSetObservation,
    Observed,
    SliceObservation,
)

if TYPE_CHECKING:
    from multislice_operator.reconcile.facts import Facts

NOTHING_TO_PROVISION = (
    "Existing mode: the slices run on node pools that exist; nothing to provision"
)


class ExistingPools:
    """Node pools that exist already (Existing)."""

    name = "ExistingPools"
    finalizer_first = False  # nothing of the job's to release
    dry_run_first = False  # the JobSet is created at once: the create itself is the judgement

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
        plan = f.plan
        message = (
            f"waiting for {plan.slices} existing node pools with {plan.shape.hosts} Ready nodes "
            f"labelled {plan.shape.generation.gke_accelerator} / {plan.shape.topology}: "
            f"{ready} ready of {f.obs.existing_pools_found} found{stale_note(f.obs)}"
        )
        b.cond(PROVISIONED, "False", Reason.WAITING_FOR_NODE_POOLS, message)
        b.requeue_in(f.cfg.resync_seconds)
        return Capacity(False, Phase.PENDING, message)

    def before_admission(self, f: Facts, b: Builder) -> Capacity:
        return Capacity(False, preexisting=NOTHING_TO_PROVISION)

    def held(self, f: Facts, b: Builder, note: Released) -> None:
        return None  # no pool of the job's: Provisioned says what it said

    def present(self, f: Facts) -> list[str]:
        return []  # the cluster's pools, not the job's

    def release(self, f: Facts, b: Builder) -> bool:
        """Only the job's strays: its slices' pools belong to the cluster."""
        return release_pools(f, b, [], strays(f))

    def taken(self, f: Facts) -> list[SliceObservation]:
        return []

    def permanent_errors(self, f: Facts, started: bool) -> list[PoolError]:
        return []

    def chips_held(self, f: Facts, b: Builder, plan: Plan, in_use: bool) -> int:
        """The pools are not the job's: it holds its slices' chips while its JobSet runs on them."""
        return plan.total_chips if in_use else 0


EXISTING_POOLS = ExistingPools()
