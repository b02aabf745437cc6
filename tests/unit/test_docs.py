"""The docs say what the code does: the generated API reference is current, and each reference
table covers every name the code defines (env contract, metrics, condition reasons, settings)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from multislice_operator import advisor, catalog, metrics
from multislice_operator.api import docs, models
from multislice_operator.cli import build_parser
from multislice_operator.plan import make_plan
from multislice_operator.render import FATAL_RULE, contract_env
from multislice_operator.settings import Settings, env_of, settings_table

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PKG = ROOT / "operator" / "multislice_operator"


def read(name: str) -> str:
    return (DOCS / name).read_text()


def test_api_reference_is_generated_from_the_models() -> None:
    assert read("api.md") == docs.generate(), "docs/api.md is stale: run `make docs`"


def test_api_reference_covers_every_field() -> None:
    text = read("api.md")
    for model in (models.MultisliceJobSpec, models.MultisliceJobStatus, models.FailurePolicy):
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in text, name


def test_environment_contract_documents_every_variable() -> None:
    spec = models.MultisliceJobSpec.model_validate(
        {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "checkpoint": {"directory": "gs://bkt/p"},
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
        }
    )
    names = [e["name"] for e in contract_env(make_plan(spec, "default", "llm-v5e"), spec)]
    text = read("environment.md")
    documented = re.findall(r"^\| `([A-Z_]+)` \|", text, re.MULTILINE)
    assert documented == names  # every variable, in the order the pod gets them


def test_metrics_reference_matches_the_registry() -> None:
    exposed = set()
    for metric in metrics.REGISTRY.collect():
        exposed.add(f"{metric.name}_total" if metric.type == "counter" else metric.name)
    text = read("metrics.md")
    table = set(re.findall(r"^\| `(multislice_\w+)` \|", text, re.MULTILINE))
    assert table == {name for name in exposed if name.startswith("multislice_")}
    # The Python client's process and platform collectors: named in prose, not tabled.
    for name in exposed - table:
        assert name.startswith(("process_", "python_")) and name in text, name
    # Alerts and prose name only real metrics.
    for name in set(re.findall(r"\bmultislice_[a-z_]+\b", text)) - {"multislice_operator"}:
        assert name in exposed, name


def test_metrics_doc_alerts_are_the_charts_prometheus_rule() -> None:
    """docs/metrics.md shows the alerts the chart's PrometheusRule ships (one home: the chart's
    alerts/multislice-operator.yaml), each naming only series the operator serves."""
    chart = ROOT / "charts" / "multislice-operator" / "alerts" / "multislice-operator.yaml"
    shipped = yaml.safe_load(chart.read_text())
    (block,) = re.findall(r"```yaml\n(groups:.*?)```", read("metrics.md"), re.S)
    assert yaml.safe_load(block) == shipped
    exposed = {m.name for m in metrics.REGISTRY.collect()}
    for rule in shipped["groups"][0]["rules"]:
        for name in re.findall(r"\bmultislice_[a-z_]+\b", rule["expr"]):
            base = re.sub(r"_(total|bucket|sum|count)$", "", name)
            assert base in exposed, (rule["alert"], name)


def _reasons_written_by_decide() -> set[str]:
    tree = ast.Module(
        body=[
            n
            for p in sorted((PKG / "reconcile").glob("*.py"))
            for n in ast.parse(p.read_text()).body
        ],
        type_ignores=[],
    )
    reasons: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = ast.unparse(node.func)
        if fn == "ctx.cond" and len(node.args) >= 3 and isinstance(node.args[2], ast.Constant):
            reasons.add(node.args[2].value)
        if fn == "_rollback" and isinstance(node.args[2], ast.Constant):
            reasons.add(f"Gang{node.args[2].value}")  # ctx.cond(..., f"Gang{reason}", ...)
        if fn == "complete" and isinstance(node.args[2], ast.Constant):
            reasons.add(node.args[2].value)
    for node in ast.walk(tree):  # the DCN reasons live in a dict literal
        if isinstance(node, ast.FunctionDef) and node.name == "_dcn_condition":
            reasons |= {
                c.value
                for c in ast.walk(node)
                if isinstance(c, ast.Constant)
                and isinstance(c.value, str)
                and re.fullmatch(r"[A-Z][A-Za-z]+", c.value)
            } - {"True", "False"}  # condition statuses, not reasons
    return reasons


def test_troubleshooting_covers_every_condition_and_reason() -> None:
    text = read("troubleshooting.md")
    for ctype in models.ConditionType:
        assert f"`{ctype.value}`" in text, ctype
    reasons = _reasons_written_by_decide()
    assert {"GangSliceFailed", "GangTimeout", "BatchTooSmall", "WaitingForNodePools"} <= reasons
    for reason in reasons:
        assert f"`{reason}`" in text, reason
    # The JobSet's own failure reasons the operator copies; and the fallback.
    for reason in ("FailJobSetFailurePolicyAction", "ReachedMaxRestarts", "JobSetFailed"):
        assert f"`{reason}`" in text, reason


def test_every_event_reason_is_documented() -> None:
    sources = [*(PKG / "reconcile").glob("*.py"), *(PKG / "controller").glob("*.py")]
    events = set()
    for source in sources:
        events |= set(re.findall(r'"(?:Normal|Warning)",\s*"(\w+)",', source.read_text()))
    assert {"RestartingAllSlices", "GangRolledBack", "SliceLost", "GangProvisioned"} <= events
    corpus = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    for reason in events:
        assert f"`{reason}`" in corpus, reason


def test_install_settings_table_is_generated_from_settings() -> None:
    assert settings_table() in read("install.md"), "run make docs"


def test_install_documents_every_setting_and_flag() -> None:
    text = read("install.md")
    for f in dataclasses.fields(Settings):
        assert f"`{env_of(f)}`" in text, env_of(f)
    run = build_parser()._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    for action in run._actions:
        long = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        if long and long[0] != "--all-namespaces":
            assert re.search(rf"[`/]{re.escape(long[0])}\b", text), long[0]


def test_chart_sets_only_variables_the_operator_reads() -> None:
    read_by_operator = {env_of(f) for f in dataclasses.fields(Settings)}
    templates = "\n".join(
        p.read_text() for p in (ROOT / "charts" / "multislice-operator" / "templates").iterdir()
    )
    set_by_chart = set(re.findall(r'"(MSJ_[A-Z_]+)"', templates))
    assert set_by_chart and set_by_chart <= read_by_operator


def test_failure_doc_matches_the_rendered_policy() -> None:
    text = read("failures.md")
    assert f"name: {FATAL_RULE}" in text and "restartStrategy: Recreate" in text
    assert str(models.DEFAULT_NON_RETRYABLE_EXIT_CODES) in text
    exitcodes = pytest.importorskip("multislice_workload.exitcodes")
    for code in (
        exitcodes.EXIT_OK,
        exitcodes.EXIT_CONFIG_ERROR,
        exitcodes.EXIT_PREEMPTED,
    ):
        assert f"| `{code}` |" in text, code


@pytest.mark.parametrize(
    ("row", "accelerator"),
    [("v4", "v4-16"), ("v5e", "v5litepod-16"), ("v5p", "v5p-32"), ("v6e", "v6e-16")],
)
def test_dcn_advisor_numbers_are_the_advisors(row: str, accelerator: str) -> None:
    shape = catalog.slice_shape(accelerator, None)
    intensity = advisor.hardware_intensity(shape)
    two = advisor.min_tokens_per_slice(intensity, advisor.bits_per_parameter(2))
    more = advisor.min_tokens_per_slice(intensity, advisor.bits_per_parameter(3))
    margin = advisor.SAFETY_MARGIN
    expected = (
        f"| {intensity:,.0f} | {two:,} / {round(two * margin):,} | "
        f"{more:,} / {round(more * margin):,} |"
    )
    line = next(x for x in read("dcn-advisor.md").splitlines() if x.startswith(f"| {row}"))
    assert line.endswith(expected), line


def test_dcn_advisor_states_the_seed_numbers() -> None:
    text = read("dcn-advisor.md")
    for number in ("22,000", "176,000", "352,000", "350,000", "700,000"):
        assert number in text, number


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", sorted(p.name for p in DOCS.glob("*.md")))
def test_relative_links_resolve(doc: str) -> None:
    source = DOCS / doc
    for target, anchor in re.findall(
        r"\]\((?!https?://)([^)#\s]*)(?:#([^)\s]+))?\)", source.read_text()
    ):
        path = (source.parent / target).resolve() if target else source
        assert path.exists(), f"{doc}: broken link {target}"
        if anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"{doc}: no #{anchor} in {target}"
