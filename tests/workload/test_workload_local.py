"""The local launcher: S slices x H hosts as processes, restarted together like a JobSet.

The multi-process tests run for real on CPU: 2 slices x 2 hosts x 2 devices = 4 processes that
see 8 global devices through jax.distributed and gloo (the hang test: 2 slices x 1 host as two
pipeline stages). The launcher kills every process it started before returning, whatever
happens, so nothing outlives a test.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from multislice_workload import env as contract
from multislice_workload import exitcodes
from multislice_workload.env import Parallelism
from multislice_workload.local import LaunchResult, Layout, default_parallelism, launch, process_env

SLICES, HOSTS, DEVICES = 2, 2, 2
TINY = [
    "--batch_size", "8", "--seq_len", "16", "--embed", "16", "--heads", "2", "--head_dim", "8",
    "--mlp", "32", "--num_layers", "2", "--data_threads", "1", "--peak_flops", "1e9",
]  # fmt: skip
TRAIN = ["train", *TINY, "--steps", "16", "--checkpoint_every", "5", "--log_every", "4"]
REQUEST_ID = "maint-1733050000"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """One JAX compilation cache for the module's training runs: compile time dominates them,
    and the runs of one layout and model compile the same programs, so the first run compiles
    them and the others load them (a loaded program is the one compiled: results stay exact)."""
    return ["--compilation_cache_dir", str(tmp_path_factory.mktemp("compilation-cache"))]


def run(tmp: Path, args: list[str], **kwargs: object) -> LaunchResult:
    result = launch(
        SLICES,
        HOSTS,
        DEVICES,
        args=args,
        log_dir=str(tmp / "logs"),
        timeout_s=300,
        grace_s=1,
        **kwargs,  # type: ignore[arg-type]
    )
    print(result.format_timeline())  # shown by pytest when a test fails
    return result


def load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {name: data[name] for name in data}


# --- Environment the launcher gives each process (no processes started). ---------------------


def env_for(process_id: int, **kwargs: object) -> dict[str, str]:
    layout = Layout(SLICES, HOSTS, DEVICES)
    options: dict[str, object] = {
        "attempt": 1,
        "jax_port": 12345,
        "parallelism": default_parallelism(layout),
        "job_name": "demo",
        "checkpoint_dir": "/ckpt",
        "extra_env": {},
        "faults": {},
        "base_env": {"PATH": "/bin", contract.SLICE_ID: "7", contract.FAIL_AT_STEP: "1"},
        "pod": {
            contract.PODINFO_DIR: "/logs/podinfo/process3",
            contract.POD_NAME: "demo-slice-1-1",
            contract.POD_NAMESPACE: "default",
        },
    }
    options.update(kwargs)
    return process_env(layout, process_id, **options)  # type: ignore[arg-type]


def test_process_env_is_the_contract() -> None:
    env = env_for(3)
    assert {k: env[k] for k in contract.CONTRACT_VARIABLES} == {
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
        "MEGASCALE_COORDINATOR_ADDRESS": "127.0.0.1",
        "MEGASCALE_PORT": "8080",
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1",
        "JAX_COORDINATOR_ADDRESS": "127.0.0.1:12345",
        "JAX_PROCESS_COUNT": "4",
        "MULTISLICE_HOSTS_PER_SLICE": "2",
        "MULTISLICE_CHIPS_PER_HOST": "2",
        "MULTISLICE_CHIPS_PER_SLICE": "4",
        "MULTISLICE_ACCELERATOR": "cpu",
        "MULTISLICE_JOB_NAME": "demo",
        "MULTISLICE_ICI_DATA": "1",
        "MULTISLICE_ICI_FSDP": "4",
        "MULTISLICE_ICI_TENSOR": "1",
        "MULTISLICE_DCN_DATA": "2",
        "MULTISLICE_DCN_FSDP": "1",
        "MULTISLICE_DCN_PIPELINE": "1",
        "MULTISLICE_DCN_TENSOR": "1",
        "MULTISLICE_CHECKPOINT_DIR": "/ckpt",
        "MULTISLICE_RESTART_ATTEMPT": "1",
        "MULTISLICE_PODINFO_DIR": "/logs/podinfo/process3",
        "MULTISLICE_POD_NAME": "demo-slice-1-1",
        "MULTISLICE_POD_NAMESPACE": "default",
    }
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
    assert contract.FAIL_AT_STEP not in env  # the parent's hooks never leak in
    assert contract.from_environ(env).process_id == 3


def test_extra_env_overrides_all_but_identity_and_addresses() -> None:
    extra = {
        contract.ACCELERATOR: "v5litepod-4",
        contract.ICI_FSDP: "2",
        contract.ICI_TENSOR: "2",
        contract.SLICE_ID: "0",
        contract.JAX_COORDINATOR: "job-slice-0-0.job:8476",
    }
    env = env_for(2, extra_env=extra, faults={contract.FAIL_AT_STEP: "5"})
    assert env[contract.ACCELERATOR] == "v5litepod-4"
    assert (env[contract.ICI_FSDP], env[contract.ICI_TENSOR]) == ("2", "2")
    assert env[contract.SLICE_ID] == "1"
    assert env[contract.JAX_COORDINATOR] == "127.0.0.1:12345"
    assert env[contract.FAIL_AT_STEP] == "5"


def test_extra_env_for_another_layout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="MEGASCALE_NUM_SLICES=4 but the launcher starts 2"):
        run(tmp_path, ["train"], extra_env={contract.NUM_SLICES: "4"})


def test_no_restart_after_exit_78(tmp_path: Path) -> None:
    result = run(tmp_path, ["train", "--bogus"], max_restarts=3)
    assert result.exit_code == exitcodes.EXIT_CONFIG_ERROR
    assert len(result.attempts) == 1 and result.attempts[0].outcome == "fatal"
    messages = result.termination_messages(0)
    assert sorted(messages) == [0, 1, 2, 3]
    failed = result.attempts[0].first_failure
    assert failed is not None
    first = messages[failed[0]]
    assert first is not None and first["reason"] == "config_error"
    # The others may have been stopped before they got that far; none says anything else.
    assert all(m is None or m["reason"] == "config_error" for m in messages.values())


@pytest.mark.parametrize(
    ("line", "notice"),
    [
        ("[Gloo] Rank 3 is connected to 15 peer ranks. Expected number of connected peer", True),
        # Two threads of one process writing at once: a head spliced in, then the rest of a notice.
        ("[Gloo] Rank 0 is con[Gloo] Rank 1 is connected to 3 peer ranks. Expected number\n", True),
        ("nected to 3 peer ranks. Expected number of connected peer ranks is : 3\n", True),
        ('{"event": "mesh", "process": 0}\n', False),
        ("error: the peer ranks did not answer\n", False),
    ],
)
def test_gloo_notices_are_kept_off_the_console_even_torn(line: str, notice: bool) -> None:
    from multislice_workload.local import _gloo_notice

    assert _gloo_notice(line) is notice


# --- Real multi-process runs. ------------------------------------------------------------------


def test_shardings_sees_every_device_of_every_slice(tmp_path: Path) -> None:
    echo = io.StringIO()
    result = run(tmp_path, ["shardings", "--steps", "2"], echo=echo)
    assert result.succeeded, result.format_timeline()
    # gloo's per-device connection notices stay in the processes' logs, off the console (a
    # failed run's last lines were forty of them; issue 56), which still shows the rest.
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("attempt0-process*.log"))
    assert logs.count("[Gloo] Rank ") >= 8 and "peer ranks" not in echo.getvalue()
    assert echo.getvalue().count('"event": "mesh"') == 4
    meshes = result.events_named("mesh")
    assert sorted(e["process"] for e in meshes) == [0, 1, 2, 3]
    for mesh in meshes:
        assert mesh["global_devices"] == mesh["expected_devices"] == 8
        assert mesh["local_devices"] == 2
        assert mesh["axes"] == {"pipeline": 1, "data": 2, "fsdp": 4, "tensor": 1}
        assert mesh["slices_by_row"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    report = result.events_named("shardings_result")[0]
    assert report["global_devices"] == 8
    assert report["tflops_per_device"] > 0 and report["mfu"] > 0


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, cache: list[str]
) -> tuple[LaunchResult, Path]:
    """An uninterrupted run, same seed and layout. Process 3 alone sees a checkpoint request
    from the start (its kubelet refreshed first); saving changes nothing in the training."""
    tmp = tmp_path_factory.mktemp("reference")
    result = run(
        tmp,
        [*TRAIN, *cache, "--final-params-out", str(tmp / "params.npz"),
         "--checkpoint_request_every", "3",
         "--podinfo_poll_s", "0", "--keep_checkpoints", "10"],
        checkpoint_dir=str(tmp / "ckpt"),
        checkpoint_request=REQUEST_ID,
        checkpoint_request_processes=[3],
    )  # fmt: skip
    assert result.succeeded, result.format_timeline()
    assert result.events_named("fresh_start")
    return result, tmp


@pytest.fixture(scope="module")
def reference_params(reference: tuple[LaunchResult, Path]) -> dict[str, np.ndarray]:
    return load(reference[1] / "params.npz")


def test_checkpoint_request_saves_at_one_agreed_step_on_every_process(
    reference: tuple[LaunchResult, Path],
) -> None:
    result, tmp = reference
    served = result.events_named("checkpoint_request_saved")
    assert sorted(e["process"] for e in served) == [0, 1, 2, 3]
    assert {(e["id"], e["step"]) for e in served} == {(REQUEST_ID, 3)}  # first exchange, step 3
    assert (tmp / "ckpt" / "3" / "commit_success.txt").is_file()
    meta = json.loads((tmp / "ckpt" / "3" / "meta" / "metadata").read_text())
    assert meta["checkpoint_request"] == {"id": REQUEST_ID, "step": 3}
    for message in result.termination_messages(0).values():
        assert message is not None and message["reason"] == "finished"
        assert message["checkpointRequest"] == {"id": REQUEST_ID, "step": 3}
        assert (message["step"], message["checkpointStep"]) == (16, 16)
    # No in-cluster credentials here: process 0's acknowledgement is skipped with one warning.
    warnings = [
        e for e in result.events_named("warning") if "acknowledgement skipped" in e["message"]
    ]
    assert [e["process"] for e in warnings] == [0]


def assert_same_params(path: Path, reference: dict[str, np.ndarray]) -> None:
    params = load(path)
    assert sorted(params) == sorted(reference)
    # Exact equality: the resumed run replays the same compiled program on the same inputs, and
    # gloo's reductions over a fixed set of ranks run in a fixed order, so nothing may drift.
    for name, value in reference.items():
        np.testing.assert_array_equal(params[name], value, err_msg=name)


def test_kill_during_a_save_resumes_from_the_last_complete_checkpoint_exactly(
    tmp_path: Path, reference_params: dict[str, np.ndarray], cache: list[str]
) -> None:
    """Process 3 is SIGKILLed while the step-10 checkpoint is being written: step 10 never
    commits, everyone restarts from step 5, and the end result is bit-identical."""
    out = tmp_path / "params.npz"
    result = run(
        tmp_path,
        [*TRAIN, *cache, "--final-params-out", str(out)],
        max_restarts=2,
        faults={3: {contract.KILL_IN_SAVE_AT_STEP: "10"}},
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    assert result.succeeded, result.format_timeline()
    first, second = result.attempts
    assert first.first_failure == (3, -9)
    assert all(code is not None for code in first.exit_codes.values())  # survivors were stopped
    assert second.exit_codes == {0: 0, 1: 0, 2: 0, 3: 0}
    started = result.events_named("checkpoint_started", attempt=0)
    assert {e["step"] for e in started if e["process"] == 3} == {5}  # it died in save 10:
    dying = result.events_named("injected_kill_in_save", attempt=0)
    assert [(e["process"], e["step"]) for e in dying] == [(3, 10)]
    restored = result.events_named("restored", attempt=1)
    assert sorted(e["process"] for e in restored) == [0, 1, 2, 3]
    assert {e["step"] for e in restored} == {5}  # the last complete checkpoint
    # The data position is global (5 steps x 8 sequences), the same on every process.
    assert all(e["attempt"] == 1 and e["data_state"] == {"next_example": 40} for e in restored)
    assert "restored from step 5" in result.format_timeline()
    assert_same_params(out, reference_params)


def test_preemption_checkpoints_on_every_process_and_resume_is_exact(
    tmp_path: Path, reference_params: dict[str, np.ndarray], cache: list[str]
) -> None:
    out = tmp_path / "params.npz"
    result = run(
        tmp_path,
        [*TRAIN, *cache, "--checkpoint_every", "1000", "--final-params-out", str(out)],
        max_restarts=1,
        preempt_process=1,
        preempt_at_step=7,
        checkpoint_dir=str(tmp_path / "ckpt"),
    )
    assert result.succeeded, result.format_timeline()
    preempted = result.events_named("preempted", attempt=0)
    # SIGTERM reached one process; JAX's sync protocol stopped all four at the same step.
    assert sorted(e["process"] for e in preempted) == [0, 1, 2, 3]
    steps = {e["step"] for e in preempted}
    assert len(steps) == 1 and steps.pop() >= 7
    assert set(result.attempts[0].exit_codes.values()) <= {exitcodes.EXIT_PREEMPTED, -15, -9}
    restored = result.events_named("restored", attempt=1)
    assert {e["step"] for e in restored} == {preempted[0]["step"]}
    assert_same_params(out, reference_params)
    messages = result.termination_messages(0)
    for process, code in result.attempts[0].exit_codes.items():
        if code == exitcodes.EXIT_PREEMPTED:
            message = messages[process]
            assert message is not None and message["reason"] == "preempted"
            assert message["checkpointStep"] == preempted[0]["step"]


def test_a_hung_pipeline_stage_is_caught_by_every_watchdog(tmp_path: Path) -> None:
    """Two slices as two pipeline stages; stage 1 stops in step 3. Stage 0 then waits in the
    next collective-permute forever; both watchdogs fire at their 3 s cap and exit 75."""
    result = launch(
        2,
        1,
        2,
        args=["train", *TINY, "--steps", "40", "--num_layers", "2", "--hang_timeout_s", "3",
              "--hang_min_s", "0", "--log_every", "1", "--measure_bubble"],
        parallelism=Parallelism(ici_fsdp=2, dcn_pipeline=2),
        faults={1: {contract.HANG_AT_STEP: "3"}},
        log_dir=str(tmp_path / "logs"),
        timeout_s=300,
        grace_s=1,
    )  # fmt: skip
    print(result.format_timeline())
    config = result.events_named("train_config")[0]
    assert (config["stages"], config["microbatches"]) == (2, 4)  # 8 rows, 2 per fsdp shard
    assert config["bubble_bound"] == pytest.approx(1 / 5, abs=1e-4)
    # Each stage timed its own work alone and against the pipelined blocks (both processes).
    bubbles = result.events_named("pipeline_bubble")
    assert sorted(e["stage"] for e in bubbles) == [0.0, 1.0]
    # Measured, not compared: which is longer is a wall-clock race on a loaded machine.
    assert all(e["stage_seconds"] > 0 and e["pipelined_seconds"] > 0 for e in bubbles)
    assert all(0 <= e["bubble_measured"] <= 1 for e in bubbles)
    assert result.events_named("step")  # steps ran through the pipeline before the hang
    assert result.attempts[0].first_failure is not None
    assert result.attempts[0].first_failure[1] == exitcodes.EXIT_HANG
    hangs = result.events_named("hang")
    assert hangs and all(e["exit_code"] == 75 and e["step"] >= 3 for e in hangs)
    messages = result.termination_messages(0)
    for process, code in result.attempts[0].exit_codes.items():
        if code == exitcodes.EXIT_HANG:
            message = messages[process]
            assert message is not None and message["reason"] == "hang"


@pytest.mark.parametrize("phase", contract.DELAY_PHASES)
def test_a_process_far_behind_its_peers_at_start_still_trains(tmp_path: Path, phase: str) -> None:
    """Process 1 falls 40 s behind process 0 at one point of the start-up (a busy machine): more
    than gloo's fixed 30 s rendezvous, which the first use of each group of devices waits (the
    checkpointer's first collective opens some, the first step the rest). Before compiling
    (`compile`), after compiling but before the set-up ends (`setup`: the peak measurement, the
    checkpointer) and with the state built (`first_step`): each failed before the processes met
    at a barrier (bounded by --init_timeout) right before each first collective. Two processes
    of two devices (the first step's group of all four is one the checkpoint manager's groups of
    one device per process do not open), three steps, a checkpoint directory (its manager's
    collectives end the set-up)."""
    delay = 40
    result = launch(
        2,
        1,
        2,
        args=["train", *TINY, "--steps", "3", "--log_every", "1", "--checkpoint_every", "3"],
        checkpoint_dir=str(tmp_path / "ckpt"),
        faults={
            1: {contract.DELAY_START_SECONDS: str(delay), contract.DELAY_PHASE: phase},
        },
        log_dir=str(tmp_path / "logs"),
        timeout_s=300,
        grace_s=1,
    )
    print(result.format_timeline())
    assert result.succeeded and result.restarts == 0, result.format_timeline()
    finished = result.events_named("finished")
    assert sorted((e["launch_process"], e["step"]) for e in finished) == [(0, 3), (1, 3)]
    # The skew was real and absorbed: process 0's first step ended only once process 1 had slept.
    (delayed,) = result.events_named("injected_delay")
    assert (delayed["launch_process"], delayed["phase"]) == (1, phase)
    first = min(e["time"] for e in result.events_named("step") if e["launch_process"] == 0)
    assert first - delayed["time"] >= delay
