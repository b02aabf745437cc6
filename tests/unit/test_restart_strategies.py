"""Restart strategies as plugins (reconcile/restart_strategy.py, registry.py): every cause has a
strategy, the job's are chosen in one place (`choose`), the JobSet renders what the chosen
strategies say, the CRD's enum of status.lastRestart.strategy is the registry's, and a strategy
the operator does not carry out itself (JobSet's Recreate) does nothing on a pass."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from multislice_operator.api import crd
from multislice_operator.api.models import MultisliceJobStatus, Phase, RestartCause
from multislice_operator.plugins.inplace import INPLACE
from multislice_operator.plugins.recreate import RECREATE
from multislice_operator.plugins.resize import RESIZE
from multislice_operator.reconcile import DecideConfig, JobMeta, StrategySupport, restart_strategy
from multislice_operator.reconcile.capacity import NO_CAPACITY, Capacity
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts, derive
from multislice_operator.reconcile.restart_strategy import (
    JobSetStrategy,
    RestartStrategy,
    choose,
)
from multislice_operator.reconcile.types import JobSetObservation
from multislice_operator.registry import Registry
from multislice_operator.render.jobset import render_jobset
from tests.unit.jobs import Observed, spec_and_plan

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)
IN_PLACE = Observed(now=NOW, support={"InPlaceRestart": StrategySupport(True, "ok")})
NO_IN_PLACE = Observed(now=NOW)


def names(chosen: restart_strategy.Chosen) -> dict[RestartCause, str]:
    return {c: s.name for c, s in chosen.items()}


def test_the_registry_holds_the_three_in_tree_strategies() -> None:
    assert restart_strategy.registered() == [INPLACE, RECREATE, RESIZE]
    every = {c for s in restart_strategy.registered() for c in s.causes}
    assert every == set(RestartCause)  # every cause has a strategy


def test_the_cause_chooses_in_place_or_recreate() -> None:
    """Where the cluster restarts pods in place: the program's failures, a hang and an asked
    restart (exit 42, cause workload) keep their pods; causes whose pods are gone or must move
    (disruption: preemption, maintenance, a lost node or pool; startup: the operator evicted
    them; resize: a new JobSet) do not. Where it cannot, every cause JobSet restarts recreates."""
    elastic, _ = spec_and_plan(elastic={"minSlices": 1})
    chosen = names(choose(elastic, None, IN_PLACE))
    assert chosen == {
        RestartCause.DISRUPTION: "Recreate",
        RestartCause.WORKLOAD: "InPlaceRestart",
        RestartCause.HANG: "InPlaceRestart",
        RestartCause.STARTUP: "Recreate",
        RestartCause.RESIZE: "Resize",
    }
    fallback = names(choose(elastic, None, NO_IN_PLACE))
    assert fallback == {**chosen, RestartCause.WORKLOAD: "Recreate", RestartCause.HANG: "Recreate"}
    plain, _ = spec_and_plan()
    assert RestartCause.RESIZE not in choose(plain, None, IN_PLACE)  # no spec.elastic


def test_a_jobset_restarts_as_it_was_rendered_whatever_the_cluster_says_now() -> None:
    """Once the JobSet exists, its own restartStrategy says what carries out each cause: one
    rendered to recreate on a cluster that gained in-place restart since still recreates."""
    spec, _ = spec_and_plan()
    recreating = JobSetObservation(restart_strategy="Recreate")
    assert set(names(choose(spec, recreating, IN_PLACE)).values()) == {"Recreate"}
    in_place = JobSetObservation(restart_strategy="InPlaceRestart")
    chosen = names(choose(spec, in_place, NO_IN_PLACE))
    assert chosen[RestartCause.WORKLOAD] == "InPlaceRestart"
    assert chosen[RestartCause.DISRUPTION] == "Recreate"  # InPlaceRestart recreates a failed Job


def test_the_jobset_renders_the_chosen_strategies_restart_field() -> None:
    spec, plan = spec_and_plan()
    value = restart_strategy.jobset_value(choose(spec, None, NO_IN_PLACE))
    assert value == "Recreate"
    assert render_jobset(plan, spec)["spec"]["failurePolicy"]["restartStrategy"] == value
    # InPlaceRestart includes Recreate (JobSet recreates a failed Job under it): one JobSet.
    assert restart_strategy.jobset_value(choose(spec, None, IN_PLACE)) == "InPlaceRestart"


def test_the_crd_lists_the_registered_strategies() -> None:
    status = crd.status_schema()["properties"]["lastRestart"]["properties"]["strategy"]
    assert status["enum"] == ["InPlaceRestart", "Recreate", "Resize"]
    assert "Recreate (every pod deleted and created again)" in status["description"]


class Blocking(JobSetStrategy):
    """A strategy whose JobSet half contradicts Recreate (JobSet's BlockingRecreate)."""

    name = "BlockingRecreate"
    description = "every Job deleted, then all created again"
    jobset_value = "BlockingRecreate"
    causes = frozenset({RestartCause.WORKLOAD})
    precedence = 30


def test_strategies_that_disagree_on_the_one_restart_strategy_cannot_render(
    registry: Registry,
) -> None:
    # One JobSet, one failurePolicy.restartStrategy: a workload restart by BlockingRecreate
    # beside a disruption recreated cannot be rendered, and says so.
    registry.add_strategy(Blocking())
    spec, _ = spec_and_plan()
    chosen = choose(spec, None, NO_IN_PLACE)
    assert names(chosen)[RestartCause.WORKLOAD] == "BlockingRecreate"
    with pytest.raises(ValueError, match="restartStrategy"):
        restart_strategy.jobset_value(chosen)


def test_a_strategy_registered_twice_under_one_name_is_refused(registry: Registry) -> None:
    class Other(JobSetStrategy):
        name = "Recreate"

    with pytest.raises(RuntimeError, match="registered twice"):
        registry.add_strategy(Other())


def _pass(**spec: Any) -> tuple[Facts, Builder]:
    s, plan = spec_and_plan(**spec)
    old = MultisliceJobStatus()
    f = derive(META, s, plan, None, old, Observed(now=NOW), DecideConfig.from_settings())
    return f, Builder(META, old, f.now)


@pytest.mark.parametrize("strategy", [INPLACE, RECREATE, RESIZE], ids=lambda s: s.name)
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


def test_the_plan_says_how_each_cause_restarts() -> None:
    text = restart_strategy.summary()
    assert text.startswith("disruption, startup Recreate; workload, hang InPlaceRestart where")
    assert text.endswith("else Recreate; resize Resize")
