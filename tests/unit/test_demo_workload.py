"""The demo's --run-workload verdict (local/multislice_local/demo.py): the demo waits for the
launcher, which owns the workload's deadline, and judges what the launcher returns.

Under load the demo once gave up on a workload that was still training (its own wait ran out
first), printed that it "did not finish", and left the four JAX processes running (issue 56
part 5). The launch here runs a stand-in program (a shell script as the launcher's `python`).
"""

from __future__ import annotations

import stat
from pathlib import Path

from multislice_local.demo import BackgroundLaunch, workload_problems
from multislice_workload.local import AttemptResult, LaunchResult

# Says it started, then never finishes (a workload slower than its deadline).
SLOW = """#!/bin/sh
echo '{"event": "seen"}'
exec sleep 600
"""


def slow_program(tmp_path: Path) -> str:
    path = tmp_path / "python"
    path.write_text(SLOW)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_a_workload_past_its_deadline_is_stopped_by_the_launcher_and_said_so(
    tmp_path: Path,
) -> None:
    run = BackgroundLaunch(
        2,
        slices=2,
        hosts_per_slice=1,
        args=["train"],
        python=slow_program(tmp_path),
        log_dir=str(tmp_path / "logs"),
        grace_s=1,
    )
    run.start()
    result, missing = run.wait()
    assert result is not None, missing
    last = result.attempts[-1]
    assert (last.outcome, result.exit_code, result.restarts) == ("timeout", 124, 0)
    # Every process was stopped (and reaped) before the verdict: none outlives the demo.
    assert sorted(last.exit_codes) == [0, 1]
    assert all(code is not None and code < 0 for code in last.exit_codes.values())
    assert [e["launch_process"] for e in result.events_named("seen")] != []
    assert workload_problems(result, [], False, 2) == [
        "not finished 2 s after its start (--timeout): attempt 0 stopped",
        "no restart",
        "no restore from a checkpoint",
        "the loss did not go down",
    ]


def launch_result(code: int, outcomes: list[str]) -> LaunchResult:
    attempts = [AttemptResult(i, [], outcome=o) for i, o in enumerate(outcomes)]
    return LaunchResult(code, attempts, [], [], Path("logs"))


def test_a_finished_workload_is_judged_on_its_result() -> None:
    done = launch_result(0, ["failed", "succeeded"])
    assert workload_problems(done, [10], True, 600) == []
    crashed = launch_result(13, ["failed", "failed"])
    assert workload_problems(crashed, [10], True, 600) == ["exit 13 (failed)"]
