"""Local multislice launcher: S slices x H hosts as S x H processes on this machine.

Stands in for GKE + JobSet when there is no TPU: every process gets exactly the environment the
operator injects (with 127.0.0.1 for every host), JAX runs on CPU with D forced host devices per
process, and the JobSet failure policy is reproduced: when any process fails, all of them are
stopped and restarted together with MULTISLICE_RESTART_ATTEMPT incremented, up to --max-restarts,
except after exit 78 (fatal configuration error), which is never retried. `--restart` says how:
``recreate`` (JobSet's Recreate: new pods, here a new coordinator port per attempt) or
``in-place`` (JobSet's InPlaceRestart: the same pods, so the same coordinator address and port;
see `RESTART_MODES`). Each process also gets
what a pod would: a pod-info directory with an ``annotations`` file (the downward API volume; write
a checkpoint request there) and a termination-message file, both under the log directory.

    python -m multislice_workload.local --slices 2 --hosts-per-slice 2 --devices-per-host 2 \\
        --max-restarts 2 --fail-process 3 --fail-at-step 12 --checkpoint-dir /tmp/ckpt \\
        -- train --steps 30 --checkpoint_every 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO, get_args

from multislice_workload import env as contract
from multislice_workload import exitcodes, logs, podinfo, termination

LOCALHOST = "127.0.0.1"
DEFAULT_TIMEOUT_S = 900.0
DEFAULT_GRACE_S = 3.0
# How all processes start again after a failure, as JobSet's failurePolicy.restartStrategy:
# - recreate: Recreate, new Jobs and pods: the coordinator's hostname stays, the pod behind it
#   (its IP) is new; here a new coordinator port per attempt stands for that.
# - in_place: InPlaceRestart (JobSet >= v0.11, KEP-467, kubernetes-sigs/jobset v0.12.0
#   keps/467-InPlaceRestart, site/static/examples/in-place-restart/): the kubelet restarts every
#   container of the pods where they are, so pod names, hostnames, IPs and the pod-info volume
#   stay, and so does the coordinator's address and port. What moves is the pod annotation
#   `jobset.sigs.k8s.io/in-place-restart-attempt`, written by JobSet's agent on each start
#   (cmd/in-place-restart-agent/main.go: the JobSet's currentInPlaceRestartAttempt + 1, 0 at first;
#   the `restart-attempt` label moves only when Jobs are recreated); the operator maps it to
#   MULTISLICE_RESTART_ATTEMPT (operator render/inplace.py), which this launcher sets likewise.
RestartMode = Literal["recreate", "in_place"]
RESTART_MODES: tuple[str, ...] = get_args(RestartMode)
# In place, the restarted coordinator binds the port its predecessor held: how long to wait for it.
PORT_REUSE_WAIT_S = 30.0
# Events worth a line in the timeline (from process 0 unless they concern one process).
_TIMELINE_EVENTS = {"restored", "fresh_start", "preempted", "finished", "shardings_result"}
_PER_PROCESS_EVENTS = {
    "injected_failure",
    "injected_preemption",
    "injected_hang",
    "injected_delay",
    "injected_kill_in_save",
    "config_error",
    "crash",
    "hang",
    "checkpoint_request_saved",
}


@dataclasses.dataclass
class ProcessRecord:
    process_id: int
    slice_id: int
    worker_id: int
    log_path: Path
    exit_code: int | None = None


@dataclasses.dataclass
class AttemptResult:
    attempt: int
    processes: list[ProcessRecord]
    outcome: str = "running"  # succeeded | failed | fatal | timeout
    first_failure: tuple[int, int] | None = None  # (process id, exit code)
    seconds: float = 0.0
    coordinator: str = ""  # JAX_COORDINATOR_ADDRESS of this attempt (host:port)

    @property
    def exit_codes(self) -> dict[int, int | None]:
        return {p.process_id: p.exit_code for p in self.processes}


@dataclasses.dataclass
class LaunchResult:
    exit_code: int
    attempts: list[AttemptResult]
    events: list[dict[str, Any]]
    timeline: list[tuple[float, str]]
    log_dir: Path

    @property
    def succeeded(self) -> bool:
        return self.exit_code == exitcodes.EXIT_OK

    @property
    def restarts(self) -> int:
        return len(self.attempts) - 1

    def events_named(self, name: str, attempt: int | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e.get("event") == name and (attempt is None or e.get("launch_attempt") == attempt)
        ]

    def format_timeline(self) -> str:
        lines = [f"{t:8.2f}s  {text}" for t, text in self.timeline]
        return "\n".join(["timeline:", *lines])

    def termination_messages(self, attempt: int) -> dict[int, dict[str, Any] | None]:
        """Each process's termination message of one attempt (None: none written)."""
        out: dict[int, dict[str, Any] | None] = {}
        for record in self.attempts[attempt].processes:
            path = termination_path(self.log_dir, attempt, record.process_id)
            out[record.process_id] = json.loads(path.read_text()) if path.exists() else None
        return out


@dataclasses.dataclass(frozen=True)
class Layout:
    slices: int
    hosts_per_slice: int
    devices_per_host: int

    @property
    def processes(self) -> int:
        return self.slices * self.hosts_per_slice

    def identity(self, process_id: int) -> tuple[int, int]:
        """(slice id, worker id) for a process id (slice id x hosts per slice + worker id)."""
        return divmod(process_id, self.hosts_per_slice)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])


def port_bindable(port: int) -> bool:
    """Whether JAX's coordinator could listen on `port` now. It binds as gRPC binds: on every
    address (jax/_src/distributed.py: ``[::]:<port>``) with SO_REUSEADDR (grpc
    src/core/lib/iomgr/tcp_server_utils_posix_common.cc, grpc_tcp_server_prepare_socket), so the
    connections of the previous coordinator left in TIME_WAIT do not block it; a listener does."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # no IPv6 on this machine: gRPC then binds IPv4
            continue
        with sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
                sock.listen()
            except OSError:
                return False
            return True
    return False


def wait_port_bindable(port: int, timeout_s: float = PORT_REUSE_WAIT_S) -> float | None:
    """Seconds waited until `port` could be listened on (0.0: at once); None if it never was."""
    start = time.monotonic()
    while True:
        if port_bindable(port):
            return time.monotonic() - start
        if time.monotonic() - start >= timeout_s:
            return None
        time.sleep(0.2)


def default_parallelism(layout: Layout) -> contract.Parallelism:
    # The overview's recommendation: FSDP inside a slice, pure data parallelism across slices.
    return contract.Parallelism(
        ici_fsdp=layout.hosts_per_slice * layout.devices_per_host, dcn_data=layout.slices
    )


def check_layout(layout: Layout, extra_env: Mapping[str, str]) -> None:
    """An env read back from the apiserver must describe the layout we are about to start."""
    expected = {
        contract.NUM_SLICES: layout.slices,
        contract.HOSTS_PER_SLICE: layout.hosts_per_slice,
        contract.CHIPS_PER_HOST: layout.devices_per_host,
    }
    wrong = [
        f"{name}={extra_env[name]} but the launcher starts {value}"
        for name, value in expected.items()
        if name in extra_env and str(extra_env[name]).strip() != str(value)
    ]
    if wrong:
        raise ValueError("extra_env disagrees with the local layout: " + "; ".join(wrong))


def pod_name(job_name: str, layout: Layout, process_id: int) -> str:
    """What JobSet would call the pod: <jobset>-<replicatedJob>-<slice>-<worker>."""
    slice_id, worker_id = layout.identity(process_id)
    return f"{job_name}-slice-{slice_id}-{worker_id}"


def podinfo_path(log_dir: Path, process_id: int) -> Path:
    """The stand-in for a pod's downward API volume (kept across attempts, like annotations)."""
    return log_dir / "podinfo" / f"process{process_id}"


def termination_path(log_dir: Path, attempt: int, process_id: int) -> Path:
    return log_dir / "termination" / f"attempt{attempt}-process{process_id}.json"


def request_checkpoint(log_dir: Path, request_id: str, processes: Sequence[int]) -> None:
    """Put a checkpoint-request annotation into these processes' pod-info files, as the kubelet
    would after ``kubectl annotate`` (hosts can see it at different times)."""
    for process_id in processes:
        directory = podinfo_path(log_dir, process_id)
        directory.mkdir(parents=True, exist_ok=True)
        text = podinfo.format_annotations({podinfo.REQUEST_ANNOTATION: request_id})
        tmp = directory / "annotations.tmp"
        tmp.write_text(text)
        tmp.replace(directory / podinfo.ANNOTATIONS_FILE)  # atomic, as the kubelet's swap


def _xla_flags(existing: str, devices: int) -> str:
    kept = [f for f in existing.split() if not f.startswith("--xla_force_host_platform_device")]
    return " ".join([*kept, f"--xla_force_host_platform_device_count={devices}"])


def process_env(
    layout: Layout,
    process_id: int,
    *,
    attempt: int,
    jax_port: int,
    parallelism: contract.Parallelism,
    job_name: str,
    checkpoint_dir: str | None,
    extra_env: Mapping[str, str],
    faults: Mapping[str, str],
    base_env: Mapping[str, str],
    pod: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Contract defaults, then the caller's overrides, then what only the launcher can know
    (`pod`: the pod-info directory, pod name and namespace, termination-message path)."""
    slice_id, worker_id = layout.identity(process_id)
    hosts = [LOCALHOST] * layout.hosts_per_slice
    defaults = contract.build_contract_env(
        num_slices=layout.slices,
        hosts_per_slice=layout.hosts_per_slice,
        chips_per_host=layout.devices_per_host,
        slice_id=slice_id,
        worker_id=worker_id,
        parallelism=parallelism,
        worker_hostnames=hosts,
        coordinator_host=LOCALHOST,
        jax_port=jax_port,
        accelerator="cpu",
        job_name=job_name,
        checkpoint_dir=checkpoint_dir,
    )
    # Nothing of the parent's contract leaks in: a stale variable would silently win.
    inherited = {k: v for k, v in base_env.items() if k not in contract.CONTRACT_VARIABLES}
    for name in contract.FAULT_VARIABLES:
        inherited.pop(name, None)
    forced = {
        contract.SLICE_ID: str(slice_id),
        contract.WORKER_ID: str(worker_id),
        contract.MEGASCALE_COORDINATOR: LOCALHOST,
        contract.WORKER_HOSTNAMES: ",".join(hosts),
        contract.JAX_COORDINATOR: f"{LOCALHOST}:{jax_port}",
        contract.RESTART_ATTEMPT: str(attempt),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": _xla_flags(base_env.get("XLA_FLAGS", ""), layout.devices_per_host),
        "PYTHONUNBUFFERED": "1",
    }
    inherited.pop(termination.TERMINATION_LOG_ENV, None)
    return {
        **inherited,
        **defaults,
        **{k: str(v) for k, v in extra_env.items()},
        **forced,
        **(pod or {}),
        **faults,
    }


class _Run:
    """State of one launch: clock, timeline and the events parsed from every process."""

    def __init__(self, layout: Layout, log_dir: Path, echo: TextIO | None) -> None:
        self.layout = layout
        self.log_dir = log_dir
        self.echo = echo
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        self.timeline: list[tuple[float, str]] = []

    def note(self, text: str) -> None:
        with self.lock:
            self.timeline.append((time.monotonic() - self.start, text))

    def pump(self, proc: subprocess.Popen[str], record: ProcessRecord, attempt: int) -> None:
        """Copy one process's output to its log file (and, but for gloo's connection notices,
        the console), collecting events."""
        prefix = f"[a{attempt} s{record.slice_id}/h{record.worker_id}] "
        assert proc.stdout is not None
        with record.log_path.open("w") as log:
            for line in proc.stdout:
                log.write(line)
                if self.echo is not None and not _gloo_notice(line):
                    with self.lock:  # whole lines from concurrent processes
                        self.echo.write(prefix + line)
                event = logs.parse_line(line)
                if event is not None:
                    self._collect(event, record, attempt)

    def _collect(self, event: dict[str, Any], record: ProcessRecord, attempt: int) -> None:
        event = {**event, "launch_process": record.process_id, "launch_attempt": attempt}
        with self.lock:
            self.events.append(event)
        name = event["event"]
        who = f"attempt {attempt}: process {record.process_id}"
        if name in _PER_PROCESS_EVENTS or (name in _TIMELINE_EVENTS and record.process_id == 0):
            self.note(f"{who}: {_event_text(event)}")


# gloo prints a line per device for every group of devices it connects, on success ("[Gloo] Rank
# 3 is connected to 15 peer ranks. Expected number of connected peer ranks is : 15"), about forty
# per attempt here. Two of a process's threads write them at once, so one line can hold a notice
# with another's head spliced in and the next line start mid-notice ("nected to 3 peer ranks.
# Expected ..."). They stay in the processes' logs; on the console they buried what a run ended
# with (issue 56).
_GLOO_NOTICE = re.compile(r"\[Gloo\] Rank |peer ranks\. Expected number of connected peer ranks")


def _gloo_notice(line: str) -> bool:
    return _GLOO_NOTICE.search(line) is not None


def _event_text(event: dict[str, Any]) -> str:
    name = event["event"]
    if name == "shardings_result":
        return (
            f"shardings {event['tflops_per_device']:.4f} TFLOP/s per device over "
            f"{event['global_devices']} devices, MFU {100 * event['mfu']:.1f}%"
        )
    detail = event.get("message") or event.get("error")
    if detail:
        return f"{name}: {detail}"
    return f"{name} at step {event['step']}" if "step" in event else name


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    labels = {
        exitcodes.EXIT_CONFIG_ERROR: "fatal configuration error",
        exitcodes.EXIT_PREEMPTED: "preempted, checkpoint saved",
        exitcodes.EXIT_INJECTED_FAILURE: "injected failure",
        exitcodes.EXIT_RESTART_REQUESTED: "restart requested",
        exitcodes.EXIT_HANG: "hang watchdog",
        exitcodes.EXIT_CRASH: "crash",
    }
    return f"exited {code}" + (f" ({labels[code]})" if code in labels else "")


def _stop(procs: Sequence[subprocess.Popen[str]], grace_s: float) -> None:
    """SIGTERM, then SIGKILL after the grace period: what the kubelet does to a deleted pod."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in alive:
        if p.poll() is None:
            p.kill()
    for p in alive:
        p.wait()


def _run_attempt(
    run: _Run,
    attempt: int,
    envs: list[dict[str, str]],
    command: list[str],
    deadline: float,
    grace_s: float,
) -> AttemptResult:
    layout = run.layout
    records = [
        ProcessRecord(i, *layout.identity(i), run.log_dir / f"attempt{attempt}-process{i}.log")
        for i in range(layout.processes)
    ]
    result = AttemptResult(attempt, records)
    procs: list[subprocess.Popen[str]] = []
    pumps: list[threading.Thread] = []
    started = time.monotonic()
    try:
        for record, env in zip(records, envs, strict=True):
            proc = subprocess.Popen(
                command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            procs.append(proc)
            pump = threading.Thread(target=run.pump, args=(proc, record, attempt), daemon=True)
            pump.start()
            pumps.append(pump)
        run.note(f"attempt {attempt}: started {len(procs)} processes")
        _watch(run, result, _Exits(procs), deadline, grace_s)
    finally:
        _stop(procs, grace_s=0)  # never leave a process behind, whatever happened above
        for pump in pumps:
            pump.join(timeout=5)
    for record, proc in zip(records, procs, strict=True):
        record.exit_code = proc.returncode
    result.seconds = time.monotonic() - started
    return result


class _Exits:
    """Exit order of the processes, as it happened.

    When one process crashes its peers fail right after it (a collective loses a member), often
    within one polling interval; a waiter thread per process timestamps each exit so the failure
    blamed is the first one, not the lowest process id.
    """

    def __init__(self, procs: list[subprocess.Popen[str]]) -> None:
        self.procs = procs
        self._lock = threading.Lock()
        self._order: list[int] = []
        for index, proc in enumerate(procs):
            threading.Thread(target=self._wait, args=(index, proc), daemon=True).start()

    def _wait(self, index: int, proc: subprocess.Popen[str]) -> None:
        proc.wait()
        with self._lock:
            self._order.append(index)

    def exited(self) -> list[tuple[int, int]]:
        """(process id, exit code) in exit order."""
        with self._lock:
            order = list(self._order)
        return [(i, int(self.procs[i].returncode)) for i in order]


def _watch(
    run: _Run,
    result: AttemptResult,
    exits: _Exits,
    deadline: float,
    grace_s: float,
) -> None:
    """Wait until all processes succeed, one fails (then stop the rest) or time runs out."""
    procs = exits.procs
    while True:
        exited = exits.exited()
        failed = [(i, code) for i, code in exited if code != 0]
        if failed:
            process_id, code = failed[0]
            result.first_failure = (process_id, code)
            result.outcome = "fatal" if code == exitcodes.EXIT_CONFIG_ERROR else "failed"
            run.note(f"attempt {result.attempt}: process {process_id} {_describe_exit(code)}")
            survivors = len(procs) - len(exited)
            if survivors:
                run.note(f"attempt {result.attempt}: stopping {survivors} other processes")
            _stop(procs, grace_s)
            return
        if len(exited) == len(procs):
            result.outcome = "succeeded"
            run.note(f"attempt {result.attempt}: all {len(procs)} processes exited 0")
            return
        if time.monotonic() > deadline:
            result.outcome = "timeout"
            run.note(f"attempt {result.attempt}: timed out, stopping every process")
            _stop(procs, grace_s)
            return
        time.sleep(0.05)


def launch(
    slices: int,
    hosts_per_slice: int,
    devices_per_host: int = 1,
    *,
    args: Sequence[str],
    extra_env: Mapping[str, str] | None = None,
    max_restarts: int = 0,
    fail_process: int | None = None,
    fail_at_step: int | None = None,
    preempt_process: int | None = None,
    preempt_at_step: int | None = None,
    faults: Mapping[int, Mapping[str, str]] | None = None,
    checkpoint_request: str | None = None,
    checkpoint_request_processes: Sequence[int] | None = None,
    checkpoint_dir: str | None = None,
    parallelism: contract.Parallelism | None = None,
    job_name: str = "local",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    grace_s: float = DEFAULT_GRACE_S,
    log_dir: str | None = None,
    echo: TextIO | None = None,
    python: str = sys.executable,
    restart: RestartMode = "recreate",
) -> LaunchResult:
    """Run `python -m multislice_workload *args` on every process, restarting like a JobSet.

    `restart`: "recreate" (a new coordinator port per attempt) or "in_place" (the same pods:
    the same coordinator address and port on every attempt; `RestartMode`). `extra_env`
    overrides contract variables for every process (e.g. an environment read back from the
    apiserver); identity and addresses stay the launcher's own. `faults` adds test-hook
    variables per process id (first attempt only), e.g. ``{1: {HANG_AT_STEP: "5"}}``.
    `checkpoint_request` is written, before the start, into the pod-info annotations of
    `checkpoint_request_processes` (default: all). Raises ValueError when `extra_env` describes
    another layout than slices x hosts x devices.
    """
    if restart not in RESTART_MODES:
        raise ValueError(f"restart={restart!r}: choose one of {', '.join(RESTART_MODES)}")
    layout = Layout(slices, hosts_per_slice, devices_per_host)
    extra = dict(extra_env or {})
    check_layout(layout, extra)
    injected = _faults(layout, fail_process, fail_at_step, preempt_process, preempt_at_step)
    for process_id, variables in (faults or {}).items():
        _check_process(layout, "fault", process_id)
        injected.setdefault(process_id, {}).update(variables)
    logs_path = Path(log_dir or tempfile.mkdtemp(prefix="multislice-local-"))
    logs_path.mkdir(parents=True, exist_ok=True)
    if checkpoint_request is not None:
        targets = checkpoint_request_processes
        request_checkpoint(
            logs_path, checkpoint_request, range(layout.processes) if targets is None else targets
        )
    run = _Run(layout, logs_path, echo)
    run.note(
        f"job {job_name}: {slices} slices x {hosts_per_slice} hosts x {devices_per_host} devices,"
        f" max {max_restarts} restarts"
        + (" in place" if restart == "in_place" else "")
        + f", logs in {logs_path}"
    )
    command = [python, "-m", "multislice_workload", *args]
    ckpt = os.path.abspath(checkpoint_dir) if checkpoint_dir else None
    deadline = time.monotonic() + timeout_s
    attempts: list[AttemptResult] = []
    port = free_port()
    for attempt in range(max_restarts + 1):
        if restart == "recreate":
            port = free_port()
        elif attempt > 0:
            port = _reuse_port(run, port)
        envs = [
            process_env(
                layout,
                i,
                attempt=attempt,
                jax_port=port,
                parallelism=parallelism or default_parallelism(layout),
                job_name=job_name,
                checkpoint_dir=ckpt,
                extra_env=extra,
                # Injected faults model one-off events: only the first attempt sees them.
                faults=injected.get(i, {}) if attempt == 0 else {},
                base_env=os.environ,
                pod=_pod_env(logs_path, layout, i, attempt, job_name),
            )
            for i in range(layout.processes)
        ]
        result = _run_attempt(run, attempt, envs, command, deadline, grace_s)
        result.coordinator = f"{LOCALHOST}:{port}"
        attempts.append(result)
        if result.outcome in ("succeeded", "fatal", "timeout"):
            break
        if attempt < max_restarts:
            how = (
                f" in place (same pods, coordinator {result.coordinator})"
                if restart == "in_place"
                else ""
            )
            run.note(f"restarting all processes{how} (restart {attempt + 1} of {max_restarts})")
    code = _final_code(attempts[-1])
    run.note(f"result: {attempts[-1].outcome}, exit {code}, {len(attempts) - 1} restarts")
    return LaunchResult(code, attempts, run.events, run.timeline, logs_path)


def _reuse_port(run: _Run, port: int) -> int:
    """The port for an in-place attempt: the previous one, once the restarted coordinator can
    bind it. Every process of the previous attempt has exited (`_stop` waits), so only its
    connections in TIME_WAIT remain, which SO_REUSEADDR ignores. A pod's network namespace is its
    own; this machine's is shared, and another program may have taken the port meanwhile: then,
    and said so, a new one."""
    waited = wait_port_bindable(port)
    if waited is None:
        moved = free_port()
        run.note(
            f"port {port} still taken after {PORT_REUSE_WAIT_S:.0f} s by another program on this "
            f"machine (a pod's own network namespace could not see it): coordinator moves to "
            f"{LOCALHOST}:{moved}"
        )
        return moved
    if waited > 0.5:
        run.note(f"port {port} free for the coordinator again after {waited:.1f} s")
    return port


def _pod_env(
    log_dir: Path, layout: Layout, process_id: int, attempt: int, job_name: str
) -> dict[str, str]:
    info = podinfo_path(log_dir, process_id)
    info.mkdir(parents=True, exist_ok=True)
    return {
        contract.PODINFO_DIR: str(info),
        contract.POD_NAME: pod_name(job_name, layout, process_id),
        contract.POD_NAMESPACE: "default",
        termination.TERMINATION_LOG_ENV: str(termination_path(log_dir, attempt, process_id)),
    }


def _check_process(layout: Layout, label: str, process: int) -> None:
    if not 0 <= process < layout.processes:
        raise ValueError(f"{label}_process {process} is not in 0..{layout.processes - 1}")


def _faults(
    layout: Layout,
    fail_process: int | None,
    fail_at_step: int | None,
    preempt_process: int | None,
    preempt_at_step: int | None,
) -> dict[int, dict[str, str]]:
    """Per-process fault variables; both halves of each (process, step) pair must be given."""
    out: dict[int, dict[str, str]] = {}
    pairs = (
        ("fail", fail_process, fail_at_step, contract.FAIL_AT_STEP),
        ("preempt", preempt_process, preempt_at_step, contract.PREEMPT_AT_STEP),
    )
    for label, process, step, variable in pairs:
        if (process is None) != (step is None):
            raise ValueError(f"{label}_process and {label}_at_step go together")
        if process is None or step is None:
            continue
        _check_process(layout, label, process)
        out.setdefault(process, {})[variable] = str(step)
    return out


def _final_code(last: AttemptResult) -> int:
    if last.outcome == "succeeded":
        return exitcodes.EXIT_OK
    if last.outcome == "timeout":
        return 124
    assert last.first_failure is not None
    code = last.first_failure[1]
    return code if code > 0 else 128 - code


# --- Command line. --------------------------------------------------------------------------------


def _parse_env(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--env expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m multislice_workload.local",
        description=__doc__.splitlines()[0],
        usage="%(prog)s --slices S --hosts-per-slice H [options] -- {shardings,train} [flags]",
    )
    p.add_argument("--slices", type=int, required=True)
    p.add_argument("--hosts-per-slice", type=int, required=True)
    p.add_argument("--devices-per-host", type=int, default=1)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument(
        "--restart",
        choices=[m.replace("_", "-") for m in RESTART_MODES],
        default="recreate",
        help="recreate: a new coordinator port per attempt (JobSet Recreate); in-place: the same "
        "pods, coordinator address and port (JobSet InPlaceRestart)",
    )
    p.add_argument("--fail-process", type=int, default=None)
    p.add_argument("--fail-at-step", type=int, default=None)
    p.add_argument("--preempt-process", type=int, default=None)
    p.add_argument("--preempt-at-step", type=int, default=None)
    p.add_argument("--hang-process", type=int, default=None)
    p.add_argument("--hang-at-step", type=int, default=None)
    p.add_argument(
        "--checkpoint-request", default=None, metavar="ID", help="annotate before the start"
    )
    p.add_argument(
        "--checkpoint-request-process",
        type=int,
        action="append",
        default=None,
        help="only these processes see the request (default: all)",
    )
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--job-name", default="local")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--grace", type=float, default=DEFAULT_GRACE_S, help="SIGTERM to SIGKILL, s")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--quiet", action="store_true", help="do not echo process output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    opts = build_parser().parse_args(argv[:split])
    workload_args = argv[split + 1 :]
    if not workload_args:
        build_parser().error("give the workload command after --, e.g. -- train --steps 20")
    if (opts.hang_process is None) != (opts.hang_at_step is None):
        build_parser().error("--hang-process and --hang-at-step go together")
    hang: dict[int, dict[str, str]] = {}
    if opts.hang_process is not None:
        hang[opts.hang_process] = {contract.HANG_AT_STEP: str(opts.hang_at_step)}
    result = launch(
        opts.slices,
        opts.hosts_per_slice,
        opts.devices_per_host,
        args=workload_args,
        extra_env=_parse_env(opts.env),
        faults=hang,
        checkpoint_request=opts.checkpoint_request,
        checkpoint_request_processes=opts.checkpoint_request_process,
        max_restarts=opts.max_restarts,
        fail_process=opts.fail_process,
        fail_at_step=opts.fail_at_step,
        preempt_process=opts.preempt_process,
        preempt_at_step=opts.preempt_at_step,
        checkpoint_dir=opts.checkpoint_dir,
        job_name=opts.job_name,
        timeout_s=opts.timeout,
        grace_s=opts.grace,
        log_dir=opts.log_dir,
        echo=None if opts.quiet else sys.stdout,
        restart="in_place" if opts.restart == "in-place" else "recreate",
    )
    print(result.format_timeline())
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
