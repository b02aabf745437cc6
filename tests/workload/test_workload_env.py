"""The environment contract: parsing, defaults and cross-variable checks (no JAX needed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from multislice_workload import env as contract
from multislice_workload import runtime
from multislice_workload.env import ConfigError, Parallelism


def operator_env(**overrides: str) -> dict[str, str]:
    """What the operator injects into slice 1, worker 1 of a 2 x v5litepod-16 job."""
    env = contract.build_contract_env(
        num_slices=2,
        hosts_per_slice=4,
        chips_per_host=4,
        slice_id=1,
        worker_id=1,
        parallelism=Parallelism(ici_fsdp=16, dcn_data=2),
        worker_hostnames=[f"job-slice-1-{i}.job" for i in range(4)],
        coordinator_host="job-slice-0-0.job",
        accelerator="v5litepod-16",
        job_name="job",
        checkpoint_dir="gs://bucket/job",
        restart_attempt=3,
    )
    env.update(overrides)
    return env


def test_contract_variable_names() -> None:
    assert set(contract.REQUIRED_VARIABLES) == {
        "MEGASCALE_NUM_SLICES",
        "MEGASCALE_SLICE_ID",
        "MEGASCALE_COORDINATOR_ADDRESS",
        "MEGASCALE_PORT",
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "JAX_COORDINATOR_ADDRESS",
        "JAX_PROCESS_COUNT",
        "MULTISLICE_HOSTS_PER_SLICE",
        "MULTISLICE_CHIPS_PER_HOST",
        "MULTISLICE_CHIPS_PER_SLICE",
        "MULTISLICE_ACCELERATOR",
        "MULTISLICE_JOB_NAME",
        "MULTISLICE_ICI_DATA",
        "MULTISLICE_ICI_FSDP",
        "MULTISLICE_ICI_TENSOR",
        "MULTISLICE_DCN_DATA",
        "MULTISLICE_DCN_FSDP",
        "MULTISLICE_DCN_PIPELINE",
        "MULTISLICE_DCN_TENSOR",
    }
    assert set(contract.OPTIONAL_VARIABLES) == {
        "MULTISLICE_CHECKPOINT_DIR",
        "MULTISLICE_RESTART_ATTEMPT",
        # docs/environment.md section 5: rendered from the downward API, absent in local runs.
        "MULTISLICE_PODINFO_DIR",
        "MULTISLICE_POD_NAME",
        "MULTISLICE_POD_NAMESPACE",
    }


def test_reads_operator_env() -> None:
    env = contract.from_environ(operator_env())
    assert env.process_id == 1 * 4 + 1
    assert env.process_count == 8
    assert env.chips_per_slice == 16
    assert env.global_chips == 32
    assert env.jax_coordinator == "job-slice-0-0.job:8476"
    assert env.megascale_port == 8080
    assert env.checkpoint_dir == "gs://bucket/job"
    assert env.restart_attempt == 3
    assert env.parallelism == Parallelism(ici_fsdp=16, dcn_data=2)
    assert not env.standalone and env.distributed


def test_podinfo_and_hooks_are_read_and_optional() -> None:
    env = contract.from_environ(
        operator_env(
            **{contract.PODINFO_DIR: "/etc/multislice/podinfo", contract.HANG_AT_STEP: "7"}
        )
    )
    assert env.podinfo_dir == "/etc/multislice/podinfo" and env.hang_at_step == 7
    plain = contract.from_environ(operator_env())
    assert plain.podinfo_dir is None and plain.hang_at_step is None


def test_fault_hooks_act_only_in_the_named_process() -> None:
    """A pod template is one for every pod of a slice: MULTISLICE_FAULT_PROCESS names the one
    process (slice x hosts + worker) whose hooks act, so one container of a real job fails."""
    hooks = {contract.FAIL_AT_STEP: "25", contract.HANG_AT_STEP: "9"}
    chosen = contract.from_environ(operator_env(**hooks, **{contract.FAULT_PROCESS: "5"}))
    assert chosen.process_id == 5 and (chosen.fail_at_step, chosen.hang_at_step) == (25, 9)
    other = contract.from_environ(operator_env(**hooks, **{contract.FAULT_PROCESS: "4"}))
    assert (other.fail_at_step, other.hang_at_step) == (None, None)
    assert contract.from_environ(operator_env(**hooks)).fail_at_step == 25  # unset: every one
    with pytest.raises(ConfigError, match=contract.FAULT_PROCESS):
        contract.from_environ(operator_env(**hooks, **{contract.FAULT_PROCESS: "x"}))


def test_restart_attempt_defaults_to_zero() -> None:
    environ = operator_env()
    del environ[contract.RESTART_ATTEMPT], environ[contract.CHECKPOINT_DIR]
    env = contract.from_environ(environ)
    assert env.restart_attempt == 0 and env.checkpoint_dir is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({contract.SLICE_ID: "2"}, "MEGASCALE_SLICE_ID=2 must be < MEGASCALE_NUM_SLICES=2"),
        ({contract.WORKER_ID: "4"}, "TPU_WORKER_ID=4 must be < MULTISLICE_HOSTS_PER_SLICE=4"),
        ({contract.PROCESS_COUNT: "4"}, "JAX_PROCESS_COUNT=4 must equal slices x hosts"),
        ({contract.ICI_FSDP: "8"}, "ICI parallelism data x fsdp x tensor = 1 x 8 x 1 = 8"),
        ({contract.DCN_DATA: "4"}, "must equal the number of slices (2)"),
        ({contract.CHIPS_PER_SLICE: "8"}, "MULTISLICE_CHIPS_PER_SLICE=8 must equal"),
        ({contract.WORKER_HOSTNAMES: "a,b"}, "lists 2 hosts, expected"),
        ({contract.JAX_COORDINATOR: "nohostport"}, "must be host:port"),
        ({contract.MEGASCALE_COORDINATOR: "h:8080"}, "must not carry a port"),
        ({contract.ACCELERATOR: "v5litepod-32"}, "has 32 chips but hosts x chips per host = 16"),
        ({contract.NUM_SLICES: "two"}, "MEGASCALE_NUM_SLICES='two' is not an integer"),
        ({contract.ICI_TENSOR: "0"}, "MULTISLICE_ICI_TENSOR=0 must be >= 1"),
        ({contract.JOB_NAME: ""}, "MULTISLICE_JOB_NAME is not set"),
    ],
)
def test_inconsistent_env_is_a_config_error(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="inconsistent multislice environment") as err:
        contract.from_environ(operator_env(**overrides))
    assert message in str(err.value)


def test_every_problem_is_reported_at_once() -> None:
    environ = operator_env()
    del environ[contract.DCN_PIPELINE], environ[contract.MEGASCALE_PORT]
    with pytest.raises(ConfigError) as err:
        contract.from_environ(environ)
    assert "MULTISLICE_DCN_PIPELINE is not set" in str(err.value)
    assert "MEGASCALE_PORT is not set" in str(err.value)


def test_standalone_without_contract() -> None:
    env = contract.from_environ({}, local_device_count=lambda: 4)
    assert env.standalone and not env.distributed
    assert env.parallelism == Parallelism(ici_fsdp=4)
    assert env.process_id == 0 and env.global_chips == 4


def test_standalone_accepts_ici_overrides() -> None:
    env = contract.from_environ(
        {contract.ICI_FSDP: "2", contract.ICI_TENSOR: "2"}, local_device_count=lambda: 4
    )
    assert env.parallelism == Parallelism(ici_fsdp=2, ici_tensor=2)


@pytest.mark.parametrize(
    ("accelerator", "chips", "generation"),
    [
        ("v4-16", 8, "v4"),
        ("v5litepod-16", 16, "v5e"),
        ("v5p-8", 4, "v5p"),
        ("v6e-256", 256, "v6e"),
        ("tpu7x-128", 64, "tpu7x"),  # TensorCores, 2 per chip: 64 chips, 4x4x4
        ("cpu", None, None),
    ],
)
def test_accelerator_names(accelerator: str, chips: int | None, generation: str | None) -> None:
    assert contract.accelerator_chips(accelerator) == chips
    assert contract.accelerator_generation(accelerator) == generation


def _pci(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """A /sys/bus/pci/devices tree: slot -> (vendor, device)."""
    for slot, (vendor, device) in devices.items():
        (root / slot).mkdir(parents=True)
        (root / slot / "vendor").write_text(vendor + "\n")
        (root / slot / "device").write_text(device + "\n")
    return root


def test_an_installed_tpu_runtime_is_not_a_tpu(tmp_path: Path) -> None:
    """The `tpu` extra installs libtpu on CPU machines (to compile for TPUs; make install does,
    for the compile lane): without a TPU chip on the PCI bus the workload runs on the CPU, unless
    JAX_PLATFORMS says otherwise."""
    assert importlib.util.find_spec("libtpu") is not None  # the case this test is about
    cpu_only = _pci(tmp_path / "cpu", {"0000:00:04.0": ("0x1af4", "0x1004")})  # virtio only
    assert runtime.tpu_chips(cpu_only) == 0
    assert not runtime.on_tpu({}, pci=cpu_only)
    assert runtime.on_tpu({"JAX_PLATFORMS": "tpu"}, pci=cpu_only)  # asked for: the backend says
    v6e = _pci(tmp_path / "v6e", {f"0000:00:0{i}.0": ("0x1ae0", "0x006f") for i in range(4)})
    assert runtime.tpu_chips(v6e) == 4
    assert runtime.on_tpu({}, pci=v6e)
    assert not runtime.on_tpu({"JAX_PLATFORMS": "cpu"}, pci=v6e)
    other_google = _pci(tmp_path / "gvnic", {"0000:00:05.0": ("0x1ae0", "0x0042")})  # gVNIC
    assert not runtime.on_tpu({}, pci=other_google)
