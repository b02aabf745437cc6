"""The collectives of a compiled program, read from its optimized HLO text, and the bytes each
one moves per device.

For every collective instruction: its op, result dtypes and shapes, replica groups (explicit
``{{0,1},{2,3}}`` or iota ``[2,2]<=[4]`` / ``[2,2]<=[2,2]T(1,0)``) or source-target pairs, and
how many times one run of the program executes it: the product of the known trip counts of the
while loops around it (``backend_config={"known_trip_count":{"n":"4"}}``, which XLA's while-loop
trip-count annotator writes; a loop without it is counted from its condition's constant bound).

Bytes per device follow the ring cost model (what one device sends; n = group size):
all-gather ``(n - 1) / n x output``, reduce-scatter ``(n - 1) x output``, all-reduce
``2 (n - 1) / n x size``, all-to-all ``(n - 1) / n x size``, collective-permute ``size`` (a device
that sends). Replica-group ids are positions in the program's device assignment, which for a
program over one mesh is ``mesh.devices.flat`` order; `axes_of` names the mesh axes a group spans.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence

import numpy as np

OPS = ("all-gather", "reduce-scatter", "all-reduce", "collective-permute", "all-to-all")
DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
    "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8,
    "f8e4m3fn": 1, "f8e5m2": 1,
}  # fmt: skip

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_OP = re.compile(r"= (.*?) (" + "|".join(OPS) + r")(-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_CALLEE = re.compile(r"\b(body|condition|to_apply|calls)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_BOUND = re.compile(r"constant\((\d+)\)")


@dataclasses.dataclass(frozen=True)
class Collective:
    op: str
    arrays: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, shape) of each result
    groups: tuple[tuple[int, ...], ...]  # replica groups; pairs (source, target) for a permute
    count: int  # executions per run of the program
    computation: str
    line: str

    @property
    def dtypes(self) -> set[str]:
        return {d for d, _ in self.arrays}

    @property
    def size_bytes(self) -> int:
        return sum(DTYPE_BYTES[d] * math.prod(s) for d, s in self.arrays)

    @property
    def group_size(self) -> int:
        return 2 if self.op == "collective-permute" else max(len(g) for g in self.groups)

    @property
    def bytes_per_device(self) -> float:
        """Bytes one device sends for one execution (ring model, module docstring)."""
        n, size = self.group_size, self.size_bytes
        if self.op == "collective-permute":
            return float(size)
        if n <= 1:
            return 0.0
        factor = {
            "all-gather": (n - 1) / n,
            "reduce-scatter": float(n - 1),
            "all-reduce": 2 * (n - 1) / n,
            "all-to-all": (n - 1) / n,
        }[self.op]
        return factor * size

    @property
    def total_bytes(self) -> float:
        return self.bytes_per_device * self.count


def collectives(hlo_text: str, num_devices: int) -> list[Collective]:
    """Every collective of an optimized HLO module that moves data (groups of one dropped)."""
    bodies, entry = _computations(hlo_text)
    counts = _execution_counts(bodies, entry)
    out = []
    for name, lines in bodies.items():
        for line in lines:
            match = _OP.search(line)
            if not match or counts.get(name, 0) == 0:
                continue
            op, started = match.group(2), bool(match.group(3))
            arrays = tuple(
                (d, tuple(int(x) for x in s.split(",") if x))
                for d, s in _ARRAY.findall(match.group(1))
            )
            arrays = _async_result(op, arrays) if started else arrays
            groups = _groups(line, op, num_devices)
            c = Collective(op, arrays, groups, counts[name], name, line.strip())
            if c.op == "collective-permute" or c.group_size > 1:
                out.append(c)
    return out


def _async_result(
    op: str, arrays: tuple[tuple[str, tuple[int, ...]], ...]
) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """An async start's result tuple holds its operands too: keep the outputs."""
    if op == "all-gather":
        return arrays[len(arrays) // 2 :]
    if op == "collective-permute":
        return arrays[1:2]
    return arrays


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """Instruction lines of each computation, and the entry computation's name."""
    bodies: dict[str, list[str]] = {}
    entry = ""
    current: list[str] | None = None
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header and " = " not in line:
            current = bodies.setdefault(header.group(1), [])
            entry = header.group(1) if line.startswith("ENTRY") else entry
            continue
        if line.strip() == "}":
            current = None
        elif current is not None:
            current.append(line)
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text")
    return bodies, entry


def _execution_counts(bodies: dict[str, list[str]], entry: str) -> dict[str, int]:
    """How many times one run executes each computation (while bodies x their trip counts)."""
    counts: dict[str, int] = {entry: 1}
    reaching = _reaching_collectives(bodies)
    order = [entry]
    while order:
        name = order.pop()
        for line in bodies.get(name, []):
            callees = [
                (kind, callee) for kind, callee in _callees(line)
                if callee in reaching and not (kind == "to_apply" and "all-reduce" in line)
            ]  # fmt: skip
            if not callees:
                continue  # a loop without collectives (attention's causal loops) needs no count
            trip = _trip_count(line, bodies)
            for kind, callee in callees:
                times = trip if kind in ("body", "condition") else 1
                counts[callee] = counts.get(callee, 0) + counts[name] * times
                order.append(callee)
    return counts


def _callees(line: str) -> list[tuple[str, str]]:
    callees = [(kind, callee) for kind, callee in _CALLEE.findall(line)]
    branches = _BRANCHES.search(line)
    if branches:
        callees += [("branch", b.strip().lstrip("%")) for b in branches.group(1).split(",")]
    return callees


def _reaching_collectives(bodies: dict[str, list[str]]) -> set[str]:
    """The computations that contain a collective, directly or through what they call."""
    calls = {
        name: {c for line in lines for _, c in _callees(line)} for name, lines in bodies.items()
    }
    reaching = {name for name, lines in bodies.items() if any(_OP.search(x) for x in lines)}
    grew = True
    while grew:
        more = {name for name, called in calls.items() if called & reaching} - reaching
        reaching |= more
        grew = bool(more)
    return reaching


def _trip_count(line: str, bodies: dict[str, list[str]]) -> int:
    if " while(" not in line:
        return 1
    known = _TRIP.search(line)
    if known:
        return int(known.group(1))
    condition = re.search(r"condition=%?([\w.\-]+)", line)
    bounds = [
        int(b) for cl in bodies.get(condition.group(1) if condition else "", []) for b in
        _BOUND.findall(cl)
    ]  # fmt: skip
    if not bounds:
        raise ValueError(f"while loop without a known trip count: {line.strip()[:200]}")
    return max(bounds)


def _groups(line: str, op: str, num_devices: int) -> tuple[tuple[int, ...], ...]:
    if op == "collective-permute":
        pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
        if not pairs:
            return ()
        return tuple(
            (int(a), int(b)) for a, b in re.findall(r"\{(\d+),(\d+)", pairs.group(1) + "}")
        )
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if iota:
        shape = [int(x) for x in iota.group(1).split(",")]
        dims = [int(x) for x in iota.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
        return tuple(tuple(int(i) for i in g) for g in ids.reshape(shape))
    explicit = re.search(r"replica_groups=\{(.*?)\}(?:,|$| )", line)
    if explicit and explicit.group(1).strip():
        return tuple(
            tuple(int(i) for i in g.split(",") if i)
            for g in re.findall(r"\{([\d,]*)\}", explicit.group(1) + "}")
        )
    return (tuple(range(num_devices)),)  # {} = every device


def axes_of(c: Collective, mesh_shape: Sequence[int], axis_names: Sequence[str]) -> tuple[str, ...]:
    """The mesh axes along which a collective's groups (or permute pairs) vary."""
    varying: set[int] = set()
    for group in c.groups:
        coords = np.array([np.unravel_index(i, tuple(mesh_shape)) for i in group])
        varying.update(int(a) for a in np.nonzero((coords != coords[0]).any(axis=0))[0])
    return tuple(axis_names[a] for a in sorted(varying))


def summarize(
    found: Iterable[Collective], mesh_shape: Sequence[int], axis_names: Sequence[str]
) -> dict[tuple[str, tuple[str, ...]], dict[str, float]]:
    """(op, mesh axes) -> executions per step and bytes per device per step."""
    out: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
    for c in found:
        key = (c.op, axes_of(c, mesh_shape, axis_names))
        entry = out.setdefault(key, {"executions": 0.0, "bytes": 0.0})
        entry["executions"] += c.count
        entry["bytes"] += c.total_bytes
    return out
