"""The docs say what the code does: the generated API reference is current, each reference
table covers every name the code defines (env contract, metrics, condition reasons, settings),
and every name the docs use exists in the code, every YAML block validates (issue 21)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from multislice_operator.api import docs, models
from multislice_operator.cli.main import build_parser
from multislice_operator.cli.main import main as cli_main
from multislice_operator.common import keys
from multislice_operator.controller import metrics
from multislice_operator.planning import advisor
from multislice_operator.planning.plan import load_job, make_plan, plan_job
from multislice_operator.reconcile.reasons import REGISTRY
from multislice_operator.reconcile.reasons import table as reasons_table
from multislice_operator.render.jobset import FATAL_RULE, contract_env, render_jobset
from multislice_operator.settings import Settings, env_of, settings_table
from multislice_operator.tpu import catalog
from tests.unit import doccheck

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


def test_troubleshooting_covers_every_condition_and_reason() -> None:
    text = read("troubleshooting.md")
    for ctype in models.ConditionType:
        assert f"`{ctype.value}`" in text, ctype
    for reason, info in REGISTRY.items():
        if info.condition or info.terminal:
            assert f"`{reason.value}`" in text, reason
    # The JobSet's own failure reasons the operator copies.
    for reason in ("FailJobSetFailurePolicyAction", "ReachedMaxRestarts"):
        assert f"`{reason}`" in text, reason


def test_the_reasons_table_is_generated_from_the_registry() -> None:
    assert reasons_table() in read("failures.md"), "run make docs"


def test_every_reason_decide_gives_is_in_the_registry() -> None:
    """Conditions and events take a Reason (mypy checks it); the only other reasons are the
    ones copied from JobSet: nothing in reconcile/ writes a reason literal."""
    for source in (PKG / "reconcile").glob("*.py"):
        text = source.read_text()
        assert not re.search(r'\.cond\([^)]*"(True|False)",\s*"', text), source.name
        assert not re.search(r'\.event\(\s*"', text), source.name


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


# ---------------------------------------------------------------- drift: docs name what exists
# (issue 21). tests/unit/doccheck.py holds the checks; each runs on every page, and on a wrong
# snippet to show that it can fail.

DOC_NAMES = [p.relative_to(ROOT).as_posix() for p in doccheck.doc_files()]
EXAMPLES = sorted((ROOT / "examples").rglob("*.yaml"))


@pytest.mark.parametrize("doc", DOC_NAMES)
@pytest.mark.parametrize(
    "check",
    [
        doccheck.check_commands,
        doccheck.check_environment,
        doccheck.check_defaults,
        doccheck.check_states,
        doccheck.check_metric_labels,
    ],
    ids=[
        "commands-and-flags",
        "environment",
        "defaults",
        "phases-conditions-reasons",
        "metric-label-values",
    ],
)
def test_every_name_in_the_docs_exists_in_the_code(doc: str, check: Any) -> None:
    findings = check((ROOT / doc).read_text(), doc)
    assert not findings, "\n".join(map(str, findings))


@pytest.mark.parametrize(
    ("snippet", "check", "needle"),
    [
        ("`multislice-operator run --gke-node-pool-size 3`", doccheck.check_commands,
         "has no flag --gke-node-pool-size"),
        ("```sh\n.venv/bin/multislice-operator explain -f job.yaml\n```", doccheck.check_commands,
         "`multislice-operator explain`: no such command"),
        ("set `--gke-pool-prefix` to share a cluster", doccheck.check_commands,
         "no command of ours has the flag --gke-pool-prefix"),
        ("`make demo SCENARIO=flood`; `make smoke`", doccheck.check_commands,
         "`make smoke`: no such target"),
        ("`python -m benchmarks.chaos --trails 3`", doccheck.check_commands,
         "has no flag --trails"),
        ("`MSJ_RESYNC_INTERVAL=5`", doccheck.check_environment, "no variable MSJ_RESYNC_INTERVAL"),
        ("`--resync-seconds` (default 30)", doccheck.check_defaults,
         "--resync-seconds defaults to 10.0, not 30"),
        ("`spec.provisioning.timeoutSeconds` (default 600)", doccheck.check_defaults,
         "defaults to [1800], not 600"),
        ("`maxRestarts` (default 3)", doccheck.check_defaults, "defaults to [10], not 3"),
        ("the job shows phase `New` first", doccheck.check_states, "phase `New` is not a phase"),
        ("`Provisioned=False` `GangStuck`", doccheck.check_states,
         "`GangStuck` is named nowhere"),
        ("condition `Wedged` reason `Admitted`", doccheck.check_states,
         "condition `Wedged` does not exist"),
        ("event `ReleasingNodePools`", doccheck.check_states, "`ReleasingNodePools`"),
        ('`multislice_reconcile_total{result="requeue"}`', doccheck.check_metric_labels,
         'multislice_reconcile_total{result="requeue"} is never emitted'),
        ("| `multislice_gke_node_pool_actions_total` | counter | `action`: `create`, `resize` |",
         doccheck.check_metric_labels, '{action="resize"} is never emitted'),
        ('`multislice_jobs{phase="Waiting"}`', doccheck.check_metric_labels,
         '{phase="Waiting"} is never emitted'),
    ],
)  # fmt: skip
def test_each_check_fails_on_a_wrong_doc(snippet: str, check: Any, needle: str) -> None:
    findings = check(snippet, "wrong.md")
    assert any(needle in str(f) for f in findings), findings


def _base_job() -> dict[str, Any]:
    obj: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "v5e-16x2-fsdp.yaml").read_text())
    return obj


def _validated(obj: dict[str, Any], tmp_path: Path, capsys: Any) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(obj))
    code = cli_main(["validate", "-f", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _subtree(part: Any, whole: Any, at: str = "") -> list[str]:
    """Where `part` says something `whole` does not (lists: element by element)."""
    if isinstance(part, dict):
        if not isinstance(whole, dict):
            return [f"{at}: not a mapping"]
        return [d for k, v in part.items() for d in _subtree(v, whole.get(k), f"{at}.{k}")]
    if isinstance(part, list):
        if not isinstance(whole, list) or len(part) > len(whole):
            return [f"{at}: not a list of at least {len(part)}"]
        return [d for i, v in enumerate(part) for d in _subtree(v, whole[i], f"{at}[{i}]")]
    return [] if part == whole else [f"{at}: {part!r} != {whole!r}"]


def check_yaml(obj: Any, tmp_path: Path, capsys: Any) -> None:
    """One YAML document of the docs or examples, checked by what it is."""
    spec_fields = {f.alias or n for n, f in models.MultisliceJobSpec.model_fields.items()}
    assert isinstance(obj, dict), obj
    kind = obj.get("kind")
    if kind == models.KIND:
        assert "valid (" in _validated(obj, tmp_path, capsys)
    elif kind is not None:
        assert obj.get("apiVersion"), obj
        if str(obj["apiVersion"]).startswith("kueue.x-k8s.io/"):
            assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2", obj  # what the operator needs
        if kind == "AdmissionCheck":
            assert obj["spec"]["controllerName"] == keys.GANG_CHECK_CONTROLLER
    elif set(obj) <= spec_fields:  # a fragment of a spec: it must validate inside a job
        job = _base_job()
        job["spec"].update(obj)
        _validated(job, tmp_path, capsys)
    elif set(obj) == {"spec"} and "replicatedJobs" in obj["spec"]:  # an excerpt of a JobSet
        job = load_job(_base_job())
        rendered = render_jobset(plan_job(job), job.spec)
        assert not _subtree(obj, rendered), _subtree(obj, rendered)
    elif set(obj) == {"spec"}:
        job = _base_job()
        assert set(obj["spec"]) <= spec_fields, obj
        job["spec"].update(obj["spec"])
        _validated(job, tmp_path, capsys)
    elif set(obj) == {"status"}:
        models.MultisliceJobStatus.model_validate(obj["status"])  # every field a real one
    elif set(obj) == {"multiKueue"}:  # Kueue's Configuration (its keys are case-sensitive)
        names = [f["name"] for f in obj["multiKueue"]["externalFrameworks"]]
        assert names == [f"{models.KIND}.{models.VERSION}.{models.GROUP}"], names
    elif set(obj) == {"groups"}:  # Prometheus rules: every metric is the operator's
        exposed = {
            f"{m.name}_total" if m.type == "counter" else m.name for m in metrics.REGISTRY.collect()
        }
        for group in obj["groups"]:
            for rule in group["rules"]:
                for name in re.findall(r"\bmultislice_[a-z_]+\b", rule["expr"]):
                    assert name in exposed, name
    else:
        raise AssertionError(f"a YAML block of an unknown shape: {sorted(obj)}")


@pytest.mark.parametrize("doc", DOC_NAMES)
def test_every_yaml_block_of_the_docs_is_valid(doc: str, tmp_path: Path, capsys: Any) -> None:
    for line, body in doccheck.yaml_blocks((ROOT / doc).read_text()):
        for obj in yaml.safe_load_all(body):
            if obj is not None:
                try:
                    check_yaml(obj, tmp_path, capsys)
                except AssertionError as exc:
                    raise AssertionError(f"{doc}:{line}: {exc}") from None


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_example_is_valid(example: Path, tmp_path: Path, capsys: Any) -> None:
    for obj in yaml.safe_load_all(example.read_text()):
        if obj is not None:
            check_yaml(obj, tmp_path, capsys)


def test_a_wrong_yaml_block_fails(tmp_path: Path, capsys: Any) -> None:
    wrong = _base_job()
    wrong["spec"]["parallelism"] = {"dcn": {"tensor": 2}}
    with pytest.raises(AssertionError):
        check_yaml(wrong, tmp_path, capsys)
    with pytest.raises(AssertionError):
        check_yaml({"failurePolicy": {"maxRestart": 3}}, tmp_path, capsys)
    with pytest.raises(AssertionError):
        check_yaml({"spec": {"replicatedJobs": [{"replicas": 3}]}}, tmp_path, capsys)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
        check_yaml({"status": {"phse": "Running"}}, tmp_path, capsys)


def test_the_retry_and_backoff_numbers_are_the_codes() -> None:
    # Issue 21: metrics.md said a failed pass is retried after 5 s.
    from multislice_operator.controller.reconciler import ERROR_BACKOFF_BASE, ERROR_BACKOFF_MAX

    errors = f"{ERROR_BACKOFF_BASE:.0f} s, doubling, at most {ERROR_BACKOFF_MAX:.0f} s"
    for doc in ("metrics.md", "troubleshooting.md"):
        assert errors in read(doc), doc
    s = Settings()
    base, top = s.backoff_base_seconds, s.backoff_max_seconds
    gang = f"{base:.0f} s, {2 * base:.0f} s, {4 * base:.0f} s, … capped at {top:.0f} s"
    assert gang in " ".join(read("provisioning.md").split())


def test_gitops_lists_exactly_the_immutable_fields() -> None:
    from multislice_operator.api.crd import IMMUTABLE

    text = read("gitops.md")
    listed = re.search(r"Changing an immutable field \(([^)]*)\)", text)
    assert listed is not None
    named = set(re.findall(r"`([A-Za-z.]+)`", listed.group(1)))
    assert named == {*IMMUTABLE, "topology", "provisioning.mode"}


def test_the_kind_path_names_the_jobset_version_kind_py_installs() -> None:
    """Issue 56: docs/demo.md said the kind path installs JobSet v0.10.1; kind.py installs the
    release its manifests URL names."""
    from multislice_local import kind

    (installed,) = re.findall(r"/download/(v[0-9.]+)/", kind.JOBSET_MANIFESTS)
    section = read("demo.md").split("## kind, where Docker exists", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"JobSet (v[0-9.]+)", section) == [installed]
