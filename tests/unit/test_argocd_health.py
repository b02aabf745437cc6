"""GitOps: the Argo CD health check (Lua, run with lupa) and the operator never writing a spec."""

from __future__ import annotations

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
        ("Queued", "Progressing"),
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


SHRUNK = {
    "type": "Degraded",
    "status": "True",
    "reason": "FewerSlices",
    "message": "running on 3 of 4 slices (spec.elastic); slice 1: GCE_STOCKOUT",
}


def test_an_elastic_job_on_fewer_slices_is_degraded() -> None:
    """Argo CD's Degraded: the resource runs, but not as its spec asks (as a Deployment short of
    its replicas); the message says by how much and why (issue 44)."""
    status = {"phase": "Running", "message": "3/4 slices running", "conditions": [SHRUNK]}
    got = health(job(status))
    assert got == {
        "status": "Degraded",
        "message": "Running: FewerSlices: running on 3 of 4 slices (spec.elastic); "
        "slice 1: GCE_STOCKOUT",
    }


def test_degraded_false_or_a_finished_job_keeps_its_health() -> None:
    """All slices back (Degraded=False) is Healthy; a job that ends shrunk is Succeeded, and a
    shrinking job that restarts is Progressing: the condition changes only a running job's."""
    back = {**SHRUNK, "status": "False", "reason": "AllSlices", "message": "running on all 4"}
    assert health(job({"phase": "Running", "conditions": [back]}))["status"] == "Healthy"
    for phase, expected in (("Succeeded", "Healthy"), ("Restarting", "Progressing")):
        assert health(job({"phase": phase, "conditions": [SHRUNK]}))["status"] == expected


def test_gitops_doc_snippet_is_the_same_script() -> None:
    doc = (ROOT / "docs" / "gitops.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL)
    (cm,) = [yaml.safe_load(b) for b in blocks if CM_KEY in b]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == "argocd-cm"
    assert cm["data"][CM_KEY] == SCRIPT


# ---------------------------------------------------------------- the operator never writes spec


class _Recorder:
    """Stands in for kopf's API client: records every request the adapter would send."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def request(self, method: str, url: str, *, payload: Any = None, **_: Any) -> Any:
        self.calls.append((method.upper(), url, payload))
        body = {"metadata": {"name": "j", "namespace": "ns", "resourceVersion": "2"}}

        class Response:
            async def __aenter__(self) -> Response:
                return self

            async def __aexit__(self, *exc: object) -> None:
                return None

            async def json(self, **_: Any) -> Any:  # loads= (orjson)
                return {"items": [], **body}

        return Response()


def test_operator_never_writes_a_job_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    """Argo CD sees no drift: a MultisliceJob gets status patches, its own finalizer and (ttl)
    a delete; never a spec or label write. Every adapter method is driven and recorded."""
    import asyncio

    from multislice_operator.controller import kube as kube_mod

    recorder = _Recorder()
    monkeypatch.setattr(kube_mod.kopf_api, "request", recorder.request)
    k = kube_mod.Kube(settings=None)  # type: ignore[arg-type]
    job = {"metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": "1"}}
    finalized = {"metadata": {**job["metadata"], "finalizers": ["multislice.dev/cleanup"]}}

    async def drive() -> None:
        await k.create_jobset({"metadata": {"name": "j", "namespace": "ns"}})
        await k.get_jobset("ns", "j")
        await k.set_jobset_suspend("ns", "j", True)
        await k.apply_job_status("ns", "j", {"phase": "Running"})
        await k.merge_job_status("ns", "j", {"message": None})
        await k.add_finalizer(job, "multislice.dev/cleanup")
        await k.remove_finalizer(finalized, "multislice.dev/cleanup")
        await k.delete_job("ns", "j")
        await k.list_jobs()
        await k.post_event(job, "Normal", "R", "m")

    asyncio.run(drive())
    job_writes = [
        (m, url, payload)
        for m, url, payload in recorder.calls
        if "/multislicejobs/" in url and m != "GET"
    ]
    assert len(job_writes) == 5
    for method, url, payload in job_writes:
        if "/status?" in url:
            assert set(payload) - {"apiVersion", "kind", "metadata"} == {"status"}
            assert set(payload.get("metadata", {})) <= {"name", "namespace"}
        elif method == "PATCH" and isinstance(payload, dict):
            assert set(payload) == {"metadata"}
            assert set(payload["metadata"]) == {"finalizers", "resourceVersion"}
        elif method == "PATCH":  # JSON patch: tests and removes our finalizer only
            assert all(op["path"].startswith("/metadata/finalizers/") for op in payload)
        else:
            assert method == "DELETE"
