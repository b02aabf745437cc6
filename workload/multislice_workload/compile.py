"""`compile` mode: compile the train step for a TPU topology on a CPU-only machine.

``multislice_workload compile --topology v5e:4x4 --slices 2 [train flags] [--json]`` asks the TPU
compiler (`libtpu`, the workload's ``tpu`` extra) for the devices of N slices of that topology
(`jax.experimental.topologies.get_topology_desc`, compile-only devices, no TPU needed), builds the
same mesh and train step as `train` on them and compiles it ahead of time, as MaxText's
``train_compile.py`` does. It reports the program's peak HBM per device (``memory_analysis``)
against the HBM the TPU compiler lets a device use (`hardware.TPU_COMPILER_HBM_BYTES`), the
collectives of the compiled program (ICI inside a slice, DCN between slices),
``cost_analysis`` FLOPs and a roofline step time, and exits 78 (`exitcodes.EXIT_CONFIG_ERROR`,
never retried) when the program does not fit in HBM, as the TPU compiler itself refuses it.
The result is one JSON object (`Result.record`): the last line of stdout under ``--json``, and
the keys of the termination message (docs/workload.md, "compile").

The program is `train.Trainer`'s, unchanged: its layout (ICI/DCN parallelism) comes from the
parallelism flags, else the MULTISLICE_ICI_*/DCN_* variables the operator injects, else FSDP over
each slice's devices and data parallelism over the slices.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

from multislice_workload import env as contract
from multislice_workload import hardware, hlo, train
from multislice_workload.common import PARALLELISM_FLAGS
from multislice_workload.env import ConfigError, Parallelism
from multislice_workload.exitcodes import EXIT_OK
from multislice_workload.mesh import MESH_AXES, build_mesh
from multislice_workload.termination import STATUS

GENERATIONS = tuple(hardware.TPU_PEAK_BF16_FLOPS)
# libtpu's chip configuration: v4 and v5p run their 2 TensorCores as one device ("megacore"),
# as MaxText's accelerator_to_spec_map.py passes it; without it a v4 chip is 2 devices.
CHIP_CONFIG = {"v4": "megacore", "v5p": "megacore"}
# GKE's multi-host TPU VMs hold a 2x2x1 block of chips (operator catalog: multi_host_chips_per_vm
# = 4); one-chip slices are one 1t VM.
HOST_BOUNDS = (2, 2, 1)
_TOPOLOGY = re.compile(r"^([a-z0-9]+):(\d+(?:x\d+){1,2})$")
_TRANSFER = re.compile(r'_xla_megascale_transfer_type="([A-Z_]+)"')
_TARGET = re.compile(r'_xla_megascale_target="\{([\d,]+)\}')
_ASYNC_PART = re.compile(r'"async_collective_fusion_config":\{"flag_start":"(-?\d+)"')


@dataclasses.dataclass(frozen=True)
class Topology:
    generation: str  # v4, v5e, v5p, v6e, tpu7x
    shape: tuple[int, ...]  # chips along each axis

    @property
    def name(self) -> str:
        return f"{self.generation}:{'x'.join(map(str, self.shape))}"

    @property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def host_bounds(self) -> tuple[int, int, int]:
        return (1, 1, 1) if self.chips == 1 else HOST_BOUNDS

    @property
    def chips_per_host(self) -> int:
        return math.prod(self.host_bounds)

    @property
    def hosts(self) -> int:
        return self.chips // self.chips_per_host


def parse_topology(text: str) -> Topology:
    """`<generation>:<AxB[xC]>` (the operator's `plan` spelling); ConfigError otherwise."""
    match = _TOPOLOGY.match(text.strip().lower())
    if not match or match.group(1) not in GENERATIONS:
        raise ConfigError(
            f"--topology {text!r}: expected <generation>:<AxB[xC]> with a generation of "
            f"{', '.join(GENERATIONS)}, e.g. v5e:4x4 or v5p:2x2x4"
        )
    shape = tuple(int(d) for d in match.group(2).split("x"))
    top = Topology(match.group(1), shape)
    if top.chips > 1 and top.chips % math.prod(HOST_BOUNDS):
        raise ConfigError(
            f"--topology {text!r}: {top.chips} chips do not fill 4-chip hosts (2x2x1); "
            "use a slice shape of the catalog (docs/provisioning.md)"
        )
    return top


def allow_concurrent_compilers() -> None:
    """libtpu holds /tmp/libtpu_lockfile so that one process owns a TPU; compiling touches no
    TPU, so let several processes (test workers, a compile beside another) load it at once."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def tpu_devices(top: Topology, slices: int) -> list[Any]:
    """The compile-only devices of `slices` slices of `top`, from libtpu."""
    allow_concurrent_compilers()
    try:
        from jax.experimental import topologies
    except ImportError as err:  # pragma: no cover (jax is a dependency)
        raise ConfigError(f"jax.experimental.topologies: {err}") from err
    try:
        desc = topologies.get_topology_desc(
            topology_name=top.name,
            platform="tpu",
            chip_config_name=CHIP_CONFIG.get(top.generation, "default"),
            chips_per_host_bounds=top.host_bounds,
            num_slices=slices,
        )
    except RuntimeError as err:
        if "not installed" in str(err):
            raise ConfigError(
                "the TPU compiler (libtpu) is not installed: pip install "
                "'multislice-workload[tpu]' (the workload image carries it)"
            ) from err
        raise ConfigError(f"--topology {top.name} --slices {slices}: {err}") from err
    return list(desc.devices)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    train.add_arguments(parser)
    add = parser.add_argument
    add("--topology", required=True, help="<generation>:<AxB[xC]>, e.g. v5e:4x4")
    add(
        "--slices",
        type=int,
        default=None,
        help="slices over DCN (default $MEGASCALE_NUM_SLICES or 1)",
    )
    add("--vocab", type=int, default=0, help="vocabulary size (default: the tokenizer's)")
    add("--json", action="store_true", help="end with the result as one JSON line")


def layout(
    args: argparse.Namespace, environ: Mapping[str, str], chips: int, slices: int
) -> Parallelism:
    """Flags, over the MULTISLICE_ICI_*/DCN_* variables that are set, over FSDP in each slice
    and data parallelism across slices."""
    base = Parallelism(ici_fsdp=chips, dcn_data=slices)
    names = dict(zip(PARALLELISM_FLAGS, contract.PARALLELISM_VARIABLES, strict=True))
    values: dict[str, int | None] = {}
    for name, variable in names.items():
        flag = getattr(args, name, None)
        raw = environ.get(variable, "").strip()
        if flag is None and raw:
            if not raw.isdigit():
                raise ConfigError(f"{variable}={raw!r} must be a positive integer")
            flag = int(raw)
        values[name] = flag
    return base.replace(**values)


def config(args: argparse.Namespace) -> train.TrainConfig:
    """The train flags as `train` reads them, bfloat16 matmuls by default (as on TPU)."""
    # vocab and eos_id come from the tokenizer, as in train (unless --vocab names the size).
    fields = {f.name for f in dataclasses.fields(train.TrainConfig)} - {"vocab", "eos_id"}
    cfg = train.TrainConfig(**{name: getattr(args, name) for name in fields})
    cfg = dataclasses.replace(cfg, dtype=cfg.dtype or "bfloat16", compilation_cache_dir=None)
    if args.vocab:
        return dataclasses.replace(cfg, vocab=args.vocab)
    from multislice_workload.datasets import DatasetSpec

    spec = DatasetSpec(tuple(p for p in (cfg.dataset or "").split(",") if p), cfg.text_field)
    tok = train.load_tokenizer(cfg, spec)
    return dataclasses.replace(cfg, vocab=tok.vocab_size, eos_id=tok.eos_id)


# --- Reading the compiled TPU program. ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DcnTransfer:
    """A collective between slices: the TPU program hands it to the megascale runtime as a host
    send (``_xla_megascale_transfer_type``, ``_xla_megascale_target`` = the slices taking part)."""

    kind: str  # ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ...
    arrays: tuple[tuple[str, tuple[int, ...]], ...]
    slices: int
    count: int

    @property
    def size_bytes(self) -> int:
        return sum(hlo.DTYPE_BYTES[d] * math.prod(s) for d, s in self.arrays)

    @property
    def bytes_per_device(self) -> float:
        """What one device sends over DCN per execution (ring model). The send carries the
        collective's operand, not its result as `hlo.Collective`'s arrays do: a gather's is the
        device's own shard (sent n - 1 times), a reduce-scatter's its whole input (measured on
        libtpu's program, tests/workload/test_tpu_compile.py)."""
        n = self.slices
        factor = {"ALL_REDUCE": 2 * (n - 1) / n, "ALL_GATHER": float(n - 1)}
        return factor.get(self.kind, (n - 1) / n) * self.size_bytes

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_device * self.count


def ici_collectives(text: str, devices_per_slice: int) -> list[hlo.Collective]:
    """The collectives inside a slice. libtpu splits an asynchronous collective into a start,
    continuations (fused with the compute it overlaps) and a done, each repeating the collective
    instruction: only the start (``flag_start`` -1) or a synchronous one is counted."""
    out = []
    for c in hlo.collectives(text, devices_per_slice):
        part = _ASYNC_PART.search(c.line)
        if part and part.group(1) != "-1":
            continue
        out.append(c)
    return out


def dcn_transfers(text: str) -> list[DcnTransfer]:
    """The megascale sends of the program, with their executions per run."""
    bodies, entry = hlo._computations(text)
    counts = _all_counts(bodies, entry)
    out = []
    for name, lines in bodies.items():
        for line in lines:
            kind = _TRANSFER.search(line)
            if " send(" not in line or not kind:
                continue
            head = line.split(" send(", 1)[0].split("=", 1)[1]
            # The send's result is (data, u32[] context, token[]): the first array is the data.
            dtype, dims = hlo._ARRAY.findall(head)[0]
            arrays = ((dtype, tuple(int(x) for x in dims.split(",") if x)),)
            target = _TARGET.search(line)
            slices = len(target.group(1).split(",")) if target else 1
            out.append(DcnTransfer(kind.group(1), arrays, slices, counts.get(name, 1)))
    return out


def _all_counts(bodies: dict[str, list[str]], entry: str) -> dict[str, int]:
    """Executions per run of every computation that reaches a send (as hlo counts collectives)."""
    sends = {n for n, lines in bodies.items() if any(" send(" in x for x in lines)}
    calls = {n: {c for x in lines for _, c in hlo._callees(x)} for n, lines in bodies.items()}
    reaching, grew = set(sends), True
    while grew:
        more = {n for n, called in calls.items() if called & reaching} - reaching
        reaching |= more
        grew = bool(more)
    counts: dict[str, int] = {entry: 1}
    order = [entry]
    while order:
        name = order.pop()
        for line in bodies.get(name, []):
            callees = [(k, c) for k, c in hlo._callees(line) if c in reaching]
            if not callees:
                continue
            trip = hlo._trip_count(line, bodies)
            for kind, callee in callees:
                times = trip if kind in ("body", "condition") else 1
                counts[callee] = counts.get(callee, 0) + counts[name] * times
                order.append(callee)
    return counts


def slice_mesh_shape(mesh: Any) -> tuple[int, ...]:
    """The mesh of one slice: the axes with a DCN factor shrink to their ICI part. The TPU
    program is one slice's; its replica groups are positions in that slice's devices."""
    import numpy as np

    slice_of = np.vectorize(lambda d: int(getattr(d, "slice_index", 0) or 0))(mesh.devices)
    first = slice_of == slice_of.flat[0]
    return tuple(
        int(first.any(axis=tuple(a for a in range(first.ndim) if a != i)).sum())
        for i in range(first.ndim)
    )


# --- The result. ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Result:
    topology: str
    slices: int
    devices: int
    mesh: dict[str, int]
    hbm_capacity_bytes: int
    hbm_bytes_per_device: int = 0
    flops_per_device: float = 0.0
    bytes_accessed_per_device: float = 0.0
    step_time_s: float = 0.0
    bound: str = ""  # compute or memory
    ici_bytes_per_device: float = 0.0
    dcn_bytes_per_device: float = 0.0
    compile_s: float = 0.0
    # libtpu's words when it refused the program for HBM (not an "error": spec.preflight reads
    # an "error" key as a failed compile, and this is a program that does not fit).
    compiler: str = ""

    @property
    def fits(self) -> bool:
        return not self.compiler and self.hbm_bytes_per_device <= self.hbm_capacity_bytes

    def record(self) -> dict[str, Any]:
        """The JSON contract (docs/workload.md, "compile")."""
        out = {"fits": self.fits, **dataclasses.asdict(self)}
        if not self.compiler:
            out.pop("compiler")
        return out


def hbm_used(memory: Any) -> int:
    """HBM of one device as the TPU compiler counts it against its usable HBM: the program's
    peak (`peak_memory_in_bytes`, from the buffer assignment: arguments, outputs and the
    temporaries live at once) plus its code. libtpu accepts a program up to exactly this
    (tests/unit/test_catalog_libtpu.py); the sum of every temporary with the arguments and
    outputs is larger, as temporaries that are never live together share HBM."""
    return int(memory.peak_memory_in_bytes + memory.generated_code_size_in_bytes)


def roofline(generation: str, per_chip: int, flops: float, accessed: float) -> tuple[float, str]:
    """Step time lower bound of one device: its FLOPs at the peak, or its HBM traffic at the
    bandwidth, whichever is longer (collectives overlap with compute and are not added)."""
    compute = flops / (hardware.TPU_PEAK_BF16_FLOPS[generation] / per_chip)
    memory = accessed / (hardware.TPU_HBM_BANDWIDTH[generation] / per_chip)
    return (compute, "compute") if compute >= memory else (memory, "memory")


# libtpu's refusals: "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for
# HLO temporaries (55.59G) exceeds available HBM (15.75G)." (0.0.42.1), and the older
# "Ran out of memory in memory space hbm. Used 20.5G of 15.75G hbm."; G = GiB.
_OOM = (
    re.compile(
        r"required for [^(]*\(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"
    ),
    re.compile(r"Used ([\d.]+)([KMGT]?) of ([\d.]+)([KMGT]?) hbm", re.IGNORECASE),
)


def _parse_oom(message: str) -> tuple[int, int] | None:
    """(needed, available) bytes from libtpu's out-of-HBM compile error, None for any other."""
    match = next((m for m in (p.search(message) for p in _OOM) if m), None)
    if "RESOURCE_EXHAUSTED" not in message or match is None:
        return None
    scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    used = float(match.group(1)) * scale[match.group(2).upper()]
    have = float(match.group(3)) * scale[match.group(4).upper()]
    return int(used), int(have)


def compile_for(
    cfg: train.TrainConfig, top: Topology, slices: int, parallelism: Parallelism, allow_split: bool
) -> tuple[Result, Any]:
    """Compile `cfg`'s train step on `slices` slices of `top`: the result and the Trainer (whose
    `compiled` is the TPU program; None when libtpu refused it for HBM)."""
    devices = tpu_devices(top, slices)
    per_chip = hardware.devices_per_chip(devices)
    if slices == 1:
        # One slice: libtpu leaves slice_index unset; the mesh code needs the runtime's tag.
        devices = [_OneSlice(d) for d in devices]
    mesh = build_mesh(
        parallelism,
        num_slices=slices,
        chips_per_slice=top.chips,
        hosts_per_slice=top.hosts,
        devices=devices,
        allow_split_physical_axes=allow_split,
    )
    if slices == 1:
        import jax
        import numpy as np

        raw = np.vectorize(lambda d: d.device, otypes=[object])(mesh.devices)
        mesh = jax.sharding.Mesh(raw, MESH_AXES)
    cfg = train.derive_grad_accum(cfg, mesh.shape)
    trainer = train.Trainer(cfg, mesh, train.check_shapes(cfg, mesh))
    base = Result(
        topology=top.name,
        slices=slices,
        devices=len(devices),
        mesh=dict(mesh.shape),
        hbm_capacity_bytes=hardware.TPU_COMPILER_HBM_BYTES[top.generation],
    )
    try:
        compiled = trainer.compiled
    except Exception as err:  # libtpu's RESOURCE_EXHAUSTED: the program does not fit
        oom = _parse_oom(str(err))
        if oom is None:
            raise
        first = str(err).strip().splitlines()[0][:300]
        return dataclasses.replace(base, hbm_bytes_per_device=oom[0], compiler=first), trainer
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    flops, accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    step, bound = roofline(top.generation, per_chip, flops, accessed)
    text = compiled.as_text()
    per_slice = len(devices) // slices
    result = dataclasses.replace(
        base,
        hbm_bytes_per_device=hbm_used(compiled.memory_analysis()),
        flops_per_device=flops,
        bytes_accessed_per_device=accessed,
        step_time_s=step,
        bound=bound,
        ici_bytes_per_device=sum(c.total_bytes for c in ici_collectives(text, per_slice)),
        dcn_bytes_per_device=sum(t.total_bytes for t in dcn_transfers(text)),
        compile_s=trainer.compile_seconds,
    )
    return result, trainer


@dataclasses.dataclass(frozen=True)
class _OneSlice:
    """A compile-only device of a one-slice topology, tagged slice 0 as the TPU runtime does."""

    device: Any
    slice_index: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.device, name)


def report(result: Result, trainer: Any) -> list[str]:
    """Human-readable lines: HBM, roofline and the collectives by kind, dtype and network."""
    gib = 2**30
    lines = [
        f"topology {result.topology} x {result.slices} slices: {result.devices} devices, "
        f"mesh {result.mesh}",
        f"HBM per device: {result.hbm_bytes_per_device / gib:.3f} GiB of "
        f"{result.hbm_capacity_bytes / gib:.3f} GiB ({'fits' if result.fits else 'DOES NOT FIT'})",
    ]
    if result.compiler:
        return [*lines, f"compiler: {result.compiler}"]
    lines.append(
        f"cost_analysis: {result.flops_per_device:.4g} FLOPs, "
        f"{result.bytes_accessed_per_device:.4g} bytes accessed per device; roofline step "
        f"{result.step_time_s * 1e3:.3f} ms ({result.bound}-bound)"
    )
    text = trainer.compiled.as_text()
    per_slice = result.devices // result.slices
    shape = slice_mesh_shape(trainer.mesh)
    rows: dict[tuple[str, str, str], list[float]] = {}
    for c in ici_collectives(text, per_slice):
        axes = ",".join(hlo.axes_of(c, shape, MESH_AXES)) or "-"
        row = rows.setdefault((c.op, "/".join(sorted(c.dtypes)), f"ICI {axes}"), [0, 0.0])
        row[0] += c.count
        row[1] += c.total_bytes
    for t in dcn_transfers(text):
        dtypes = "/".join(sorted({d for d, _ in t.arrays}))
        row = rows.setdefault((t.kind.lower().replace("_", "-"), dtypes, "DCN slices"), [0, 0.0])
        row[0] += t.count
        row[1] += t.total_bytes
    lines.append("collectives (per device per step): op dtype network executions bytes")
    for (op, dtypes, net), (count, moved) in sorted(rows.items()):
        lines.append(f"  {op:18} {dtypes:9} {net:18} {int(count):6d} {moved:14.0f}")
    return lines


def run(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    import jax

    # The compile-only TPU devices come from libtpu directly; JAX's own backend stays the CPU
    # (a CPU machine has no TPU to start, whatever JAX_PLATFORMS the job's environment sets).
    jax.config.update("jax_platforms", "cpu")
    top = parse_topology(args.topology)
    slices = args.slices or int(environ.get(contract.NUM_SLICES, "").strip() or 1)
    if slices < 1:
        raise ConfigError(f"--slices must be >= 1, got {slices}")
    cfg = config(args)
    parallelism = layout(args, environ, top.chips, slices)
    result, trainer = compile_for(cfg, top, slices, parallelism, args.allow_split_physical_axes)
    for line in report(result, trainer):
        print(line)
    STATUS.result = result.record()
    if args.json:
        print(json.dumps(result.record(), separators=(",", ":")))
    sys.stdout.flush()
    if not result.fits:
        raise ConfigError(
            f"the program does not fit: {result.hbm_bytes_per_device / 2**30:.2f} GiB of HBM per "
            f"device, the TPU has {result.hbm_capacity_bytes / 2**30:.2f} GiB: add slices or FSDP, "
            "or shrink the batch (--microbatch_size) or the model"
        )
    return EXIT_OK


def summarize(trainer: Any) -> dict[tuple[str, tuple[str, ...]], dict[str, float]]:
    """(op, mesh axes) -> executions and bytes per device per step, as `hlo.summarize` keys them
    for XLA:CPU programs: ICI collectives by the axes their groups span inside a slice, DCN
    transfers by the axes that cross slices (those with a DCN factor)."""
    text = trainer.compiled.as_text()
    mesh = trainer.mesh
    shape = slice_mesh_shape(mesh)
    devices = int(mesh.devices.size)
    per_slice = math.prod(shape)
    out = hlo.summarize(ici_collectives(text, per_slice), shape, MESH_AXES)
    dcn = tuple(a for a, full, local in zip(MESH_AXES, mesh.devices.shape, shape, strict=True)
                if full > local)  # fmt: skip
    for t in dcn_transfers(text) if devices > per_slice else []:
        key = (t.kind.lower().replace("_", "-"), dcn)
        entry = out.setdefault(key, {"executions": 0.0, "bytes": 0.0})
        entry["executions"] += t.count
        entry["bytes"] += t.total_bytes
    return out
