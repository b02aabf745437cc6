"""Elastic slice count (issue 25): the operator restarts a job on fewer slices after losing one
and later on the full count again, changing only the environment (MEGASCALE_NUM_SLICES and
dcn.data), never the command line. `--microbatch_size` keeps the global batch, and so the
training, the same at every slice count: fewer slices run more gradient-accumulation
microbatches. Real JAX processes through the local launcher: 1 host x 1 device per slice."""

from __future__ import annotations

import dataclasses
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from multislice_workload import env as contract
from multislice_workload import exitcodes, train
from multislice_workload.local import LaunchResult, launch

BATCH, MICRO = 12, 1  # 12 sequences a step: 3 microbatches on 4 slices, 4 on 3
K = 2  # steps per leg: 4 slices to K, 3 slices to 2K, 4 slices to 3K
ARGS = [
    "train",
    "--batch_size", str(BATCH), "--microbatch_size", str(MICRO), "--seq_len", "16",
    "--embed", "16", "--heads", "2", "--head_dim", "8", "--mlp", "32", "--num_layers", "2",
    "--data_threads", "0", "--peak_flops", "1e9", "--steps", str(3 * K),
    "--checkpoint_every", str(K), "--log_every", "1000",
]  # fmt: skip
# Float tolerance of the final parameters. 4 and 3 slices sum the same 12 per-sequence gradients
# in another grouping (3 microbatches of 4 rows each all-reduced over 4 replicas, against 4 of 3
# over 3), so float32 rounding differs in the last bits (~1e-7 relative); Adam's division by
# sqrt(v) passes such noise on to the (lr = 1e-3) update, more for a near-zero gradient.
# Measured: max |difference| 6e-8 over every parameter after 3K steps. 1e-6 is well above that
# noise and far below what a real error makes (an Adam step is about lr in size): resumed at
# step 2K from a data position one batch off, the final parameters differed by up to 7e-4, and
# by more than 6e-5 in every array.
ATOL = 1e-6


def run_on(slices: int, tmp: Path, name: str, ckpt: Path, **kw: object) -> LaunchResult:
    result = launch(
        slices,
        1,
        1,
        args=[*ARGS, "--compilation_cache_dir", str(tmp / "cache"), "--final_params_out",
              str(tmp / "params.npz")],  # the same command line at every slice count
        checkpoint_dir=str(ckpt),
        log_dir=str(tmp / name),
        timeout_s=240,
        grace_s=1,
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    print(result.format_timeline())  # shown by pytest when a test fails
    return result


def by_process(result: LaunchResult, event: str) -> dict[int, dict[str, Any]]:
    return {e["process"]: e for e in result.events_named(event)}


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data}


# Many CPU-bound processes: tests/conftest.py's serial group of the other multi-process runs.
SERIAL = pytest.mark.xdist_group("workload-processes")


@SERIAL
def test_resume_on_3_slices_then_4_trains_as_one_4_slice_run(tmp_path: Path) -> None:
    """The uninterrupted 4-slice run of 3K steps checkpoints every K steps (saving changes
    nothing in the training); its step-K checkpoint stands for the job that lost a slice after
    step K. The job resumes from it on 3 slices, which stop at 2K (a restart request), then on
    4 slices to 3K: the final parameters match the uninterrupted run's within ATOL."""
    reference = run_on(4, tmp_path, "reference", tmp_path / "ref-ckpt")
    assert reference.succeeded, reference.format_timeline()
    starts = by_process(reference, "fresh_start")
    assert sorted(starts) == [0, 1, 2, 3]
    assert {(e["grad_accum"], e["next_example"]) for e in starts.values()} == {(3, 0)}
    expected = load((tmp_path / "params.npz").rename(tmp_path / "reference.npz"))

    ckpt = tmp_path / "ckpt"  # the job's checkpoints when its slice was lost: up to step K
    shutil.copytree(tmp_path / "ref-ckpt" / str(K), ckpt / str(K))
    faults = {i: {contract.RESTART_AT_STEP: str(2 * K)} for i in range(3)}
    three = run_on(3, tmp_path, "three", ckpt, faults=faults)
    assert three.exit_code == exitcodes.EXIT_RESTART_REQUESTED, three.format_timeline()
    assert {e["axes"]["data"] for e in three.events_named("mesh")} == {3}
    restored = by_process(three, "restored")
    assert sorted(restored) == [0, 1, 2]
    assert {
        (e["step"], e["grad_accum"], e["data_state"]["next_example"]) for e in restored.values()
    } == {(K, 4, K * BATCH)}
    assert {e["step"] for e in three.events_named("restart_requested")} == {2 * K}

    four = run_on(4, tmp_path, "four", ckpt)
    assert four.succeeded, four.format_timeline()
    assert {e["axes"]["data"] for e in four.events_named("mesh")} == {4}
    restored = by_process(four, "restored")
    assert sorted(restored) == [0, 1, 2, 3]
    assert {
        (e["step"], e["grad_accum"], e["data_state"]["next_example"]) for e in restored.values()
    } == {(2 * K, 3, 2 * K * BATCH)}
    assert {e["step"] for e in four.events_named("finished")} == {3 * K}
    resumed = load(tmp_path / "params.npz")

    assert sorted(resumed) == sorted(expected)
    worst = max(float(np.max(np.abs(resumed[n] - expected[n]))) for n in expected)
    print(f"max |parameter difference| = {worst:.3g}")
    for name, value in expected.items():
        np.testing.assert_allclose(resumed[name], value, rtol=0, atol=ATOL, err_msg=name)


# --- The derived grad_accum (no processes). ----------------------------------------------------


def mesh_shape(pipeline: int = 1, data: int = 1, fsdp: int = 1, tensor: int = 1) -> dict[str, int]:
    return {"pipeline": pipeline, "data": data, "fsdp": fsdp, "tensor": tensor}


CFG = train.TrainConfig(batch_size=48, microbatch_size=2)


@pytest.mark.parametrize(
    ("shape", "grad_accum"),
    [
        (mesh_shape(data=4, fsdp=2), 3),  # 4 slices x fsdp 2: 8 devices x 2 = 16 rows, 3 of them
        (mesh_shape(data=3, fsdp=2), 4),  # a slice lost: 6 x 2 = 12 rows a microbatch, 4
        (mesh_shape(data=2, fsdp=2), 6),
        (mesh_shape(data=1, fsdp=2), 12),
        (mesh_shape(data=4, fsdp=2, tensor=4), 3),  # tensor parallelism holds no rows of its own
        (mesh_shape(pipeline=2, data=2, fsdp=2), 6),  # the pipeline splits each microbatch
    ],
)
def test_microbatch_size_derives_grad_accum_per_layout(
    shape: dict[str, int], grad_accum: int
) -> None:
    derived = train.derive_grad_accum(CFG, shape)
    assert derived.grad_accum == grad_accum
    assert dataclasses.replace(derived, grad_accum=1) == CFG  # nothing else changes
    assert derived.grad_accum * CFG.microbatch_size * shape["data"] * shape["fsdp"] == 48


def test_under_a_pipeline_the_stages_split_each_microbatch() -> None:
    """48 rows, 6 microbatches of 8 (2 per device of data 2 x fsdp 2): the pipeline's own
    microbatches are chosen from those 8 rows (2 of 4 rows each), not from the whole batch (6,
    whose 8 rows would not split into 6 x 8 per step)."""
    shape = mesh_shape(pipeline=2, data=2, fsdp=2)
    cfg = train.derive_grad_accum(dataclasses.replace(CFG, embed=32, num_layers=2), shape)
    assert train.check_shapes(cfg, types.SimpleNamespace(shape=shape)) == 2


def test_without_microbatch_size_grad_accum_is_the_flags() -> None:
    cfg = train.TrainConfig(batch_size=48, grad_accum=4)
    assert train.derive_grad_accum(cfg, mesh_shape(data=3)) is cfg


def test_a_batch_that_does_not_split_at_this_layout_is_a_config_error() -> None:
    # 48 / (2 x 5 x 2): 20 rows a microbatch do not divide 48.
    with pytest.raises(train.ConfigError) as err:
        train.derive_grad_accum(CFG, mesh_shape(data=5, fsdp=2))
    message = str(err.value)
    assert "--batch_size=48 is not divisible by --microbatch_size=2 x 10 data-parallel" in message
    assert "a multiple of 20 (e.g. 60)" in message
    # Fewer rows than one microbatch needs is the same error, not grad_accum 0.
    with pytest.raises(train.ConfigError, match="--batch_size=8 is not divisible"):
        train.derive_grad_accum(dataclasses.replace(CFG, batch_size=8), mesh_shape(data=8))


def test_microbatch_size_and_grad_accum_are_mutually_exclusive() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    train.add_arguments(parser)
    args = parser.parse_args(["--microbatch_size", "2", "--grad_accum", "4"])
    with pytest.raises(train.ConfigError, match="--microbatch_size=2 and --grad_accum=4 are mutu"):
        train.config_from(args, contract.from_environ({}))
    ok = parser.parse_args(["--microbatch_size", "2", "--grad_accum", "1"])
    assert train.config_from(ok, contract.from_environ({})).microbatch_size == 2


@SERIAL
def test_a_batch_that_does_not_split_exits_78_naming_the_flag() -> None:
    """One process, 2 devices (fsdp 2): 4 sequences cannot make microbatches of 3 x 2."""
    from tests.workload.test_workload_cli import TINY, run_workload

    code, events, stderr = run_workload(["train", *TINY, "--microbatch_size", "3"])
    assert code == exitcodes.EXIT_CONFIG_ERROR, stderr
    error = next(e for e in events if e["event"] == "config_error")
    assert "--batch_size=4 is not divisible by --microbatch_size=3 x 2" in error["message"]
    assert not [e for e in events if e["event"] in ("crash", "train_config")]
