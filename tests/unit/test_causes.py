"""One source for every list of restart causes (issue 39): RestartCause and BUDGET_OF_CAUSE.

The model's descriptions (and so the CRD and docs/api.md), the restart metric's help and labels,
the alert rules and the docs' lists are built from the enum; each test here fails when one of
them is written by hand again and a cause is added, as `resize` was missing from several."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from multislice_operator.api import docs, models
from multislice_operator.api.models import BUDGET_OF_CAUSE, Budget, RestartCause
from multislice_operator.controller import metrics
from multislice_operator.reconcile.reasons import SLICE_FAILURE_REASONS

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts" / "multislice-operator" / "alerts" / "multislice-operator.yaml"
RESTARTS = "multislice_restarts_total"


def named(text: str) -> set[str]:
    """The causes a text names, as words."""
    return {c.value for c in RestartCause if re.search(rf"\b{c.value}\b", text)}


def description(model: type[BaseModel], field: str) -> str:
    return model.model_fields[field].description or ""


def test_every_cause_has_a_budget_and_a_counter() -> None:
    assert set(BUDGET_OF_CAUSE) == set(RestartCause)
    assert set(models.RestartsByCause.model_fields) == {c.value for c in RestartCause}


def test_the_model_descriptions_name_every_cause() -> None:
    everything = {c.value for c in RestartCause}
    assert named(description(models.RestartStatus, "cause")) == everything
    assert named(description(models.MultisliceJobStatus, "restarts_by_cause")) == everything
    # Each budget's field names the causes charged to it.
    program = description(models.FailurePolicy, "max_restarts")
    assert {c.value for c in models.PROGRAM_CAUSES} <= named(program)
    disruption = description(models.FailurePolicy, "max_disruption_restarts")
    assert {c.value for c in models.DISRUPTION_CAUSES} <= named(disruption)
    # ... and every counter of status.restartsByCause the budget its cause is charged to.
    for cause in RestartCause:
        text = description(models.RestartsByCause, cause.value)
        budget = BUDGET_OF_CAUSE[cause]
        assert (budget.value if budget != Budget.NONE else "no budget") in text, cause


def test_the_restart_metric_names_every_cause_and_its_budget() -> None:
    (family,) = [f for f in metrics.REGISTRY.collect() if f.name == RESTARTS.removesuffix("_total")]
    assert named(family.documentation) == {c.value for c in RestartCause}
    for budget in Budget:
        assert budget.value in family.documentation, budget
    # The budget label follows from the cause: a pass names the cause only.
    from multislice_operator.controller import reconciler  # noqa: F401  (the presets)

    token = metrics.enter_namespace("causes-ns")
    try:
        metrics.RESTARTS_TOTAL.labels(RestartCause.RESIZE.value).inc()
    finally:
        metrics.JOB_NAMESPACE.reset(token)
    seen = {
        (s.labels["cause"], s.labels.get("budget")): s.value
        for f in metrics.REGISTRY.collect()
        if f.name == family.name
        for s in f.samples
        if s.labels["namespace"] == "causes-ns" and s.name == RESTARTS
    }
    assert set(seen) == {(c.value, BUDGET_OF_CAUSE[c].value) for c in RestartCause}
    assert seen[RestartCause.RESIZE.value, Budget.NONE.value] == 1


def test_the_slice_failure_metric_names_every_reason_and_cause_of_the_registry() -> None:
    (family,) = [f for f in metrics.REGISTRY.collect() if f.name == "multislice_slice_failures"]
    row = next(
        line
        for line in (ROOT / "docs" / "metrics.md").read_text().splitlines()
        if line.startswith("| `multislice_slice_failures_total` |")
    )
    for info in SLICE_FAILURE_REASONS.values():
        assert info.metric and f"`{info.metric}`" in row, info.metric
        for cause in info.causes:
            assert re.search(rf"\b{cause}\b", family.documentation), cause
            assert f"`{cause}`" in row, cause


def restart_rules() -> list[dict[str, str]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if RESTARTS in r["expr"]]


def test_restart_alerts_select_by_budget_never_by_cause() -> None:
    """A cause added to a budget is alerted on with no edit of the rules."""
    budgets = set()
    for rule in restart_rules():
        for selector in re.findall(rf"{RESTARTS}\{{([^}}]*)\}}", rule["expr"]):
            assert "cause" not in selector, rule["alert"]
            budgets |= set(re.findall(r'budget="(\w+)"', selector))
        assert RESTARTS + "{" in rule["expr"], rule["alert"]  # every use selects
    assert budgets == {Budget.MAX_RESTARTS.value, Budget.MAX_DISRUPTION_RESTARTS.value}


DOCS_WITH_CAUSES = {
    "README.md": {"all"},
    "docs/failures.md": {"table", Budget.MAX_RESTARTS.value, Budget.MAX_DISRUPTION_RESTARTS.value},
    "docs/metrics.md": {"all", "budgets"},
    "docs/troubleshooting.md": {Budget.MAX_RESTARTS.value, Budget.MAX_DISRUPTION_RESTARTS.value},
}


DOCS = sorted(
    ["README.md", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))]
)


@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_cause_lists_are_generated_from_the_enum(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert docs.with_cause_lists(text) == text, f"{doc}: a cause list is stale: run `make docs`"
    spans = dict(docs.cause_spans(text))
    assert DOCS_WITH_CAUSES.get(doc, set()) <= set(spans), doc
    # A list within a paragraph: a line opening with a comment would end the paragraph there.
    for line in text.splitlines():
        assert not line.startswith("<!-- causes: ") or line == "<!-- causes: table -->", line
    for key, body in spans.items():
        if key in ("all", "table"):
            assert named(body) == {c.value for c in RestartCause}, (doc, key)


def test_a_stale_or_unknown_cause_list_is_rewritten_or_refused() -> None:
    stale = "split into <!-- causes: all -->`disruption` and `workload`<!-- /causes -->."
    fresh = docs.with_cause_lists(stale)
    assert fresh != stale and named(fresh) == {c.value for c in RestartCause}
    with pytest.raises(KeyError):
        docs.with_cause_lists("<!-- causes: maxRestart -->`workload`<!-- /causes -->")
