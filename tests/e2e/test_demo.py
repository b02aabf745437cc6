"""The README's main command, in its non-interactive form: every scenario reaches its outcome,
leaves no node pool, no fake node and no process behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line names `text` (the demo's control-plane directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


def run_demo(scenario: str, *extra: str) -> tuple[int, str]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "multislice_local.cli",
            "demo",
            "--scenario",
            scenario,
            "--pool-latency",
            "1.5",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=420,
    )
    out = proc.stdout + proc.stderr
    match = re.search(r"control-plane state in (\S+)", out)
    assert match, out[-3000:]
    workdir = match.group(1)
    assert not processes_mentioning(workdir), f"processes left running for {workdir}"
    assert not Path(workdir).exists(), "temporary control-plane state left behind"
    return proc.returncode, out


@pytest.mark.parametrize(
    ("scenario", "must_see"),
    [
        ("restart", ["RestartingAllSlices", "restarts=1", "GangProvisioned", "20 steps lost"]),
        ("stockout", ["GangRolledBack", "GCE_STOCKOUT"]),
        ("preemption", ["SliceLost", "preempting spot node pool"]),
        ("fatal", ["exited with non-retryable code 78"]),
        (
            "maintenance",
            [
                "MaintenanceScheduled",
                "CheckpointRequested",
                "CheckpointSaved",
                "cause disruption: not charged to maxRestarts",
                "restarts: 1 (disruption 1)",
                "0 steps lost",
            ],
        ),
        ("delete", ["deleting the job while its node pools are being created", "the job is gone"]),
        (
            "queue",
            [
                "insufficient unused quota for google.com/tpu",
                "the job held 0 node pools while queued",
                "admission check multislice-gang=Ready",
                "Admitted by clusterQueue team-a",
            ],
        ),
    ],
)
def test_demo_scenario(scenario, must_see):
    code, out = run_demo(scenario)
    assert code == 0, out[-4000:]
    assert "outcome reached" in out
    assert "0 node pools and 0 TPU nodes left" in out
    for needle in must_see:
        assert needle in out, f"{needle!r} missing:\n{out[-3000:]}"
    assert "timeline:" in out
    if scenario != "delete":  # it ends with where the job's TPU time went
        assert re.search(r"goodput  \S+ since creation", out), out[-3000:]
        assert "chip goodput" in out
    else:
        assert "the job was deleted, and its status with it" in out


def test_demo_runs_the_real_workload_with_the_injected_environment():
    code, out = run_demo("restart", "--run-workload")
    assert code == 0, out[-4000:]
    assert "MEGASCALE_NUM_SLICES=2" in out  # read back from a JobSet pod
    assert re.search(r"workload: exit 0, [1-9] restart\(s\), restored from step [1-9]", out), out[
        -3000:
    ]
