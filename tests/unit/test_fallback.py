"""provisioning.mode Fallback (plugins/fallback.py, issue 55): an ordered list of capacity
options and shapes, each tried all or none by its own model; a stockout, quota error, an
exhausted reservation or the option's time running out rolls it back and moves to the next,
after the last back to the first with backoff; a shape the preflight compile refused is never
provisioned. Passes of decide(), each planned from the status as the controller plans it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from multislice_operator.api.models import FallbackLeave, MultisliceJobStatus, Phase
from multislice_operator.common import keys
from multislice_operator.common.errors import SpecError
from multislice_operator.common.pools import (
    CODE_QUOTA,
    CODE_RESERVATION_EXHAUSTED,
    CODE_STOCKOUT,
    PoolError,
    PoolState,
)
from multislice_operator.planning.plan import Plan, load_job, make_plan, plan_job
from multislice_operator.plugins import fallback, nodepools
from multislice_operator.reconcile import (
    CheckObservation,
    CheckState,
    CreateJobSet,
    CreatePools,
    CreateWorkload,
    Decision,
    DeleteJobSet,
    DeletePools,
    DeleteWorkload,
    JobMeta,
    JobSetObservation,
    QueueObservation,
    SetAdmissionCheckState,
    SliceObservation,
    WorkloadObservation,
)
from multislice_operator.reconcile.capacity import model_of
from multislice_operator.reconcile.context import backoff_seconds
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import PreflightObservation
from multislice_operator.registry import REGISTRY
from tests.unit import jobs
from tests.unit.jobs import Observed, body

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
OPTIONS: list[dict[str, Any]] = [
    {"capacity": {"type": "Reserved", "reservation": "res-a"}, "trySeconds": 600},
    {"capacity": {"type": "FlexStart"}, "trySeconds": 900},
    {"capacity": {"type": "Spot"}, "zone": "us-east5-c", "shape": "v6e", "trySeconds": 300},
]
SHAPES: list[dict[str, Any]] = [
    {
        "name": "v6e",
        "accelerator": "v6e-32",
        "slices": 1,
        "parallelism": {"ici": {"fsdp": 32}},
    }
]


def fallback_job(options: list[dict[str, Any]] = OPTIONS, shapes: list[dict[str, Any]] = SHAPES,
                 **spec: Any) -> dict[str, Any]:  # fmt: skip
    fb = {"options": options, "shapes": shapes}
    return body(provisioning={"mode": "Fallback", "fallback": fb}, **spec)


SPEC = load_job(fallback_job()).spec


def plan_for(old: MultisliceJobStatus | dict[str, Any] | None, spec: Any = SPEC) -> Plan:
    """The plan as the controller makes it: of the option the status says the job tries."""
    return make_plan(spec, "ns", "job", jobs.status(old))


Pools = Callable[[Plan], list[SliceObservation]]


def absent(plan: Plan) -> list[SliceObservation]:
    return [SliceObservation(p.slice_index, p.name) for p in plan.pools]


def state(s: PoolState, ready: int = 0, error: str | None = None) -> Pools:
    def pools(plan: Plan) -> list[SliceObservation]:
        out = []
        for p in plan.pools:
            err = (
                PoolError(p.slice_index, p.name, error, f"{error} in zone", False)
                if error
                else None
            )
            out.append(SliceObservation(p.slice_index, p.name, s, ready, error=err))
        return out

    return pools


def step(old: Any, at: float, pools: Pools = absent, spec: Any = SPEC, **obs: Any) -> Decision:
    """One pass `at` seconds after NOW on the pools `pools` makes of the pass's plan."""
    plan = plan_for(old, spec)
    seen = Observed(now=NOW + timedelta(seconds=at), slices=pools(plan), **obs)
    return jobs.run(old, seen, plan=(spec, plan))


def reasons(d: Decision) -> list[str]:
    return [e.reason for e in d.events]


def provisioned(d: Decision) -> str | None:
    cond = d.status.condition("Provisioned")
    return cond.reason if cond else None


# ---------------------------------------------------------------- planning


def test_the_job_is_planned_as_the_option_it_tries() -> None:
    first = plan_for(None)
    assert (first.mode, first.composed, first.capacity) == ("Managed", "Fallback", "Reserved")
    assert first.shape.accelerator == "v5litepod-16" and first.slices == 2
    assert {p.reservation for p in first.pools} == {"res-a"}
    assert {p.node_labels[keys.CAPACITY_TYPE] for p in first.pools} == {"Reserved"}
    assert first.node_selector == {keys.CAPACITY_TYPE: "Reserved"}
    third = plan_for({"fallback": {"option": 2}})
    assert (third.capacity, third.shape.accelerator, third.slices) == ("Spot", "v6e-32", 1)
    assert third.parallelism.ici_fsdp == 32 and {p.zone for p in third.pools} == {"us-east5-c"}
    assert all(p.spot for p in third.pools)
    assert third.node_selector == {keys.CAPACITY_TYPE: "Spot", keys.GKE_SPOT: "true"}
    assert (third.shape_key, first.shape_key) == ("v6e", "")
    assert isinstance(model_of(third), fallback.Fallback)
    assert model_of(third) is model_of(first)  # one per option model: decide() compares


def test_every_option_and_shape_is_checked_and_named_where_the_spec_says_it() -> None:
    bad = fallback_job(
        options=[
            {"capacity": {"type": "Reserved"}},  # no reservation named
            {"capacity": {"type": "FlexStart"}, "shape": "v4"},  # no flex-start on v4
        ],
        shapes=[
            {"name": "v4", "accelerator": "v4-32", "slices": 2, "parallelism": {"ici": {"fsdp": 4}}}
        ],
    )
    with pytest.raises(SpecError) as exc:
        plan_job(load_job(bad))
    paths = {e.path for e in exc.value.errors}
    assert paths == {
        "spec.provisioning.fallback.options[0].capacity.reservation",
        "spec.provisioning.fallback.options[1].capacity.type",
        "spec.provisioning.fallback.shapes[0].parallelism.ici",
    }


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"capacity": {"type": "Spot"}}, "spec.capacity"),
        ({"elastic": {"minSlices": 1}}, "spec.elastic"),
    ],
)
def test_what_fallback_does_not_read_is_refused(change: dict[str, Any], path: str) -> None:
    with pytest.raises(SpecError) as exc:
        plan_job(load_job(fallback_job(**change)))
    assert path in {e.path for e in exc.value.errors}


def test_an_option_must_name_a_shape_there_is() -> None:
    with pytest.raises(SpecError) as exc:
        plan_job(load_job(fallback_job(options=[{"shape": "nope"}])))
    assert [e.path for e in exc.value.errors] == ["spec.provisioning.fallback.options[].shape"]


def test_fallback_is_a_registered_mode_with_its_own_rules() -> None:
    plugin = REGISTRY.model("Fallback")
    assert plugin.compose is not None and plugin.wraps is not None
    assert any(r.field == "spec.capacity" for r in plugin.rules)


# ---------------------------------------------------------------- moving on


def stocked_out(code: str) -> Pools:
    return state(PoolState.FAILED, error=code)


@pytest.mark.parametrize(
    ("code", "why"),
    [
        (CODE_STOCKOUT, FallbackLeave.STOCKOUT),
        (CODE_QUOTA, FallbackLeave.QUOTA),
        (CODE_RESERVATION_EXHAUSTED, FallbackLeave.RESERVATION),
    ],
)
def test_a_capacity_error_leaves_the_option_for_the_next_not_a_backoff(code: str, why: str) -> None:
    created = step(None, 0)
    assert created.actions == [CreatePools((0, 1))]
    assert created.status.fallback is not None and created.status.fallback.since == NOW
    assert created.status.fallback.shape == ""  # the job's own
    assert (created.status.message or "").startswith("option 1 (Reserved res-a, v5litepod-16 x")
    d = step(created.status, 30, stocked_out(code))
    fb = d.status.fallback
    assert fb is not None and (fb.option, fb.leaving) == (0, why)
    assert d.status.next_attempt_time is None  # no backoff before the next option
    assert any(isinstance(a, DeletePools) and len(a.pools) == 2 for a in d.actions)
    assert provisioned(d) == Reason.LEAVING_OPTION
    assert Reason.GANG_ROLLED_BACK not in reasons(d)  # not retried here: moved on
    (moved,) = [e for e in d.events if e.reason == Reason.FALLBACK_MOVED]
    assert "option 1 (Reserved res-a, v5litepod-16 x 2)" in moved.message
    assert "next: option 2 (FlexStart, v5litepod-16 x 2)" in moved.message
    (first,) = fb.options
    assert (first.attempts, first.waited_seconds, first.last_left) == (1, 30, why)
    # While its pools go, the next option waits; once they are gone, it is the one tried.
    waiting = step(d.status, 35, state(PoolState.DELETING))
    assert waiting.status.fallback is not None and waiting.status.fallback.option == 0
    assert not [a for a in waiting.actions if isinstance(a, CreatePools)]
    moved_on = step(waiting.status, 40)
    assert moved_on.status.fallback is not None and moved_on.status.fallback.option == 1
    assert moved_on.status.fallback.leaving is None
    assert (moved_on.status.fallback.last_left, moved_on.status.fallback.last_left_option) == (
        why,
        0,
    )
    nxt = step(moved_on.status, 41)
    assert nxt.actions == [CreatePools((0, 1))]
    assert plan_for(nxt.status).capacity == "FlexStart"


def flex_waiting(plan: Plan) -> list[SliceObservation]:
    return [
        SliceObservation(p.slice_index, p.name, PoolState.READY, 0, present_hosts=0)
        for p in plan.pools
    ]  # fmt: skip


# NodePools' own observation of those pools: flex-start pools (run duration not listed).
FLEX_POOLS = nodepools.FlexStartPools({0: None, 1: None})


def on_option(k: int, since: datetime = NOW) -> dict[str, Any]:
    return {
        "phase": "Provisioning",
        "fallback": {"option": k, "since": since.isoformat()},
        "provisioningAttempts": 1,
    }


def test_flex_start_waiting_past_its_try_time_is_left_with_its_jobset() -> None:
    """Flex-start pools wait for capacity with their JobSet (its pending pods scale them up):
    within trySeconds that is no failure; past it the option is left, its JobSet deleted with
    its pools, and the next option makes its own."""
    old = on_option(1)
    d = step(old, 60, flex_waiting, capacity=FLEX_POOLS)
    assert d.actions == [CreateJobSet()]
    assert d.status.phase == Phase.PROVISIONING
    js = JobSetObservation(replicas=2)
    late = step(d.status, 901, flex_waiting, capacity=FLEX_POOLS, jobset=js)
    assert late.status.fallback is not None and late.status.phase == Phase.PROVISIONING
    assert late.status.fallback.leaving == FallbackLeave.TIMEOUT
    assert DeleteJobSet(foreground=True) in late.actions
    assert any(isinstance(a, DeletePools) for a in late.actions)
    moved = next(e for e in late.events if e.reason == Reason.FALLBACK_MOVED)
    assert "not ready within its trySeconds" in moved.message and "next: option 3" in moved.message
    # The JobSet still goes: no move yet.
    going = step(late.status, 905, jobset=JobSetObservation(replicas=2, deleting=True))
    assert going.status.fallback is not None and going.status.fallback.option == 1
    gone = step(going.status, 910)
    assert gone.status.fallback is not None and gone.status.fallback.option == 2
    assert (gone.status.fallback.shape, gone.status.fallback.last_left) == ("v6e", "Timeout")
    spot = step(gone.status, 911)
    assert spot.actions == [CreatePools((0,))]  # v6e-32 x 1, spot, us-east5-c


def test_the_option_that_comes_up_runs_and_its_waiting_is_counted() -> None:
    old = on_option(2, since=NOW)
    up = step(old, 120, state(PoolState.READY, ready=8))
    assert CreateJobSet() in up.actions
    fb = up.status.fallback
    assert fb is not None and fb.ready and fb.option == 2
    assert fb.option_status(2) is not None and fb.option_status(2).waited_seconds == 120
    # Running there, its time is no longer counted and nothing moves.
    js = JobSetObservation(replicas=1, ready_jobs=1)
    later = step(up.status, 10_000, state(PoolState.READY, ready=8), jobset=js,
                 pods=jobs.running({0: 8}))  # fmt: skip
    assert later.status.fallback is not None and later.status.fallback.option == 2
    assert Reason.FALLBACK_MOVED not in reasons(later)
    assert later.status.phase == Phase.RUNNING


def test_after_the_last_option_the_first_again_after_a_backoff() -> None:
    old = on_option(2)
    left = step(old, 30, stocked_out(CODE_STOCKOUT))
    assert "next: option 1 (Reserved res-a, v5litepod-16 x 2) after a backoff" in next(
        e.message for e in left.events if e.reason == Reason.FALLBACK_MOVED
    )
    wrapped = step(left.status, 40)
    fb = wrapped.status.fallback
    assert fb is not None and (fb.option, fb.round) == (0, 2)
    wait = backoff_seconds("uid-1", 1, jobs.CFG)
    assert wrapped.status.next_attempt_time == NOW + timedelta(seconds=40 + round(wait))
    during = step(wrapped.status, 41)
    assert not [a for a in during.actions if isinstance(a, CreatePools)]
    assert during.status.fallback is not None and during.status.fallback.since is None
    after = step(during.status, 41 + wait + 1)
    assert after.actions == [CreatePools((0, 1))]


def test_a_permanent_error_still_fails_the_job() -> None:
    bad = PoolError(0, "p", "INVALID_ARGUMENT", "unknown machine type", True)

    def refused(plan: Plan) -> list[SliceObservation]:
        return [SliceObservation(0, plan.pools[0].name, PoolState.FAILED, error=bad),
                SliceObservation(1, plan.pools[1].name)]  # fmt: skip

    d = step(on_option(0), 10, refused)
    assert d.status.phase == Phase.FAILED
    assert Reason.FALLBACK_MOVED not in reasons(d)


# ---------------------------------------------------------------- shapes and the compiler

PREFLIGHT_OPTIONS: list[dict[str, Any]] = [
    {"capacity": {"type": "Spot"}},  # the job's own shape
    {"capacity": {"type": "FlexStart"}},  # the job's own shape again
    {"capacity": {"type": "Spot"}, "shape": "v6e"},
]
PRE_SPEC = load_job(fallback_job(PREFLIGHT_OPTIONS, preflight={})).spec
GIB = 1024**3


def compiled(shape: str, fits: bool, need: float, have: float) -> PreflightObservation:
    data = {"fits": fits, "hbm_bytes_per_device": int(need * GIB),
            "hbm_capacity_bytes": int(have * GIB)}  # fmt: skip
    return PreflightObservation(
        "job-preflight", generation=jobs.META.generation, finished=True, succeeded=fits,
        exit_code=0 if fits else 78, message=json.dumps(data), shape=shape,
    )  # fmt: skip


def test_a_shape_the_compiler_refuses_is_skipped_with_every_option_of_it_and_never_provisioned():
    first = step(None, 0, spec=PRE_SPEC)
    assert [type(a).__name__ for a in first.actions] == ["CreatePreflightJob"]
    assert first.status.phase == Phase.PENDING
    refused = step(first.status, 60, spec=PRE_SPEC, preflight=compiled("", False, 20.5, 15.75))
    assert refused.status.phase != Phase.FAILED  # another shape is left to try
    fb = refused.status.fallback
    assert fb is not None and fb.option == 2  # options 1 and 2 are the refused shape's
    (shape,) = fb.shapes
    assert (shape.name, shape.fits, shape.hbm_bytes_per_device) == ("", False, int(20.5 * GIB))
    assert shape.what == "v5litepod-16 x 2"
    moved = next(e for e in refused.events if e.reason == Reason.FALLBACK_MOVED)
    assert "its shape did not compile" in moved.message
    assert "next: option 3 (Spot, v6e-32 x 1)" in moved.message
    # The next shape is compiled before anything of it is made.
    again = step(refused.status, 61, spec=PRE_SPEC)
    assert [type(a).__name__ for a in again.actions] == ["CreatePreflightJob"]
    fits = step(again.status, 120, spec=PRE_SPEC, preflight=compiled("v6e", True, 9.5, 31.25))
    assert CreatePools((0,)) in fits.actions
    assert fits.status.fallback is not None
    assert {s.name: s.fits for s in fits.status.fallback.shapes} == {"": False, "v6e": True}
    # Not one pool, in any pass, for the refused shape.
    made = [a for d in (first, refused, again) for a in d.actions if isinstance(a, CreatePools)]
    assert made == []


def test_when_every_shape_is_refused_the_job_fails_before_any_pool():
    old = {"fallback": {"option": 2, "shapes": [{"name": "", "what": "v5litepod-16 x 2",
                                                 "fits": False, "generation": 1}]}}  # fmt: skip
    d = step(old, 10, spec=PRE_SPEC, preflight=compiled("v6e", False, 40.0, 31.25))
    assert d.status.phase == Phase.FAILED
    failed = d.status.condition("Failed")
    assert failed is not None and failed.reason == Reason.PREFLIGHT_FAILED
    assert "every other shape of provisioning.fallback was refused" in failed.message
    assert not [a for a in d.actions if isinstance(a, CreatePools)]


def test_a_shape_that_compiled_before_is_not_compiled_again():
    old = {
        "phase": "Provisioning",
        "fallback": {"option": 2, "leaving": "Stockout", "shapes": [
            {"name": "", "what": "v5litepod-16 x 2", "fits": True, "generation": 1,
             "hbmBytesPerDevice": 5 * GIB}]},
        "preflight": {"state": "Passed", "job": "job-preflight", "generation": 1,
                      "shape": "v6e"},
    }  # fmt: skip
    wrapped = step(old, 10, spec=PRE_SPEC)
    fb = wrapped.status.fallback
    assert fb is not None and fb.option == 0
    pre = wrapped.status.preflight
    assert pre is not None and (pre.shape, pre.state) == ("", "Passed")
    after = step(wrapped.status, 10 + 3600, spec=PRE_SPEC)
    assert after.actions == [CreatePools((0, 1))]


# ---------------------------------------------------------------- with Kueue

QUEUE = {keys.KUEUE_QUEUE_NAME: "team-a"}
QUEUED_META = JobMeta("ns", "job", "uid-1", 1, labels=QUEUE, has_finalizer=True)
QUEUED_SPEC = load_job(fallback_job(metadata={"labels": QUEUE})).spec
WORKLOAD = "multislicejob-job"


def workload(option: int, **kw: Any) -> QueueObservation:
    kw.setdefault("cluster_queue", "cq")
    wl = WorkloadObservation(WORKLOAD, "7", quota_key=str(option), **kw)
    return QueueObservation("team-a", cluster_queue="cq", workload=wl)


def queued(old: Any, at: float, queue: QueueObservation, pools: Pools = absent,
           **obs: Any) -> Decision:  # fmt: skip
    plan = plan_for(old, QUEUED_SPEC)
    seen = Observed(now=NOW + timedelta(seconds=at), slices=pools(plan), queue=queue, **obs)
    return jobs.run(old, seen, plan=(QUEUED_SPEC, plan), meta=QUEUED_META)


def test_a_queued_option_is_left_with_retry_and_its_workload_replaced_by_the_next_ones():
    """Each option's Workload asks for that option's quota (its pods select its capacity type,
    which Kueue matches against its flavors' node labels); a stockout hands the quota back with
    Retry, and once the option is released the next option's Workload replaces it."""
    pending = CheckObservation("gang", CheckState.PENDING)
    reserved = workload(0, quota_reserved=True, check=pending)
    made = queued({"phase": "Queued"}, 0, reserved)
    assert CreatePools((0, 1)) in made.actions
    out = queued(made.status, 30, reserved, stocked_out(CODE_STOCKOUT),
                 jobset=JobSetObservation(suspended=True))  # fmt: skip
    (retry,) = [a for a in out.actions if isinstance(a, SetAdmissionCheckState)]
    assert retry.state == CheckState.RETRY
    assert DeleteJobSet(foreground=True) in out.actions  # the suspended JobSet was option 1's
    assert out.status.fallback is not None
    assert out.status.fallback.leaving == FallbackLeave.STOCKOUT
    # Kueue evicted it: held without quota, the option's pools gone: the next option.
    evicted = workload(0, evicted=True, check=CheckObservation("gang", CheckState.RETRY))
    moved = queued(out.status, 40, evicted)
    assert moved.status.fallback is not None and moved.status.fallback.option == 1
    # The pass that moves plans option 1 still: it makes nothing of it (a JobSet made now would
    # select option 1's nodes for good: the next option's pods would never schedule).
    assert not [a for a in moved.actions if isinstance(a, CreateJobSet | CreateWorkload)]
    # The Workload asks for option 1's quota: deleted; the next pass makes option 2's.
    stale = queued(moved.status, 100, workload(0, check=pending))
    assert DeleteWorkload(WORKLOAD, "7") in stale.actions
    fresh = queued(stale.status, 101, QueueObservation("team-a", cluster_queue="cq"))
    assert CreateWorkload() in fresh.actions
    # The new Workload is waited for from its own create, not the job's start (no
    # NoKueueWorkload for a Workload made a moment ago).
    assert fresh.status.phase == Phase.QUEUED, fresh.status.message
    assert Reason.NO_KUEUE_WORKLOAD not in reasons(fresh)
    assert plan_for(fresh.status, QUEUED_SPEC).node_selector == {keys.CAPACITY_TYPE: "FlexStart"}


def test_an_option_whose_quota_does_not_come_within_its_try_time_is_left():
    waiting = workload(0, pending_reason="Pending", pending_message="insufficient quota")
    first = queued({"phase": "Queued"}, 0, waiting)
    assert first.status.phase == Phase.QUEUED
    assert first.status.fallback is not None and first.status.fallback.since == NOW
    assert not [a for a in first.actions if isinstance(a, CreatePools)]
    late = queued(first.status, 601, waiting)
    fb = late.status.fallback
    assert fb is not None and fb.option == 1 and fb.leaving is None
    left = fb.option_status(0)
    assert left is not None and left.last_left == FallbackLeave.TIMEOUT
    assert left.waited_seconds == 601
    assert "no quota for it in the ClusterQueue's flavors" in (left.message or "")


def test_an_options_pools_are_created_in_its_zone_with_its_capacity_type_label() -> None:
    """What GKE is sent for option 3 (Spot in us-east5-c): the option's zone, not the operator's
    node location, spot VMs, and the label the job's pods select; option 1's go to the
    operator's zone on the reservation."""
    from multislice_operator.provisioning.gke_requests import build_node_pool
    from multislice_operator.render.jobset import render_pod_template

    spot = plan_for({"fallback": {"option": 2}})
    pool = build_node_pool(spot, spot.pools[0], "uid-1", ["us-east5-b"])
    assert list(pool.locations) == ["us-east5-c"] and pool.config.spot
    assert pool.config.labels[keys.CAPACITY_TYPE] == "Spot"
    selector = render_pod_template(spot, SPEC)["spec"]["nodeSelector"]
    assert selector[keys.CAPACITY_TYPE] == "Spot" and selector[keys.GKE_SPOT] == "true"
    reserved = plan_for(None)
    pool = build_node_pool(reserved, reserved.pools[0], "uid-1", ["us-east5-b"])
    assert list(pool.locations) == ["us-east5-b"] and not pool.config.spot
    assert list(pool.config.reservation_affinity.values) == ["res-a"]
