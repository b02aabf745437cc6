"""GitOps: the Argo CD health check (Lua, run with lupa) and the operator never writing a spec."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from lupa import LuaRuntime

from multislice_operator.api.models import Phase

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "docs" / "argocd" / "health.lua").read_text()
CM_KEY = "resource.customizations.health.multislice.dev_MultisliceJob"


def health(obj: dict[str, Any]) -> dict[str, str]:
    """Run the script as Argo CD does: a function body with the resource as global `obj`."""
    lua = LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(SCRIPT)
    return dict(result.items())


def job(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": "llm", "generation": generation},
        "spec": {"accelerator": "v5litepod-16", "slices": 2},
    }
    if status is not None:
        obj["status"] = status
    return obj


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("Running", "Healthy"),
        ("Succeeded", "Healthy"),
        ("Pending", "Progressing"),
        ("Provisioning", "Progressing"),
        ("Starting", "Progressing"),
        ("Restarting", "Progressing"),
        ("Failed", "Degraded"),
        ("Suspended", "Suspended"),
    ],
)
def test_phase_maps_to_health_with_the_message(phase: str, expected: str) -> None:
    got = health(job({"phase": phase, "message": "2/2 slices running", "observedGeneration": 1}))
    assert got == {"status": expected, "message": f"{phase}: 2/2 slices running"}


def test_every_phase_of_the_api_is_mapped() -> None:
    for phase in Phase:
        assert health(job({"phase": phase.value}))["status"] != "Unknown", phase


def test_no_status_yet_is_progressing() -> None:
    assert health(job(None))["status"] == "Progressing"
    assert health(job({"restarts": 0}))["status"] == "Progressing"


def test_a_status_for_an_older_generation_is_progressing() -> None:
    got = health(job({"phase": "Running", "observedGeneration": 1}, generation=2))
    assert got["status"] == "Progressing" and "generation 2" in got["message"]


def test_message_falls_back_to_the_phase_and_unknown_phases_are_unknown() -> None:
    assert health(job({"phase": "Failed"})) == {"status": "Degraded", "message": "Failed"}
    assert health(job({"phase": "Exploded"}))["status"] == "Unknown"


def test_failed_job_explains_why() -> None:
    status = {
        "phase": "Failed",
        "message": "pod llm-slice-1-0 (slice 1) exited with non-retryable code 42",
        "conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs"}],
    }
    got = health(job(status))
    assert got["status"] == "Degraded" and "non-retryable code 42" in got["message"]


def test_gitops_doc_snippet_is_the_same_script() -> None:
    doc = (ROOT / "docs" / "gitops.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL)
    (cm,) = [yaml.safe_load(b) for b in blocks if CM_KEY in b]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "argocd-cm"
    assert cm["data"][CM_KEY] == SCRIPT


# ---------------------------------------------------------------- the operator never writes spec


def _custom_object_calls(path: Path) -> list[tuple[str, str]]:
    """(CustomObjectsApi method, API group argument) for every call the adapter makes."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        fn = node.args[0]
        if isinstance(fn, ast.Attribute) and ast.unparse(fn.value) == "self.custom":
            group = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            calls.append((fn.attr, group))
    return calls


def test_operator_never_writes_a_job_spec() -> None:
    """Argo CD sees no drift: jobs get only status patches (and kopf's metadata patches)."""
    controller = ROOT / "operator" / "multislice_operator" / "controller"
    calls = _custom_object_calls(controller / "kube.py")
    writes = {(m, g) for m, g in calls if not m.startswith(("get_", "list_"))}
    assert writes == {
        ("create_namespaced_custom_object", "JOBSET_GROUP"),
        ("patch_namespaced_custom_object", "JOBSET_GROUP"),  # JobSet spec.suspend
        ("patch_namespaced_custom_object_status", "models.GROUP"),
        ("delete_namespaced_custom_object", "models.GROUP"),  # ttlSecondsAfterFinished
    }
    for source in controller.glob("*.py"):
        text = source.read_text()
        # kopf's patch object would write the body; the handlers never touch it.
        assert not re.search(r"\bpatch\.(spec|metadata)\b|\bpatch\[", text), source.name
        assert "replace_namespaced_custom_object" not in text, source.name
