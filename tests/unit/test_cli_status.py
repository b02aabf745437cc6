"""`multislice-operator status`: what it prints is what the status it read says, the goodput live
at the time it was read."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from multislice_operator.cli.main import main
from multislice_operator.cli.view import duration
from multislice_operator.common.pools import PoolError, PoolState
from multislice_operator.planning.plan import load_job, plan_job
from multislice_operator.reconcile import (
    DecideConfig,
    JobMeta,
    JobSetObservation,
    SliceObservation,
)
from tests.unit import jobs
from tests.unit.jobs import Observed

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
CFG = DecideConfig.from_settings(None, resync_seconds=10)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def body(mode: str = "Existing") -> dict:
    return jobs.body(
        "llm", "team", metadata={"creationTimestamp": iso(T0)}, provisioning={"mode": mode}
    )


def restarted_job() -> dict:
    """A job the way decide() leaves it: started, ran, one pod failed at step 120 (checkpoint
    100), all slices restarted and run again."""
    obj = body()
    job = load_job(obj)
    plan = plan_job(job)
    meta = JobMeta("team", "llm", "uid", 1, creation_time=T0)
    slices = [SliceObservation(i, f"pool-{i}", PoolState.READY, 4) for i in range(2)]
    failed = jobs.failed("llm-slice-1-0-a", 1, 13, "Error", 0, step=120, checkpoint_step=100)
    run = {0: 4, 1: 4}
    status = None
    for t, js, failures, running in (
        (5, None, [], {}),
        (10, JobSetObservation(ready_jobs=2), [], run),
        (100, JobSetObservation(ready_jobs=1), [failed], {0: 4}),
        (105, JobSetObservation(restarts=1, restarts_counted=1), [failed], {}),
        (130, JobSetObservation(ready_jobs=2, restarts=1, restarts_counted=1), [], run),
    ):
        pods = [*failures, *jobs.running(running, js.restarts if js else 0)]
        obs = Observed(now=at(t), slices=list(slices), jobset=js, pods=pods)
        status = jobs.run(status, obs, cfg=CFG, meta=meta, plan=(job.spec, plan)).status
    assert status is not None
    obj["status"] = status.to_dict()
    return obj


def status_of(tmp_path: Path, obj: dict, now: datetime, *args: str, capsys=None) -> str:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(obj))
    assert main(["status", "-f", str(path), "--now", iso(now), *args]) == 0
    assert capsys is not None
    return str(capsys.readouterr().out)


def test_json_is_the_status_with_the_goodput_live(tmp_path, capsys):
    obj = restarted_job()
    st = obj["status"]
    out = json.loads(status_of(tmp_path, obj, at(400), "-o", "json", capsys=capsys))
    assert (out["phase"], out["restarts"], out["readySlices"]) == ("Running", 1, "2/2")
    assert out["lastRestart"] == st["lastRestart"]
    assert out["lastRestart"]["lostSteps"] == 20
    assert out["lastRestart"]["recoverySeconds"] == 30
    assert out["lastFailure"]["pod"] == "llm-slice-1-0-a"
    assert out["restartsByCause"] == {"workload": 1}
    g, stored = out["goodput"], st["goodput"]
    # Closed states as stored; the current one from its `since` up to now.
    assert (stored["state"], stored["since"]) == ("running", iso(at(130)))
    for state, secs in stored["seconds"].items():
        extra = 400 - 130 if state == stored["state"] else 0
        assert g["seconds"][state] == secs + extra, state
    assert g["wallSeconds"] == 400  # now - creationTimestamp
    assert g["heldChipSeconds"] == sum(g["chipSeconds"].values()) == 400 * 32
    assert g["chipGoodput"] == round(g["chipSeconds"]["running"] / (400 * 32), 4)
    assert g["lostSteps"] == 20
    assert [s["state"] for s in out["timeline"]] == ["starting", "running", "restarting", "running"]
    assert sum(s["seconds"] for s in out["timeline"]) == 400
    assert out["nextAttemptTime"] is None


def test_text_shows_every_state_slices_restarts_and_timeline(tmp_path, capsys):
    obj = restarted_job()
    text = status_of(tmp_path, obj, at(400), capsys=capsys)
    data = json.loads(status_of(tmp_path, obj, at(400), "-o", "json", capsys=capsys))
    assert "team/llm" in text and "Running" in text and "2/2 slices running" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    for state, secs in data["goodput"]["seconds"].items():
        assert rows[state][1] == duration(secs), (state, rows[state])
    assert rows["running"][2] == f"{secs_share(data, 'running')}%"
    for s in obj["status"]["slices"]:
        assert any(
            line.split()[:4] == [str(s["index"]), s["nodePool"], f"{s['readyHosts']}/4", s["phase"]]
            for line in text.splitlines()
        )
    assert "restarts: 1 (workload 1)" in text
    assert "20 steps lost" in text and "recovered in 30s" in text
    assert "pod llm-slice-1-0-a exit code 13" in text
    assert "steps lost 20" in text
    assert f"chip goodput {data['goodput']['chipGoodput'] * 100:.1f}%" in text
    lines = [line.split() for line in text.splitlines()]
    for seg in data["timeline"]:
        assert [seg["since"], seg["state"], duration(seg["seconds"])] in lines, seg


def secs_share(data: dict, state: str) -> str:
    g = data["goodput"]
    return f"{g['seconds'][state] / g['wallSeconds'] * 100:.1f}"


def test_next_gang_attempt_after_a_rollback(tmp_path, capsys):
    obj = body("Managed")
    job = load_job(obj)
    plan = plan_job(job)
    meta = JobMeta("team", "llm", "uid", 1, creation_time=T0, has_finalizer=True)
    names = [p.name for p in plan.node_pools]
    nothing_yet = Observed(now=at(1), slices=[SliceObservation(i, n) for i, n in enumerate(names)])
    first = jobs.run(None, nothing_yet, cfg=CFG, meta=meta, plan=(job.spec, plan)).status
    stockout = PoolError(1, names[1], "GCE_STOCKOUT", "no capacity", False)
    obs = Observed(
        now=at(20),
        slices=[
            SliceObservation(0, names[0], PoolState.CREATING),
            SliceObservation(1, names[1], PoolState.FAILED, error=stockout),
        ],
    )
    st = jobs.run(first, obs, cfg=CFG, meta=meta, plan=(job.spec, plan)).status
    assert st.next_attempt_time is not None
    obj["status"] = st.to_dict()
    data = json.loads(status_of(tmp_path, obj, at(25), "-o", "json", capsys=capsys))
    wait = int((st.next_attempt_time - at(25)).total_seconds())
    assert data["nextAttemptTime"] == iso(st.next_attempt_time)
    assert data["nextAttemptInSeconds"] == wait
    assert data["goodput"]["seconds"]["provisioning"] == 25
    # No pool until the pass at 20 saw them (one creating, one failed): both held since.
    # Held from the pass that created the pools (t=1), as the next pass sees them: 25 s x 32.
    assert data["goodput"]["chipSeconds"]["provisioning"] == 25 * 32
    text = status_of(tmp_path, obj, at(25), capsys=capsys)
    assert (
        f"next gang attempt at {iso(st.next_attempt_time)} (in {duration(wait)}, attempt 2)" in text
    )


def test_a_job_without_status_yet(tmp_path, capsys):
    # Issue 21: it said phase "New", which no doc and no status ever names.
    text = status_of(tmp_path, body(), at(3), capsys=capsys)
    assert "team/llm  (no status yet)" in text and "restarts: 0" in text
    assert "New" not in text and "watching namespace team?" in text


def test_a_job_file_without_namespace_is_in_default(tmp_path, capsys):
    # Issue 21: a hand-written job without metadata.namespace showed as "None/llm".
    obj = body()
    del obj["metadata"]["namespace"]
    text = status_of(tmp_path, obj, at(3), capsys=capsys)
    assert text.startswith("default/llm ") and "None" not in text


def fake_kubectl(tmp_path: Path, obj: dict, code: int = 0) -> Path:
    (tmp_path / "obj.json").write_text(json.dumps(obj))
    script = tmp_path / "kubectl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" > {tmp_path}/argv\n'
        f"[ {code} -eq 0 ] || {{ echo 'Error from server (NotFound)' >&2; exit {code}; }}\n"
        f"cat {tmp_path}/obj.json\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_reads_the_job_with_kubectl(tmp_path, capsys):
    obj = restarted_job()
    kubectl = fake_kubectl(tmp_path, obj)
    argv = ["status", "llm", "-n", "team", "--kubectl", str(kubectl), "-o", "json"]
    assert main([*argv, "--context", "prod", "--now", iso(at(400))]) == 0
    assert json.loads(capsys.readouterr().out)["goodput"]["wallSeconds"] == 400
    assert (tmp_path / "argv").read_text().split() == [
        "get",
        "multislicejobs.multislice.dev",
        "llm",
        "-o",
        "json",
        "-n",
        "team",
        "--context",
        "prod",
    ]


def test_kubectl_errors_are_reported_not_raised(tmp_path, capsys):
    kubectl = fake_kubectl(tmp_path, {}, code=1)
    assert main(["status", "nope", "--kubectl", str(kubectl)]) == 2
    assert "NotFound" in capsys.readouterr().err
    assert main(["status", "nope", "--kubectl", str(tmp_path / "absent")]) == 2
    assert "not found" in capsys.readouterr().err


def test_json_needs_no_rich_and_text_says_how_to_get_it(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(restarted_job()))
    code = (
        "import sys\n"
        "sys.modules['rich'] = None  # not installed\n"
        "from multislice_operator.cli.main import main\n"
        f"assert main(['status', '-f', {str(path)!r}, '-o', 'json']) == 0\n"
        f"sys.exit(main(['status', '-f', {str(path)!r}]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 2, out.stderr
    assert "multislice-operator[cli]" in out.stderr
    assert json.loads(out.stdout)["name"] == "llm"


@pytest.mark.parametrize("entry", ["multislice-operator", "kubectl-msj"])
def test_console_scripts_include_the_kubectl_plugin(entry, tmp_path):
    exe = Path(sys.executable).parent / entry
    assert exe.exists() and os.access(exe, os.X_OK)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(restarted_job()))
    out = subprocess.run(
        [str(exe), "status", "-f", str(path), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout)["lastRestart"]["lostSteps"] == 20
    helped = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert ("kubectl msj" in helped.stdout) == (entry == "kubectl-msj")


def test_maintenance_and_checkpoint_are_shown(tmp_path, capsys):
    obj = restarted_job()
    obj["status"]["maintenance"] = {
        "time": "2026-11-30T13:00:00Z",
        "slices": [1],
        "nodes": 4,
        "active": False,
    }
    obj["status"]["checkpoint"] = {
        "requestId": "maint-1796130532",
        "source": "maintenance",
        "requestTime": "2026-11-30T12:50:00Z",
        "podsAnnotated": 8,
        "savedStep": 120,
    }
    text = " ".join(status_of(tmp_path, obj, at(400), capsys=capsys).split())  # rich wraps
    assert "maintenance: at 2026-11-30T13:00:00Z on slices 1 (4 nodes)" in text
    assert "checkpoint: request maint-1796130532 (maintenance)" in text
    assert "8 pods, saved at step 120" in text
    out = json.loads(status_of(tmp_path, obj, at(400), "-o", "json", capsys=capsys))
    assert out["checkpoint"]["savedStep"] == 120 and out["maintenance"]["slices"] == [1]


def test_a_fallback_job_says_which_option_it_tries_and_why_it_left_the_others(tmp_path, capsys):
    obj = restarted_job()
    obj["status"]["fallback"] = {
        "option": 2,
        "round": 1,
        "lastLeft": "Timeout",
        "lastLeftOption": 1,
        "options": [
            {"option": 0, "what": "Reserved res-a, v5litepod-16 x 2", "attempts": 1,
             "waitedSeconds": 30, "lastLeft": "ReservationExhausted"},
            {"option": 1, "what": "FlexStart, v5litepod-16 x 2", "attempts": 1,
             "waitedSeconds": 900, "lastLeft": "Timeout"},
            {"option": 2, "what": "Spot in us-east5-c, v6e-32 x 1", "attempts": 1},
        ],
        "shapes": [{"name": "v6e", "what": "v6e-32 x 1", "fits": True, "generation": 1,
                    "hbmBytesPerDevice": 9 * 2**30}],
    }  # fmt: skip
    text = " ".join(status_of(tmp_path, obj, at(400), capsys=capsys).split())  # rich wraps
    assert "fallback: option 3 (Spot in us-east5-c, v6e-32 x 1), round 1; left option 2: " \
        "Timeout" in text  # fmt: skip
    assert "option 1 (Reserved res-a, v5litepod-16 x 2): 1 attempt, waited 30s, last left: " \
        "ReservationExhausted" in text  # fmt: skip
    assert "option 2 (FlexStart, v5litepod-16 x 2): 1 attempt, waited 15m" in text
    assert "last left: Timeout" in text
    assert "shape v6e (v6e-32 x 1): compiles, HBM 9.00 GiB per device" in text
    out = json.loads(status_of(tmp_path, obj, at(400), "-o", "json", capsys=capsys))
    assert out["fallback"]["options"][1]["waitedSeconds"] == 900


def test_an_elastic_job_on_fewer_slices_says_so_with_its_degraded_chip_hours(tmp_path, capsys):
    obj = jobs.body("llm", "team", metadata={"creationTimestamp": iso(T0)}, slices=4,
                    elastic={"minSlices": 3})  # fmt: skip
    obj["status"] = {
        "phase": "Running",
        "activeSlices": 3,
        "goodput": {
            "state": "running",
            "since": iso(at(100)),
            "heldChips": 64,
            "degraded": True,
            "degradedChipSeconds": 7200,
            "chipSeconds": {"running": 7200},
            "seconds": {"running": 100},
        },
    }
    text = status_of(tmp_path, obj, at(100), capsys=capsys)
    assert "running on 3 of 4 slices (elastic)" in text
    assert "on fewer slices (spec.elastic): 2.00 chip-hours" in text
    data = json.loads(status_of(tmp_path, obj, at(100), "-o", "json", capsys=capsys))
    assert data["activeSlices"] == 3 and data["goodput"]["degradedChipSeconds"] == 7200
