"""The command line, its exit codes and termination messages, one process (the failure policy
keys on these codes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from multislice_workload import env as contract
from multislice_workload import exitcodes, termination
from multislice_workload.env import Parallelism

# A tiny LM: what is tested here is the program around it.
TINY = [
    "--batch_size", "4", "--seq_len", "16", "--embed", "16", "--heads", "2", "--head_dim", "8",
    "--mlp", "32", "--num_layers", "2", "--data_threads", "0", "--peak_flops", "1e9",
]  # fmt: skip


def run_workload(
    args: list[str],
    extra_env: dict[str, str] | None = None,
    timeout: float = 120,
    termination_log: Path | None = None,
) -> tuple[int, list[dict[str, Any]], str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in contract.CONTRACT_VARIABLES + contract.FAULT_VARIABLES
    }
    env.pop(termination.TERMINATION_LOG_ENV, None)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0",
        **(extra_env or {}),
    )
    if termination_log is not None:
        env[termination.TERMINATION_LOG_ENV] = str(termination_log)
    proc = subprocess.run(
        [sys.executable, "-m", "multislice_workload", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, events, proc.stderr


def test_exit_code_constants() -> None:
    # docs/environment.md section 1: the operator's failure policy keys on exactly these values.
    assert (exitcodes.EXIT_OK, exitcodes.EXIT_CRASH, exitcodes.EXIT_INJECTED_FAILURE) == (0, 1, 13)
    assert exitcodes.EXIT_RESTART_REQUESTED == 42
    assert exitcodes.EXIT_HANG == 75
    assert exitcodes.EXIT_CONFIG_ERROR == 78
    assert exitcodes.EXIT_PREEMPTED == 143
    assert not exitcodes.is_retryable(78)
    for code in (1, 13, 42, 75, 143):
        assert exitcodes.is_retryable(code)
    assert set(exitcodes.REASONS.values()) == {
        "finished", "crash", "injected", "restart_requested", "hang", "preempted", "config_error",
    }  # fmt: skip


def read_message(path: Path) -> dict[str, Any]:
    message = json.loads(path.read_text())
    assert isinstance(message, dict) and message["v"] == 1
    assert len(path.read_bytes()) <= termination.MAX_BYTES
    return message


def test_bad_flag_exits_78_with_a_termination_message(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    code, events, stderr = run_workload(["train", "--no-such-flag"], termination_log=log)
    assert code == exitcodes.EXIT_CONFIG_ERROR
    assert "unrecognized arguments: --no-such-flag" in stderr
    assert [e["event"] for e in events[-2:]] == ["config_error", "exit"]
    message = read_message(log)
    assert message["reason"] == "config_error" and message["exitCode"] == 78
    assert message["step"] is None and message["checkpointStep"] is None
    assert "--no-such-flag" in message["message"]


def test_a_sequence_the_corpus_cannot_serve_exits_78_before_compiling() -> None:
    """A training configuration error is fatal (78), never a crash (1) that the operator would
    retry until the restart budget is spent: here the data pipeline refuses --seq_len, and it is
    built before the step is compiled (a 50M-token sequence would not compile in memory)."""
    code, events, stderr = run_workload(["train", *TINY, "--seq_len", "50000000"])
    assert code == exitcodes.EXIT_CONFIG_ERROR, stderr
    error = next(e for e in events if e["event"] == "config_error")
    assert "--seq_len=50000000" in error["message"] and "shorter --seq_len" in error["message"]
    assert not [e for e in events if e["event"] == "crash"]


def test_inconsistent_env_exits_78_before_joining() -> None:
    environ = contract.build_contract_env(
        num_slices=2,
        hosts_per_slice=1,
        chips_per_host=2,
        slice_id=2,  # out of range
        worker_id=0,
        parallelism=Parallelism(ici_fsdp=2, dcn_data=2),
        worker_hostnames=["127.0.0.1"],
        coordinator_host="127.0.0.1",
        jax_port=1,  # nothing listens: reaching jax.distributed would hang, not exit 78
    )
    code, events, _ = run_workload(["shardings"], environ)
    assert code == exitcodes.EXIT_CONFIG_ERROR
    error = next(e for e in events if e["event"] == "config_error")
    assert "MEGASCALE_SLICE_ID=2 must be < MEGASCALE_NUM_SLICES=2" in error["message"]


def test_parallelism_flags_that_do_not_fit_exit_78() -> None:
    code, events, _ = run_workload(["shardings", "--ici_tensor_parallelism", "4"])
    assert code == exitcodes.EXIT_CONFIG_ERROR
    error = next(e for e in events if e["event"] == "config_error")
    assert "1 x 2 x 4 = 8 must equal the chips per slice (2)" in error["message"]


def test_sigterm_saves_then_exits_143_and_resume_is_exact(tmp_path: Path) -> None:
    """One process: SIGTERM after step 4 -> checkpoint (waited for) + 143; the rerun resumes the
    model and the data iterator, exactly."""
    ckpt, log = tmp_path / "ckpt", tmp_path / "termination-log"
    train = ["train", *TINY, "--steps", "8", "--checkpoint_every", "100", "--log_every", "4"]
    preempt = {contract.PREEMPT_AT_STEP: "4", contract.CHECKPOINT_DIR: str(ckpt)}
    code, events, _ = run_workload(train, preempt, termination_log=log)
    assert code == exitcodes.EXIT_PREEMPTED
    preempted = next(e for e in events if e["event"] == "preempted")
    assert preempted["checkpoint_saved"] and preempted["step"] == 4
    assert (ckpt / "4" / "commit_success.txt").is_file()  # async save finished before the exit
    # The data position: one global example index, not a file per process.
    assert json.loads((ckpt / "4" / "data" / "metadata").read_text()) == {"next_example": 16}
    message = read_message(log)
    assert (message["reason"], message["exitCode"]) == ("preempted", 143)
    assert (message["step"], message["checkpointStep"]) == (4, 4)

    resumed_out, reference_out = tmp_path / "resumed.npz", tmp_path / "reference.npz"
    code, events, _ = run_workload(
        [*train, "--final-params-out", str(resumed_out)],
        # The hook only fires on attempt 0, as in the launcher.
        {**preempt, contract.RESTART_ATTEMPT: "1"},
        termination_log=log,
    )
    assert code == exitcodes.EXIT_OK
    restored = next(e for e in events if e["event"] == "restored")
    assert restored["message"] == "restored from step 4"
    assert restored["data_state"] == {"next_example": 16}  # came back with the model
    message = read_message(log)
    assert (message["reason"], message["step"], message["checkpointStep"]) == ("finished", 8, 8)
    code, _, _ = run_workload([*train, "--final-params-out", str(reference_out)])
    assert code == exitcodes.EXIT_OK
    resumed, reference = np.load(resumed_out), np.load(reference_out)
    assert sorted(resumed) == sorted(reference)
    for name in reference:
        np.testing.assert_array_equal(resumed[name], reference[name])


def test_restart_request_saves_and_exits_42(tmp_path: Path) -> None:
    log, ckpt = tmp_path / "termination-log", tmp_path / "ckpt"
    hook = {contract.RESTART_AT_STEP: "3", contract.CHECKPOINT_DIR: str(ckpt)}
    code, events, _ = run_workload(["train", *TINY, "--steps", "6"], hook, termination_log=log)
    assert code == exitcodes.EXIT_RESTART_REQUESTED
    assert next(e for e in events if e["event"] == "restart_requested")["step"] == 3
    message = read_message(log)
    assert (message["reason"], message["step"], message["checkpointStep"]) == (
        "restart_requested",
        3,
        3,
    )


def test_hang_is_caught_dumped_and_exits_75(tmp_path: Path) -> None:
    """The main thread never returns from step 3; the watchdog's absolute cap (2 s) ends it."""
    log = tmp_path / "termination-log"
    args = ["train", *TINY, "--steps", "50", "--hang_timeout_s", "2", "--hang_min_s", "0"]
    code, events, stderr = run_workload(args, {contract.HANG_AT_STEP: "3"}, termination_log=log)
    assert code == exitcodes.EXIT_HANG
    hang = next(e for e in events if e["event"] == "hang")
    assert hang["step"] == 3 and hang["exit_code"] == 75
    assert "(bound 2 s)" in hang["message"]
    # faulthandler's dump names the stuck frame and the watchdog's own thread.
    assert "most recent call first" in stderr and "_injected_hang" in stderr
    assert "hang-watchdog" in stderr or "hang_exit" in stderr
    message = read_message(log)
    assert (message["reason"], message["exitCode"], message["step"]) == ("hang", 75, 3)
