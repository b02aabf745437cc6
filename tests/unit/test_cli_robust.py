"""The CLI never crashes (issue 45): every input a user can give a verb that reads a file ends in
one line per problem and a documented exit status, never a traceback."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multislice_operator.cli import main as cli
from multislice_operator.cli.main import main
from multislice_operator.cli.yamlload import MAX_DEPTH, MAX_INPUT_BYTES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "v5e-16x2-fsdp.yaml"
BASE = yaml.safe_load(EXAMPLE.read_text())
# Every verb that reads a file, with the flags that change what it does with it.
FILE_VERBS = [
    ["validate", "-f"],
    ["plan", "-f"],
    ["plan", "-o", "json", "-f"],
    ["render", "-f"],
    ["render", "--gke-requests", "-f"],
    ["status", "--now", "2026-01-01T00:00:00Z", "-f"],
    ["status", "-o", "json", "--now", "2026-01-01T00:00:00Z", "-f"],
]
DOCUMENTED = {code for code, _ in cli.EXIT_CODES}


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def edited(change: Any) -> dict[str, Any]:
    obj = copy.deepcopy(BASE)
    change(obj)
    return obj


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def container(obj: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = pod(obj)["containers"][0]
    return c


AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "a", "operator": "In", "values": 5}]}
            ]
        }
    }
}
# The inputs that gave tracebacks in issue 45, each with the line the CLI must say instead.
CRASHERS = {
    "metadata-string": (edited(lambda o: o.update(metadata="hello")), "metadata"),
    "volumes-string": (
        edited(lambda o: pod(o).update(volumes="x")),
        "spec.template.spec.volumes: must be a list of Volume objects",
    ),
    "affinity-values-int": (
        edited(lambda o: pod(o).update(affinity=AFFINITY)),
        "matchExpressions[0].values: must be a list of strings",
    ),
    "spec-string": (edited(lambda o: o.update(spec="hello")), "spec"),
}


def write(tmp_path: Path, obj: Any) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(obj if isinstance(obj, str) else yaml.safe_dump(obj))
    return str(path)


@pytest.mark.parametrize("name", sorted(CRASHERS))
@pytest.mark.parametrize("verb", FILE_VERBS, ids=" ".join)
def test_the_inputs_that_crashed_end_in_one_line(tmp_path, capsys, name, verb):
    obj, message = CRASHERS[name]
    code, _, err = run(capsys, *verb, write(tmp_path, obj))
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in (cli.EXIT_OK, cli.EXIT_INVALID), err
    if verb[0] != "status":  # status shows what a file holds; the others judge it
        assert code == cli.EXIT_INVALID and message in err, err


@pytest.mark.parametrize("verb", FILE_VERBS, ids=" ".join)
def test_deep_nesting_is_refused_naming_the_limit(tmp_path, capsys, verb):
    code, _, err = run(capsys, *verb, write(tmp_path, "[" * 100_000))
    assert code == cli.EXIT_INVALID, err
    assert f"nested deeper than {MAX_DEPTH} levels" in err and len(err.splitlines()) == 1


def test_stdout_on_a_full_disk_is_one_line_and_its_own_code():
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "multislice_operator.cli.main", "validate", "-f", str(EXAMPLE)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == cli.EXIT_WRITE, done.stderr
    assert done.stderr == "error: cannot write the output: No space left on device\n"


@pytest.mark.parametrize(
    ("change", "path", "fix"),
    [
        (lambda o: o["metadata"].pop("name"), "metadata.name", "required"),
        (
            lambda o: container(o).update(args=5),
            "spec.template.spec.containers[0].args",
            "must be a list of strings",
        ),
        (
            lambda o: container(o).update(resources={"limitz": {"cpu": 1}}),
            "spec.template.spec.containers[0].resources.limitz",
            "did you mean limits?",
        ),
        (
            lambda o: pod(o).update(securityContext={"runAsUsr": 1000}),
            "spec.template.spec.securityContext.runAsUsr",
            "did you mean runAsUser?",
        ),
        (  # deeper than any level checked by hand
            lambda o: container(o).update(
                livenessProbe={"httpGet": {"port": 8080, "httpHeaderz": []}}
            ),
            "spec.template.spec.containers[0].livenessProbe.httpGet.httpHeaderz",
            "did you mean httpHeaders?",
        ),
        (
            lambda o: pod(o).update(volumes=[{"name": "v", "emptyDir": {"sizeLimit": "lots"}}]),
            "spec.template.spec.volumes[0].emptyDir.sizeLimit",
            "is not a quantity",
        ),
        (
            lambda o: pod(o).update(activeDeadlineSeconds="5"),
            "spec.template.spec.activeDeadlineSeconds",
            "must be an integer",
        ),
        (
            lambda o: container(o).update(volumeMounts=[{"name": "v"}]),
            "spec.template.spec.containers[0].volumeMounts[0].mountPath",
            "required",
        ),
    ],
    ids=["no-name", "args-int", "limitz", "runAsUsr", "deep-typo", "quantity", "int", "required"],
)
def test_validate_refuses_what_the_apiserver_refuses(tmp_path, capsys, change, path, fix):
    code, _, err = run(capsys, "validate", "-f", write(tmp_path, edited(change)))
    assert code == cli.EXIT_INVALID, err
    line = next((x for x in err.splitlines() if f": {path}: " in x), None)
    assert line is not None and fix in line, err


def test_a_duplicate_key_is_refused_naming_it_and_its_line(tmp_path, capsys):
    text = EXAMPLE.read_text().replace("  slices: 2\n", "  slices: 2\n  slices: 4\n")
    code, _, err = run(capsys, "validate", "-f", write(tmp_path, text))
    line = text.splitlines().index("  slices: 4") + 1
    first = line - 1
    assert code == cli.EXIT_INVALID
    assert f"duplicate key 'slices' (line {line}; first at line {first})" in err


def test_a_merge_key_is_not_a_duplicate(tmp_path, capsys):
    text = "x-base: &base\n  name: a\n  image: b\n" + EXAMPLE.read_text().replace(
        "        - name: train\n", "        - <<: *base\n          name: train\n"
    )
    assert "<<: *base" in text
    code, _, err = run(capsys, "validate", "-f", write(tmp_path, text))
    assert code == cli.EXIT_OK, err


def test_a_file_over_the_limit_is_refused_before_parsing(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# " + b"x" * MAX_INPUT_BYTES + b"\n")
    code, _, err = run(capsys, "validate", "-f", str(big))
    assert code == cli.EXIT_INVALID
    assert "larger than 3 MiB" in err and "split the file" in err


def test_aliases_that_expand_beyond_the_bound_are_refused(tmp_path, capsys):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 8)]
    code, _, err = run(capsys, "validate", "-f", write(tmp_path, "\n".join(lines) + "\n"))
    assert code == cli.EXIT_INVALID and "aliases are expanded" in err, err


@pytest.mark.parametrize(
    ("content", "code"),
    [("kind: Pod\n", cli.EXIT_INVALID), ("a: [1, 2", cli.EXIT_INVALID), (None, cli.EXIT_USAGE)],
)
def test_a_wrong_kind_and_a_wrong_api_version_are_one_code(tmp_path, capsys, content, code):
    wrong_version = edited(lambda o: o.update(apiVersion="multislice.dev/v9"))
    assert run(capsys, "validate", "-f", write(tmp_path, wrong_version))[0] == cli.EXIT_INVALID
    path = tmp_path / "other.yaml"
    if content is not None:
        path.write_text(content)
    assert run(capsys, "validate", "-f", str(path))[0] == code


def test_a_wrong_now_is_a_usage_error(capsys):
    code, _, err = run(capsys, "status", "-f", str(EXAMPLE), "--now", "yesterday")
    assert code == cli.EXIT_USAGE and "--now yesterday: not an ISO 8601 time" in err, err


def test_logs_reports_kubectls_failure_as_its_own_code(tmp_path, capsys):
    from multislice_operator.cli import verbs as cli_verbs

    kubectl = cli_verbs.Kubectl(
        type("A", (), {"kubectl": "false", "context": None, "kubeconfig": None})()
    )
    with pytest.raises(cli_verbs.KubectlError, match="exited 1"):
        kubectl.stream(["false", "logs"])
    assert kubectl.stream(["true", "logs"]) == cli.EXIT_OK


def test_an_unexpected_error_is_one_line_and_its_own_code(monkeypatch, capsys):
    def boom(_: Any) -> int:
        raise KeyError("x")

    monkeypatch.setattr(cli, "cmd_crd", boom)
    code, _, err = run(capsys, "crd")
    assert code == cli.EXIT_INTERNAL
    assert err.startswith("error: internal error in crd: KeyError") and len(err.splitlines()) == 1


def test_every_exit_status_is_documented():
    text = (ROOT / "docs" / "cli.md").read_text()
    assert cli.EXIT_TABLE_BEGIN + cli.exit_codes_table() + cli.EXIT_TABLE_END in text, (
        "run make docs"
    )


# ---------------------------------------------------------------- the property

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["MultisliceJob", "v5litepod-16", "Managed", "Spot", "[", "{", "hello"]),
)
_keys = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.sampled_from(
        [
            "apiVersion", "kind", "metadata", "name", "namespace", "spec", "status", "template",
            "containers", "image", "args", "resources", "limits", "volumes", "affinity",
            "accelerator", "slices", "capacity", "type", "phase", "goodput", "restartsByCause",
            "values", "matchExpressions", "nodeSelector", "parallelism", "ici", "dcn",
        ]
    ),
)  # fmt: skip
_trees = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=5)),
    max_leaves=25,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def _mutated_jobs(draw: Any) -> Any:
    """The example job with one subtree replaced by an arbitrary tree: a near-valid input reaches
    deeper code (planning, rendering, the status view) than a random tree does."""
    obj = copy.deepcopy(BASE)
    obj["status"] = {"phase": "Running", "restarts": 1, "slices": [{"index": 0, "hosts": 4}]}
    path = draw(st.sampled_from(_paths(obj)[1:]))
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = draw(_trees)
    return obj


def _dump(obj: Any) -> str:
    return yaml.safe_dump(obj, sort_keys=False, allow_unicode=True)


_inputs = st.one_of(
    _mutated_jobs().map(_dump),
    _trees.map(_dump),
    st.binary(max_size=200),
    st.text(alphabet="[]{}:-,&*!|>'\"#%@`? \n\tab01", max_size=60),
)


@settings(  # CLI_EXAMPLES=5000 for a longer search
    max_examples=int(os.environ.get("CLI_EXAMPLES", "500")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=_inputs, verb=st.sampled_from(FILE_VERBS))
def test_no_input_makes_any_verb_crash(tmp_path, capsys, data, verb):
    path = tmp_path / "input.yaml"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    code, _, err = run(capsys, *verb, str(path))
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in DOCUMENTED - {cli.EXIT_INTERNAL}, (code, err)
