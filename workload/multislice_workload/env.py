"""The operator's environment contract, read and checked once at start-up.

The operator injects the same variables into every pod of a multislice job; only the identity
(slice id, worker id) differs between pods. Everything the program needs to know about the
topology comes from here, so one manifest runs on 1 or 256 slices unchanged.

No JAX import here: the launcher and the tests use this module without starting a backend.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import TypedDict

# --- Variable names (the contract). -------------------------------------------------------------
NUM_SLICES = "MEGASCALE_NUM_SLICES"
SLICE_ID = "MEGASCALE_SLICE_ID"
MEGASCALE_COORDINATOR = "MEGASCALE_COORDINATOR_ADDRESS"
MEGASCALE_PORT = "MEGASCALE_PORT"
WORKER_ID = "TPU_WORKER_ID"
WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
JAX_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
PROCESS_COUNT = "JAX_PROCESS_COUNT"
HOSTS_PER_SLICE = "MULTISLICE_HOSTS_PER_SLICE"
CHIPS_PER_HOST = "MULTISLICE_CHIPS_PER_HOST"
CHIPS_PER_SLICE = "MULTISLICE_CHIPS_PER_SLICE"
ACCELERATOR = "MULTISLICE_ACCELERATOR"
JOB_NAME = "MULTISLICE_JOB_NAME"
CHECKPOINT_DIR = "MULTISLICE_CHECKPOINT_DIR"
RESTART_ATTEMPT = "MULTISLICE_RESTART_ATTEMPT"
ICI_DATA = "MULTISLICE_ICI_DATA"
ICI_FSDP = "MULTISLICE_ICI_FSDP"
ICI_TENSOR = "MULTISLICE_ICI_TENSOR"
DCN_DATA = "MULTISLICE_DCN_DATA"
DCN_FSDP = "MULTISLICE_DCN_FSDP"
DCN_PIPELINE = "MULTISLICE_DCN_PIPELINE"
DCN_TENSOR = "MULTISLICE_DCN_TENSOR"
# Rendered by the operator from the downward API for checkpoints on demand (docs/environment.md
# sections 3, 5); absent in local runs, where the launcher may set them.
PODINFO_DIR = "MULTISLICE_PODINFO_DIR"
POD_NAME = "MULTISLICE_POD_NAME"
POD_NAMESPACE = "MULTISLICE_POD_NAMESPACE"
# Not injected by the operator: test/demo hooks, honoured only on restart attempt 0, each acting
# after step K: crash (exit 13); SIGTERM to itself (a preemption); hang forever (the watchdog's
# case); ask for a restart (exit 42); SIGKILL itself while a checkpoint of step K is being written;
# wait until its own checkpoint of step K is written before step K + 1 (so a fault injected later,
# on any process, finds step K committed instead of racing its background write). One more acts
# before any step: sleep S seconds at a point of the start-up, MULTISLICE_DELAY_PHASE (a process far
# behind its peers, as on a busy machine; `DELAY_PHASES`).
FAIL_AT_STEP = "MULTISLICE_FAIL_AT_STEP"
PREEMPT_AT_STEP = "MULTISLICE_PREEMPT_AT_STEP"
HANG_AT_STEP = "MULTISLICE_HANG_AT_STEP"
RESTART_AT_STEP = "MULTISLICE_RESTART_AT_STEP"
KILL_IN_SAVE_AT_STEP = "MULTISLICE_KILL_IN_SAVE_AT_STEP"
SETTLE_SAVE_AT_STEP = "MULTISLICE_SETTLE_SAVE_AT_STEP"
DELAY_START_SECONDS = "MULTISLICE_DELAY_START_SECONDS"
DELAY_PHASE = "MULTISLICE_DELAY_PHASE"
# Where that sleep happens; each phase ends at a first collective of the run. compile: after
# joining jax.distributed, before compiling; setup: after compiling, before the set-up that ends
# in the checkpointer's first collective; first_step: with the state built, before the first step.
DELAY_PHASES: tuple[str, ...] = ("compile", "setup", "first_step")
# The one process whose hooks act (slice x hosts per slice + worker; unset: every process): a
# pod template is the same for every pod, so a real job fails one container with it.
FAULT_PROCESS = "MULTISLICE_FAULT_PROCESS"
FAULT_VARIABLES: tuple[str, ...] = (
    FAIL_AT_STEP,
    PREEMPT_AT_STEP,
    HANG_AT_STEP,
    RESTART_AT_STEP,
    KILL_IN_SAVE_AT_STEP,
    SETTLE_SAVE_AT_STEP,
    DELAY_START_SECONDS,
    DELAY_PHASE,
    FAULT_PROCESS,
)

PARALLELISM_VARIABLES: tuple[str, ...] = (
    ICI_DATA,
    ICI_FSDP,
    ICI_TENSOR,
    DCN_DATA,
    DCN_FSDP,
    DCN_PIPELINE,
    DCN_TENSOR,
)
REQUIRED_VARIABLES: tuple[str, ...] = (
    NUM_SLICES,
    SLICE_ID,
    MEGASCALE_COORDINATOR,
    MEGASCALE_PORT,
    WORKER_ID,
    WORKER_HOSTNAMES,
    JAX_COORDINATOR,
    PROCESS_COUNT,
    HOSTS_PER_SLICE,
    CHIPS_PER_HOST,
    CHIPS_PER_SLICE,
    ACCELERATOR,
    JOB_NAME,
    *PARALLELISM_VARIABLES,
)
OPTIONAL_VARIABLES: tuple[str, ...] = (
    CHECKPOINT_DIR,
    RESTART_ATTEMPT,
    PODINFO_DIR,
    POD_NAME,
    POD_NAMESPACE,
)
CONTRACT_VARIABLES: tuple[str, ...] = REQUIRED_VARIABLES + OPTIONAL_VARIABLES

DEFAULT_MEGASCALE_PORT = 8080
DEFAULT_JAX_PORT = 8476


class ConfigError(ValueError):
    """Missing or inconsistent configuration. The program exits with EXIT_CONFIG_ERROR (78)."""


@dataclasses.dataclass(frozen=True)
class Parallelism:
    """Shards per parallelism kind, inside a slice (ICI) and across slices (DCN)."""

    ici_data: int = 1
    ici_fsdp: int = 1
    ici_tensor: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1
    dcn_pipeline: int = 1
    dcn_tensor: int = 1

    @property
    def ici_product(self) -> int:
        return self.ici_data * self.ici_fsdp * self.ici_tensor

    @property
    def dcn_product(self) -> int:
        return self.dcn_data * self.dcn_fsdp * self.dcn_pipeline * self.dcn_tensor

    def problems(self, num_slices: int, chips_per_slice: int) -> list[str]:
        """Why this layout cannot fill `num_slices` slices of `chips_per_slice` chips."""
        out = [
            f"{f.name}_parallelism must be >= 1, got {getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) < 1
        ]
        if self.ici_product != chips_per_slice:
            out.append(
                f"ICI parallelism data x fsdp x tensor = {self.ici_data} x {self.ici_fsdp} x "
                f"{self.ici_tensor} = {self.ici_product} must equal the chips per slice "
                f"({chips_per_slice})"
            )
        if self.dcn_product != num_slices:
            out.append(
                f"DCN parallelism data x fsdp x pipeline x tensor = {self.dcn_data} x "
                f"{self.dcn_fsdp} x {self.dcn_pipeline} x {self.dcn_tensor} = "
                f"{self.dcn_product} must equal the number of slices ({num_slices})"
            )
        return out

    def check(self, num_slices: int, chips_per_slice: int) -> None:
        problems = self.problems(num_slices, chips_per_slice)
        if problems:
            raise ConfigError("; ".join(problems))

    def replace(self, **overrides: int | None) -> Parallelism:
        """Copy with the non-None overrides applied (CLI flags over environment)."""
        return dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})


@dataclasses.dataclass(frozen=True)
class WorkloadEnv:
    """Everything one process knows about the job, after validation."""

    num_slices: int
    slice_id: int
    hosts_per_slice: int
    worker_id: int
    chips_per_host: int
    worker_hostnames: tuple[str, ...]
    megascale_coordinator: str
    megascale_port: int
    jax_coordinator: str
    process_count: int
    accelerator: str
    job_name: str
    parallelism: Parallelism
    checkpoint_dir: str | None = None
    restart_attempt: int = 0
    fail_at_step: int | None = None
    preempt_at_step: int | None = None
    hang_at_step: int | None = None
    restart_at_step: int | None = None
    kill_in_save_at_step: int | None = None
    settle_save_at_step: int | None = None
    delay_start_seconds: int | None = None
    delay_phase: str = DELAY_PHASES[0]
    podinfo_dir: str | None = None
    # True when no contract variable was set: a developer running one process by hand.
    standalone: bool = False

    @property
    def chips_per_slice(self) -> int:
        return self.hosts_per_slice * self.chips_per_host

    @property
    def process_id(self) -> int:
        return self.slice_id * self.hosts_per_slice + self.worker_id

    @property
    def global_chips(self) -> int:
        return self.num_slices * self.chips_per_slice

    @property
    def distributed(self) -> bool:
        return self.process_count > 1

    def summary(self) -> dict[str, object]:
        """Flat view for the start-up log line."""
        return {
            "job": self.job_name,
            "accelerator": self.accelerator,
            "slices": self.num_slices,
            "slice_id": self.slice_id,
            "hosts_per_slice": self.hosts_per_slice,
            "worker_id": self.worker_id,
            "process_id": self.process_id,
            "process_count": self.process_count,
            "chips_per_host": self.chips_per_host,
            "chips_per_slice": self.chips_per_slice,
            "restart_attempt": self.restart_attempt,
            "checkpoint_dir": self.checkpoint_dir,
            "standalone": self.standalone,
            **dataclasses.asdict(self.parallelism),
        }


# --- Parsing. ------------------------------------------------------------------------------------


class _Reader:
    """Collects every problem instead of stopping at the first, so one crash shows them all."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[str] = []

    def text(self, name: str, default: str | None = None) -> str:
        value = self.environ.get(name, "").strip()
        if value:
            return value
        if default is None:
            self.problems.append(f"{name} is not set")
            return ""
        return default

    def integer(self, name: str, default: int | None = None, minimum: int = 0) -> int:
        raw = self.environ.get(name, "").strip()
        if not raw:
            if default is None:
                self.problems.append(f"{name} is not set")
                return minimum
            return default
        try:
            value = int(raw)
        except ValueError:
            self.problems.append(f"{name}={raw!r} is not an integer")
            return minimum
        if value < minimum:
            self.problems.append(f"{name}={value} must be >= {minimum}")
            return minimum
        return value

    def optional_integer(self, name: str) -> int | None:
        return self.integer(name, minimum=0) if self.environ.get(name, "").strip() else None

    def choice(self, name: str, choices: tuple[str, ...]) -> str:
        """One of `choices` (unset: the first)."""
        value = self.environ.get(name, "").strip() or choices[0]
        if value not in choices:
            self.problems.append(f"{name}={value!r} must be one of {', '.join(choices)}")
            return choices[0]
        return value


def is_standalone(environ: Mapping[str, str]) -> bool:
    """No topology variable at all: a single process started by hand, not by the operator."""
    return not any(environ.get(name) for name in (NUM_SLICES, PROCESS_COUNT, HOSTS_PER_SLICE))


def from_environ(
    environ: Mapping[str, str], local_device_count: Callable[[], int] | None = None
) -> WorkloadEnv:
    """Read and validate the contract. Raises ConfigError listing every problem found.

    `local_device_count` is only called in standalone mode, where the chips of the single host are
    whatever JAX sees (it is a callable so the operator path never touches a backend early).
    """
    if is_standalone(environ):
        chips = local_device_count() if local_device_count else 1
        return _standalone(environ, chips)
    reader = _Reader(environ)
    env = _read_contract(reader)
    # Redundant with hosts x chips per host, so not a field: read to check they agree.
    declared_chips = reader.integer(CHIPS_PER_SLICE, minimum=1)
    problems = reader.problems or consistency_problems(env)
    if not reader.problems and declared_chips != env.chips_per_slice:
        problems.append(
            f"{CHIPS_PER_SLICE}={declared_chips} must equal {HOSTS_PER_SLICE} x {CHIPS_PER_HOST} "
            f"= {env.hosts_per_slice} x {env.chips_per_host} = {env.chips_per_slice}"
        )
    if problems:
        raise ConfigError("inconsistent multislice environment: " + "; ".join(problems))
    return env


def _read_parallelism(reader: _Reader, default_fsdp: int | None = None) -> Parallelism:
    # Operator path: every variable required. Standalone: all-FSDP inside the one slice.
    def get(name: str, default: int | None) -> int:
        return reader.integer(name, default=default, minimum=1)

    standalone = default_fsdp is not None
    return Parallelism(
        ici_data=get(ICI_DATA, 1 if standalone else None),
        ici_fsdp=get(ICI_FSDP, default_fsdp),
        ici_tensor=get(ICI_TENSOR, 1 if standalone else None),
        dcn_data=get(DCN_DATA, 1 if standalone else None),
        dcn_fsdp=get(DCN_FSDP, 1 if standalone else None),
        dcn_pipeline=get(DCN_PIPELINE, 1 if standalone else None),
        dcn_tensor=get(DCN_TENSOR, 1 if standalone else None),
    )


def _read_contract(reader: _Reader) -> WorkloadEnv:
    hostnames = tuple(h.strip() for h in reader.text(WORKER_HOSTNAMES).split(",") if h.strip())
    slice_id, hosts = reader.integer(SLICE_ID), reader.integer(HOSTS_PER_SLICE, minimum=1)
    worker = reader.integer(WORKER_ID)
    return WorkloadEnv(
        num_slices=reader.integer(NUM_SLICES, minimum=1),
        slice_id=slice_id,
        hosts_per_slice=hosts,
        worker_id=worker,
        chips_per_host=reader.integer(CHIPS_PER_HOST, minimum=1),
        worker_hostnames=hostnames,
        megascale_coordinator=reader.text(MEGASCALE_COORDINATOR),
        megascale_port=reader.integer(MEGASCALE_PORT, minimum=1),
        jax_coordinator=reader.text(JAX_COORDINATOR),
        process_count=reader.integer(PROCESS_COUNT, minimum=1),
        accelerator=reader.text(ACCELERATOR),
        job_name=reader.text(JOB_NAME),
        parallelism=_read_parallelism(reader),
        checkpoint_dir=reader.environ.get(CHECKPOINT_DIR, "").strip() or None,
        restart_attempt=reader.integer(RESTART_ATTEMPT, default=0),
        **_optional_fields(reader, slice_id * hosts + worker),
    )


class _OptionalFields(TypedDict):
    fail_at_step: int | None
    preempt_at_step: int | None
    hang_at_step: int | None
    restart_at_step: int | None
    kill_in_save_at_step: int | None
    settle_save_at_step: int | None
    delay_start_seconds: int | None
    delay_phase: str
    podinfo_dir: str | None


def _optional_fields(reader: _Reader, process_id: int | None = None) -> _OptionalFields:
    """Test hooks and the pod-info directory: the same in standalone and operator runs. The
    hooks are dropped in every process but MULTISLICE_FAULT_PROCESS when it is set."""
    chosen = reader.optional_integer(FAULT_PROCESS)
    acts = chosen is None or process_id is None or chosen == process_id

    def hook(name: str) -> int | None:
        value = reader.optional_integer(name)
        return value if acts else None

    return {
        "fail_at_step": hook(FAIL_AT_STEP),
        "preempt_at_step": hook(PREEMPT_AT_STEP),
        "hang_at_step": hook(HANG_AT_STEP),
        "restart_at_step": hook(RESTART_AT_STEP),
        "kill_in_save_at_step": hook(KILL_IN_SAVE_AT_STEP),
        "settle_save_at_step": hook(SETTLE_SAVE_AT_STEP),
        "delay_start_seconds": hook(DELAY_START_SECONDS),
        "delay_phase": reader.choice(DELAY_PHASE, DELAY_PHASES),
        "podinfo_dir": reader.environ.get(PODINFO_DIR, "").strip() or None,
    }


def consistency_problems(env: WorkloadEnv) -> list[str]:
    """Cross-variable checks: each variable can be well-formed and the set still be wrong."""
    out: list[str] = []
    if env.slice_id >= env.num_slices:
        out.append(f"{SLICE_ID}={env.slice_id} must be < {NUM_SLICES}={env.num_slices}")
    if env.worker_id >= env.hosts_per_slice:
        out.append(f"{WORKER_ID}={env.worker_id} must be < {HOSTS_PER_SLICE}={env.hosts_per_slice}")
    if len(env.worker_hostnames) != env.hosts_per_slice:
        out.append(
            f"{WORKER_HOSTNAMES} lists {len(env.worker_hostnames)} hosts, expected "
            f"{HOSTS_PER_SLICE}={env.hosts_per_slice}"
        )
    expected_processes = env.num_slices * env.hosts_per_slice
    if env.process_count != expected_processes:
        out.append(
            f"{PROCESS_COUNT}={env.process_count} must equal slices x hosts per slice = "
            f"{expected_processes}"
        )
    out += _address_problems(env)
    out += env.parallelism.problems(env.num_slices, env.chips_per_slice)
    expected = accelerator_chips(env.accelerator)
    if expected is not None and expected != env.chips_per_slice:
        out.append(
            f"{ACCELERATOR}={env.accelerator} has {expected} chips but hosts x chips per host = "
            f"{env.chips_per_slice}"
        )
    return out


def _address_problems(env: WorkloadEnv) -> list[str]:
    out: list[str] = []
    host, _, port = env.jax_coordinator.rpartition(":")
    if not host or not port.isdigit():
        out.append(f"{JAX_COORDINATOR}={env.jax_coordinator!r} must be host:port")
    if ":" in env.megascale_coordinator:
        # libtpu appends MEGASCALE_PORT itself; a port here would be doubled.
        out.append(f"{MEGASCALE_COORDINATOR}={env.megascale_coordinator!r} must not carry a port")
    return out


def _standalone(environ: Mapping[str, str], chips: int) -> WorkloadEnv:
    reader = _Reader(environ)
    env = WorkloadEnv(
        num_slices=1,
        slice_id=0,
        hosts_per_slice=1,
        worker_id=0,
        chips_per_host=chips,
        worker_hostnames=("localhost",),
        megascale_coordinator="localhost",
        megascale_port=DEFAULT_MEGASCALE_PORT,
        jax_coordinator=f"localhost:{DEFAULT_JAX_PORT}",
        process_count=1,
        accelerator=reader.text(ACCELERATOR, default="local"),
        job_name=reader.text(JOB_NAME, default="standalone"),
        parallelism=_read_parallelism(reader, default_fsdp=chips),
        checkpoint_dir=environ.get(CHECKPOINT_DIR, "").strip() or None,
        restart_attempt=reader.integer(RESTART_ATTEMPT, default=0),
        **_optional_fields(reader),
        standalone=True,
    )
    if reader.problems:
        raise ConfigError("; ".join(reader.problems))
    return env


# --- Accelerator names. --------------------------------------------------------------------------

# Cloud TPU counts TensorCores in v4/v5p/tpu7x names (2 per chip) and chips in v5e/v6e names
# (tpu7x-128 = 64 chips: xpk's system_characteristics.py, GKE's Ironwood pages).
_CORES_PER_NAME_UNIT = {"v4": 2, "v5p": 2, "v5litepod": 1, "v6e": 1, "tpu7x": 2}
_ACCELERATOR_RE = re.compile(r"^(v4|v5p|v5litepod|v6e|tpu7x)-(\d+)$")


def accelerator_chips(accelerator: str) -> int | None:
    """Chips in one slice of a Cloud TPU accelerator type, None for names we do not know."""
    match = _ACCELERATOR_RE.match(accelerator.strip())
    if not match:
        return None
    return math.ceil(int(match.group(2)) / _CORES_PER_NAME_UNIT[match.group(1)])


def accelerator_generation(accelerator: str) -> str | None:
    """'v4', 'v5e', 'v5p', 'v6e' or 'tpu7x' for a Cloud TPU accelerator type name."""
    match = _ACCELERATOR_RE.match(accelerator.strip())
    if not match:
        return None
    return {"v5litepod": "v5e"}.get(match.group(1), match.group(1))


# --- Building the contract (the local launcher; mirrors what the operator injects). -------------


def build_contract_env(
    *,
    num_slices: int,
    hosts_per_slice: int,
    chips_per_host: int,
    slice_id: int,
    worker_id: int,
    parallelism: Parallelism,
    worker_hostnames: list[str],
    coordinator_host: str,
    jax_port: int = DEFAULT_JAX_PORT,
    megascale_port: int = DEFAULT_MEGASCALE_PORT,
    accelerator: str = "cpu",
    job_name: str = "local",
    checkpoint_dir: str | None = None,
    restart_attempt: int = 0,
) -> dict[str, str]:
    """The variables of the contract for one process, as strings."""
    values: dict[str, object] = {
        NUM_SLICES: num_slices,
        SLICE_ID: slice_id,
        MEGASCALE_COORDINATOR: coordinator_host,
        MEGASCALE_PORT: megascale_port,
        WORKER_ID: worker_id,
        WORKER_HOSTNAMES: ",".join(worker_hostnames),
        JAX_COORDINATOR: f"{coordinator_host}:{jax_port}",
        PROCESS_COUNT: num_slices * hosts_per_slice,
        HOSTS_PER_SLICE: hosts_per_slice,
        CHIPS_PER_HOST: chips_per_host,
        CHIPS_PER_SLICE: hosts_per_slice * chips_per_host,
        ACCELERATOR: accelerator,
        JOB_NAME: job_name,
        ICI_DATA: parallelism.ici_data,
        ICI_FSDP: parallelism.ici_fsdp,
        ICI_TENSOR: parallelism.ici_tensor,
        DCN_DATA: parallelism.dcn_data,
        DCN_FSDP: parallelism.dcn_fsdp,
        DCN_PIPELINE: parallelism.dcn_pipeline,
        DCN_TENSOR: parallelism.dcn_tensor,
        RESTART_ATTEMPT: restart_attempt,
    }
    if checkpoint_dir:
        values[CHECKPOINT_DIR] = checkpoint_dir
    return {k: str(v) for k, v in values.items()}
