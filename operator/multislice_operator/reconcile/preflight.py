"""spec.preflight as a gate before capacity: compile first, then the node pools. Pure.

A job with spec.preflight gets no node pool (and no JobSet) until its compile command has passed
for the spec it runs: the command runs in the job's own image as a CPU Job owned by the job
(render/preflight.py), one per spec generation under one deterministic name
(names.preflight_job), so a pass after a crash finds the Job it created instead of making
another. The shell reads the Job and its pod's termination message (Observed.preflight) while the
job holds no capacity; this module says what that means:

* no Job yet: create it; the job is Pending (Provisioned=False, PreflightRunning);
* running: wait (a pass every few seconds: the Job is read, not watched);
* passed: status.preflight records it with its figures (HBM per device, the generation's HBM,
  the estimated step time) and the lifecycle goes on to the capacity in the same pass;
* failed (a non-zero exit, the deadline): a verdict (verdicts.py, PreflightFailed) fails the job
  with the command's own words, before any node pool; no restart budget is charged.

A finished Job is deleted on the pass that reads it (its result is in the status first: the
shell writes the status before it acts), so nothing of it is left.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from multislice_operator.api.models import (
    EXIT_CONFIG_ERROR,
    ConditionType,
    Phase,
    PreflightState,
    PreflightStatus,
)
from multislice_operator.common.names import preflight_job
from multislice_operator.reconcile.capacity import pools_present
from multislice_operator.reconcile.context import Builder
from multislice_operator.reconcile.facts import Facts
from multislice_operator.reconcile.reasons import Reason
from multislice_operator.reconcile.types import OwnAction, PreflightObservation


@dataclass(frozen=True)
class CreatePreflightJob(OwnAction):
    """Run the compile command (spec.preflight) as a CPU Job owned by the job, before any pool."""

    creates: ClassVar[bool] = True


@dataclass(frozen=True)
class DeletePreflightJob(OwnAction):
    """The compile Job finished (or is not this spec's): deleted with its pod."""


POLL_SECONDS = 5.0  # the compile Job is read, not watched: a pass this often while it runs
MESSAGE_MAX = 1024  # of the command's words kept in the status and the condition
GIB = 1024**3


def result(message: str) -> dict[str, Any]:
    """The compile command's JSON result: the last line of its termination message that is a
    JSON object ({"fits", "hbm_bytes_per_device", "hbm_capacity_bytes", "step_time_s", ...});
    {} when it wrote none."""
    for line in reversed(message.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, Mapping):
            return dict(data)
    return {}


def _number(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)


def _int(data: Mapping[str, Any], key: str) -> int | None:
    value = _number(data, key)
    return int(value) if value is not None else None


def _gib(n: int | None) -> str:
    return f"{n / GIB:.2f} GiB" if n is not None else "?"


def _said(message: str, data: dict[str, Any]) -> str:
    """The command's words: its JSON result's error or message when it wrote one (the workload's
    termination message: docs/environment.md), its text when it wrote no JSON, else nothing (the
    figures of a result have fields of their own)."""
    said = data.get("error") or data.get("message")
    if isinstance(said, str) and said:
        return said
    return "" if data else message.strip()


def _words(message: str) -> str:
    """What the command said, bounded, for a verdict: its words, else its whole text."""
    text = _said(message, result(message)) or message.strip()
    return text[-MESSAGE_MAX:] or "no message"


def _applies(f: Facts) -> bool:
    """spec.preflight is set and nothing of the job holds capacity yet."""
    spec = f.spec
    return (
        spec is not None and spec.preflight is not None and f.js is None and not (pools_present(f))
    )


def _shape(f: Facts) -> str | None:
    """The shape the plan is for when the job has several (Plan.shape_key), else None."""
    return f.plan.shape_key if f.plan is not None else None


def _ours(f: Facts, generation: int, shape: str | None) -> bool:
    """A compile (a Job, a record) of the spec and shape the job runs now."""
    return generation == f.meta.generation and shape == _shape(f)


def _current(f: Facts) -> PreflightObservation | None:
    """The job's own compile Job for the spec (and shape) it runs now."""
    obs = f.obs.preflight
    if obs is None or not obs.owned or not _ours(f, obs.generation, obs.shape):
        return None
    return obs


def _moves_on(f: Facts) -> bool:
    """A refused compile is not the job's end while it has other shapes to try (its capacity
    model moves to one: plugins/fallback.py)."""
    return f.plan is not None and f.plan.shape_alternatives > 0


def failure(f: Facts) -> str | None:
    """Why the compile failed (the verdict's message), or None: it did not (or is not ours, or
    the job has other shapes to try)."""
    obs = _current(f)
    if obs is None or not obs.finished or obs.succeeded or not _applies(f) or _moves_on(f):
        return None
    data = result(obs.message)
    need, have = _int(data, "hbm_bytes_per_device"), _int(data, "hbm_capacity_bytes")
    if data.get("fits") is False and not data.get("error") and need is not None:
        why = (
            f"the program does not fit: it needs {_gib(need)} of HBM per device, the TPU has "
            f"{_gib(have)}"
        )
    else:
        code = f"exit code {obs.exit_code}" if obs.exit_code is not None else obs.reason
        why = f"the compile command failed ({code or 'no exit code'}): {_words(obs.message)}"
    fix = (
        "more slices, FSDP (spec.parallelism) or a smaller batch"
        if data.get("fits") is False or obs.exit_code == EXIT_CONFIG_ERROR
        else "fix the program or spec.preflight.command"
    )
    others = " (and every other shape of provisioning.fallback was refused before)"
    return (
        f"preflight: {why}{others if _shape(f) is not None else ''}; nothing was provisioned; "
        f"{fix}, then recreate the job (Job {obs.name})"
    )


def record(f: Facts, b: Builder) -> None:
    """status.preflight from the compile Job seen now (every pass); a finished Job, or one of an
    older spec, is deleted (its result is written first)."""
    obs = f.obs.preflight
    if obs is None or not obs.owned or obs.deleting:
        return
    ours = _ours(f, obs.generation, obs.shape)
    if obs.finished or not ours:
        b.add(DeletePreflightJob())
    if not ours:
        return
    new = _status(f, obs)
    old = f.old.preflight
    if (
        old is not None
        and old.state == new.state
        and old.generation == new.generation
        and old.shape == new.shape
    ):
        new.time = old.time  # unchanged: no status write per pass
    b.status.preflight = new
    if new.state == PreflightState.PASSED and (old is None or old.state != new.state):
        b.event(Reason.PREFLIGHT_PASSED, passed_message(new))


def _status(f: Facts, obs: PreflightObservation) -> PreflightStatus:
    data = result(obs.message) if obs.finished else {}
    state = (
        PreflightState.RUNNING
        if not obs.finished
        else PreflightState.PASSED
        if obs.succeeded
        else PreflightState.FAILED
    )
    words = _said(obs.message, data)
    return PreflightStatus(
        state=state,
        job=obs.name,
        generation=obs.generation,
        hbm_bytes_per_device=_int(data, "hbm_bytes_per_device"),
        hbm_capacity_bytes=_int(data, "hbm_capacity_bytes"),
        step_time_seconds=_number(data, "step_time_s"),
        # The figures are in their fields; the words: its error, or its text when not JSON.
        message=words[-MESSAGE_MAX:] if words else None,
        time=f.now if obs.finished else None,
        shape=obs.shape,
    )


def passed_message(st: PreflightStatus) -> str:
    if st.hbm_bytes_per_device is None:
        return f"preflight passed (Job {st.job})"
    step = f", estimated step {st.step_time_seconds:.3g} s" if st.step_time_seconds else ""
    return (
        f"preflight passed: {_gib(st.hbm_bytes_per_device)} of HBM per device of "
        f"{_gib(st.hbm_capacity_bytes)}{step}"
    )


def gate(f: Facts, b: Builder) -> tuple[Phase, str] | None:
    """What the preflight allows this pass: None, go on to the capacity; else the job waits,
    without any node pool, while its compile Job is created or runs."""
    if not _applies(f):
        return None
    st = b.status.preflight
    if st is not None and _ours(f, st.generation, st.shape):
        if st.state == PreflightState.PASSED:
            return None
        if st.state == PreflightState.FAILED and _moves_on(f):
            return None  # its capacity model leaves this shape for another one
    assert f.plan is not None
    name = preflight_job(f.plan.name)
    shape = f.plan.shape_key
    what = "the job's TPUs" if shape is None else f"{f.plan.shape.accelerator} x {f.plan.slices}"
    obs = f.obs.preflight
    if obs is None:
        b.add(CreatePreflightJob())
        message = f"preflight: compiling the program for {what} (Job {name})"
    elif not obs.owned:
        message = (
            f"preflight: a Job named {name} exists that this job does not own; it waits for it "
            "to go (delete it if it is not an earlier job's of this name)"
        )
    elif obs.deleting or not _ours(f, obs.generation, obs.shape):
        older = "an older spec" if obs.generation != f.meta.generation else "another shape"
        message = f"preflight: waiting for Job {name} of {older} to go"
    else:
        message = f"preflight: compiling the program for {what} (Job {name})"
    b.cond(ConditionType.PROVISIONED, "False", Reason.PREFLIGHT_RUNNING, message)
    b.requeue_in(POLL_SECONDS)
    return Phase.PENDING, message
