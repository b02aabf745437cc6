"""spec.preflight (issue 42, section 2): the compile Job is a gate before capacity. decide() with
the Job pending, running, failed and passed (pure), the Job it renders, and the spec's
validation."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest

from multislice_operator.common.errors import SpecError
from multislice_operator.common.pools import PoolState
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.reconcile import (
    CreateJobSet,
    CreatePools,
    DecideConfig,
    JobMeta,
    JobSetObservation,
    SliceObservation,
    ValidateJobSet,
)
from multislice_operator.reconcile import preflight as pf
from multislice_operator.reconcile.preflight import CreatePreflightJob, DeletePreflightJob
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import (
    PreflightObservation,
)
from multislice_operator.render.preflight import render_preflight_job
from tests.unit import jobs

NOW = datetime(2026, 12, 4, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10)
META = JobMeta("ns", "job", "uid-1", 3, has_finalizer=True)
GIB = 1024**3
PREFLIGHT: dict[str, Any] = {"preflight": {}}
_, PLAN = jobs.spec_and_plan()
ABSENT = [SliceObservation(i, p.name, PoolState.ABSENT) for i, p in enumerate(PLAN.node_pools)]

run = partial(jobs.run, cfg=CFG, meta=META)


def observed(job: PreflightObservation | None = None, **kw: Any):
    kw.setdefault("slices", ABSENT)
    return jobs.Observed(now=NOW, preflight=job, **kw)


def compile_job(**kw: Any) -> PreflightObservation:
    return PreflightObservation("job-preflight", generation=META.generation, **kw)


def said(fits: bool, need: float, have: float = 16, step: float = 0.42) -> str:
    """The compile command's output as its termination message: log lines, then its JSON."""
    data = {"fits": fits, "hbm_bytes_per_device": int(need * GIB),
            "hbm_capacity_bytes": int(have * GIB), "step_time_s": step}  # fmt: skip
    return f"compiling for v5e:4x4 x 2\n{json.dumps(data)}\n"


def kinds(d) -> list[str]:
    return [type(a).__name__ for a in d.actions]


def cond(d, ctype: str) -> dict:
    return {c["type"]: c for c in d.status.to_dict()["conditions"]}[ctype]


# ---------------------------------------------------------------- decide(): the gate


def test_a_job_with_preflight_creates_its_compile_job_and_no_pool():
    d = run(obs=observed(), **PREFLIGHT)
    assert CreatePreflightJob() in d.actions
    assert kinds(d).count("CreatePools") == 0 and "CreateJobSet" not in kinds(d)
    assert d.status.phase == "Pending"
    assert cond(d, "Provisioned")["reason"] == Reason.PREFLIGHT_RUNNING
    assert d.requeue_after == pf.POLL_SECONDS


def test_the_apiservers_dry_run_comes_before_the_compile():
    d = run(obs=observed(admission=None), **PREFLIGHT)
    assert d.actions == [ValidateJobSet()]


def test_a_running_compile_is_waited_for_and_not_created_again():
    d = run(obs=observed(compile_job()), **PREFLIGHT)
    assert kinds(d).count("CreatePreflightJob") == 0
    assert kinds(d).count("CreatePools") == 0 and "DeletePreflightJob" not in kinds(d)
    assert d.status.phase == "Pending"
    assert d.status.preflight is not None and d.status.preflight.state == "Running"


def test_a_program_that_does_not_fit_fails_the_job_before_any_pool():
    job = compile_job(finished=True, exit_code=78, message=said(False, need=20.5))
    d = run(obs=observed(job), **PREFLIGHT)
    assert kinds(d).count("CreatePools") == 0 and "CreateJobSet" not in kinds(d)
    assert kinds(d).count("CreatePreflightJob") == 0
    assert DeletePreflightJob() in d.actions  # nothing of it is left
    assert d.status.phase == "Failed"
    failed = cond(d, "Failed")
    assert failed["reason"] == Reason.PREFLIGHT_FAILED
    assert "20.50 GiB of HBM per device" in failed["message"]
    assert "16.00 GiB" in failed["message"]
    # No restart budget is charged: it never ran.
    assert d.status.restarts == 0 and d.status.restarts_by_cause is None
    st = d.status.preflight
    assert st is not None and st.state == "Failed"
    assert st.hbm_bytes_per_device == int(20.5 * GIB)


def test_a_compiler_error_is_quoted_in_the_condition():
    words = "XlaRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm"
    job = compile_job(finished=True, exit_code=1, message=f"Traceback ...\n{words}\n")
    d = run(obs=observed(job), **PREFLIGHT)
    failed = cond(d, "Failed")
    assert failed["reason"] == Reason.PREFLIGHT_FAILED
    assert words in failed["message"] and "exit code 1" in failed["message"]
    assert d.status.preflight is not None and words in (d.status.preflight.message or "")


def test_a_compile_error_in_the_workloads_result_is_quoted_not_called_a_fit():
    # The workload's termination message: its result keys beside its own (reason, message).
    said = {"v": 1, "reason": "config", "exitCode": 78, "fits": False,
            "hbm_bytes_per_device": 0, "hbm_capacity_bytes": 16 * 10**9,
            "error": "mesh 3x16 does not divide the batch of 16", "message": "x"}  # fmt: skip
    job = compile_job(finished=True, exit_code=78, message=json.dumps(said))
    d = run(obs=observed(job), **PREFLIGHT)
    message = cond(d, "Failed")["message"]
    assert "mesh 3x16 does not divide the batch of 16" in message
    assert "does not fit" not in message
    assert d.status.preflight is not None
    assert d.status.preflight.message == "mesh 3x16 does not divide the batch of 16"


def test_a_compile_past_its_deadline_fails_the_job():
    job = compile_job(finished=True, reason="DeadlineExceeded")
    d = run(obs=observed(job), **PREFLIGHT)
    assert "DeadlineExceeded" in cond(d, "Failed")["message"]


def test_a_passed_compile_is_recorded_and_the_gang_is_provisioned_in_the_same_pass():
    job = compile_job(finished=True, succeeded=True, exit_code=None, message=said(True, 9.25))
    d = run(obs=observed(job), **PREFLIGHT)
    st = d.status.preflight
    assert st is not None and st.state == "Passed"
    assert st.hbm_bytes_per_device == int(9.25 * GIB) and st.hbm_capacity_bytes == 16 * GIB
    assert st.step_time_seconds == pytest.approx(0.42)
    assert DeletePreflightJob() in d.actions and CreatePools((0, 1)) in d.actions
    passed = [e for e in d.events if e.reason == Reason.PREFLIGHT_PASSED]
    assert len(passed) == 1 and "9.25 GiB" in passed[0].message


def test_once_passed_the_gone_job_is_not_run_again():
    job = compile_job(finished=True, succeeded=True, message=said(True, 9.25))
    first = run(obs=observed(job), **PREFLIGHT)
    again = run(old=first.status.to_dict(), obs=observed(), **PREFLIGHT)
    assert kinds(again).count("CreatePreflightJob") == 0
    assert CreatePools((0, 1)) in again.actions
    assert again.status.preflight == first.status.preflight  # no rewrite per pass
    assert not [e for e in again.events if e.reason == Reason.PREFLIGHT_PASSED]


def test_a_passed_job_seen_again_after_a_crash_is_deleted_not_rerun():
    job = compile_job(finished=True, succeeded=True, message=said(True, 9.25))
    first = run(obs=observed(job), **PREFLIGHT)
    again = run(old=first.status.to_dict(), obs=observed(job), **PREFLIGHT)
    assert DeletePreflightJob() in again.actions
    assert kinds(again).count("CreatePreflightJob") == 0
    assert again.status.preflight == first.status.preflight


def test_a_compile_of_an_older_spec_is_deleted_and_waited_for():
    old = replace(compile_job(), generation=META.generation - 1)
    d = run(obs=observed(old), **PREFLIGHT)
    assert DeletePreflightJob() in d.actions
    assert kinds(d).count("CreatePreflightJob") == 0 and kinds(d).count("CreatePools") == 0
    assert "older spec" in (d.status.message or "")


def test_a_job_of_the_name_that_is_not_ours_is_never_touched():
    stranger = replace(compile_job(), owned=False, finished=True, exit_code=1, message="x")
    d = run(obs=observed(stranger), **PREFLIGHT)
    assert not {"DeletePreflightJob", "CreatePreflightJob", "CreatePools"} & set(kinds(d))
    assert d.status.phase == "Pending"


def test_a_queued_job_compiles_before_its_jobset_reaches_kueue():
    queued = replace(META, labels={"kueue.x-k8s.io/queue-name": "team-a"})
    d = run(obs=observed(), meta=queued, **PREFLIGHT)
    assert CreatePreflightJob() in d.actions
    assert not {"CreateJobSet", "CreatePools"} & set(kinds(d))


def test_without_preflight_nothing_is_compiled():
    d = run(obs=observed())
    assert kinds(d).count("CreatePreflightJob") == 0 and CreatePools((0, 1)) in d.actions


def test_a_job_that_already_holds_capacity_is_not_held_back():
    # spec.preflight added to a running job: its JobSet runs; no compile, no hold.
    js = JobSetObservation(ready_jobs=2, active_jobs=2)
    up = [SliceObservation(i, p.name, PoolState.READY, 4) for i, p in enumerate(PLAN.node_pools)]
    d = run(obs=observed(slices=up, jobset=js, pods=jobs.running({0: 4, 1: 4})), **PREFLIGHT)
    assert kinds(d).count("CreatePreflightJob") == 0 and d.status.phase == "Running"
    assert CreateJobSet() not in d.actions


# ---------------------------------------------------------------- the Job it renders


def test_the_compile_job_runs_the_jobs_image_and_env_without_any_tpu():
    body = jobs.body(preflight={"timeoutSeconds": 600, "memory": "12Gi"})
    body["spec"]["template"]["spec"]["containers"][0].update(
        args=["train", "--steps", "100", "--fsdp_bf16"],
        env=[{"name": "HF_HOME", "value": "/cache"}],
    )
    job = load_job(body)
    plan = plan_job(job)
    owner = {"apiVersion": "multislice.dev/v1alpha1", "kind": "MultisliceJob", "name": "job",
             "uid": "uid-1", "controller": True}  # fmt: skip
    rendered = render_preflight_job(plan, job.spec, 3, owner)
    assert rendered["metadata"]["name"] == "job-preflight"
    assert rendered["metadata"]["ownerReferences"] == [owner]
    assert rendered["spec"]["backoffLimit"] == 0
    assert rendered["spec"]["activeDeadlineSeconds"] == 600
    pod = rendered["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert not {"nodeSelector", "tolerations", "hostNetwork"} & set(pod)
    (c,) = pod["containers"]
    assert c["image"] == "i"
    assert c["command"] == ["multislice_workload", "compile", "--topology", "v5e:4x4",
                            "--slices", "2", "--json", "--steps", "100", "--fsdp_bf16"]  # fmt: skip
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert c["resources"] == {"requests": {"cpu": "2", "memory": "12Gi"},
                              "limits": {"memory": "12Gi"}}  # fmt: skip
    assert "google.com/tpu" not in json.dumps(c["resources"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MEGASCALE_NUM_SLICES"] == "2" and env["MULTISLICE_ICI_FSDP"] == "16"
    assert env["HF_HOME"] == "/cache"
    labels = rendered["metadata"]["labels"]
    assert labels["multislice.dev/job-name"] == "job"
    assert labels["multislice.dev/preflight-generation"] == "3"


def test_a_named_command_is_run_as_given():
    cmd = ["python3", "-m", "MaxText.train_compile", "MaxText/configs/base.yml",
           "compile_topology=v5e-16", "compile_topology_num_slices=2"]  # fmt: skip
    job = load_job(jobs.body(preflight={"command": cmd}))
    rendered = render_preflight_job(plan_job(job), job.spec, 1, {})
    assert rendered["spec"]["template"]["spec"]["containers"][0]["command"] == cmd


# ---------------------------------------------------------------- the result and the spec


@pytest.mark.parametrize(
    ("message", "fits"),
    [
        ('{"fits": true, "hbm_bytes_per_device": 1}', True),
        ('log\n{"fits": false}\n', False),
        ("{not json\n", None),
        ("", None),
    ],
)
def test_the_result_is_the_last_json_line(message: str, fits: bool | None):
    assert pf.result(message).get("fits") is fits


@pytest.mark.parametrize(
    ("preflight", "field"),
    [
        ({"command": []}, "spec.preflight.command"),
        ({"command": [""]}, "spec.preflight.command"),
        ({"timeoutSeconds": 5}, "spec.preflight.timeoutSeconds"),
        ({"memory": "lots"}, "spec.preflight.memory"),
        ({"cpu": "2 cores"}, "spec.preflight.cpu"),
        ({"image": "x"}, "spec.preflight.image"),
    ],
)
def test_a_bad_preflight_names_its_field(preflight: dict[str, Any], field: str):
    with pytest.raises(SpecError) as err:
        load_job(jobs.body(preflight=preflight))
    assert any(e.path.startswith(field) for e in err.value.errors), err.value.errors


# ---------------------------------------------------------------- the shell's reading of the Job


def test_the_job_and_its_pods_last_words_are_read_as_the_apiserver_stores_them():
    from multislice_operator.controller.observe import preflight_observation

    job = {
        "metadata": {"name": "job-preflight", "uid": "j1",
                     "labels": {"multislice.dev/preflight-generation": "3"},
                     "ownerReferences": [{"uid": "uid-1", "controller": True}]},
        "status": {"conditions": [{"type": "FailureTarget", "status": "True"},
                                  {"type": "Failed", "status": "True",
                                   "reason": "BackoffLimitExceeded"}]},
    }  # fmt: skip
    pod = {"status": {"containerStatuses": [{"state": {"terminated": {
        "exitCode": 78, "message": said(False, 20.5)}}}]}}  # fmt: skip
    seen = preflight_observation(job, [pod], "uid-1")
    assert (seen.owned, seen.generation, seen.finished, seen.succeeded) == (True, 3, True, False)
    assert (seen.exit_code, seen.reason) == (78, "BackoffLimitExceeded")
    assert pf.result(seen.message)["fits"] is False
    assert not preflight_observation(job, [], "someone-else").owned
    running = preflight_observation({**job, "status": {}}, [], "uid-1")
    assert not running.finished and running.exit_code is None


def test_the_default_compile_command_is_one_the_workload_image_has() -> None:
    """The Job's command replaces the image's entry point (python -m multislice_workload): its
    executable must be one the workload package installs (workload/pyproject.toml's scripts,
    which `pip install .` in workload/Dockerfile puts on the PATH), running the same entry."""
    import importlib
    import tomllib
    from pathlib import Path

    from multislice_operator.render import preflight as render_preflight

    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "workload" / "pyproject.toml").read_text())["project"][
        "scripts"
    ]
    target = scripts[render_preflight.WORKLOAD_COMMAND]
    module, _, function = target.partition(":")
    assert module == "multislice_workload.__main__"  # the image's ENTRYPOINT's module
    assert callable(getattr(importlib.import_module(module), function))
    assert (
        'ENTRYPOINT ["python", "-m", "multislice_workload"]'
        in (root / "workload" / "Dockerfile").read_text()
    )
