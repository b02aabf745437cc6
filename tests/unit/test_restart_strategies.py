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
from multislice_operator.reconcile.restart_recreate import RECREATE
from multislice_operator.reconcile.restart_resize import RESIZE
from multislice_operator.reconcile.restart_strategy import STRATEGIES, RestartStrategy
from multislice_operator.render import jobset
from multislice_operator.render.jobset import render_jobset
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)


def test_every_restart_cause_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(RestartCause)
    assert {c for c, s in STRATEGIES.items() if s is RESIZE} == {RestartCause.RESIZE}
    assert restart_strategy.strategies() == [RECREATE, RESIZE]  # each once, in order


def test_the_jobset_renders_the_registrys_restart_fields() -> None:
    spec, plan = spec_and_plan()
    policy = render_jobset(plan, spec)["spec"]["failurePolicy"]
    assert policy["restartStrategy"] == "Recreate"
    # The binding: what render/jobset.py renders is what the registry's strategies need.
    registry = restart_strategy.jobset_fields()
    assert registry == {"restartStrategy": "Recreate"}
    assert {k: policy[k] for k in registry} == registry == jobset.JOBSET_RESTART_FIELDS


class InPlace:
    """The shape of the next strategy (JobSet >= 0.11): one class and its registry entries."""

    name = "InPlace"

    def jobset_fields(self) -> dict[str, Any]:
        return {"restartStrategy": "InPlaceRestart"}

    def carry_out(self, f: Facts, b: Builder, cap: Capacity) -> tuple[Phase, str] | None:
        return None


def test_a_new_strategy_is_a_registry_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next strategy is one class and its registry entries; its JobSet half is rendered by
    render/jobset.py (render reads no registry of decide()'s), which the binding test below
    holds to the registry."""
    inplace: RestartStrategy = InPlace()
    jobset_causes = {c: inplace for c, s in STRATEGIES.items() if s is RECREATE}
    monkeypatch.setattr(restart_strategy, "STRATEGIES", {**STRATEGIES, **jobset_causes})
    assert restart_strategy.jobset_fields() == {"restartStrategy": "InPlaceRestart"}
    assert restart_strategy.strategy_of(RestartCause.WORKLOAD) is inplace
    assert restart_strategy.strategy_of(RestartCause.RESIZE) is RESIZE
    monkeypatch.setattr(jobset, "JOBSET_RESTART_FIELDS", restart_strategy.jobset_fields())
    spec, plan = spec_and_plan()
    assert render_jobset(plan, spec)["spec"]["failurePolicy"]["restartStrategy"] == (
        "InPlaceRestart"
    )


def test_the_causes_jobset_restarts_agree_on_its_one_restart_strategy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One JobSet, one failurePolicy.restartStrategy: a workload restart in place beside a
    # disruption recreated cannot be rendered, and says so.
    mixed = {**STRATEGIES, RestartCause.WORKLOAD: InPlace()}
    monkeypatch.setattr(restart_strategy, "STRATEGIES", mixed)
    with pytest.raises(ValueError, match="restartStrategy"):
        restart_strategy.jobset_fields()


def _pass(**spec: Any) -> tuple[Facts, Builder]:
    s, plan = spec_and_plan(**spec)
    old = MultisliceJobStatus()
    f = derive(META, s, plan, None, old, Observed(now=NOW), DecideConfig.from_settings())
    return f, Builder(META, old, f.now)


@pytest.mark.parametrize("strategy", restart_strategy.strategies(), ids=lambda s: s.name)
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
