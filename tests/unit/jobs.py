"""What the unit tests of decide() share: a MultisliceJob body, its spec and plan, an
observation in which the apiserver already accepted the JobSet, pods, and `run`: one decide()
pass. A test file that needs its own config or job binds them once, e.g.
``run = partial(jobs.run, cfg=CFG, now=NOW)``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from multislice_operator.api.models import MultisliceJobStatus
from multislice_operator.common.errors import SpecError
from multislice_operator.planning.plan import Plan, load_job, plan_job
from multislice_operator.reconcile import (
    Admission,
    DecideConfig,
    Decision,
    JobMeta,
    Pod,
    Termination,
    decide,
)
from multislice_operator.reconcile import Observed as _Observed

CFG = DecideConfig.from_settings()
META = JobMeta("ns", "job", "uid-1", 1, has_finalizer=True)


def body(
    name: str = "job", namespace: str = "ns", *, metadata: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """A MultisliceJob of 2 v5litepod-16 slices (container "c", image "i"); `metadata` adds to
    the name and namespace, `spec` sets spec fields (replacing)."""
    return {
        "apiVersion": "multislice.dev/v1alpha1",
        "kind": "MultisliceJob",
        "metadata": {"name": name, "namespace": namespace, **(metadata or {})},
        "spec": {
            "accelerator": "v5litepod-16",
            "slices": 2,
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
            # Progress survives restarts (else the first pass warns NoCheckpoint, once).
            "checkpoint": {"directory": "gs://bucket/job"},
            **spec,
        },
    }


def spec_and_plan(obj: dict[str, Any] | None = None, **spec: Any) -> tuple[Any, Plan]:
    """The spec and plan of `obj`, or of ``body(**spec)``."""
    job = load_job(obj if obj is not None else body(**spec))
    return job.spec, plan_job(job)


def spec_errors(obj: dict[str, Any]) -> dict[str, str]:
    """The fields `validate` and `plan` refuse in `obj` (SpecError), with their messages; fails
    when `obj` is accepted."""
    with pytest.raises(SpecError) as exc:
        spec_and_plan(obj)
    return {e.path: e.message for e in exc.value.errors}


def Observed(**kw: Any) -> _Observed:
    """An observation in which the apiserver already accepted the JobSet (the dry run before
    any pool, issue 14); the tests of admission itself pass `admission` explicitly."""
    kw.setdefault("admission", Admission())
    return _Observed(**kw)


def status(old: MultisliceJobStatus | dict[str, Any] | None) -> MultisliceJobStatus:
    """`old` as decide() takes it: a status, or the dict stored in the object (None or {}: a
    new job's empty status)."""
    return old if isinstance(old, MultisliceJobStatus) else MultisliceJobStatus.from_dict(old)


def run(
    old: MultisliceJobStatus | dict[str, Any] | None = None,
    obs: _Observed | None = None,
    *,
    now: datetime | None = None,
    cfg: DecideConfig = CFG,
    meta: JobMeta = META,
    plan: tuple[Any, Plan] | None = None,
    **spec: Any,
) -> Decision:
    """One decide() pass from the status `old` on `obs` (None: nothing observed at `now` but an
    accepted JobSet), for `plan` (a spec and its plan) or else the job ``body(**spec)``
    (`metadata` included)."""
    if plan is not None and spec:
        raise TypeError("run() takes a plan or the spec fields of one, not both")
    if obs is None:
        if now is None:
            raise TypeError("run() needs obs, or now to observe nothing at")
        obs = Observed(now=now)
    s, p = plan if plan is not None else spec_and_plan(**spec)
    return decide(meta, s, p, None, status(old), obs, cfg)


def failed(
    name: str,
    slice_index: int | None,
    exit_code: int | None,
    reason: str = "Error",
    attempt: int = 0,
    *,
    step: int | None = None,
    checkpoint_step: int | None = None,
    termination_reason: str | None = None,
    checkpoint_request: tuple[str, int] | None = None,
    disruption: str | None = None,
) -> Pod:
    """A failed pod, with what its termination message said (when it said anything)."""
    said = (step, checkpoint_step, termination_reason, checkpoint_request)
    termination = Termination(*said) if any(v is not None for v in said) else None
    return Pod(
        name,
        slice_index,
        attempt,
        "Failed",
        exit_code=exit_code,
        reason=reason,
        termination=termination,
        disruption=disruption,
    )


def running(counts: dict[int, int], attempt: int = 0) -> list[Pod]:
    """Pods running and ready: `counts` per slice."""
    return [
        Pod(f"job-slice-{i}-{h}", i, attempt, "Running", ready=True)
        for i, n in sorted(counts.items())
        for h in range(n)
    ]


def succeeded(counts: dict[int, int], attempt: int = 0) -> list[Pod]:
    return [
        Pod(f"job-slice-{i}-{h}-done", i, attempt, "Succeeded")
        for i, n in sorted(counts.items())
        for h in range(n)
    ]
