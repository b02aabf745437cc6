"""The command line and its exit codes, one process (the failure policy keys on these codes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from multislice_workload import env as contract
from multislice_workload import exitcodes
from multislice_workload.env import Parallelism


def run_workload(
    args: list[str], extra_env: dict[str, str] | None = None, timeout: float = 120
) -> tuple[int, list[dict[str, Any]], str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in contract.CONTRACT_VARIABLES + contract.FAULT_VARIABLES
    }
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        **(extra_env or {}),
    )
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
    assert exitcodes.EXIT_OK == 0
    assert exitcodes.EXIT_CONFIG_ERROR == 42
    assert exitcodes.EXIT_PREEMPTED == 143
    assert not exitcodes.is_retryable(42)
    assert exitcodes.is_retryable(143) and exitcodes.is_retryable(exitcodes.EXIT_CRASH)
    assert exitcodes.is_retryable(exitcodes.EXIT_INJECTED_FAILURE)


def test_bad_flag_exits_42() -> None:
    code, events, stderr = run_workload(["train", "--no-such-flag"])
    assert code == exitcodes.EXIT_CONFIG_ERROR
    assert "unrecognized arguments: --no-such-flag" in stderr
    assert events[-1]["event"] == "config_error"


def test_inconsistent_env_exits_42_before_joining() -> None:
    environ = contract.build_contract_env(
        num_slices=2,
        hosts_per_slice=1,
        chips_per_host=2,
        slice_id=2,  # out of range
        worker_id=0,
        parallelism=Parallelism(ici_fsdp=2, dcn_data=2),
        worker_hostnames=["127.0.0.1"],
        coordinator_host="127.0.0.1",
        jax_port=1,  # nothing listens: reaching jax.distributed would hang, not exit 42
    )
    code, events, _ = run_workload(["shardings"], environ)
    assert code == exitcodes.EXIT_CONFIG_ERROR
    assert "MEGASCALE_SLICE_ID=2 must be < MEGASCALE_NUM_SLICES=2" in events[-1]["message"]


def test_parallelism_flags_that_do_not_fit_exit_42() -> None:
    code, events, _ = run_workload(["shardings", "--ici_tensor_parallelism", "4"])
    assert code == exitcodes.EXIT_CONFIG_ERROR
    assert "1 x 2 x 4 = 8 must equal the chips per slice (2)" in events[-1]["message"]


def test_sigterm_saves_then_exits_143_and_resume_is_exact(tmp_path: Path) -> None:
    """One process: SIGTERM after step 4 -> checkpoint + 143; the rerun resumes, exactly."""
    ckpt = tmp_path / "ckpt"
    train = ["train", "--steps", "12", "--checkpoint_every", "100", "--log_every", "4"]
    preempt = {contract.PREEMPT_AT_STEP: "4", contract.CHECKPOINT_DIR: str(ckpt)}
    code, events, _ = run_workload(train, preempt)
    assert code == exitcodes.EXIT_PREEMPTED
    preempted = next(e for e in events if e["event"] == "preempted")
    assert preempted["checkpoint_saved"] and preempted["step"] == 4
    assert (ckpt / "4").is_dir()

    resumed_out, reference_out = tmp_path / "resumed.npz", tmp_path / "reference.npz"
    code, events, _ = run_workload(
        [*train, "--final-params-out", str(resumed_out)],
        # The hook only fires on attempt 0, as in the launcher.
        {**preempt, contract.RESTART_ATTEMPT: "1"},
    )
    assert code == exitcodes.EXIT_OK
    assert next(e for e in events if e["event"] == "restored")["message"] == (
        "restored from step 4"
    )
    code, _, _ = run_workload([*train, "--final-params-out", str(reference_out)])
    assert code == exitcodes.EXIT_OK
    resumed, reference = np.load(resumed_out), np.load(reference_out)
    assert sorted(resumed) == sorted(reference)
    for name in reference:
        np.testing.assert_array_equal(resumed[name], reference[name])
