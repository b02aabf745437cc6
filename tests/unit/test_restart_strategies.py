"""Restart strategies as one interface (reconcile/restart_strategy.py): every cause has one in the
registry, the JobSet renders what the registry says, and a strategy the operator does not carry
out itself (JobSet's Recreate) does nothing on a pass."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from multislice_operator.api.models import MultisliceJobStatus, Phase, RestartCause
from multislice_operator.reconcile import DecideConfig, JobMeta, restart_strategy
from multislice_operator.reconcile.capacity import NO_CAPACITY, Capacity
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts, derive
from multislice_operator.reconcile.restart_inplace import INPLACE
from multislice_operator.reconcile.restart_recreate import RECREATE
from multislice_operator.reconcile.restart_resize import RESIZE
from multislice_operator.reconcile.restart_strategy import (
    IN_PLACE_STRATEGIES,
    STRATEGIES,
    RestartStrategy,
)
from multislice_operator.render import jobset
from multislice_operator.render.jobset import render_jobset
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)


def test_every_restart_cause_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(RestartCause) == set(IN_PLACE_STRATEGIES)
    assert {c for c, s in STRATEGIES.items() if s is RESIZE} == {RestartCause.RESIZE}
    assert restart_strategy.strategies() == [RECREATE, RESIZE]  # each once, in order
    assert restart_strategy.strategies(in_place=True) == [RECREATE, INPLACE, RESIZE]


def test_the_cause_chooses_in_place_or_recreate() -> None:
    """Where the cluster restarts pods in place: the program's failures, a hang and an asked
    restart (exit 42, cause workload) keep their pods; causes whose pods are gone or must move
    (disruption: preemption, maintenance, a lost node or pool; startup: the operator evicted
    them; resize: a new JobSet) do not. Where it cannot, every cause JobSet restarts recreates."""
    chosen = {c: restart_strategy.strategy_of(c, in_place=True).name for c in RestartCause}
    assert chosen == {
        RestartCause.DISRUPTION: "Recreate",
        RestartCause.WORKLOAD: "InPlaceRestart",
        RestartCause.HANG: "InPlaceRestart",
        RestartCause.STARTUP: "Recreate",
        RestartCause.RESIZE: "Resize",
    }
    fallback = {c: restart_strategy.strategy_of(c).name for c in RestartCause}
    assert fallback == {**chosen, RestartCause.WORKLOAD: "Recreate", RestartCause.HANG: "Recreate"}


def test_the_jobset_renders_the_registrys_restart_fields() -> None:
    spec, plan = spec_and_plan()
    policy = render_jobset(plan, spec)["spec"]["failurePolicy"]
    assert policy["restartStrategy"] == "Recreate"
    # The binding: what render/jobset.py renders is what the registry's strategies need.
    registry = restart_strategy.jobset_fields()
    assert registry == {"restartStrategy": "Recreate"}
    assert {k: policy[k] for k in registry} == registry == jobset.JOBSET_RESTART_FIELDS


class BlockingRecreate:
    """A strategy whose JobSet half contradicts Recreate (JobSet's BlockingRecreate)."""

    name = "BlockingRecreate"

    def jobset_fields(self) -> dict[str, Any]:
        return {"restartStrategy": "BlockingRecreate"}

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        return None


def test_a_new_strategy_is_a_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next strategy is one class and its registry entries; its JobSet half is rendered by
    render/jobset.py (render reads no registry of decide()'s), which the binding test below
    holds to the registry."""
    other: RestartStrategy = BlockingRecreate()
    jobset_causes = {c: other for c, s in STRATEGIES.items() if s is RECREATE}
    monkeypatch.setattr(restart_strategy, "STRATEGIES", {**STRATEGIES, **jobset_causes})
    assert restart_strategy.jobset_fields() == {"restartStrategy": "BlockingRecreate"}
    assert restart_strategy.strategy_of(RestartCause.WORKLOAD) is other
    assert restart_strategy.strategy_of(RestartCause.RESIZE) is RESIZE
    monkeypatch.setattr(jobset, "JOBSET_RESTART_FIELDS", restart_strategy.jobset_fields())
    spec, plan = spec_and_plan()
    assert render_jobset(plan, spec)["spec"]["failurePolicy"]["restartStrategy"] == (
        "BlockingRecreate"
    )


def test_the_causes_jobset_restarts_agree_on_its_one_restart_strategy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One JobSet, one failurePolicy.restartStrategy: a workload restart by BlockingRecreate
    # beside a disruption recreated cannot be rendered, and says so.
    mixed = {**STRATEGIES, RestartCause.WORKLOAD: BlockingRecreate()}
    monkeypatch.setattr(restart_strategy, "STRATEGIES", mixed)
    with pytest.raises(ValueError, match="restartStrategy"):
        restart_strategy.jobset_fields()


def test_in_place_restart_includes_recreate() -> None:
    # Under InPlaceRestart JobSet recreates a failed Job (jobset_types.go), so the causes that
    # recreate and those that restart in place share one JobSet: it renders InPlaceRestart.
    assert restart_strategy.jobset_fields(in_place=True) == {"restartStrategy": "InPlaceRestart"}
    assert restart_strategy.jobset_fields(in_place=True) == jobset.JOBSET_INPLACE_RESTART_FIELDS
    spec, plan = spec_and_plan()
    rendered = render_jobset(plan, spec, in_place_agent="agent:1")["spec"]["failurePolicy"]
    assert rendered["restartStrategy"] == "InPlaceRestart"


def _pass(**spec: Any) -> tuple[Facts, Builder]:
    s, plan = spec_and_plan(**spec)
    old = MultisliceJobStatus()
    f = derive(META, s, plan, None, old, Observed(now=NOW), DecideConfig.from_settings())
    return f, Builder(META, old, f.now)


@pytest.mark.parametrize(
    "strategy", restart_strategy.strategies(in_place=True), ids=lambda s: s.name
)
def test_no_strategy_acts_on_a_job_that_has_nothing_to_restart(strategy: RestartStrategy) -> None:
    f, b = _pass()
    assert strategy.carry_out(f, b, NO_CAPACITY) is None
    assert b.actions == [] and b.events == []


def test_an_elastic_jobs_resize_waits_for_its_pools_between_the_two_jobsets() -> None:
    f, b = _pass(elastic={"minSlices": 1})
    between = MultisliceJobStatus(active_slices=1)  # the old JobSet ran on 1 slice, now gone
    f = derive(META, f.spec, f.plan, None, between, Observed(now=NOW), f.cfg)
    waiting = Capacity(False, message="provisioning")
    assert RESIZE.carry_out(f, b, waiting) == (
        Phase.RESTARTING,
        "resizing to 2 of 2 slices: provisioning",
    )
    assert RECREATE.carry_out(f, b, waiting) is None
