"""In-place restart (JobSet's InPlaceRestart) in the local launcher: the same pods, so the same
coordinator address and port on every attempt; the workload joins it again, resumes from the
last checkpoint and loads its programs from the persistent compilation cache.

The first tests run a stand-in program (a shell script given as the launcher's `python`), the last
one the real workload: 2 slices x 1 host x 2 CPU devices, two JAX processes.
"""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from multislice_workload import env as contract
from multislice_workload import exitcodes
from multislice_workload.env import Parallelism
from multislice_workload.local import LaunchResult, launch, main, port_bindable

TINY = [
    "--batch_size", "8", "--seq_len", "16", "--embed", "16", "--heads", "2", "--head_dim", "8",
    "--mlp", "32", "--num_layers", "2", "--data_threads", "0", "--peak_flops", "1e9",
]  # fmt: skip

# Says what a container would see, then fails on attempt 0 and succeeds afterwards. Attempt 0
# fails only once every process has said it (a barrier of marker files): the first failure makes
# the launcher stop the others, and on a busy machine one not yet started would never say it.
STAND_IN = f"""#!/bin/sh
echo "{{\\"event\\": \\"seen\\", \\"coordinator\\": \\"${contract.JAX_COORDINATOR}\\", \\
\\"attempt\\": \\"${contract.RESTART_ATTEMPT}\\", \\"pod\\": \\"${contract.POD_NAME}\\", \\
\\"podinfo\\": \\"${contract.PODINFO_DIR}\\"}}"
mkdir -p BARRIER && touch "BARRIER/${contract.POD_NAME}"
if [ "${contract.RESTART_ATTEMPT}" = 0 ]; then
  i=0
  while [ "$(ls BARRIER | wc -l)" -lt PROCESSES ] && [ $i -lt 1200 ]; do
    sleep 0.05; i=$((i + 1))
  done
  exit {exitcodes.EXIT_INJECTED_FAILURE}
fi
exit 0
"""


def stand_in(tmp_path: Path, processes: int) -> str:
    path = tmp_path / "python"
    barrier = tmp_path / "seen-at-attempt-0"
    path.write_text(STAND_IN.replace("BARRIER", str(barrier)).replace("PROCESSES", str(processes)))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def seen(result: LaunchResult, attempt: int) -> dict[int, tuple[str, str, str, str]]:
    return {
        e["launch_process"]: (e["coordinator"], e["attempt"], e["pod"], e["podinfo"])
        for e in result.events_named("seen", attempt)
    }


def test_in_place_keeps_the_pods_and_the_coordinator_address(tmp_path: Path) -> None:
    result = launch(
        2,
        2,
        args=["train"],
        max_restarts=1,
        restart="in_place",
        python=stand_in(tmp_path, 4),
        log_dir=str(tmp_path / "logs"),
        grace_s=1,
    )
    assert result.succeeded and result.restarts == 1, result.format_timeline()
    first, second = seen(result, 0), seen(result, 1)
    assert sorted(first) == sorted(second) == [0, 1, 2, 3]
    address = result.attempts[0].coordinator
    assert address.startswith("127.0.0.1:") and result.attempts[1].coordinator == address
    for process in range(4):
        coordinator, attempt, pod, podinfo = first[process]
        # Same address, pod name and pod-info volume; only the restart attempt moves.
        assert second[process] == (coordinator, "1", pod, podinfo)
        assert (coordinator, attempt) == (address, "0")
    assert "in place (same pods, coordinator " + address in result.format_timeline()


def test_recreate_stays_the_default_with_a_port_per_attempt(tmp_path: Path) -> None:
    result = launch(
        2,
        1,
        args=["train"],
        max_restarts=1,
        python=stand_in(tmp_path, 2),
        log_dir=str(tmp_path / "logs"),
        grace_s=1,
    )
    assert result.succeeded and result.restarts == 1, result.format_timeline()
    for attempt in (0, 1):
        addresses = {v[0] for v in seen(result, attempt).values()}
        assert addresses == {result.attempts[attempt].coordinator}
    assert "in place" not in result.format_timeline()


def test_an_unknown_restart_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="restart='InPlace': choose one of recreate, in_place"):
        launch(1, 1, args=["train"], restart="InPlace")  # type: ignore[arg-type]


def test_the_command_line_restarts_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["--slices", "2", "--hosts-per-slice", "1", "--max-restarts", "1", "--restart",
         "in-place", "--quiet", "--log-dir", str(tmp_path / "logs"), "--", "train", "--bogus"]
    )  # fmt: skip
    # A bad flag is fatal (78, never retried): what is checked is that the mode got through.
    assert code == exitcodes.EXIT_CONFIG_ERROR
    assert "max 1 restarts in place" in capsys.readouterr().out


def test_a_port_in_time_wait_is_bindable_as_the_coordinator_binds_it() -> None:
    """The previous coordinator closes its connections first when it exits: they stay in
    TIME_WAIT on its port for a minute. A plain bind of that port fails; the coordinator's bind
    (gRPC: SO_REUSEADDR) does not, so an in-place restart can reuse the port at once. A port
    still listened on is not bindable."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert not port_bindable(port)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: its end goes to TIME_WAIT
        client.recv(1)  # the FIN
        client.close()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the TIME_WAIT is really there
    assert port_bindable(port)


def test_an_in_place_restart_rejoins_the_same_coordinator_and_loads_its_programs(
    tmp_path: Path,
) -> None:
    """Process 1 fails after step 7; the step-6 checkpoint is settled before step 7 on both
    processes. Both start again in place: the same coordinator address, a restore from step 6,
    and process 0 loads the programs of attempt 0 from the compilation cache under the checkpoint
    directory (empty before attempt 0)."""
    ckpt = tmp_path / "ckpt"
    result = launch(
        2,
        1,
        2,
        args=["train", *TINY, "--steps", "9", "--checkpoint_every", "3", "--log_every", "3"],
        parallelism=Parallelism(ici_fsdp=2, dcn_data=2),
        max_restarts=1,
        restart="in_place",
        fail_process=1,
        fail_at_step=7,
        faults={p: {contract.SETTLE_SAVE_AT_STEP: "6"} for p in (0, 1)},
        checkpoint_dir=str(ckpt),
        log_dir=str(tmp_path / "logs"),
        timeout_s=600,
        grace_s=1,
    )
    print(result.format_timeline())
    assert result.succeeded and result.restarts == 1, result.format_timeline()
    assert result.attempts[0].first_failure == (1, exitcodes.EXIT_INJECTED_FAILURE)
    configs = {a: result.events_named("train_config", a) for a in (0, 1)}
    assert all(sorted(e["launch_process"] for e in configs[a]) == [0, 1] for a in (0, 1))
    # What JAX joined, per attempt and process: one address, the launcher's, on both attempts.
    joined = {(a, e["coordinator_address"]) for a in (0, 1) for e in configs[a]}
    address = result.attempts[0].coordinator
    assert joined == {(0, address), (1, address)}
    # The restore is the last checkpoint attempt 0 made durable.
    saved = [e["step"] for e in result.events_named("checkpoint_saved", 0)]
    assert saved and max(saved) == 6
    restored = result.events_named("restored", 1)
    assert sorted(e["launch_process"] for e in restored) == [0, 1]
    assert {e["step"] for e in restored} == {max(saved)}
    # The cache: empty for attempt 0; on attempt 1 process 0 loads the init and step programs.
    # Process 0 alone writes entries (jax/_src/compiler.py, _cache_write), and on CPU the key
    # hashes a topology fingerprint that differs per process, so process 1 compiles again here.
    hits = {
        a: {e["launch_process"]: e["compilation_cache_hits"] for e in configs[a]} for a in (0, 1)
    }
    assert hits[0] == {0: 0, 1: 0}
    assert hits[1][0] >= 2
    seconds = {a: {e["launch_process"]: e["compile_seconds"] for e in configs[a]} for a in (0, 1)}
    print(f"cache hits {hits}; train-step compile seconds by attempt and process {seconds}")
    finished = result.events_named("finished", 1)
    assert sorted((e["launch_process"], e["step"]) for e in finished) == [(0, 9), (1, 9)]
